//! The CCT builder: per-thread calling context trees from event streams, merged on demand
//! into a [`Profile`].
//!
//! The one idea: the hot path ([`CctBuilder::push_events`]) only moves indices around in
//! per-thread arenas and adds ticks; names, nanoseconds, self times and the merged tree
//! are produced by [`CctBuilder::snapshot`], which reads the builder without changing it
//! and may be called at any time (a live view calls it several times a second).

use super::arena::CallArena;
use super::calibration::{CalibrationError, Correction};
use super::model::{Calibration, MergedProfile, Profile, Stats, ThreadProfile};
use super::thread_tree::{RootFunctions, ThreadTree};
use std::borrow::Cow;
use std::collections::HashMap;
use tendril_wire::events::Event;

/// Names a function id: the controller's function table, or anything that stands in.
pub trait FunctionNames {
    /// The demangled name of `function`.
    fn name(&self, function: u32) -> Cow<'_, str>;
    /// The file name of the module defining `function`.
    fn module(&self, function: u32) -> Cow<'_, str>;
}

/// One entry of a function table indexed by function id.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FunctionName {
    pub name: String,
    pub module: String,
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
}

impl FunctionNames for Vec<FunctionName> {
    fn name(&self, function: u32) -> Cow<'_, str> {
        self.as_slice().name(function)
    }

    fn module(&self, function: u32) -> Cow<'_, str> {
        self.as_slice().module(function)
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
    /// Returns to a stack a thread had left (coroutines), see `ThreadCounters`.
    pub stack_switches: u64,
    /// Frames closed when their stack was left that returned later.
    pub dropped_frames: u64,
    /// Exits of frames entered before a thread's stream began (ignored).
    pub stale_exits: u64,
    /// Calls made outside any recorded root frame (left out), see `ThreadCounters`.
    pub discarded_calls: u64,
}

/// The functions instrumented as roots, by id: only they start a context at the top of
/// a tree. Until [`CctBuilder::set_root_functions`] is called, every function may.
#[derive(Debug, Clone, Default)]
struct RootSet {
    known: bool,
    is_root: Vec<bool>,
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
}

impl CctBuilder {
    /// A builder that corrects times with `calibration` (JFluid §5.3).
    pub fn new(calibration: Calibration) -> Result<CctBuilder, CalibrationError> {
        Ok(CctBuilder {
            calibration,
            correction: Correction::new(&calibration)?,
            roots: RootSet::default(),
            threads: Vec::new(),
            index_of_tid: HashMap::new(),
        })
    }

    pub fn calibration(&self) -> Calibration {
        self.calibration
    }

    fn thread_index(&mut self, tid: u32) -> usize {
        *self.index_of_tid.entry(tid).or_insert_with(|| {
            self.threads.push(ThreadTree::new(tid));
            self.threads.len() - 1
        })
    }

    fn thread_mut(&mut self, tid: u32) -> &mut ThreadTree {
        let index = self.thread_index(tid);
        &mut self.threads[index]
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
        };
    }

    /// Applies the next events of thread `tid`, in program order.
    pub fn push_events(&mut self, tid: u32, events: &[Event]) {
        let correction = self.correction;
        let index = self.thread_index(tid);
        self.threads[index].push(events, &correction, &self.roots);
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
            sum.stack_switches += counters.stack_switches;
            sum.dropped_frames += counters.dropped_frames;
            sum.stale_exits += counters.stale_exits;
            sum.discarded_calls += counters.discarded_calls;
        }
        sum
    }

    /// The profile as of now. Frames still open count their time up to their thread's
    /// latest event; the builder is not changed.
    pub fn snapshot(&self, info: &RecordingInfo, names: &(impl FunctionNames + ?Sized)) -> Profile {
        let correction = &self.correction;
        let describe = |function| {
            (
                names.name(function).into_owned(),
                names.module(function).into_owned(),
            )
        };
        let mut merged = CallArena::default();
        let mut threads = Vec::with_capacity(self.threads.len());
        for thread in &self.threads {
            let totals = thread.totals_now(correction);
            merged.merge(thread.arena(), &totals);
            let counters = thread.counters();
            threads.push(ThreadProfile {
                tid: thread.tid,
                name: thread.name.clone(),
                roots: thread.arena().to_nodes(&totals, correction, describe),
                stack_switches: counters.stack_switches,
                dropped_frames: counters.dropped_frames,
            });
        }
        let merged_totals: Vec<f64> = merged.nodes().iter().map(|n| n.total_ticks).collect();
        let counters = self.counters();
        Profile {
            duration_ns: 0,
            discovery: None,
            gross: Vec::new(),
            format: Profile::FORMAT.to_owned(),
            version: Profile::VERSION,
            pid: info.pid,
            exe: info.exe.clone(),
            roots: info.roots.clone(),
            scheme: info.scheme.clone(),
            calibration: self.calibration,
            stats: Stats {
                instrumented_functions: info.instrumented_functions,
                invoked_functions: info.invoked_functions,
                events: counters.events,
                lost_events: info.lost_events,
                indirect_call_sites: info.indirect_call_sites,
                pause_ns: correction.ticks_to_ns(counters.pause_ticks as f64),
                unwound_exits: counters.unwound_exits,
                unmatched_exits: counters.unmatched_exits,
                stack_switches: counters.stack_switches,
                dropped_frames: counters.dropped_frames,
            },
            threads,
            merged: MergedProfile {
                roots: merged.to_nodes(&merged_totals, correction, describe),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::model::Node;
    use crate::profile::tests_support::{entry, exit, info, names, pause, resumed, unwind};
    use tendril_wire::events::EventKind;

    /// 1 tick = 1 ns and no overhead to remove, so times are the raw tick differences.
    fn exact_builder() -> CctBuilder {
        CctBuilder::new(Calibration {
            tsc_hz: 1_000_000_000,
            inner_ns: 0.0,
            outer_ns: 0.0,
        })
        .unwrap()
    }

    const NAMES: [&str; 4] = ["main", "fib", "work", "other"];

    fn snapshot(builder: &CctBuilder) -> Profile {
        builder.snapshot(&info(), &names(&NAMES))
    }

    fn n(name: &str, calls: u64, total: u64, self_ns: u64, children: Vec<Node>) -> Node {
        let mut node = Node::leaf(name, "app", calls, total, self_ns);
        node.children = children;
        node
    }

    #[test]
    fn recursion_stays_nested() {
        let mut builder = exact_builder();
        builder.push_events(
            1,
            &[
                entry(1, 0),
                entry(1, 10),
                entry(1, 20),
                exit(1, 25),
                exit(1, 40),
                exit(1, 100),
            ],
        );
        let profile = snapshot(&builder);
        let expected = n(
            "fib",
            1,
            100,
            70,
            vec![n("fib", 1, 30, 25, vec![n("fib", 1, 5, 5, vec![])])],
        );
        assert_eq!(profile.threads[0].roots, vec![expected.clone()]);
        assert_eq!(profile.merged.roots, vec![expected]);
    }

    #[test]
    fn an_exit_below_the_top_closes_the_frames_above_it_as_unwound() {
        let mut builder = exact_builder();
        // work → fib → fib; then work exits directly (longjmp past both fibs).
        builder.push_events(1, &[entry(2, 0), entry(1, 10), entry(1, 20), exit(2, 50)]);
        let profile = snapshot(&builder);
        let expected = n(
            "work",
            1,
            50,
            10,
            vec![n("fib", 1, 40, 10, vec![n("fib", 1, 30, 30, vec![])])],
        );
        assert_eq!(profile.merged.roots, vec![expected]);
        assert_eq!(profile.stats.unwound_exits, 2);
        assert_eq!(profile.stats.unmatched_exits, 0);
        assert_eq!(builder.open_frames(1), 0);
    }

    #[test]
    fn after_a_stop_nothing_nests_under_the_frames_open_then_and_only_roots_start_a_tree() {
        let mut builder = exact_builder();
        builder.set_root_functions([0]);
        // main → fib, then the recording stops watching at 20 (a pause).
        builder.push_events(1, &[entry(0, 0), entry(1, 10)]);
        builder.stop_watching(20);
        builder.push_events(
            1,
            &[
                // After the resume: the old frames' exits, without their entries…
                exit(1, 30),
                // …a call made inside them (not a root: left out)…
                entry(1, 35),
                entry(1, 36),
                exit(1, 37),
                exit(1, 38),
                exit(0, 40),
                // …and the next call of the root, at the top.
                entry(0, 70),
                entry(1, 80),
                exit(1, 90),
                exit(0, 100),
            ],
        );
        let profile = snapshot(&builder);
        let expected = n("main", 2, 50, 30, vec![n("fib", 2, 20, 20, vec![])]);
        assert_eq!(profile.merged.roots, vec![expected]);
        assert_eq!(profile.stats.unmatched_exits, 0);
        assert_eq!(builder.counters().stale_exits, 2);
        assert_eq!(builder.counters().discarded_calls, 2);
        assert_eq!(builder.open_frames(1), 0);
    }

    #[test]
    fn an_exit_of_a_function_not_open_is_ignored_and_counted() {
        let mut builder = exact_builder();
        builder.push_events(
            1,
            &[
                entry(2, 0),
                exit(3, 5),
                entry(1, 10),
                exit(1, 20),
                exit(2, 30),
                exit(2, 31),
            ],
        );
        let profile = snapshot(&builder);
        let expected = n("work", 1, 30, 20, vec![n("fib", 1, 10, 10, vec![])]);
        assert_eq!(profile.merged.roots, vec![expected]);
        assert_eq!(profile.stats.unmatched_exits, 2);
        assert_eq!(profile.stats.unwound_exits, 0);
        assert_eq!(profile.stats.events, 6);
    }

    #[test]
    fn open_frames_count_up_to_the_latest_event_and_snapshots_change_nothing() {
        let mut builder = exact_builder();
        builder.push_events(1, &[entry(0, 100), entry(2, 110), exit(2, 130)]);
        let first = snapshot(&builder);
        assert_eq!(
            first.merged.roots,
            vec![n("main", 1, 30, 10, vec![n("work", 1, 20, 20, vec![])])]
        );
        assert_eq!(
            snapshot(&builder),
            first,
            "a snapshot does not change the builder"
        );

        builder.push_events(1, &[entry(2, 200), pause(15)]);
        // main: 200 − 100 − 15 = 85. The open work entered at 200, the latest event is
        // at 200 and the pause fell inside it: 0 − 15, clamped at 0.
        let second = snapshot(&builder);
        assert_eq!(
            second.merged.roots,
            vec![n("main", 1, 85, 65, vec![n("work", 2, 20, 20, vec![])])]
        );

        builder.push_events(1, &[exit(2, 260), exit(0, 300)]);
        // work: 20 + (60 − 15) = 65; main: 200 − 15 = 185.
        let last = snapshot(&builder);
        assert_eq!(
            last.merged.roots,
            vec![n("main", 1, 185, 120, vec![n("work", 2, 65, 65, vec![])])]
        );
        assert_eq!(last.stats.pause_ns, 15);
        assert_eq!(builder.open_frames(1), 0);
    }

    #[test]
    fn finishing_closes_open_frames_as_unwound() {
        let mut builder = exact_builder();
        builder.push_events(1, &[entry(0, 0), entry(2, 10)]);
        builder.push_events(2, &[entry(0, 5)]);
        builder.finish_thread(1, 50);
        assert_eq!((builder.open_frames(1), builder.open_frames(2)), (0, 1));
        builder.finish_all(105);
        assert_eq!(builder.open_frames(2), 0);
        let profile = snapshot(&builder);
        assert_eq!(
            profile.threads[0].roots,
            vec![n("main", 1, 50, 10, vec![n("work", 1, 40, 40, vec![])])]
        );
        assert_eq!(
            profile.threads[1].roots,
            vec![n("main", 1, 100, 100, vec![])]
        );
        assert_eq!(profile.stats.unwound_exits, 3);
        // A later finish has nothing left to close.
        builder.finish_all(1_000);
        assert_eq!(snapshot(&builder), profile);
    }

    #[test]
    fn threads_merge_by_call_path() {
        let mut builder = exact_builder();
        builder.set_thread_name(20, "worker-b");
        builder.push_events(10, &[entry(0, 0), entry(2, 10), exit(2, 30), exit(0, 40)]);
        builder.push_events(
            20,
            &[
                entry(0, 0),
                entry(3, 1),
                exit(3, 2),
                entry(2, 5),
                exit(2, 11),
                exit(0, 100),
            ],
        );
        builder.push_events(30, &[entry(2, 0), exit(2, 7)]);
        builder.set_thread_name(10, "worker-a");
        let profile = snapshot(&builder);
        let tids: Vec<(u32, &str)> = profile
            .threads
            .iter()
            .map(|t| (t.tid, t.name.as_str()))
            .collect();
        assert_eq!(tids, [(20, "worker-b"), (10, "worker-a"), (30, "")]);
        assert_eq!(
            profile.merged.roots,
            vec![
                n(
                    "main",
                    2,
                    140,
                    113,
                    vec![n("other", 1, 1, 1, vec![]), n("work", 2, 26, 26, vec![])]
                ),
                n("work", 1, 7, 7, vec![]),
            ]
        );
    }

    #[test]
    fn unwind_events_and_unknown_kinds_are_counted() {
        let mut builder = exact_builder();
        let bogus = Event {
            value: 1,
            function: 0,
            kind: 99,
        };
        builder.push_events(
            1,
            &[entry(0, 0), entry(2, 1), unwind(2, 4), bogus, exit(0, 9)],
        );
        let counters = builder.counters();
        assert_eq!(counters.events, 5);
        assert_eq!(counters.unwound_exits, 1);
        assert_eq!(counters.malformed_events, 1);
        assert_eq!(
            snapshot(&builder).merged.roots,
            vec![n("main", 1, 9, 6, vec![n("work", 1, 3, 3, vec![])])]
        );
    }

    #[test]
    fn unknown_function_ids_get_placeholder_names() {
        let mut builder = exact_builder();
        builder.push_events(1, &[entry(40, 0), exit(40, 3)]);
        let profile = snapshot(&builder);
        assert_eq!(profile.merged.roots[0].name, "function #40");
        assert_eq!(profile.merged.roots[0].module, "?");
    }

    #[test]
    fn a_wide_fan_out_keeps_every_callee_apart() {
        let mut builder = exact_builder();
        let mut events = vec![entry(0, 0)];
        let mut ts = 0;
        for round in 0..3 {
            for callee in 100..140 {
                events.push(entry(callee, ts));
                ts += u64::from(callee - 99) + round;
                events.push(exit(callee, ts));
            }
        }
        events.push(exit(0, ts));
        builder.push_events(1, &events);
        let profile = snapshot(&builder);
        let root = &profile.merged.roots[0];
        assert_eq!(root.children.len(), 40);
        for (index, child) in root.children.iter().enumerate() {
            assert_eq!(child.name, format!("function #{}", 100 + index));
            assert_eq!(child.calls, 3);
            assert_eq!(child.total_ns, 3 * (index as u64 + 1) + 3);
        }
        assert_eq!(root.self_ns, 0);
    }

    #[test]
    fn a_100_000_deep_recursion_builds_and_snapshots() {
        let depth = 100_000u64;
        let mut events: Vec<Event> = (0..depth).map(|i| entry(1, i)).collect();
        let mut builder = exact_builder();
        builder.push_events(1, &events);
        let live = snapshot(&builder);
        let mut deepest = &live.merged.roots[0];
        let mut levels = 1;
        while let Some(child) = deepest.children.first() {
            deepest = child;
            levels += 1;
        }
        assert_eq!(levels, depth);
        assert_eq!(live.merged.roots[0].total_ns, depth - 1);

        events = (0..depth).map(|i| exit(1, depth + i)).collect();
        builder.push_events(1, &events);
        let done = snapshot(&builder);
        assert_eq!(done.merged.roots[0].total_ns, 2 * depth - 1);
        assert_eq!(done.merged.roots[0].self_ns, 2);
        assert_eq!(builder.counters().events, 2 * depth);
        assert_eq!(
            Event::new(EventKind::Exit, 1, 5),
            exit(1, 5),
            "the helpers make real events"
        );
    }

    #[test]
    fn frames_resumed_after_a_stack_switch_are_counted_never_matched() {
        let mut builder = exact_builder();
        // main -> work, which yields: its frame and fib's are dropped (unwound) when
        // main's frame returns on the other stack; later both come back (one switch),
        // then work is entered again from main.
        builder.push_events(
            1,
            &[
                entry(0, 0),
                entry(2, 10),
                entry(1, 20),
                unwind(1, 30),
                unwind(2, 30),
                resumed(1, 40),
                resumed(2, 45),
                entry(2, 50),
                exit(2, 60),
                resumed(1, 70),
                exit(0, 100),
            ],
        );
        let profile = snapshot(&builder);
        assert_eq!(profile.stats.stack_switches, 2);
        assert_eq!(profile.stats.dropped_frames, 3);
        assert_eq!(profile.stats.unmatched_exits, 0);
        assert_eq!(profile.threads[0].stack_switches, 2);
        assert_eq!(profile.threads[0].dropped_frames, 3);
        let main = &profile.merged.roots[0];
        assert_eq!(
            (main.name.as_str(), main.calls, main.total_ns),
            ("main", 1, 100)
        );
        assert_eq!(main.children[0].calls, 2);
        let warning = crate::profile::stack_switch_warning(&profile).unwrap();
        assert!(warning.contains("2 times"), "{warning}");
        assert!(warning.contains("3 frames"), "{warning}");
    }
}
