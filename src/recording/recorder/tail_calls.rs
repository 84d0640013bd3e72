//! Which calls of a recording are tail calls: the profile's nodes reached by a tail
//! jump are marked (`Node::tail_call`), for `tendril compare`.
//!
//! The one idea: a function that tail-jumps away has no frame left, so a sampled stack
//! shows its callee right under its own caller, and a recorded context differs from
//! the sampled one by that frame. The controller decodes, once each, the functions the
//! recording saw run (as for Go and JIT callees), resolves PLT stubs and GOT slots to
//! the functions they reach, and marks a child under a parent whose code reaches it by
//! jumps alone. A callee the same parent both calls and jumps to stays unmarked: which
//! of the two a context saw cannot be told.

use super::code_reading::{callees_of, for_each_tree, read_pointer};
use super::*;
use crate::profile::Node;
use std::collections::{BTreeSet, HashSet};

/// The tail calls found in the recorded functions' code so far.
#[derive(Debug, Default)]
pub struct TailCalls {
    scanned: HashSet<u64>,
    /// (caller's entry, callee's entry), the callee reached by tail jumps alone.
    tail_only: HashSet<(u64, u64)>,
}

impl TailCalls {
    /// Decodes the functions at `addresses` not decoded yet.
    fn scan(&mut self, symbols: &ProcessSymbols, addresses: impl Iterator<Item = u64>) {
        let pid = symbols.pid();
        for address in addresses {
            if !self.scanned.insert(address) {
                continue;
            }
            let Some(found) = callees_of(symbols, address) else {
                continue;
            };
            if found.tail_only.is_empty() && found.tail_only_pointers.is_empty() {
                continue;
            }
            let entry = |target: &u64| function_reached(symbols, *target);
            let slot = |slot: &u64| read_pointer(pid, *slot);
            let jumped: BTreeSet<u64> = (found.tail_only.iter().map(entry))
                .chain(found.tail_only_pointers.iter().filter_map(slot))
                .collect();
            let called: BTreeSet<u64> = (found.direct.iter())
                .filter(|target| found.tail_only.binary_search(target).is_err())
                .map(entry)
                .chain(
                    (found.through_pointers.iter())
                        .filter(|s| found.tail_only_pointers.binary_search(s).is_err())
                        .filter_map(slot),
                )
                .collect();
            for callee in jumped.difference(&called) {
                self.tail_only.insert((address, *callee));
            }
        }
    }

    /// Marks the nodes of `roots` reached by a tail jump from their parent.
    fn mark(&self, roots: &mut [Node]) {
        let mut pending: Vec<&mut Node> = roots.iter_mut().collect();
        while let Some(node) = pending.pop() {
            let parent = node.address;
            for child in &mut node.children {
                if let (Some(caller), Some(callee)) = (parent, child.address) {
                    child.tail_call = self.tail_only.contains(&(caller, callee));
                }
            }
            pending.extend(node.children.iter_mut());
        }
    }
}

/// The function a jump to `target` reaches: through a PLT stub, the function its GOT
/// slot holds now; else `target` itself.
fn function_reached(symbols: &ProcessSymbols, target: u64) -> u64 {
    symbols
        .plt_stub(target)
        .and_then(|stub| read_pointer(symbols.pid(), stub.got_slot))
        .unwrap_or(target)
}

impl Recorder {
    /// Marks the nodes of `profile` its functions reach by tail jumps.
    pub(super) fn mark_tail_calls(&mut self, profile: &mut Profile) {
        let Some(seen) = self.recorded_functions() else {
            return;
        };
        self.tail_calls.scan(&self.symbols, seen.into_iter());
        if self.tail_calls.tail_only.is_empty() {
            return;
        }
        for_each_tree(profile, |roots| self.tail_calls.mark(roots));
    }
}
