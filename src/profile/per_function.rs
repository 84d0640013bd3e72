//! Per-function sums over calling context trees, for adaptive timing's judge
//! (`recording/recorder/adaptive.rs`): how often each function was called, what its
//! calls took with their callees, and which functions it calls.
//!
//! The one idea: a recursive function's calls nest inside each other, so only its
//! outermost calls' totals are summed. Divided by all its calls, that is its mean time
//! per call, the recursion's own calls included: for `fib`, what one call adds.

use super::arena::{CallArena, TOP};
use std::collections::{HashMap, HashSet};

/// One function's sums (see the module comment).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FunctionSums {
    /// Calls in every context.
    pub calls: u64,
    /// Corrected ticks of its calls not made inside another call of its own.
    pub outermost_ticks: f64,
    /// The other functions it called.
    pub callees: HashSet<u32>,
}

impl FunctionSums {
    /// Mean ticks a call takes, callees included; `None` before the first call.
    pub fn mean_ticks(&self) -> Option<f64> {
        (self.calls > 0).then(|| self.outermost_ticks / self.calls as f64)
    }
}

/// Adds the nodes of `arena` (their totals in `totals`, indexed like its nodes) to
/// `sums`, by function id.
pub fn add_arena(arena: &CallArena, totals: &[f64], sums: &mut HashMap<u32, FunctionSums>) {
    let nodes = arena.nodes();
    // A walk from the top, depth first, knowing how often each function is open above.
    let mut open: HashMap<u32, u32> = HashMap::new();
    let mut stack: Vec<(u32, bool)> = nodes[TOP as usize].children().map(|c| (c, false)).collect();
    while let Some((index, leaving)) = stack.pop() {
        let node = &nodes[index as usize];
        let depth = open.entry(node.function).or_insert(0);
        if leaving {
            *depth -= 1;
            continue;
        }
        let function = sums.entry(node.function).or_default();
        function.calls += node.calls;
        if *depth == 0 {
            function.outermost_ticks += totals[index as usize];
        }
        *depth += 1;
        stack.push((index, true));
        for child in node.children() {
            let callee = nodes[child as usize].function;
            if callee != node.function {
                function.callees.insert(callee);
            }
            stack.push((child, false));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recursion_sums_its_outermost_calls_over_all_its_calls() {
        // main → fib → fib → fib, and main → leaf.
        let mut arena = CallArena::default();
        let main = arena.child(TOP, 1);
        let fib = arena.child(main, 2);
        let fib_inner = arena.child(fib, 2);
        let fib_innermost = arena.child(fib_inner, 2);
        let leaf = arena.child(main, 3);
        let mut totals = vec![0.0; arena.len()];
        for (node, calls, ticks) in [
            (main, 1, 1000.0),
            (fib, 1, 90.0),
            (fib_inner, 2, 60.0),
            (fib_innermost, 4, 20.0),
            (leaf, 10, 50.0),
        ] {
            arena.node_mut(node).calls = calls;
            totals[node as usize] = ticks;
        }
        let mut sums = HashMap::new();
        add_arena(&arena, &totals, &mut sums);
        assert_eq!(sums[&2].calls, 7);
        assert_eq!(sums[&2].outermost_ticks, 90.0);
        assert!(
            sums[&2].callees.is_empty(),
            "a call of its own is no callee"
        );
        assert_eq!(sums[&1].callees, HashSet::from([2, 3]));
        assert_eq!(sums[&3].mean_ticks(), Some(5.0));
    }
}
