//! The CCT builder: per-thread calling context trees from event streams, merged on demand
//! into a [`Profile`].
//!
//! The one idea: the hot path ([`CctBuilder::push_events`]) only moves indices around in
//! per-thread arenas and adds ticks; names, nanoseconds, self times and the merged tree
//! are produced by [`CctBuilder::snapshot`], which reads the builder without changing it
//! and may be called at any time (a live view calls it several times a second).

use super::arena::CallArena;
use super::calibration::{CalibrationError, Correction};
use super::model::{Calibration, MergedProfile, Profile, Stats, ThreadProfile, TimingPolicy};
use super::per_function::{self, FunctionSums};
use super::thread_tree::{OwnFunctions, RootFunctions, ThreadTree};
use std::borrow::Cow;
use std::collections::HashMap;
use tendril_wire::events::Event;

/// Names a function id: the controller's function table, or anything that stands in.
pub trait FunctionNames {
    /// The demangled name of `function`.
    fn name(&self, function: u32) -> Cow<'_, str>;
    /// The file name of the module defining `function`.
    fn module(&self, function: u32) -> Cow<'_, str>;
    /// The entry address of `function` in the target, when known: what tells apart two
    /// functions that share a name and module (`static` functions of two files).
    fn address(&self, _function: u32) -> Option<u64> {
        None
    }
}

/// One entry of a function table indexed by function id.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FunctionName {
    pub name: String,
    pub module: String,
    /// Its entry address in the target, when known.
    pub address: Option<u64>,
}

/// A table indexed by function id; an id past its end is named `function #ID` in `?`.
impl FunctionNames for [FunctionName] {
    fn name(&self, function: u32) -> Cow<'_, str> {
        match self.get(function as usize) {
            Some(known) => Cow::Borrowed(&known.name),
            None => Cow::Owned(format!("function #{function}")),
        }
    }

    fn module(&self, function: u32) -> Cow<'_, str> {
        match self.get(function as usize) {
            Some(known) => Cow::Borrowed(&known.module),
            None => Cow::Borrowed("?"),
        }
    }

    fn address(&self, function: u32) -> Option<u64> {
        self.get(function as usize)?.address
    }
}

impl FunctionNames for Vec<FunctionName> {
    fn name(&self, function: u32) -> Cow<'_, str> {
        self.as_slice().name(function)
    }

    fn module(&self, function: u32) -> Cow<'_, str> {
        self.as_slice().module(function)
    }

    fn address(&self, function: u32) -> Option<u64> {
        self.as_slice().address(function)
    }
}

/// What the caller knows about a recording that the event streams do not say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordingInfo {
    pub pid: u32,
    pub exe: String,
    pub roots: Vec<String>,
    pub scheme: String,
    pub instrumented_functions: u64,
    pub invoked_functions: u64,
    pub lost_events: u64,
    pub indirect_call_sites: u64,
    /// Adaptive timing's policy and what it switched (its `untimed_calls` is filled in
    /// by the builder); `None` when every call is timed.
    pub timing: Option<TimingPolicy>,
}

/// The builder's counters, summed over threads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BuildCounters {
    /// Events processed.
    pub events: u64,
    /// Exit events of a function that was not open on that thread (ignored).
    pub unmatched_exits: u64,
    /// Frames closed other than by their own exit event.
    pub unwound_exits: u64,
    /// Events of an unknown kind (ignored).
    pub malformed_events: u64,
    /// All pauses tendril caused in the target, in ticks.
    pub pause_ticks: u64,
    /// Of those, the waits for a core that tendril's own draining held.
    pub core_wait_ticks: u64,
    /// Returns to a stack a thread had left (coroutines), see `ThreadCounters`.
    pub stack_switches: u64,
    /// Frames closed when their stack was left that returned later.
    pub dropped_frames: u64,
    /// Exits of frames entered before a thread's stream began (ignored).
    pub stale_exits: u64,
    /// Calls made outside any recorded root frame (left out), see `ThreadCounters`.
    pub discarded_calls: u64,
    /// Calls of untimed functions counted in the trees.
    pub untimed_calls: u64,
}

/// The functions instrumented as roots, by id: only they start a context at the top of
/// a tree. Until [`CctBuilder::set_root_functions`] is called, every function may.
#[derive(Debug, Clone, Default)]
struct RootSet {
    known: bool,
    is_root: Vec<bool>,
    /// The in-situ calibration's functions (see [`RootFunctions::ignored`]).
    ignored: OwnFunctions,
}

impl RootFunctions for RootSet {
    fn is_root(&self, function: u32) -> bool {
        !self.known
            || self
                .is_root
                .get(function as usize)
                .copied()
                .unwrap_or(false)
    }

    fn ignored(&self) -> OwnFunctions {
        self.ignored
    }
}

/// Builds calling context trees from per-thread event streams.
#[derive(Debug, Clone)]
pub struct CctBuilder {
    calibration: Calibration,
    correction: Correction,
    roots: RootSet,
    /// In the order threads were first seen.
    threads: Vec<ThreadTree>,
    index_of_tid: HashMap<u32, usize>,
    /// Off-CPU intervals are being given ([`CctBuilder::push_off_cpu`]): nodes get
    /// CPU times.
    measures_cpu: bool,
    /// Off-CPU intervals of threads with no events yet, kept until their first events
    /// (the intervals come before the events that follow them).
    off_cpu_of_unseen: HashMap<u32, Vec<(u64, u64, u64)>>,
    /// By function id: its calls are counted, not timed (adaptive timing).
    untimed: Vec<bool>,
}

/// Off-CPU intervals kept for one thread with no events yet: a thread asleep outside
/// the roots keeps its latest ones only (the older ones end before any frame it opens).
const MAX_UNSEEN_INTERVALS: usize = 4096;

impl CctBuilder {
    /// A builder that corrects times with `calibration` (JFluid §5.3).
    pub fn new(calibration: Calibration) -> Result<CctBuilder, CalibrationError> {
        Ok(CctBuilder {
            calibration,
            correction: Correction::new(&calibration)?,
            roots: RootSet::default(),
            threads: Vec::new(),
            index_of_tid: HashMap::new(),
            measures_cpu: false,
            off_cpu_of_unseen: HashMap::new(),
            untimed: Vec::new(),
        })
    }

    pub fn calibration(&self) -> Calibration {
        self.calibration
    }

    fn thread_index(&mut self, tid: u32) -> usize {
        *self.index_of_tid.entry(tid).or_insert_with(|| {
            let mut thread = ThreadTree::new(tid);
            for (out_tsc, in_tsc, held) in self.off_cpu_of_unseen.remove(&tid).unwrap_or_default() {
                thread.push_off_cpu(out_tsc, in_tsc, held);
            }
            self.threads.push(thread);
            self.threads.len() - 1
        })
    }

    fn thread_mut(&mut self, tid: u32) -> &mut ThreadTree {
        let index = self.thread_index(tid);
        &mut self.threads[index]
    }

    /// Says which functions are untimed now (adaptive timing): their nodes below a
    /// caller are shown as counted, their time in the caller's ([`Timing::InCaller`]),
    /// including the calls they made before they were switched.
    ///
    /// [`Timing::InCaller`]: super::model::Timing::InCaller
    pub fn set_untimed(&mut self, ids: impl IntoIterator<Item = u32>) {
        self.untimed.clear();
        for id in ids {
            if self.untimed.len() <= id as usize {
                self.untimed.resize(id as usize + 1, false);
            }
            self.untimed[id as usize] = true;
        }
    }

    fn is_untimed(&self, function: u32) -> bool {
        self.untimed
            .get(function as usize)
            .copied()
            .unwrap_or(false)
    }

    /// Each function's calls, mean time and callees over every thread's tree, as of
    /// now (frames still open count up to their thread's latest event). The time is
    /// on-CPU time when the recording measures it: a call preempted on a busy machine
    /// is not made longer by the wait. Each thread's own mean counts for a function it
    /// called at least `min_calls` times (`per_function`).
    pub fn function_sums(&self, min_calls: u64) -> HashMap<u32, FunctionSums> {
        let mut sums = HashMap::new();
        for thread in &self.threads {
            let totals = match self.measures_cpu {
                true => thread.cpu_totals_now(&self.correction),
                false => thread.totals_now(&self.correction),
            };
            per_function::add_arena(thread.arena(), &totals, min_calls, &mut sums);
        }
        sums
    }

    /// Says which function ids are the recording's roots: from now on, an entry of any
    /// other function that is not inside a recorded root frame is left out (it was
    /// called from frames entered before the thread's stream began).
    pub fn set_root_functions(&mut self, ids: impl IntoIterator<Item = u32>) {
        let mut is_root = Vec::new();
        for id in ids {
            if is_root.len() <= id as usize {
                is_root.resize(id as usize + 1, false);
            }
            is_root[id as usize] = true;
        }
        self.roots = RootSet {
            known: true,
            is_root,
            ignored: self.roots.ignored,
        };
    }

    /// Leaves the events of `functions` out of every tree: tendril's own in-situ
    /// calibration calls, whose time the agent removes as a pause.
    pub fn ignore_functions(&mut self, functions: OwnFunctions) {
        self.roots.ignored = functions;
    }

    /// The functions whose events are left out (see `ignore_functions`).
    pub fn ignored_functions(&self) -> OwnFunctions {
        self.roots.ignored
    }

    /// Corrects with `calibration` from now on: every frame that closes later, and
    /// every snapshot's open frames.
    pub fn set_calibration(&mut self, calibration: Calibration) -> Result<(), CalibrationError> {
        self.correction = Correction::new(&calibration)?;
        self.calibration = calibration;
        Ok(())
    }

    /// Applies the next events of thread `tid`, in program order.
    pub fn push_events(&mut self, tid: u32, events: &[Event]) {
        let correction = self.correction;
        let index = self.thread_index(tid);
        self.threads[index].push(events, &correction, &self.roots);
    }

    /// From now on the nodes carry CPU times: every interval a thread spends off the CPU
    /// is given to [`CctBuilder::push_off_cpu`] before the events that follow it.
    pub fn measure_cpu(&mut self) {
        self.measures_cpu = true;
    }

    pub fn measures_cpu(&self) -> bool {
        self.measures_cpu
    }

    /// Thread `tid` was off the CPU from `out_tsc` to `in_tsc` (later than any interval
    /// given for it before), `held` ticks of it waiting for a core tendril held; give it
    /// before the thread's events that follow it.
    pub fn push_off_cpu(&mut self, tid: u32, out_tsc: u64, in_tsc: u64, held: u64) {
        if let Some(&index) = self.index_of_tid.get(&tid) {
            self.threads[index].push_off_cpu(out_tsc, in_tsc, held);
            return;
        }
        // No tree for a thread that never recorded an event (it would show in the
        // profile); its intervals wait for its first events.
        let waiting = self.off_cpu_of_unseen.entry(tid).or_default();
        if waiting.len() == MAX_UNSEEN_INTERVALS {
            waiting.drain(..MAX_UNSEEN_INTERVALS / 2);
        }
        waiting.push((out_tsc, in_tsc, held));
    }

    /// Names thread `tid` (e.g. from `/proc/PID/task/TID/comm`).
    pub fn set_thread_name(&mut self, tid: u32, name: impl Into<String>) {
        self.thread_mut(tid).name = name.into();
    }

    /// Frames open on thread `tid` (0 for a thread never seen).
    pub fn open_frames(&self, tid: u32) -> usize {
        self.index_of_tid
            .get(&tid)
            .map_or(0, |&index| self.threads[index].depth())
    }

    /// The functions open on thread `tid`, outermost first (none for a thread never
    /// seen).
    pub fn open_functions(&self, tid: u32) -> Vec<u32> {
        self.index_of_tid
            .get(&tid)
            .map_or_else(Vec::new, |&index| self.threads[index].open_functions())
    }

    /// Closes thread `tid`'s open frames as unwound at `at_ts` (the thread exited).
    pub fn finish_thread(&mut self, tid: u32, at_ts: u64) {
        if let Some(&index) = self.index_of_tid.get(&tid) {
            self.threads[index].finish(at_ts, &self.correction);
        }
    }

    /// Closes every thread's open frames as unwound at `at_ts` (recording ended).
    pub fn finish_all(&mut self, at_ts: u64) {
        for thread in &mut self.threads {
            thread.finish(at_ts, &self.correction);
        }
    }

    /// The recording stopped watching at `at_ts` (paused, roots changed, detached):
    /// every thread's open frames end there, and whatever the threads record later
    /// starts afresh at a root — never under a frame whose exit was not seen.
    pub fn stop_watching(&mut self, at_ts: u64) {
        for thread in &mut self.threads {
            thread.stop_watching(at_ts, &self.correction);
        }
    }

    /// Every function id that has a node in some thread's tree (it ran inside a root).
    pub fn functions_seen(&self) -> Vec<u32> {
        let mut seen: Vec<u32> = self
            .threads
            .iter()
            .flat_map(|t| t.arena().nodes().iter().skip(1).map(|n| n.function))
            .collect();
        seen.sort_unstable();
        seen.dedup();
        seen
    }

    /// The number of threads with at least `depth` frames open (a test's way to act in
    /// the middle of calls).
    pub fn threads_at_depth(&self, depth: usize) -> usize {
        self.threads.iter().filter(|t| t.depth() >= depth).count()
    }

    pub fn counters(&self) -> BuildCounters {
        let mut sum = BuildCounters::default();
        for thread in &self.threads {
            let counters = thread.counters();
            sum.events += counters.events;
            sum.unmatched_exits += counters.unmatched_exits;
            sum.unwound_exits += counters.unwound_exits;
            sum.malformed_events += counters.malformed_events;
            sum.pause_ticks += counters.pause_ticks;
            sum.core_wait_ticks += counters.core_wait_ticks;
            sum.stack_switches += counters.stack_switches;
            sum.dropped_frames += counters.dropped_frames;
            sum.stale_exits += counters.stale_exits;
            sum.discarded_calls += counters.discarded_calls;
            sum.untimed_calls += counters.untimed_calls;
        }
        sum
    }

    /// The profile as of now. Frames still open count their time up to their thread's
    /// latest event; the builder is not changed.
    pub fn snapshot(&self, info: &RecordingInfo, names: &(impl FunctionNames + ?Sized)) -> Profile {
        let describe = |function| {
            (
                names.name(function).into_owned(),
                names.module(function).into_owned(),
                names.address(function),
            )
        };
        let mut merged = CallArena::default();
        // Merged nodes some thread's part of which was below resolution.
        let mut merged_below: Vec<bool> = vec![false];
        let mut threads = Vec::with_capacity(self.threads.len());
        for thread in &self.threads {
            threads.push(self.thread_profile(thread, &mut merged, &mut merged_below, describe));
        }
        Profile {
            duration_ns: 0,
            discovery: None,
            gross: Vec::new(),
            sampling: None,
            modules: Vec::new(),
            trace: None,
            format: Profile::FORMAT.to_owned(),
            version: Profile::VERSION,
            pid: info.pid,
            exe: info.exe.clone(),
            roots: info.roots.clone(),
            scheme: info.scheme.clone(),
            calibration: self.calibration,
            stats: self.stats(info),
            threads,
            merged: self.merged_profile(&merged, &merged_below, describe),
        }
    }

    /// `thread`'s tree as of now, added to the `merged` tree (and `merged_below`).
    fn thread_profile(
        &self,
        thread: &ThreadTree,
        merged: &mut CallArena,
        merged_below: &mut Vec<bool>,
        describe: impl FnMut(u32) -> (String, String, Option<u64>),
    ) -> ThreadProfile {
        let correction = &self.correction;
        let untimed = |function| self.is_untimed(function);
        let in_caller = thread.arena().in_caller(untimed);
        let counted_only = |mut raw: Vec<f64>| {
            for (total, &counted) in raw.iter_mut().zip(&in_caller) {
                if counted {
                    *total = 0.0;
                }
            }
            raw
        };
        let settled = thread
            .arena()
            .settle(&counted_only(thread.totals_now(correction)));
        let matching = merged.merge(thread.arena(), &settled.totals);
        merged_below.resize(merged.len(), false);
        for (mine, below) in matching.iter().zip(&settled.below) {
            merged_below[*mine as usize] |= below;
        }
        let cpu = self.measures_cpu.then(|| {
            let cpu = thread
                .arena()
                .settle(&counted_only(thread.cpu_totals_now(correction)))
                .totals;
            merged.add_cpu(&matching, &cpu);
            cpu
        });
        let counters = thread.counters();
        ThreadProfile {
            tid: thread.tid,
            name: thread.name.clone(),
            roots: thread.arena().to_nodes_with_cpu(
                &settled.totals,
                &settled.below,
                &in_caller,
                cpu.as_deref(),
                correction,
                describe,
            ),
            stack_switches: counters.stack_switches,
            dropped_frames: counters.dropped_frames,
        }
    }

    /// The tree of every thread's trees, `merged`.
    fn merged_profile(
        &self,
        merged: &CallArena,
        merged_below: &[bool],
        describe: impl FnMut(u32) -> (String, String, Option<u64>),
    ) -> MergedProfile {
        let untimed = |function| self.is_untimed(function);
        // Sums of consistent trees are consistent: nothing to settle.
        let merged_totals: Vec<f64> = merged.nodes().iter().map(|n| n.total_ticks).collect();
        let merged_cpu: Option<Vec<f64>> = self
            .measures_cpu
            .then(|| merged.nodes().iter().map(|n| n.cpu_ticks).collect());
        MergedProfile {
            roots: merged.to_nodes_with_cpu(
                &merged_totals,
                merged_below,
                &merged.in_caller(untimed),
                merged_cpu.as_deref(),
                &self.correction,
                describe,
            ),
        }
    }

    /// The profile's statistics: the recording's, and the builder's counters.
    fn stats(&self, info: &RecordingInfo) -> Stats {
        let correction = &self.correction;
        let counters = self.counters();
        Stats {
            instrumented_functions: info.instrumented_functions,
            invoked_functions: info.invoked_functions,
            events: counters.events,
            lost_events: info.lost_events,
            indirect_call_sites: info.indirect_call_sites,
            pause_ns: correction.ticks_to_ns(counters.pause_ticks as f64),
            core_wait_ns: correction.ticks_to_ns(counters.core_wait_ticks as f64),
            unwound_exits: counters.unwound_exits,
            unmatched_exits: counters.unmatched_exits,
            stack_switches: counters.stack_switches,
            dropped_frames: counters.dropped_frames,
            timing: info.timing.clone().map(|policy| TimingPolicy {
                untimed_calls: counters.untimed_calls,
                ..policy
            }),
            ..Stats::default()
        }
    }
}

#[cfg(test)]
mod tests;
