//! The root picker's function list, and the pattern that names a picked function for the
//! recorder.
//!
//! The one idea: the recorder takes patterns (exact name, glob or `module:name`), and the
//! picker hands back functions; `module:raw_name` with glob characters escaped names the
//! picked function and nothing else (unless the module really has two functions of that
//! symbol name, e.g. two `static` helpers from different files — then both are roots).

use crate::agent_bundle::is_agent_module;
use crate::symbols::{Function, ProcessSymbols};
use tendril_tui::FunctionEntry;

/// Every function of the target, in the symbol table's order, for the root picker —
/// but tendril's own agent's, which are never instrumented.
pub fn function_entries(symbols: &ProcessSymbols) -> Vec<FunctionEntry> {
    symbols.demangle_all();
    symbols
        .functions()
        .iter()
        .filter(|function| !is_agent_module(&function.module))
        .map(entry_of)
        .collect()
}

pub(super) fn entry_of(function: &Function) -> FunctionEntry {
    FunctionEntry {
        name: function.name.to_string(),
        module: function.module.to_string(),
        size: function.size,
        address: function.addr,
    }
}

/// A pattern that matches `entry`'s function exactly (see the module comment), or `None`
/// if the symbols have no such function.
pub fn pattern_for(symbols: &ProcessSymbols, entry: &FunctionEntry) -> Option<String> {
    let function = symbols
        .functions()
        .iter()
        .find(|f| f.addr == entry.address && f.name == entry.name && f.module == entry.module)?;
    let exact = format!(
        "{}:{}",
        glob::Pattern::escape(&function.module),
        glob::Pattern::escape(&function.raw_name)
    );
    let found = symbols.find(&exact).ok()?;
    if found.iter().any(|f| f.addr == function.addr) {
        Some(exact)
    } else {
        // Cannot happen with the pattern syntax of `symbols::pattern`; the display name
        // is the best remaining way to say which function was meant.
        Some(function.name.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test binary's own symbols: it is a real process with a libc.
    fn own_symbols() -> ProcessSymbols {
        ProcessSymbols::load(std::process::id() as i32).expect("symbols of the test process")
    }

    #[test]
    fn a_picked_function_is_named_exactly() {
        let symbols = own_symbols();
        let entries = function_entries(&symbols);
        assert_eq!(entries.len(), symbols.functions().len());
        for name in ["malloc", "free", "memcpy"] {
            let entry = entries
                .iter()
                .find(|e| e.name == name && e.module.starts_with("libc"))
                .unwrap_or_else(|| panic!("{name} not in libc"));
            let pattern = pattern_for(&symbols, entry).expect("a pattern");
            assert!(pattern.starts_with("libc"), "{pattern}");
            let found = symbols.find(&pattern).expect("the pattern matches");
            assert!(found.iter().any(|f| f.addr == entry.address), "{found:?}");
            // Only functions of that very symbol name in that module: glibc has two
            // versions of `memcpy` (GLIBC_2.2.5 and GLIBC_2.14), which no pattern tells
            // apart, so both become roots.
            assert!(
                found
                    .iter()
                    .all(|f| f.name == entry.name && f.module == entry.module),
                "{found:?}"
            );
            if name != "memcpy" {
                assert_eq!(found.len(), 1, "{found:?}");
            }
        }
    }

    #[test]
    fn an_unknown_function_has_no_pattern() {
        let symbols = own_symbols();
        let entry = FunctionEntry {
            name: "no_such_function_anywhere".into(),
            module: "nowhere".into(),
            size: 1,
            address: 1,
        };
        assert_eq!(pattern_for(&symbols, &entry), None);
    }
}
