//! The view-model: plain data the controller hands to the UI (processes, functions, and
//! profile snapshots with their calling context trees and status).
//!
//! The one idea: the UI never sees the controller's own types. The controller converts its
//! data into these structs, so this crate can be written and tested without a target.
//! Calling context trees keep recursion as nesting and can be thousands of levels deep,
//! so [`TreeNode`]'s `Clone`, `Drop`, `PartialEq` and `Debug` are all iterative.

use std::fmt;
use std::time::Duration;

/// One row of the process picker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessEntry {
    pub pid: u32,
    pub user: String,
    pub threads: u32,
    pub command_line: String,
}

/// One function the root picker offers (from the target's symbols).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionEntry {
    /// Demangled name.
    pub name: String,
    /// File name of the module defining it (`libc.so.6`, `calltree`).
    pub module: String,
    /// Size in bytes.
    pub size: u64,
    /// Run-time address in the target.
    pub address: u64,
}

/// One node of a calling context tree: a function in one calling context.
///
/// Times are nanoseconds, already corrected for the profiler's own cost. `total_ns` includes
/// the callees, `self_ns` does not.
#[derive(Default)]
pub struct TreeNode {
    pub name: String,
    pub module: String,
    pub calls: u64,
    pub total_ns: f64,
    pub self_ns: f64,
    /// The self time is below what the profiler can measure (shown as `<res`, not 0).
    pub below_resolution: bool,
    /// The calls were counted, not timed (adaptive timing): their time is the caller's
    /// (shown as `in caller`, not 0).
    pub in_caller: bool,
    /// The other clock's (total, self) times, when the recording measured CPU time:
    /// on-CPU times while `total_ns`/`self_ns` are wall-clock, and the other way round
    /// after [`TreeNode::swap_clocks`].
    pub other_clock: Option<(f64, f64)>,
    /// The estimated error of `total_ns`, when the profiler gives one.
    pub error_ns: Option<f64>,
    /// The function's entry address in the target, when known: what tells apart two
    /// functions that share a name and module (`static` functions of two files).
    pub address: Option<u64>,
    /// A call into code generated at run time (JIT), which the profiler never patches:
    /// not counted (shown as `jit` in the calls column), its time its caller's.
    pub jit: bool,
    pub children: Vec<TreeNode>,
}

impl TreeNode {
    /// A node without children.
    pub fn new(
        name: impl Into<String>,
        module: impl Into<String>,
        calls: u64,
        total_ns: f64,
        self_ns: f64,
    ) -> Self {
        TreeNode {
            name: name.into(),
            module: module.into(),
            calls,
            total_ns,
            self_ns,
            below_resolution: false,
            in_caller: false,
            other_clock: None,
            error_ns: None,
            address: None,
            jit: false,
            children: Vec::new(),
        }
    }

    /// Swaps every node's times with its other clock's (wall-clock and on-CPU), without
    /// recursion. Nodes without the other clock keep theirs.
    pub fn swap_clocks(&mut self) {
        let mut pending: Vec<&mut TreeNode> = vec![self];
        while let Some(node) = pending.pop() {
            if let Some((total, self_ns)) = node.other_clock {
                node.other_clock = Some((node.total_ns, node.self_ns));
                node.total_ns = total;
                node.self_ns = self_ns;
            }
            pending.extend(node.children.iter_mut());
        }
    }

    /// The same node with these children appended (builder style, handy in tests).
    pub fn with_children(mut self, children: impl IntoIterator<Item = TreeNode>) -> Self {
        self.children.extend(children);
        self
    }

    /// Number of nodes in this subtree, this node included (iterative).
    pub fn node_count(&self) -> usize {
        let mut count = 0;
        let mut pending = vec![self];
        while let Some(node) = pending.pop() {
            count += 1;
            pending.extend(node.children.iter());
        }
        count
    }

    /// Number of levels in this subtree: 1 for a leaf (iterative).
    pub fn depth(&self) -> usize {
        let mut deepest = 0;
        let mut pending = vec![(self, 1usize)];
        while let Some((node, level)) = pending.pop() {
            deepest = deepest.max(level);
            pending.extend(node.children.iter().map(|child| (child, level + 1)));
        }
        deepest
    }

    fn clone_without_children(&self) -> TreeNode {
        TreeNode {
            name: self.name.clone(),
            module: self.module.clone(),
            calls: self.calls,
            total_ns: self.total_ns,
            self_ns: self.self_ns,
            below_resolution: self.below_resolution,
            in_caller: self.in_caller,
            other_clock: self.other_clock,
            error_ns: self.error_ns,
            address: self.address,
            jit: self.jit,
            children: Vec::with_capacity(self.children.len()),
        }
    }

    fn same_fields(&self, other: &TreeNode) -> bool {
        self.name == other.name
            && self.module == other.module
            && self.calls == other.calls
            && self.total_ns == other.total_ns
            && self.self_ns == other.self_ns
            && self.below_resolution == other.below_resolution
            && self.in_caller == other.in_caller
            && self.other_clock == other.other_clock
            && self.error_ns == other.error_ns
            && self.address == other.address
            && self.jit == other.jit
            && self.children.len() == other.children.len()
    }
}

impl Clone for TreeNode {
    /// Copies the subtree without recursion, so a 10,000-deep chain clones on any stack.
    fn clone(&self) -> Self {
        // Each frame: the source node, the copy being filled, and how many children are done.
        let mut frames: Vec<(&TreeNode, TreeNode, usize)> =
            vec![(self, self.clone_without_children(), 0)];
        loop {
            let top = frames.len() - 1;
            let (source, _, next_child) = &mut frames[top];
            if let Some(child) = source.children.get(*next_child) {
                *next_child += 1;
                frames.push((child, child.clone_without_children(), 0));
                continue;
            }
            let (_, finished, _) = frames.pop().expect("frame stack is never empty here");
            match frames.last_mut() {
                Some((_, parent, _)) => parent.children.push(finished),
                None => return finished,
            }
        }
    }
}

impl Drop for TreeNode {
    /// Frees the subtree without recursion: children are detached onto a heap stack first,
    /// so every node dropped here has no children left to recurse into.
    fn drop(&mut self) {
        let mut pending = std::mem::take(&mut self.children);
        while let Some(mut node) = pending.pop() {
            pending.append(&mut node.children);
        }
    }
}

impl PartialEq for TreeNode {
    /// Structural equality, compared without recursion.
    fn eq(&self, other: &Self) -> bool {
        let mut pending = vec![(self, other)];
        while let Some((left, right)) = pending.pop() {
            if !left.same_fields(right) {
                return false;
            }
            pending.extend(left.children.iter().zip(right.children.iter()));
        }
        true
    }
}

impl fmt::Debug for TreeNode {
    /// Shows this node's fields and the size of its subtree (never recurses).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TreeNode")
            .field("name", &self.name)
            .field("module", &self.module)
            .field("calls", &self.calls)
            .field("total_ns", &self.total_ns)
            .field("self_ns", &self.self_ns)
            .field("children", &self.children.len())
            .finish()
    }
}

/// Per-thread totals and that thread's own calling context tree.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ThreadSummary {
    pub tid: u32,
    pub name: String,
    pub calls: u64,
    pub total_ns: f64,
    pub roots: Vec<TreeNode>,
}

/// What the status bar shows: the session, the collection counters, and the last message.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Status {
    /// What is being profiled, e.g. `pid 4242 calltree`, or the file in read-only mode.
    pub target: String,
    /// Names of the root functions.
    pub roots: Vec<String>,
    /// Time since collection started.
    pub elapsed: Duration,
    pub events_per_second: f64,
    pub instrumented_functions: u64,
    pub invoked_functions: u64,
    pub indirect_call_sites: u64,
    /// Of those, the sites seen entering an instrumented target.
    pub indirect_sites_followed: u64,
    /// Distinct targets of calls through pointers that ran in the graph.
    pub indirect_targets: u64,
    pub lost_events: u64,
    /// Estimated slowdown of the instrumented code, in percent.
    pub estimated_overhead_percent: f64,
    pub paused: bool,
    /// Result of the last action, e.g. `saved profile to x.json`.
    pub message: Option<String>,
    /// The target was detached: the data stays browsable, nothing more is collected.
    pub detached: bool,
    /// A sampled snapshot (the Sampled view): how the samples are taken. Its nodes'
    /// `calls` are then samples (at or below the node), and the times are estimates.
    pub sampling: Option<SamplingStatus>,
    /// The instrumented tree's overlap with the sampled tree below the same roots (0 to
    /// 1: Σ over call paths of the smaller self share), when there is a sampled tree
    /// with samples below them.
    pub overlap: Option<f64>,
    /// Why the trees have no on-CPU times, when they have none.
    pub cpu_unmeasured: Option<String>,
    /// The times shown are on-CPU (the `C` key), not wall-clock.
    pub shows_cpu_time: bool,
    /// Adaptive timing: the functions counted, not timed, and the threshold (ns per
    /// call) they fell under; `None` when every call is timed.
    pub untimed: Option<(u64, f64)>,
}

/// How the samples of a sampled snapshot are taken (nothing is loaded into the target).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SamplingStatus {
    /// Samples per second of each thread's CPU time.
    pub rate_hz: u64,
    /// `cpu` or `wall`.
    pub clock: String,
    pub samples: u64,
    /// Samples the kernel dropped (its buffer was full).
    pub lost_samples: u64,
    /// Stacks that could not be walked to their outermost frame.
    pub truncated_stacks: u64,
    /// Threads sampled right now.
    pub threads: usize,
    /// Sampling has stopped (a root is instrumented now, or the target exited): the
    /// tree stays as it was then.
    pub stopped: bool,
}

/// Everything the live view shows at one moment.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProfileSnapshot {
    /// The calling context tree merged over all threads.
    pub merged: Vec<TreeNode>,
    /// One summary per thread, in thread-id order (the threads tab shows them so).
    pub threads: Vec<ThreadSummary>,
    pub status: Status,
}

impl ProfileSnapshot {
    /// Whether the trees carry a second clock (on-CPU time) to switch to.
    pub fn has_other_clock(&self) -> bool {
        self.merged
            .first()
            .is_some_and(|root| root.other_clock.is_some())
    }

    /// Swaps every tree's wall-clock and on-CPU times (see [`TreeNode::swap_clocks`]).
    pub fn swap_clocks(&mut self) {
        self.merged.iter_mut().for_each(TreeNode::swap_clocks);
        for thread in &mut self.threads {
            thread.roots.iter_mut().for_each(TreeNode::swap_clocks);
            thread.total_ns = thread.roots.iter().map(|root| root.total_ns).sum();
        }
    }
}
