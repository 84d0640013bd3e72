//! Placing untimed calls in a thread's calling context tree.
//!
//! An untimed function (adaptive timing, issue 32) sends a `Call` event per call: no
//! timestamp, only the call site's return address, which the recorder turns into the
//! id of the function that made the call (see [`resolved_call`]). The call belongs
//! under the innermost *timed* frame open — that frame's time contains it — or, when an
//! untimed function made it, under the node of that untimed call.
//!
//! The one idea: the untimed calls made inside one timed frame, between two of its
//! thread's timed events, form a chain of the latest untimed call at each depth. A call
//! made by function G goes under the deepest node of G in that chain (the chain is cut
//! back to it: calls of G's deeper callees have returned), or under the timed frame
//! when no untimed G is in the chain (the frame's own function, or code tendril does not
//! hook, made it). Every timed event starts a new chain. Recursion among untimed
//! functions, which the calls alone cannot tell apart from a sequence of calls, is
//! folded: a call of a function already in the chain counts on that node, so the
//! chain never holds a function twice and its depth stays bounded.

use super::arena::CallArena;
use tendril_wire::events::{CALL_ADDRESS_BITS, CALL_ADDRESS_MASK, Event};

/// A caller the recorder could not name (code no hook of this recording covers).
pub const UNKNOWN_CALLER: u32 = u32::MAX;

/// The value of a Call event once the recorder has named its caller: the caller's
/// function id (or [`UNKNOWN_CALLER`]) where the return address was, the count as
/// before.
pub fn resolved_call(event: &Event, caller: u32) -> Event {
    Event {
        value: (event.value & !CALL_ADDRESS_MASK) | u64::from(caller),
        ..*event
    }
}

/// The caller and count of a resolved Call event.
pub fn caller_and_count(event: &Event) -> (u32, u64) {
    let caller = (event.value & CALL_ADDRESS_MASK) as u32;
    (caller, (event.value >> CALL_ADDRESS_BITS) + 1)
}

/// The chain of the latest untimed calls inside the innermost timed frame (see the
/// module comment).
#[derive(Debug, Clone, Default)]
pub struct UntimedChain {
    nodes: Vec<u32>,
}

impl UntimedChain {
    /// A timed event: the chain starts again.
    #[inline]
    pub fn reset(&mut self) {
        self.nodes.clear();
    }

    /// The node of `count` calls of `function` made by `caller` inside the timed frame
    /// whose node is `frame` (its calls are added).
    pub fn place(
        &mut self,
        arena: &mut CallArena,
        frame: u32,
        function: u32,
        caller: u32,
        count: u64,
    ) -> u32 {
        let function_of = |arena: &CallArena, node: u32| arena.nodes()[node as usize].function;
        let parent = match self
            .nodes
            .iter()
            .rposition(|&n| function_of(arena, n) == caller)
        {
            Some(at) => {
                self.nodes.truncate(at + 1);
                self.nodes[at]
            }
            None => {
                self.nodes.clear();
                frame
            }
        };
        let node = match self
            .nodes
            .iter()
            .position(|&n| function_of(arena, n) == function)
        {
            Some(at) => {
                self.nodes.truncate(at + 1);
                self.nodes[at]
            }
            None => {
                let node = arena.child(parent, function);
                self.nodes.push(node);
                node
            }
        };
        arena.node_mut(node).calls += count;
        node
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::arena::TOP;

    fn path(arena: &CallArena, mut node: u32) -> Vec<u32> {
        let mut functions = Vec::new();
        while node != TOP {
            functions.push(arena.nodes()[node as usize].function);
            node = arena.nodes()[node as usize].parent;
        }
        functions.reverse();
        functions
    }

    #[test]
    fn calls_nest_under_their_untimed_callers_and_the_timed_frame() {
        let mut arena = CallArena::default();
        let root = arena.child(TOP, 1);
        let mut chain = UntimedChain::default();
        // root → mid → leaf, leaf; root → mid → leaf, leaf.
        for _ in 0..2 {
            let mid = chain.place(&mut arena, root, 2, 1, 1);
            assert_eq!(path(&arena, mid), [1, 2]);
            for _ in 0..2 {
                let leaf = chain.place(&mut arena, root, 3, 2, 1);
                assert_eq!(path(&arena, leaf), [1, 2, 3]);
            }
        }
        let mid = arena.child(root, 2);
        assert_eq!(arena.nodes()[mid as usize].calls, 2);
        assert_eq!(
            {
                let leaf = arena.child(mid, 3);
                arena.nodes()[leaf as usize].calls
            },
            4
        );
        // The frame's function calls leaf itself: under the frame.
        let direct = chain.place(&mut arena, root, 3, 1, 5);
        assert_eq!(path(&arena, direct), [1, 3]);
        assert_eq!(arena.nodes()[direct as usize].calls, 5);
    }

    #[test]
    fn recursion_folds_and_an_unknown_caller_means_the_timed_frame() {
        let mut arena = CallArena::default();
        let root = arena.child(TOP, 1);
        let mut chain = UntimedChain::default();
        let fib = chain.place(&mut arena, root, 7, 1, 1);
        for _ in 0..10 {
            assert_eq!(chain.place(&mut arena, root, 7, 7, 1), fib);
        }
        assert_eq!(arena.nodes()[fib as usize].calls, 11);
        let unknown = chain.place(&mut arena, root, 9, UNKNOWN_CALLER, 1);
        assert_eq!(path(&arena, unknown), [1, 9]);
    }

    #[test]
    fn a_resolved_call_keeps_its_count() {
        let event = Event::new(
            tendril_wire::events::EventKind::Call,
            4,
            0x7f12_3456_789a | 2 << CALL_ADDRESS_BITS,
        );
        assert_eq!(caller_and_count(&resolved_call(&event, 17)), (17, 3));
    }
}
