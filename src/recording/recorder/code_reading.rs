//! Reading a recorded function's code from the target, for what the agent does not
//! report: its Go callees, its calls into JIT code, its tail calls; and the recorded
//! functions and trees those readings apply to.
//!
//! The one idea: the controller decodes each function at most once, from the target's
//! memory as it is now (a patched entry's first bytes are the hook's jump, which
//! `callees::scan` reads as one more callee at most), and each user keeps the answers
//! it needs.

use super::Recorder;
use crate::profile::{Node, Profile};
use crate::symbols::ProcessSymbols;
use tendril_callgraph::callees::{self, Callees};

/// Longest body decoded.
const MAX_BODY: u64 = 1 << 20;

/// What the code of the function starting at `address` calls; `None` when no known
/// function starts there or its code cannot be read.
pub(super) fn callees_of(symbols: &ProcessSymbols, address: u64) -> Option<Callees> {
    let function = symbols.lookup(address).filter(|f| f.addr == address)?;
    let end = address.saturating_add(function.size.min(MAX_BODY));
    let code = crate::symbols::maps::read_memory(symbols.pid(), address, end).ok()?;
    Some(callees::scan(&code, address))
}

/// The pointer stored at `address` in process `pid`.
pub(super) fn read_pointer(pid: i32, address: u64) -> Option<u64> {
    let bytes = crate::symbols::maps::read_memory(pid, address, address + 8).ok()?;
    Some(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?))
}

/// Every callee of `found`: its direct ones and those its pointers hold now.
pub(super) fn all_targets(pid: i32, found: Callees) -> impl Iterator<Item = u64> {
    found.direct.into_iter().chain(
        found
            .through_pointers
            .into_iter()
            .filter_map(move |slot| read_pointer(pid, slot)),
    )
}

impl Recorder {
    /// The entries of the functions the recording has seen run so far; `None` before
    /// it has begun.
    pub(super) fn recorded_functions(&self) -> Option<Vec<u64>> {
        let (builder, rings) = (self.builder.as_ref()?, self.rings.as_ref()?);
        let seen = builder.functions_seen().into_iter();
        Some(seen.filter_map(|id| rings.function_address(id)).collect())
    }
}

/// Calls `change` on the merged tree's roots and on every thread's.
pub(super) fn for_each_tree(profile: &mut Profile, mut change: impl FnMut(&mut [Node])) {
    change(&mut profile.merged.roots);
    for thread in &mut profile.threads {
        change(&mut thread.roots);
    }
}
