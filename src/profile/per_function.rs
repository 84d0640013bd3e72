//! Per-function sums over calling context trees, for adaptive timing's judge
//! (`recording/recorder/adaptive.rs`): how often each function was called, what its
//! calls took with their callees, and which functions it calls.
//!
//! The one idea: a recursive function's calls nest inside each other, so only its
//! outermost calls' totals are summed. Divided by all its calls, that is its mean time
//! per call, the recursion's own calls included: for `fib`, what one call adds.
//!
//! Each thread's own mean is kept too, for the threads that made enough calls: on a
//! busy machine of many threads some thread is always preempted inside some call, and
//! in wall-clock time one such wait of milliseconds raises the mean of all threads'
//! calls of a 2 ns function past any threshold; the median of the threads' means
//! leaves those few threads out.

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
    /// Each thread's mean ticks per call, for the threads that made at least the
    /// `min_calls` given to [`add_arena`].
    pub thread_means: Vec<f64>,
}

impl FunctionSums {
    /// Mean ticks a call takes, callees included; `None` before the first call.
    pub fn mean_ticks(&self) -> Option<f64> {
        (self.calls > 0).then(|| self.outermost_ticks / self.calls as f64)
    }

    /// The median of the threads' means (the lower middle one of an even count);
    /// `None` when no thread made enough calls.
    pub fn median_thread_mean_ticks(&self) -> Option<f64> {
        let mut means = self.thread_means.clone();
        means.sort_unstable_by(f64::total_cmp);
        means.get(means.len().checked_sub(1)? / 2).copied()
    }
}

/// Adds the nodes of `arena`, one thread's (their totals in `totals`, indexed like its
/// nodes) to `sums`, by function id; with the thread's mean per call of each function
/// it called at least `min_calls` times.
pub fn add_arena(
    arena: &CallArena,
    totals: &[f64],
    min_calls: u64,
    sums: &mut HashMap<u32, FunctionSums>,
) {
    // This thread's calls and outermost ticks, by function.
    let mut own: HashMap<u32, (u64, f64)> = HashMap::new();
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
        let (calls, ticks) = own.entry(node.function).or_default();
        *calls += node.calls;
        if *depth == 0 {
            *ticks += totals[index as usize];
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
    for (id, (calls, ticks)) in own {
        let function = sums.entry(id).or_default();
        function.calls += calls;
        function.outermost_ticks += ticks;
        if calls >= min_calls.max(1) {
            function.thread_means.push(ticks / calls as f64);
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
        add_arena(&arena, &totals, 1, &mut sums);
        assert_eq!(sums[&2].calls, 7);
        assert_eq!(sums[&2].outermost_ticks, 90.0);
        assert!(
            sums[&2].callees.is_empty(),
            "a call of its own is no callee"
        );
        assert_eq!(sums[&1].callees, HashSet::from([2, 3]));
        assert_eq!(sums[&3].mean_ticks(), Some(5.0));
        assert_eq!(sums[&3].thread_means, vec![5.0]);
    }

    #[test]
    fn the_median_of_the_threads_means_leaves_a_preempted_thread_out() {
        // Three threads call leaf (id 2) 1,000 times at 5 ticks; in a fourth, one call
        // waited 1,000,000 ticks for a core. A fifth made too few calls to count.
        let mut sums = HashMap::new();
        for (calls, ticks) in [
            (1000, 5000.0),
            (1000, 5000.0),
            (1000, 5000.0),
            (1000, 1_005_000.0),
            (10, 50.0),
        ] {
            let mut arena = CallArena::default();
            let main = arena.child(TOP, 1);
            let leaf = arena.child(main, 2);
            arena.node_mut(main).calls = 1;
            arena.node_mut(leaf).calls = calls;
            let mut totals = vec![0.0; arena.len()];
            totals[leaf as usize] = ticks;
            add_arena(&arena, &totals, 1000, &mut sums);
        }
        let leaf = &sums[&2];
        assert_eq!(leaf.calls, 4010);
        assert!(leaf.mean_ticks().unwrap() > 250.0);
        assert_eq!(leaf.thread_means.len(), 4);
        assert_eq!(leaf.median_thread_mean_ticks(), Some(5.0));
        assert_eq!(FunctionSums::default().median_thread_mean_ticks(), None);
    }
}
