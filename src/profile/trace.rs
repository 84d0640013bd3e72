//! Traces: the raw enter and exit events of a recording's first seconds, kept in order
//! so the chrome and speedscope exports can show each thread's timeline.
//!
//! The one idea: a trace is captured raw (TSC ticks, as the rings deliver them) and
//! corrected only when a profile is made, on one virtual clock per thread from which
//! tendril's own cost is taken out the way the tree takes it out (`calibration`). Each
//! instrumented call costs its caller `t_O`, of which `t_I` lies between its own entry
//! and exit timestamps; the clock loses `(t_O − t_I)/2` before each entry timestamp and
//! `t_I/2` after it, `t_I/2` before each exit timestamp and `(t_O − t_I)/2` after it, and
//! every pause tendril caused. A frame's length on that clock is then
//! `t_meas − t_I − m·t_O`, exactly the time the tree charges it. Where a call measured
//! less than the hooks' calibrated cost, that clock can go backwards; the frames are
//! then nested afterwards (`nest`): a frame never begins before the previous event nor
//! ends after its parent, while every frame that does not conflict keeps its own times,
//! so no child moves its parent: a root's length is the tree's (unless the root before
//! it ended, on the corrected clock, a few ns after this one began). Every begin has its end: frames still open
//! when the trace ends are closed there.

use super::calibration::Correction;
use super::cct::FunctionNames;
use super::thread_tree::OwnFunctions;
use std::collections::HashMap;
use tendril_wire::events::{Event, EventKind, HookShape};

pub use super::trace_model::*;

/// A trace being captured from the rings.
#[derive(Debug, Clone)]
pub struct TraceCapture {
    seconds: f64,
    start_tick: u64,
    deadline_tick: u64,
    max_events: u64,
    kept: u64,
    capped: bool,
    threads: Vec<CapturedThread>,
    index_of_tid: HashMap<u32, usize>,
    /// The in-situ calibration's functions, whose events are tendril's own.
    ignored: OwnFunctions,
}

#[derive(Debug, Clone)]
struct CapturedThread {
    tid: u32,
    /// Functions open when the trace began, outermost first.
    open_at_start: Vec<u32>,
    /// Whether an event at or after the start has been seen.
    started: bool,
    events: Vec<Event>,
    /// Open frames are closed here: the latest event, or the deadline once passed.
    end_tick: u64,
    /// An event past the deadline was seen.
    done: bool,
}

impl TraceCapture {
    /// A trace from `start_tick` for `seconds` (TSC at `tsc_hz`), of at most
    /// `max_events` raw events.
    pub fn new(start_tick: u64, tsc_hz: u64, seconds: f64, max_events: u64) -> TraceCapture {
        let length = (seconds.max(0.0) * tsc_hz as f64).min(u64::MAX as f64 / 2.0) as u64;
        TraceCapture {
            seconds,
            start_tick,
            deadline_tick: start_tick.saturating_add(length),
            max_events,
            kept: 0,
            capped: false,
            threads: Vec::new(),
            index_of_tid: HashMap::new(),
            ignored: OwnFunctions::default(),
        }
    }

    /// Leaves the events of `functions` out (the in-situ calibration's, as the trees
    /// do; their time is an Adjust, which the trace keeps).
    pub fn ignore_functions(&mut self, functions: OwnFunctions) {
        self.ignored = functions;
    }

    /// Raw entry, exit and unwind events kept so far.
    pub fn kept_events(&self) -> u64 {
        self.kept
    }

    /// Whether the trace takes no more events: it reached its cap, or `now_tick` is
    /// past its end.
    pub fn is_over(&self, now_tick: u64) -> bool {
        self.capped || now_tick > self.deadline_tick
    }

    /// Takes the next events of thread `tid`, in program order. `open_before` gives the
    /// functions open on the thread before these events (outermost first); it is asked
    /// once, for the thread's first batch.
    pub fn push(&mut self, tid: u32, events: &[Event], open_before: impl FnOnce() -> Vec<u32>) {
        if self.capped {
            return;
        }
        let index = *self.index_of_tid.entry(tid).or_insert_with(|| {
            self.threads.push(CapturedThread {
                tid,
                open_at_start: open_before(),
                started: false,
                events: Vec::new(),
                end_tick: self.start_tick,
                done: false,
            });
            self.threads.len() - 1
        });
        let thread = &mut self.threads[index];
        for event in events {
            if thread.done {
                return;
            }
            let kind = event.kind();
            if kind == Some(EventKind::Adjust) {
                if thread.started {
                    thread.events.push(*event);
                }
                continue;
            }
            // An untimed call has no time on a timeline: it is its caller's.
            if matches!(kind, Some(EventKind::Resumed | EventKind::Call))
                || kind.is_none()
                || self.ignored.contains(event.function)
            {
                continue;
            }
            if event.value < self.start_tick && !thread.started {
                // Before the trace: only the frames open at its start matter.
                track_open(&mut thread.open_at_start, kind, event.function);
                continue;
            }
            if event.value > self.deadline_tick {
                thread.end_tick = self.deadline_tick;
                thread.done = true;
                return;
            }
            if self.kept >= self.max_events {
                self.capped = true;
                return;
            }
            thread.started = true;
            thread.events.push(*event);
            thread.end_tick = thread.end_tick.max(event.value);
            self.kept += 1;
        }
    }

    /// The trace on the corrected clock, with `names` for its functions and
    /// `thread_names` for its threads.
    pub fn to_trace(
        &self,
        correction: &Correction,
        names: &(impl FunctionNames + ?Sized),
        thread_name: impl Fn(u32) -> String,
    ) -> Trace {
        let mut index_of_function: HashMap<u32, u32> = HashMap::new();
        let mut functions = Vec::new();
        let mut function_index = |id: u32| {
            *index_of_function.entry(id).or_insert_with(|| {
                functions.push(TraceFunction {
                    name: names.name(id).into_owned(),
                    module: names.module(id).into_owned(),
                });
                functions.len() as u32 - 1
            })
        };
        let mut threads = Vec::with_capacity(self.threads.len());
        for captured in &self.threads {
            let mut timeline = Timeline::new(self.start_tick, correction);
            for &function in &captured.open_at_start {
                timeline.begin_open(function_index(function));
            }
            for event in &captured.events {
                match event.kind() {
                    Some(EventKind::Entry) => timeline.enter(
                        function_index(event.function),
                        event.hook_shape(),
                        event.value,
                    ),
                    Some(EventKind::Exit | EventKind::Unwind) => {
                        timeline.exit(function_index(event.function), event.value)
                    }
                    Some(EventKind::Adjust) => timeline.pause(event.value),
                    _ => {}
                }
            }
            let events = timeline.close_all(captured.end_tick);
            if events.is_empty() {
                continue;
            }
            threads.push(TraceThread {
                tid: captured.tid,
                name: thread_name(captured.tid),
                events,
            });
        }
        Trace {
            seconds: self.seconds,
            max_events: self.max_events,
            capped: self.capped,
            functions,
            threads,
        }
    }
}

/// Keeps the stack of open functions up to date before the trace starts.
fn track_open(open: &mut Vec<u32>, kind: Option<EventKind>, function: u32) {
    match kind {
        Some(EventKind::Entry) => open.push(function),
        Some(EventKind::Exit | EventKind::Unwind) => {
            if let Some(at) = open.iter().rposition(|&f| f == function) {
                open.truncate(at);
            }
        }
        _ => {}
    }
}

/// One thread's corrected clock and open frames, turning raw events into a timeline.
struct Timeline<'a> {
    start_tick: u64,
    correction: &'a Correction,
    /// Ticks taken off the clock so far (hooks and pauses).
    removed: f64,
    /// The open frames' functions, and their hooks' shapes.
    open: Vec<(u32, HookShape)>,
    events: Vec<TraceEvent>,
}

impl<'a> Timeline<'a> {
    fn new(start_tick: u64, correction: &'a Correction) -> Timeline<'a> {
        Timeline {
            start_tick,
            correction,
            // The hook cost before the first entry's timestamp falls before the start.
            removed: -outside_half(correction, HookShape::Jump),
            open: Vec::new(),
            events: Vec::new(),
        }
    }

    /// The corrected time of raw tick `tick` (never before the start; it may be before
    /// the previous event's, which `nest` settles).
    fn at(&self, tick: u64) -> u64 {
        let ticks = (tick.saturating_sub(self.start_tick) as f64 - self.removed).max(0.0);
        self.correction.ticks_to_ns(ticks)
    }

    /// A frame open when the trace began: it begins at the start.
    fn begin_open(&mut self, function: u32) {
        self.open.push((function, HookShape::Jump));
        self.events.push(TraceEvent(Edge::Begin, function, 0));
    }

    fn enter(&mut self, function: u32, shape: HookShape, tick: u64) {
        self.removed += outside_half(self.correction, shape);
        let at = self.at(tick);
        self.removed += self.correction.inner_ticks(shape) / 2.0;
        self.open.push((function, shape));
        self.events.push(TraceEvent(Edge::Begin, function, at));
    }

    /// An exit closes the function's innermost open frame and every frame above it
    /// (left by an unwind); an exit of a function that is not open is ignored.
    fn exit(&mut self, function: u32, tick: u64) {
        let Some(depth) = self.open.iter().rposition(|&(f, _)| f == function) else {
            return;
        };
        let shape = self.open[depth].1;
        self.removed += self.correction.inner_ticks(shape) / 2.0;
        let at = self.at(tick);
        self.removed += outside_half(self.correction, shape);
        while self.open.len() > depth {
            let (closed, _) = self.open.pop().expect("depth < len");
            self.events.push(TraceEvent(Edge::End, closed, at));
        }
    }

    fn pause(&mut self, ticks: u64) {
        self.removed += ticks as f64;
    }

    /// Closes the frames still open at `end_tick` and returns the nested timeline.
    fn close_all(mut self, end_tick: u64) -> Vec<TraceEvent> {
        if !self.open.is_empty() {
            let at = self.at(end_tick);
            while let Some((function, _)) = self.open.pop() {
                self.events.push(TraceEvent(Edge::End, function, at));
            }
        }
        nest(&mut self.events);
        self.events
    }
}

/// Makes a balanced timeline's times non-decreasing and properly nested, outermost
/// frames first: each frame keeps its own begin and end unless they fall before the
/// previous event or after its parent's (settled) end, and is then moved just enough.
/// A frame's times are therefore never moved by its children's.
fn nest(events: &mut [TraceEvent]) {
    let mut end_of_begin = vec![0u64; events.len()];
    let mut open = Vec::new();
    for (index, event) in events.iter().enumerate() {
        match event.edge() {
            Edge::Begin => open.push(index),
            Edge::End => {
                if let Some(begin) = open.pop() {
                    end_of_begin[begin] = event.at_ns();
                }
            }
        }
    }
    let mut floor = 0u64;
    // The settled ends of the open frames, outermost first.
    let mut settled_ends: Vec<u64> = Vec::new();
    for (index, event) in events.iter_mut().enumerate() {
        let at = match event.edge() {
            Edge::Begin => {
                let ceiling = settled_ends.last().copied().unwrap_or(u64::MAX);
                let begin = event.at_ns().max(floor).min(ceiling);
                settled_ends.push(end_of_begin[index].max(begin).min(ceiling));
                begin
            }
            Edge::End => settled_ends.pop().unwrap_or(floor),
        };
        event.2 = at;
        floor = at;
    }
}

/// Half of the part of a hook of `shape` outside its call's own timestamps: it falls
/// before the entry's and after the exit's.
fn outside_half(correction: &Correction, shape: HookShape) -> f64 {
    ((correction.outer_ticks(shape) - correction.inner_ticks(shape)) / 2.0).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::cct::CctBuilder;
    use crate::profile::model::Calibration;
    use crate::profile::tests_support::{entry, exit, info, names, pause, unwind};

    /// 1 tick = 1 ns, `t_I` = 2 ns, `t_O` = 6 ns.
    fn calibration() -> Calibration {
        Calibration {
            tsc_hz: 1_000_000_000,
            inner_ns: 2.0,
            outer_ns: 6.0,
            inner_spread_ns: 0.0,
            outer_spread_ns: 0.0,
            ..Default::default()
        }
    }

    fn capture(events: &[Event], start: u64, seconds: f64, max: u64) -> Trace {
        let correction = Correction::new(&calibration()).unwrap();
        let mut capture = TraceCapture::new(start, 1_000_000_000, seconds, max);
        capture.push(1, events, Vec::new);
        capture.to_trace(&correction, &names(&["root", "mid", "leaf"]), |tid| {
            format!("t{tid}")
        })
    }

    fn durations(trace: &Trace) -> Vec<(String, u64)> {
        let mut open: Vec<TraceEvent> = Vec::new();
        let mut out = Vec::new();
        for event in &trace.threads[0].events {
            match event.edge() {
                Edge::Begin => open.push(*event),
                Edge::End => {
                    let begin = open.pop().unwrap();
                    assert_eq!(begin.function(), event.function());
                    out.push((
                        trace.function_name(event.function()).to_owned(),
                        event.at_ns() - begin.at_ns(),
                    ));
                }
            }
        }
        assert!(open.is_empty());
        out
    }

    #[test]
    fn frame_lengths_are_the_times_the_tree_charges() {
        let events = [
            entry(0, 1000),
            entry(1, 1100),
            entry(2, 1200),
            exit(2, 1300),
            pause(40),
            entry(2, 1400),
            exit(2, 1500),
            exit(1, 1700),
            exit(0, 2000),
        ];
        let trace = capture(&events, 1000, 1.0, 100);
        let mut builder = CctBuilder::new(calibration()).unwrap();
        builder.push_events(1, &events);
        let tree = builder.snapshot(&info(), &names(&["root", "mid", "leaf"]));
        let root = &tree.merged.roots[0];
        let mid = &root.children[0];
        let leaf = &mid.children[0];
        let lengths = durations(&trace);
        assert_eq!(lengths[0], ("leaf".to_owned(), 98));
        assert_eq!(lengths[1], ("leaf".to_owned(), 98));
        assert_eq!(lengths[0].1 + lengths[1].1, leaf.total_ns);
        assert_eq!(lengths[2], ("mid".to_owned(), mid.total_ns));
        assert_eq!(lengths[3], ("root".to_owned(), root.total_ns));
        assert_eq!(root.total_ns, 1000 - 40 - 2 - 3 * 6);
        // Non-decreasing.
        let times: Vec<u64> = trace.threads[0].events.iter().map(|e| e.at_ns()).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    }

    #[test]
    fn a_call_below_the_hook_cost_never_moves_its_parent() {
        // The leaf measures 1 tick against t_I = 2: on the corrected clock it ends
        // before it begins, and after its parent's end.
        let events = [
            entry(0, 1000),
            entry(2, 1100),
            exit(2, 1101),
            exit(0, 1103),
            entry(0, 1200),
            exit(0, 1300),
        ];
        let trace = capture(&events, 1000, 1.0, 100);
        let mut builder = CctBuilder::new(calibration()).unwrap();
        builder.push_events(1, &events);
        let tree = builder.snapshot(&info(), &names(&["root", "mid", "leaf"]));
        let root = &tree.merged.roots[0];
        let lengths = durations(&trace);
        assert_eq!(lengths[0], ("leaf".to_owned(), 0));
        assert_eq!(lengths[1], ("root".to_owned(), 103 - 2 - 6));
        assert_eq!(lengths[1].1 + lengths[2].1, root.total_ns);
        let times: Vec<u64> = trace.threads[0].events.iter().map(|e| e.at_ns()).collect();
        assert_eq!(times, [0, 95, 95, 95, 188, 286]);
    }

    #[test]
    fn the_trace_stops_at_its_deadline_and_closes_open_frames() {
        let events = [
            entry(0, 1000),
            entry(1, 1100),
            exit(1, 1200),
            entry(1, 3_000_000),
            exit(1, 3_000_100),
            exit(0, 4_000_000),
        ];
        let trace = capture(&events, 1000, 0.001, 100);
        let thread = &trace.threads[0].events;
        assert_eq!(thread.len(), 4);
        let last = thread.last().unwrap();
        assert_eq!((last.edge(), last.function()), (Edge::End, 0));
        // Closed at the deadline, 1 ms after the start, less the hooks removed.
        assert!(
            last.at_ns() > 990_000 && last.at_ns() <= 1_000_000,
            "{last:?}"
        );
        assert!(!trace.capped);
    }

    #[test]
    fn the_cap_ends_the_trace_and_is_said() {
        let events: Vec<Event> = (0..50)
            .flat_map(|i| [entry(1, 1000 + 10 * i), exit(1, 1005 + 10 * i)])
            .collect();
        let trace = capture(&events, 1000, 1.0, 11);
        assert!(trace.capped);
        // 11 raw events: 6 begins, 5 ends; the open one is closed.
        assert_eq!(trace.event_count(), 12);
        assert!(
            trace
                .summary()
                .contains("at most 11 raw events kept, reached")
        );
    }

    #[test]
    fn frames_open_at_the_start_begin_there_and_unwinds_close_frames_above() {
        let events = [
            entry(0, 10),
            entry(1, 20),
            entry(2, 1100),
            unwind(1, 1200),
            exit(0, 1300),
        ];
        let trace = capture(&events, 1000, 1.0, 100);
        let edges: Vec<(Edge, &str)> = trace.threads[0]
            .events
            .iter()
            .map(|e| (e.edge(), trace.function_name(e.function())))
            .collect();
        assert_eq!(
            edges,
            [
                (Edge::Begin, "root"),
                (Edge::Begin, "mid"),
                (Edge::Begin, "leaf"),
                (Edge::End, "leaf"),
                (Edge::End, "mid"),
                (Edge::End, "root"),
            ]
        );
        assert_eq!(trace.threads[0].events[0].at_ns(), 0);
        assert_eq!(trace.threads[0].name, "t1");
    }
}
