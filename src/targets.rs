//! Choosing what the agent patches: user patterns become functions, and functions
//! become patch targets.
//!
//! The one idea: the controller knows every symbol of the process, the agent knows
//! nothing but addresses. So everything that needs names happens here — pattern
//! matching, resolving an IFUNC (`memcpy`) to the implementation the loader chose,
//! finding nearby code that might jump into a function's first bytes, and finding the
//! unwinder entry points that return hooks depend on.

use crate::agent_bundle::is_agent_module;
use crate::agent_connection::{AgentConnection, AgentConnectionError};
use crate::refusals;
use crate::symbols::{Function, ProcessSymbols, SymbolError};
use tendril_wire::{Hook, PatchTarget, Request, Response};

/// How far around a function to look for code that might branch into its entry.
const NEIGHBOURHOOD: u64 = 4096;

/// A function chosen for patching, with the name to show for it.
#[derive(Debug, Clone)]
pub struct Chosen {
    /// What is patched (for an IFUNC, the implementation).
    pub function: Function,
    /// The name the user knows it by: the symbol's name, and for an IFUNC
    /// `memcpy → <implementation>`.
    pub display_name: String,
}

/// Why patterns could not be turned into functions.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    #[error("{0}")]
    Symbols(#[from] SymbolError),
    #[error("no function matches '{pattern}' in pid {pid} — {hint}")]
    NoMatch {
        pattern: String,
        pid: i32,
        hint: String,
    },
    #[error("process {pid}: {source}")]
    Session {
        pid: i32,
        source: AgentConnectionError,
    },
    #[error("nothing that matches can be patched in pid {pid}: {reasons}{hint}")]
    AllRefused {
        pid: i32,
        reasons: String,
        hint: String,
    },
}

/// The functions matching `patterns`, in pattern order (a function may appear twice).
/// Needs no agent: a bad pattern is reported before anything touches the target.
///
/// tendril's own agent is left out unless a pattern names its module (`libtendril_agent*:
/// name`), so that no glob picks it up; a function named that way reaches the agent,
/// which refuses it with the reason.
pub fn match_patterns<'a>(
    symbols: &'a ProcessSymbols,
    patterns: &[String],
) -> Result<Vec<&'a Function>, SelectError> {
    let pid = symbols.pid();
    let mut matched: Vec<&Function> = Vec::new();
    for pattern in patterns {
        let mut found = find(symbols, pattern)?;
        let agents_named: Vec<&str> = symbols
            .modules()
            .iter()
            .filter(|m| is_agent_module(&m.name) && symbols.pattern_names_module(pattern, m))
            .map(|m| m.name.as_str())
            .collect();
        let before = found.len();
        found.retain(|f| !is_agent_module(&f.module) || agents_named.contains(&f.module.as_str()));
        if found.is_empty() && before > 0 {
            return Err(SelectError::NoMatch {
                pattern: pattern.clone(),
                pid,
                hint: "only tendril's own agent has such functions, and it never instruments \
                       itself"
                    .into(),
            });
        }
        matched.extend(found);
    }
    Ok(matched)
}

/// Fails, before anything touches the target, if every function of `matched` is
/// refused by name or by its code (`refusals`); `hooks_returns` as there. An IFUNC is
/// never refused here: the agent resolves it to its implementation first.
pub fn refuse_if_none_patchable(
    symbols: &ProcessSymbols,
    matched: &[&Function],
    hooks_returns: bool,
) -> Result<(), SelectError> {
    let mut refused: Vec<(String, &str)> = Vec::new();
    for function in matched {
        match refusals::reason(function, hooks_returns) {
            Some(reason) if !function.ifunc => {
                refused.push((format!("{} ({})", function.name, function.module), reason))
            }
            _ => return Ok(()),
        }
    }
    if refused.is_empty() {
        return Ok(());
    }
    let pid = symbols.pid();
    let hint = if refused.iter().any(|(_, r)| *r == refusals::GO_CODE) {
        format!(" — `tendril sample {pid}` shows where Go code spends its time")
    } else {
        String::new()
    };
    refused.dedup();
    Err(SelectError::AllRefused {
        pid,
        reasons: summarize_refusals(refused.iter().map(|(n, r)| (n.as_str(), *r))),
        hint,
    })
}

/// The functions matching one pattern, with a hint when there are none.
fn find<'a>(symbols: &'a ProcessSymbols, pattern: &str) -> Result<Vec<&'a Function>, SelectError> {
    let pid = symbols.pid();
    symbols.find(pattern).map_err(|error| match error {
        SymbolError::NoMatch {
            pattern,
            suggestions,
        } => SelectError::NoMatch {
            pattern,
            pid,
            hint: if suggestions.is_empty() {
                format!(
                    "list them with `tendril symbols {pid}` (a function of a library not \
                     loaded yet: name it with its module, `LIB:FUNC`, and a recording waits \
                     for the library)"
                )
            } else {
                format!("did you mean: {}?", suggestions.join(", "))
            },
        },
        other => other.into(),
    })
}

/// The functions to patch for `matched`, each once (by address). IFUNC symbols are
/// resolved through the agent to the implementation the loader chose.
pub fn choose(
    symbols: &ProcessSymbols,
    matched: &[&Function],
    session: &mut AgentConnection,
) -> Result<Vec<Chosen>, SelectError> {
    let pid = symbols.pid();
    let ifunc_names: Vec<String> = matched
        .iter()
        .filter(|f| f.ifunc)
        .map(|f| f.raw_name.to_string())
        .collect();
    let implementations = if ifunc_names.is_empty() {
        Vec::new()
    } else {
        resolve(session, pid, ifunc_names.clone())?
    };
    let mut chosen: Vec<Chosen> = Vec::new();
    for &function in matched {
        let pick = if function.ifunc {
            let index = ifunc_names.iter().position(|n| *n == function.raw_name);
            let implementation = index
                .and_then(|i| implementations.get(i).copied().flatten())
                .and_then(|address| symbols.lookup(address).filter(|f| f.addr == address));
            match implementation {
                Some(implementation) => Chosen {
                    function: implementation.clone(),
                    display_name: format!("{} → {}", function.name, implementation.name),
                },
                // Unresolvable: keep the resolver; the agent will say if it is useless.
                None => Chosen {
                    function: function.clone(),
                    display_name: function.name.to_string(),
                },
            }
        } else {
            Chosen {
                function: function.clone(),
                display_name: function.name.to_string(),
            }
        };
        if !chosen.iter().any(|c| c.function.addr == pick.function.addr) {
            chosen.push(pick);
        }
    }
    Ok(chosen)
}

fn resolve(
    session: &mut AgentConnection,
    pid: i32,
    names: Vec<String>,
) -> Result<Vec<Option<u64>>, SelectError> {
    let session_error = |source| SelectError::Session { pid, source };
    match session
        .request(&Request::ResolveSymbols { names })
        .map_err(session_error)?
    {
        Response::Resolved { addresses } => Ok(addresses),
        other => Err(session_error(AgentConnectionError::Protocol(format!(
            "{other:?}"
        )))),
    }
}

/// The request that patches `functions`, each with its hook, in one batch.
pub fn patch_request(symbols: &ProcessSymbols, functions: &[(&Function, Hook)]) -> Request {
    let targets = functions
        .iter()
        .map(|&(function, hook)| PatchTarget {
            address: function.addr,
            size: function.size,
            hook,
            module: function
                .module_path
                .is_absolute()
                .then(|| function.module_path.display().to_string()),
        })
        .collect();
    let only_functions: Vec<&Function> = functions.iter().map(|&(f, _)| f).collect();
    Request::Patch {
        targets,
        code_ranges: code_ranges(symbols, &only_functions),
    }
}

/// The `.cold` parts (start, size) the compiler split off `function`: the rarely run
/// code it jumps to, named after it (`name.cold`) in the same module. When another
/// function of the module has the same name (`static` functions of two files), so do
/// their parts: then only the parts `function`'s code branches into are its own.
pub fn cold_parts(symbols: &ProcessSymbols, function: &Function) -> Vec<(u64, u64)> {
    let all = symbols.functions();
    let named: Vec<(u64, u64)> = all
        .iter()
        .filter(|f| {
            f.size > 0
                && f.module == function.module
                && f.raw_name.strip_suffix(".cold") == Some(function.raw_name.as_str())
        })
        .map(|f| (f.addr, f.size))
        .collect();
    let has_a_twin = all.iter().any(|f| {
        f.addr != function.addr && f.module == function.module && f.raw_name == function.raw_name
    });
    if !has_a_twin || named.is_empty() {
        return named;
    }
    // The code as the process has it. A patched entry (a jump over part of a longer
    // instruction) can put the decoder off its instructions for a while, so it starts
    // at each of the first 16 bytes: x86 code falls back into step within a few
    // instructions, and a target must also land in a part of this very name.
    let code = crate::symbols::maps::read_memory(symbols.pid(), function.addr, function.end())
        .unwrap_or_default();
    let targets: Vec<u64> = (0..code.len().min(16))
        .flat_map(|start| {
            iced_x86::Decoder::with_ip(64, &code[start..], function.addr + start as u64, 0)
                .into_iter()
                .map(|instruction| instruction.near_branch_target())
                .filter(|&target| target != 0)
                .collect::<Vec<u64>>()
        })
        .collect();
    named
        .into_iter()
        .filter(|&(start, size)| targets.iter().any(|t| (start..start + size).contains(t)))
        .collect()
}

/// Every known function within [`NEIGHBOURHOOD`] of one of `functions` (same module),
/// the functions themselves, and their `.cold` parts wherever those are: the code that
/// might branch into a patched entry (glibc's `__mempcpy_*` jump into `__memmove_*` a
/// few bytes in; a `.cold` part may jump back anywhere), sorted and without repeats.
fn code_ranges(symbols: &ProcessSymbols, functions: &[&Function]) -> Vec<(u64, u64)> {
    let all = symbols.functions();
    // `.cold` parts by the name and module of the function they belong to, found once:
    // a batch may hold thousands of functions (the address-taken ones).
    let mut cold_parts: std::collections::HashMap<(&str, &str), Vec<(u64, u64)>> =
        std::collections::HashMap::new();
    for f in all {
        if let Some(owner) = f.raw_name.strip_suffix(".cold") {
            cold_parts
                .entry((owner, f.module.as_str()))
                .or_default()
                .push((f.addr, f.size));
        }
    }
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for function in functions {
        let low = function.addr.saturating_sub(NEIGHBOURHOOD);
        let high = function.end().saturating_add(NEIGHBOURHOOD);
        let first = all.partition_point(|f| f.addr < low);
        ranges.extend(
            all[first..]
                .iter()
                .take_while(|f| f.addr < high)
                .filter(|f| f.size > 0 && f.module == function.module)
                .map(|f| (f.addr, f.size)),
        );
        if let Some(cold) = cold_parts.get(&(function.raw_name.as_str(), function.module.as_str()))
        {
            ranges.extend(cold.iter().copied());
        }
    }
    ranges.sort_unstable();
    ranges.dedup();
    ranges
}

/// The unwinder glibc loads when a thread first exits or is cancelled.
const LIBGCC_S: &str = "libgcc_s.so.1";

/// Return hooks need the unwinder's entry points hooked before any frame can be
/// unwound, including `libgcc_s`'s, which glibc uses for `pthread_exit` and
/// cancellation even in a program that links its own unwinder statically. A program
/// that has never unwound may not have loaded it yet; the agent brings it along (it
/// unwinds with it too), so symbols read before the attach are read again then.
/// Returns the fresh symbols if they had to be read again.
pub fn unwinder_symbols_after_attach(
    symbols: &ProcessSymbols,
) -> Result<Option<ProcessSymbols>, SymbolError> {
    if symbols.modules().iter().any(|m| m.name == LIBGCC_S) {
        return Ok(None);
    }
    ProcessSymbols::load(symbols.pid()).map(Some)
}

/// The unwinder's entry points and catch functions of every module, with the internal
/// hook each needs so that return hooks survive exceptions, panics and thread exit.
/// The agent's own copies (it is a Rust library) are left out: they unwind only the
/// agent's threads, which never run hooked code, and the agent is never patched.
pub fn unwinder_targets(symbols: &ProcessSymbols) -> Vec<(Function, Hook)> {
    const HOOKS: [(&str, Hook); 8] = [
        ("_Unwind_RaiseException", Hook::UnwinderStarts),
        ("_Unwind_Resume", Hook::UnwinderStarts),
        ("_Unwind_Resume_or_Rethrow", Hook::UnwinderStarts),
        ("_Unwind_ForcedUnwind", Hook::UnwinderStarts),
        ("_Unwind_Backtrace", Hook::Backtrace),
        ("__cxa_begin_catch", Hook::ExceptionCaught),
        ("_Unwind_DeleteException", Hook::ExceptionCaught),
        // Where Rust's catch_unwind takes a caught panic (`__rustc::__rust_panic_cleanup`).
        ("__rust_panic_cleanup", Hook::ExceptionCaught),
    ];
    let mut found: Vec<(Function, Hook)> = Vec::new();
    for function in symbols.functions() {
        // A name that ends in `::name` holds `name` mangled too: test that first, so
        // that the process's names are not all demangled here.
        let is = |name: &str| {
            function.raw_name == name
                || function.raw_name.contains(name) && function.name.ends_with(&format!("::{name}"))
        };
        if let Some(&(_, hook)) = HOOKS.iter().find(|(name, _)| is(name))
            && !is_agent_module(&function.module)
            && !found.iter().any(|(f, _)| f.addr == function.addr)
        {
            found.push((function.clone(), hook));
        }
    }
    found
}

/// Most names listed for one reason in [`summarize_refusals`].
const NAMES_PER_REASON: usize = 3;

/// Refusals `(name, reason)` as one line, grouped by reason in order of first
/// appearance: `a, b: reason` — with `… and N more` when many share one reason (every
/// function of a module refused for the same reason would otherwise fill the screen).
pub fn summarize_refusals<'a>(refusals: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
    for (name, reason) in refusals {
        match groups.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, names)) => names.push(name),
            None => groups.push((reason, vec![name])),
        }
    }
    let parts: Vec<String> = groups
        .iter()
        .map(|(reason, names)| {
            let shown = names[..names.len().min(NAMES_PER_REASON)].join(", ");
            match names.len().checked_sub(NAMES_PER_REASON) {
                Some(more) if more > 0 => format!("{shown} and {more} more: {reason}"),
                _ => format!("{shown}: {reason}"),
            }
        })
        .collect();
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::summarize_refusals;

    #[test]
    fn refusals_are_grouped_by_reason() {
        let refusals = [
            ("a", "too short"),
            ("b", "part of tendril's agent"),
            ("c", "too short"),
            ("d", "part of tendril's agent"),
            ("e", "part of tendril's agent"),
            ("f", "part of tendril's agent"),
            ("g", "part of tendril's agent"),
        ];
        assert_eq!(
            summarize_refusals(refusals),
            "a, c: too short; b, d, e and 2 more: part of tendril's agent"
        );
        assert_eq!(summarize_refusals([("x", "r")]), "x: r");
    }
}
