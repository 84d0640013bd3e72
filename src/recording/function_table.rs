//! Writing the function table a recording's agent uses to discover callees (see
//! `tendril_wire::function_table`).
//!
//! The one idea: the agent can decode a function only if it knows where the function
//! ends, and can follow a PLT stub only if something knows where it leads; the
//! controller knows both from the symbols, so it hands them over — as bytes right after
//! the `StartRecording` request on the control connection, never as a file in a
//! directory the target's user could tamper with. Functions
//! that must never be instrumented — the dynamic loader's (they run while the process
//! is half set up, with their own calling conventions), the vDSO's, the agent's, and
//! those refused by name (`refusals`) — are marked excluded. Address-taken functions
//! (`address_taken`) are marked as such: the agent counts them as targets of calls
//! through pointers when they first run in the graph.

use super::address_taken::AddressTaken;
use crate::refusals;
use crate::symbols::{Function, ProcessSymbols, SymbolSource};
use std::collections::HashMap;
use tendril_wire::function_table::{
    self, FLAG_ADDRESS_TAKEN, FLAG_EXCLUDED, FLAG_PLT, FunctionEntry,
};

/// The table for `symbols`, with the address-taken functions `taken`.
pub fn entries(symbols: &ProcessSymbols, taken: &AddressTaken) -> Vec<FunctionEntry> {
    let exported: HashMap<&str, &Function> = symbols
        .functions()
        .iter()
        .filter(|f| f.source != SymbolSource::Plt && f.size > 0 && !f.ifunc)
        .map(|f| (f.raw_name.as_str(), f))
        .collect();
    let mut entries: Vec<FunctionEntry> = Vec::with_capacity(symbols.functions().len());
    for function in symbols.functions() {
        if entries.last().is_some_and(|e| e.start == function.addr) {
            continue; // An alias: the first name at an address is the best one.
        }
        let mut flags = 0;
        let mut target = 0;
        if let Some(callee) = function.plt_target() {
            flags |= FLAG_PLT;
            target = exported
                .get(callee)
                .filter(|f| f.module != function.module)
                .map_or(0, |f| f.addr);
        }
        if is_excluded(&function.module) || refusals::reason(function, true).is_some() {
            flags |= FLAG_EXCLUDED;
        }
        if taken.contains(function.addr) {
            flags |= FLAG_ADDRESS_TAKEN;
        }
        entries.push(FunctionEntry {
            start: function.addr,
            size: function.size,
            flags,
            target,
        });
    }
    entries
}

/// Modules whose functions are never instrumented.
fn is_excluded(module: &str) -> bool {
    module.starts_with("ld-linux")
        || module.starts_with("ld-")
        || module == "[vdso]"
        || crate::agent_bundle::is_agent_module(module)
}

/// The encoded table for `symbols`, as `StartRecording` carries it.
pub fn encode(symbols: &ProcessSymbols, taken: &AddressTaken) -> Vec<u8> {
    function_table::encode(&entries(symbols, taken))
}
