//! The profile file's data model (docs/DESIGN.md §5, version 1) as serde types.
//!
//! The one idea: a [`Node`] tree may be as deep as the target's recursion (100,000 levels
//! is normal), so nothing here recurses over the tree. `Drop`, `Clone`, `PartialEq` and
//! `Debug` of [`Node`] are written by hand with explicit stacks (`node_tree`), and
//! [`walk`] visits a tree without recursion. The derived serde impls do recurse;
//! `profile::file` runs them on a stack that grows on demand (see there).
//!
//! Times are whole nanoseconds (`u64`), already corrected for tendril's own overhead.
//! Within one tree, `self_ns == total_ns - Σ children.total_ns` exactly, and no child's
//! total exceeds its parent's; where the correction took more from a node than its own
//! time, its total is its children's and it says so ([`Node::below_resolution`]).

use super::trace_model::Trace;
use serde::{Deserialize, Deserializer, Serialize};

pub use super::calibration_model::{Calibration, ShapeCalibration};
pub use node_tree::{Visit, walk};

mod node_tree;

/// A whole recording: who was profiled, how, and the calling context trees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Always [`Profile::FORMAT`].
    pub format: String,
    /// Always [`Profile::VERSION`] for profiles this tendril writes.
    pub version: u32,
    pub pid: u32,
    /// The target's executable path.
    pub exe: String,
    /// The root functions the user picked, as given.
    pub roots: Vec<String>,
    /// The instrumentation scheme: "A" (eager) or "B" (lazy, JFluid §6.2).
    pub scheme: String,
    pub calibration: Calibration,
    pub stats: Stats,
    /// One tree per thread that ran inside a root.
    #[serde(default)]
    pub threads: Vec<ThreadProfile>,
    /// All threads' trees merged by call path.
    #[serde(default)]
    pub merged: MergedProfile,
    /// How long the recording ran (wall time), 0 if unknown.
    #[serde(default)]
    pub duration_ns: u64,
    /// What Scheme B discovery did, when there was discovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery: Option<DiscoveryStats>,
    /// With `--gross-only`: each root's gross time distribution.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gross: Vec<GrossTime>,
    /// Where each module was mapped, for exports that name addresses (pprof).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub modules: Vec<ModuleMapping>,
    /// With `record --trace`: the enter and exit events of the recording's first
    /// seconds, as per-thread timelines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<Trace>,
    /// For `"scheme": "sampled"`: how the samples were taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<SamplingInfo>,
}

/// How a sampled profile (`tendril sample`) was taken. Its nodes carry `samples`, and
/// their times are estimates: samples times the period (plus, with the wall clock, the
/// measured time each thread spent switched out).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SamplingInfo {
    /// `"cpu"` (each thread's CPU time) or `"wall"` (CPU time plus time switched out).
    pub clock: String,
    /// Samples per second of each thread's CPU time.
    pub rate_hz: u64,
    /// Samples that made the trees.
    pub samples: u64,
    /// Samples the kernel dropped because tendril's buffer was full.
    pub lost_samples: u64,
    /// Samples whose stack could not be walked to its outermost frame (kept under
    /// `[truncated stack]`).
    pub truncated_stacks: u64,
    /// How many bytes of each thread's stack a sample copied.
    pub stack_bytes: u64,
}

/// One module (executable or shared library) as it was mapped in the target.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ModuleMapping {
    /// The file name, as in [`Node::module`].
    pub name: String,
    /// The path inside the target.
    pub path: String,
    /// Lowest mapped address.
    pub start: u64,
    /// One past the highest mapped address.
    pub end: u64,
}

/// What discovery (JFluid's Scheme B) did during a recording.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DiscoveryStats {
    /// Functions whose first invocation in the graph instrumented their callees.
    pub discoveries: u64,
    /// Their mean pause (already removed from the times).
    pub mean_pause_ns: u64,
    /// Their median pause (over the most recent few hundred).
    #[serde(default)]
    pub median_pause_ns: u64,
    /// Callees found but not instrumented (the agent refused to patch them).
    pub refused_callees: u64,
    /// Targets of calls through pointers that are not followed, with the reason: a
    /// subtree stops at a call into one of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub indirect_not_followed: Vec<NotFollowed>,
    /// Direct callees of recorded functions that discovery does not follow (Go code),
    /// with the reason: a subtree stops at a call into one of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_followed: Vec<NotFollowed>,
    /// Invocations on other threads that waited while a discovery ran (one discovery
    /// at a time; also removed from the times).
    #[serde(default)]
    pub waits: u64,
    /// Their mean wait.
    #[serde(default)]
    pub mean_wait_ns: u64,
}

/// The distribution of one root's gross times (entry to exit, corrected for the hooks'
/// inner time; nothing below the root is instrumented).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct GrossTime {
    pub root: String,
    pub calls: u64,
    pub total_ns: u64,
    pub min_ns: u64,
    pub median_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
}

impl Profile {
    pub const FORMAT: &'static str = "tendril-profile";
    pub const VERSION: u32 = 1;

    /// The sum of the merged roots' total times: the 100 % of every share in a report.
    pub fn merged_total_ns(&self) -> u64 {
        self.merged.roots.iter().map(|root| root.total_ns).sum()
    }

    /// The estimated slowdown of the instrumented code, in percent: the calibrated outer
    /// cost `t_O` of every recorded call, against the corrected time plus that cost.
    /// `tendril record` prints it and the live view's status bar shows it.
    pub fn estimated_overhead_percent(&self) -> f64 {
        let calls = self.stats.events / 2;
        let overhead_ns = calls as f64 * self.calibration.outer_ns;
        let measured = self.merged_total_ns() as f64 + overhead_ns;
        if measured > 0.0 && overhead_ns.is_finite() {
            100.0 * overhead_ns / measured
        } else {
            0.0
        }
    }
}

/// A target of calls through pointers that a recording does not follow.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NotFollowed {
    /// `function (module)`, or a module's file name.
    pub target: String,
    pub reason: String,
}

/// Counts that say how complete and how costly a recording was.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Stats {
    /// Functions patched (JFluid's "instrumented methods").
    pub instrumented_functions: u64,
    /// Functions whose callees were instrumented (Scheme B's `invoked`): the roots, as
    /// their hooks go in (they are discovered ahead), and every function that ran
    /// inside a root's subgraph.
    pub invoked_functions: u64,
    /// Events the CCT builder processed.
    pub events: u64,
    /// Events the agent could not deliver (0 unless a lossy mode was chosen).
    pub lost_events: u64,
    /// `call reg` / `call [mem]` sites and tail jumps through pointers found in
    /// instrumented code.
    pub indirect_call_sites: u64,
    /// Of those, the sites seen entering an instrumented function for the first time (a
    /// lower bound of the sites followed: a site whose targets had all been reached
    /// from elsewhere first is not counted).
    #[serde(default)]
    pub indirect_sites_followed: u64,
    /// Address-taken functions (the candidate targets of calls through pointers)
    /// instrumented.
    #[serde(default)]
    pub indirect_candidates: u64,
    /// Address-taken functions that ran inside the call graph: distinct targets of
    /// calls through pointers found.
    #[serde(default)]
    pub indirect_targets: u64,
    /// Total time tendril paused the target's threads (removed from the times above).
    pub pause_ns: u64,
    /// Of `pause_ns`: the target's threads waiting, after a preemption, for a core on
    /// which tendril's draining thread ran (known from context switches, so with CPU
    /// time only).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub core_wait_ns: u64,
    /// Of `pause_ns`: threads waiting for room in their full ring, for the controller
    /// to read it (a recording is lossless: the drain fell behind).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ring_wait_ns: u64,
    /// Of `pause_ns`: threads faulting their ring's memory in, a part at a time.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ring_fault_ns: u64,
    /// Frames closed by an unwind (exception, panic, longjmp, thread exit) or because the
    /// recording ended while they were open, rather than by a normal return.
    #[serde(default)]
    pub unwound_exits: u64,
    /// Exit events whose function was not open on that thread (ignored).
    #[serde(default)]
    pub unmatched_exits: u64,
    /// Times a thread came back to a stack it had left (ucontext coroutines, green
    /// threads), summed over threads. Non-zero means the trees are cut at the switches:
    /// see `dropped_frames`.
    #[serde(default)]
    pub stack_switches: u64,
    /// Frames closed (as unwound) when their thread left their stack, which returned
    /// after it came back: their times stop at the switch, and calls they made after
    /// it are charged to whatever frame was open then.
    #[serde(default)]
    pub dropped_frames: u64,
    /// Why the nodes carry no CPU times (`cpu_ns`), when they do not: the kernel refused
    /// the context-switch records, or the recording was `--gross-only`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_unmeasured: Option<String>,
    /// Context-switch records the kernel dropped (a ring was full); the time they would
    /// have taken out counts as on-CPU.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub off_cpu_lost: u64,
    /// Libraries the process loaded and unloaded while the recording ran (the dynamic
    /// loader's own counts).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub libraries_loaded: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub libraries_unloaded: u64,
    /// Of `libraries_loaded`: those tendril followed (read and instrumented a new one, or
    /// instrumented again one loaded where it had been). Calls into the others — loaded
    /// and unloaded between two of its looks, every 100 ms — are not recorded.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub libraries_followed: u64,
    /// Instrumented functions whose library was unloaded while they were patched: their
    /// calls after that are recorded only if the library came back and was followed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unloaded_functions: u64,
    /// Adaptive timing: which functions were counted rather than timed, and why.
    /// Absent in profiles of recordings that timed every call (`--time-all`, older
    /// versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<TimingPolicy>,
    /// Whether the nodes' `total_ns`/`self_ns` hold CPU times now
    /// (`Profile::show_clock`); never saved: a saved profile holds wall-clock times there.
    #[serde(skip)]
    pub shows_cpu_time: bool,
}

/// What adaptive timing did in a recording (`Stats::timing`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TimingPolicy {
    /// A function whose mean time per call, its callees included, stayed under this
    /// after enough calls to judge was switched to the untimed hook.
    pub threshold_ns: f64,
    /// Functions switched (at the end of the recording).
    pub untimed_functions: u64,
    /// Calls of untimed functions, each counted in its context.
    pub untimed_calls: u64,
    /// Functions that qualified but whose hook could not be switched, kept timed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub refused: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// One thread's calling context tree.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ThreadProfile {
    pub tid: u32,
    /// The thread's name (`/proc/PID/task/TID/comm`), empty if unknown.
    pub name: String,
    pub roots: Vec<Node>,
    /// This thread's share of [`Stats::stack_switches`].
    #[serde(default)]
    pub stack_switches: u64,
    /// This thread's share of [`Stats::dropped_frames`].
    #[serde(default)]
    pub dropped_frames: u64,
}

/// The per-thread trees merged by call path (same functions along the path).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct MergedProfile {
    pub roots: Vec<Node>,
}

/// One calling context: a function reached by one particular path from a root.
///
/// `total_ns` is the corrected time of all its invocations in this context, callees
/// included; `self_ns` is the part not spent in instrumented callees. Both are whole
/// nanoseconds. Recursion stays as nesting: `fib` called by `fib` is a child node.
#[derive(Default, Serialize, Deserialize)]
pub struct Node {
    /// The demangled function name.
    pub name: String,
    /// The file name of the module (executable or shared library) defining it.
    pub module: String,
    /// Invocations in this context, counted at entry (so calls in progress count).
    #[serde(deserialize_with = "whole_number")]
    pub calls: u64,
    #[serde(deserialize_with = "whole_number")]
    pub total_ns: u64,
    #[serde(deserialize_with = "whole_number")]
    pub self_ns: u64,
    /// The self time is below what tendril can measure: removing the hooks' calibrated
    /// cost left less than nothing (its callees' totals exceeded its own), so `self_ns`
    /// is 0 and `total_ns` is its children's sum — not a measured 0.
    #[serde(default, skip_serializing_if = "is_false")]
    pub below_resolution: bool,
    /// On-CPU time, corrected, when the recording measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ns: Option<u64>,
    /// The part of [`Node::cpu_ns`] not spent in instrumented callees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_cpu_ns: Option<u64>,
    /// The estimated error of `total_ns` (and `cpu_ns`): the calibration's spread per
    /// call times the calls whose hook cost was removed from it (`Correction::error_ns`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_ns: Option<u64>,
    /// The function's entry address in the target, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<u64>,
    /// In a sampled profile: the samples taken in this context, callees included
    /// (`total_ns` and `self_ns` are then estimates from them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
    /// Code generated at run time (JIT), named from the runtime's perf map or jitdump
    /// (module `[jit]`). tendril never patches it: in an instrumented profile such a
    /// node is a leaf met in its caller's code, whose calls and time are not measured
    /// (`calls` and times 0; its time is in its caller's self time).
    #[serde(default, skip_serializing_if = "is_false")]
    pub jit: bool,
    /// Reached by a tail jump in its parent's code (a `jmp`, never a `call`): while it
    /// runs, its parent's frame is gone, so a sampled stack shows it right under its
    /// grandparent. `tendril compare` matches the two (`overlap`). Set by a recording,
    /// only where the parent's code reaches this function by tail jumps alone.
    #[serde(default, skip_serializing_if = "is_false")]
    pub tail_call: bool,
    /// `in_caller`: the function's calls here were too short to time and were counted
    /// only (adaptive timing); its time is part of its caller's self time, and its
    /// `total_ns`, `self_ns` and `cpu_ns` are 0.
    #[serde(default, skip_serializing_if = "Timing::is_timed")]
    pub timing: Timing,
    #[serde(default)]
    pub children: Vec<Node>,
}

/// How a node's time was measured (see [`Node::timing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Timing {
    /// Each call timed by its own hook.
    #[default]
    Timed,
    /// Calls counted, their time left in the caller's.
    InCaller,
}

impl Timing {
    pub fn is_timed(&self) -> bool {
        *self == Timing::Timed
    }
}

fn is_false(flag: &bool) -> bool {
    !*flag
}

/// Reads a count or a time that another tool may have written as a fraction (`10.4`):
/// any number ≥ 0, rounded to the nearest whole one.
fn whole_number<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    let number = serde_json::Number::deserialize(deserializer)?;
    number
        .as_u64()
        .or_else(|| {
            number
                .as_f64()
                .filter(|f| f.is_finite() && *f >= 0.0)
                .map(|f| f.round() as u64)
        })
        .ok_or_else(|| serde::de::Error::custom(format!("expected a number ≥ 0, not {number}")))
}

impl Node {
    /// A node with no children.
    pub fn leaf(name: &str, module: &str, calls: u64, total_ns: u64, self_ns: u64) -> Node {
        Node {
            name: name.to_owned(),
            module: module.to_owned(),
            calls,
            total_ns,
            self_ns,
            below_resolution: false,
            cpu_ns: None,
            self_cpu_ns: None,
            error_ns: None,
            address: None,
            samples: None,
            jit: false,
            tail_call: false,
            timing: Timing::Timed,
            children: Vec::new(),
        }
    }

    /// The same node without its children (a shallow copy).
    fn without_children(&self) -> Node {
        let mut node = Node::leaf(
            &self.name,
            &self.module,
            self.calls,
            self.total_ns,
            self.self_ns,
        );
        node.below_resolution = self.below_resolution;
        node.cpu_ns = self.cpu_ns;
        node.self_cpu_ns = self.self_cpu_ns;
        node.error_ns = self.error_ns;
        node.address = self.address;
        node.samples = self.samples;
        node.jit = self.jit;
        node.tail_call = self.tail_call;
        node.timing = self.timing;
        node
    }

    fn same_fields(&self, other: &Node) -> bool {
        self.name == other.name
            && self.module == other.module
            && self.calls == other.calls
            && self.total_ns == other.total_ns
            && self.self_ns == other.self_ns
            && self.below_resolution == other.below_resolution
            && self.cpu_ns == other.cpu_ns
            && self.self_cpu_ns == other.self_cpu_ns
            && self.error_ns == other.error_ns
            && self.address == other.address
            && self.samples == other.samples
            && self.jit == other.jit
            && self.tail_call == other.tail_call
            && self.timing == other.timing
            && self.children.len() == other.children.len()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A chain `name` → `name` → … `depth` levels deep, each level 1 ns of self time.
    pub(crate) fn chain(name: &str, depth: usize) -> Node {
        let mut node = Node::leaf(name, "m", 1, 1, 1);
        for _ in 1..depth {
            let total_ns = node.total_ns + 1;
            let mut parent = Node::leaf(name, "m", 1, total_ns, 1);
            parent.children.push(node);
            node = parent;
        }
        node
    }

    #[test]
    fn the_jit_mark_is_written_only_when_set_and_old_profiles_load_without_it() {
        let plain = Node::leaf("f", "m", 1, 2, 2);
        let json = serde_json::to_string(&plain).unwrap();
        assert!(!json.contains("jit"), "{json}");
        let old: Node = serde_json::from_str(&json).unwrap();
        assert!(!old.jit);
        let mut marked = Node::leaf("JS:*leafy app.js:1", "[jit]", 0, 0, 0);
        marked.jit = true;
        let json = serde_json::to_string(&marked).unwrap();
        assert!(json.contains("\"jit\":true"), "{json}");
        assert!(serde_json::from_str::<Node>(&json).unwrap().jit);
    }
}
