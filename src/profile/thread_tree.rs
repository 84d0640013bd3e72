//! One thread's calling context tree, grown from its event stream.
//!
//! The one idea: a stack of open frames over the thread's [`CallArena`]. An entry finds
//! or creates the child context and pushes a frame; an exit pops it and charges the
//! invocation's corrected time (see `calibration`) to its node. A pause ("adjust" event)
//! must be removed from every open frame, so instead of touching them all the thread keeps
//! a running total of pauses and each frame remembers the total at its entry: the pause
//! inside a frame is the difference at its exit. Every event is O(1) (amortised).
//!
//! CPU time works the same way: the intervals the thread spent off the CPU (from the
//! kernel's context-switch records, [`ThreadTree::push_off_cpu`]) fall between two of
//! its events, since a thread records nothing while it is switched out. Each timed
//! event first takes in the intervals that ended before it, adding them to a running
//! total of off-CPU time, and a frame's CPU time is its wall time less the difference
//! of that total over the frame. A pause is already removed from wall time, so the
//! off-CPU time inside the same window as a pause (a parked thread sleeps) is counted
//! only beyond the pause's length.
//!
//! A thread's stream may begin in the middle of calls: the recording started, resumed,
//! was reset or changed its roots while the thread was inside the graph, so the exits of
//! the frames it was in come without their entries, and its next calls are made from
//! frames the tree never saw. Such calls are not roots of the tree: an entry of a
//! function that is not a root, with no recorded frame to nest in, opens a *discarded*
//! frame (no node, no time), and so do the calls made inside it, until it returns. The
//! tree therefore only ever holds contexts that start at a root.

use super::arena::{CallArena, TOP};
use super::calibration::Correction;
use super::untimed_calls::{UntimedChain, caller_and_count};
use std::collections::VecDeque;
use tendril_wire::events::{Event, EventKind, HOOK_SHAPES, HookShape, KIND_MASK};

const ENTRY: u32 = EventKind::Entry as u32;
const EXIT: u32 = EventKind::Exit as u32;
const UNWIND: u32 = EventKind::Unwind as u32;
const ADJUST: u32 = EventKind::Adjust as u32;
const RESUMED: u32 = EventKind::Resumed as u32;
const CALL: u32 = EventKind::Call as u32;

/// The node of a frame that is not recorded: a call made outside any recorded root
/// frame (see the module comment).
const DISCARDED: u32 = u32::MAX;

/// Which functions may start a context at the top of a tree.
pub trait RootFunctions {
    fn is_root(&self, function: u32) -> bool;

    /// The functions whose events are tendril's own (the in-situ calibration's), left
    /// out of the tree.
    fn ignored(&self) -> OwnFunctions {
        OwnFunctions::default()
    }
}

/// tendril's own functions in a recording, whose events are left out of the trees: the
/// in-situ calibration's, one per hook shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnFunctions([u32; HOOK_SHAPES]);

impl Default for OwnFunctions {
    fn default() -> Self {
        OwnFunctions([u32::MAX; HOOK_SHAPES])
    }
}

impl OwnFunctions {
    /// Function `id` calibrates hooks of `shape`.
    pub fn set(&mut self, shape: HookShape, id: u32) {
        self.0[shape as usize] = id;
    }

    pub fn contains(&self, function: u32) -> bool {
        self.0.contains(&function)
    }
}

/// An invocation that has been entered and not yet left.
#[derive(Debug, Clone, Copy)]
struct Frame {
    /// Its node, or [`DISCARDED`].
    node: u32,
    function: u32,
    /// How its function's entry reaches its hook, which decides the hook's `t_I`.
    shape: HookShape,
    entry_ts: u64,
    /// The thread's [`ThreadTree::paused_ticks`] when the frame was entered.
    paused_at_entry: u64,
    /// The thread's [`OffCpu::total`] when the frame was entered.
    off_cpu_at_entry: u64,
    /// The hook cost `t_O` of the instrumented calls made inside this invocation, at any
    /// depth, that have returned, each at the correction in force when it returned
    /// (with the frames still open above it, what the correction removes from it).
    descendant_outer_ticks: f64,
}

/// What one thread's stream contained, beyond the tree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadCounters {
    pub events: u64,
    /// Exits of a function that was not open (ignored).
    pub unmatched_exits: u64,
    /// Frames closed by an unwind, by an exit of a frame below them, or by `finish`.
    pub unwound_exits: u64,
    /// Events whose kind is none of the known ones (ignored).
    pub malformed_events: u64,
    /// The sum of all pauses.
    pub pause_ticks: u64,
    /// Of those, the waits for a core that tendril's own draining held.
    pub core_wait_ticks: u64,
    /// Exits of frames entered before the thread's stream began (a recording started,
    /// resumed or was reset inside them): expected, and ignored.
    pub stale_exits: u64,
    /// Calls seen outside any recorded root frame (and the calls inside them): made
    /// from frames entered before the stream began, so they are left out.
    pub discarded_calls: u64,
    /// Times the thread came back to a stack it had left (a coroutine resumed): the
    /// runs of `Resumed` events.
    pub stack_switches: u64,
    /// Frames closed (by an unwind) when their stack was left, that returned later:
    /// their times stop at the switch, and what they did after it is not theirs.
    pub dropped_frames: u64,
    /// Calls of untimed functions placed in the tree (`untimed_calls`).
    pub untimed_calls: u64,
}

/// Most off-CPU spans kept waiting for the thread's next event. A thread that switches
/// often and records nothing (it runs outside the roots) has its oldest spans merged in
/// pairs beyond this, so memory stays bounded; a merged span keeps its off-CPU length
/// exactly, and only an event falling inside it would see that length spread evenly.
const MAX_PENDING_OFF_CPU: usize = 4096;

/// Off-CPU time between `out` and `in` (TSC ticks): `off` ticks of it (all of it for
/// one switch; less for merged ones), of which `held` waited for a core tendril held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OffSpan {
    out: u64,
    back: u64,
    off: u64,
    held: u64,
}

impl OffSpan {
    /// The off-CPU ticks of this span that fall in `from..to`.
    fn off_within(&self, from: u64, to: u64) -> u64 {
        let (start, end) = (self.out.max(from), self.back.min(to));
        if end <= start {
            return 0;
        }
        let length = self.back - self.out;
        if self.off == length {
            end - start
        } else {
            (self.off as u128 * u128::from(end - start) / u128::from(length.max(1))) as u64
        }
    }

    /// The share of `held` in `off_part` of this span's off-CPU ticks.
    fn held_in(&self, off_part: u64) -> u64 {
        match self.off {
            0 => 0,
            off => (u128::from(self.held) * u128::from(off_part) / u128::from(off)) as u64,
        }
    }
}

/// The thread's time off the CPU (see the module comment).
#[derive(Debug, Clone, Default)]
struct OffCpu {
    /// Spans not yet reached by an event, in time order.
    pending: VecDeque<OffSpan>,
    /// Off-CPU ticks so far, less those inside pauses.
    total: u64,
    /// Pauses recorded since the latest timed event.
    paused_in_window: u64,
}

#[derive(Debug, Clone)]
pub struct ThreadTree {
    pub tid: u32,
    pub name: String,
    arena: CallArena,
    frames: Vec<Frame>,
    /// How many frames of each function id are open: finds an unmatched exit in O(1).
    open_per_function: Vec<u32>,
    /// All pauses so far, in ticks.
    paused_ticks: u64,
    off_cpu: OffCpu,
    /// The timestamp of the latest entry/exit/unwind: open frames count up to here.
    latest_ts: u64,
    /// Whether the latest event was `Resumed` (the next one continues the same switch).
    resuming: bool,
    /// Where the next untimed call goes (see `untimed_calls`).
    chain: UntimedChain,
    /// Whether a root has been entered since the stream began (until then, an exit
    /// with nothing open is a stale exit, not an unmatched one).
    joined: bool,
    counters: ThreadCounters,
}

impl ThreadTree {
    pub fn new(tid: u32) -> ThreadTree {
        ThreadTree {
            tid,
            name: String::new(),
            arena: CallArena::default(),
            frames: Vec::new(),
            open_per_function: Vec::new(),
            paused_ticks: 0,
            off_cpu: OffCpu::default(),
            latest_ts: 0,
            resuming: false,
            chain: UntimedChain::default(),
            joined: false,
            counters: ThreadCounters::default(),
        }
    }

    pub fn arena(&self) -> &CallArena {
        &self.arena
    }

    pub fn counters(&self) -> ThreadCounters {
        ThreadCounters {
            pause_ticks: self.paused_ticks,
            ..self.counters
        }
    }

    /// Frames still open.
    pub fn depth(&self) -> usize {
        self.frames.len()
    }

    /// The functions of the open frames, outermost first.
    pub fn open_functions(&self) -> Vec<u32> {
        self.frames.iter().map(|frame| frame.function).collect()
    }

    /// Applies a batch of this thread's events, in program order.
    pub fn push(
        &mut self,
        events: &[Event],
        correction: &Correction,
        roots: &(impl RootFunctions + ?Sized),
    ) {
        self.counters.events += events.len() as u64;
        let ignored = roots.ignored();
        for event in events {
            let kind = event.kind & KIND_MASK;
            if kind == ADJUST {
                self.paused_ticks += event.value;
                self.off_cpu.paused_in_window += event.value;
                continue;
            }
            if ignored.contains(event.function) {
                continue;
            }
            if kind == CALL {
                self.untimed_call(event, correction);
                continue;
            }
            self.chain.reset();
            if !self.off_cpu.pending.is_empty() || self.off_cpu.paused_in_window != 0 {
                self.take_off_cpu_until(event.value);
            }
            if kind == RESUMED {
                self.resumed(event.value);
                continue;
            }
            self.resuming = false;
            match kind {
                ENTRY => self.enter(event.function, event.hook_shape(), event.value, roots),
                EXIT => self.exit(event.function, event.value, false, correction),
                UNWIND => self.exit(event.function, event.value, true, correction),
                _ => self.counters.malformed_events += 1,
            }
        }
    }

    /// `count` calls of an untimed function (no timestamp): counted in the context of
    /// the innermost timed frame, whose time holds them and their hooks' cost.
    fn untimed_call(&mut self, event: &Event, correction: &Correction) {
        let (caller, count) = caller_and_count(event);
        let Some(top) = self.frames.last_mut().filter(|top| top.node != DISCARDED) else {
            self.counters.discarded_calls += count;
            return;
        };
        top.descendant_outer_ticks += count as f64 * correction.untimed_ticks();
        let frame = top.node;
        (self.chain).place(&mut self.arena, frame, event.function, caller, count);
        self.counters.untimed_calls += count;
    }

    /// Adds an interval the thread spent off the CPU, `out_tsc..in_tsc` (later than
    /// every interval given before), `held` ticks of which it waited for a core tendril
    /// held: those are a pause, removed from wall time too.
    pub fn push_off_cpu(&mut self, out_tsc: u64, in_tsc: u64, held: u64) {
        let pending = &mut self.off_cpu.pending;
        if pending.len() >= MAX_PENDING_OFF_CPU {
            // Merge the older half in pairs: the same off-CPU time in half the spans.
            let older: Vec<OffSpan> = pending.drain(..MAX_PENDING_OFF_CPU / 2).collect();
            for pair in older.chunks(2).rev() {
                let merged = match pair {
                    [a, b] => OffSpan {
                        out: a.out,
                        back: b.back,
                        off: a.off + b.off,
                        held: a.held + b.held,
                    },
                    [a] => *a,
                    _ => unreachable!("chunks of two"),
                };
                pending.push_front(merged);
            }
        }
        let back = in_tsc.max(out_tsc);
        pending.push_back(OffSpan {
            out: out_tsc,
            back,
            off: back - out_tsc,
            held: held.min(back - out_tsc),
        });
    }

    /// Takes in the off-CPU time before `ts` (a timed event's), since the latest one.
    #[cold]
    #[inline(never)]
    fn take_off_cpu_until(&mut self, ts: u64) {
        let window_start = self.latest_ts;
        let (mut off, mut held) = (0, 0);
        while let Some(&span) = self.off_cpu.pending.front() {
            if span.out >= ts {
                break;
            }
            let off_here = span.off_within(window_start, ts);
            off += off_here;
            held += span.held_in(off_here);
            if span.back <= ts {
                self.off_cpu.pending.pop_front();
            } else {
                // Ends after the event (the clocks' conversion is off by a hair, or a
                // merged span): the rest belongs to the next window.
                let before = span.off_within(span.out, ts);
                self.off_cpu.pending[0] = OffSpan {
                    out: ts,
                    back: span.back,
                    off: span.off - before,
                    held: span.held - span.held_in(before),
                };
                break;
            }
        }
        // A wait for a core tendril held is a pause, unless it fell inside one of the
        // agent's own (which measured it already): as for the off-CPU time, the pauses
        // of the window are taken to overlap it.
        let paused = std::mem::take(&mut self.off_cpu.paused_in_window);
        // Only while a recorded frame is open is it a pause removed from anything (a
        // discarded frame opens only where no recorded one is, so the top one tells).
        let in_a_recorded_frame = self.frames.last().is_some_and(|f| f.node != DISCARDED);
        let held_beyond_pauses = match in_a_recorded_frame {
            true => held.saturating_sub(paused),
            false => 0,
        };
        self.paused_ticks += held_beyond_pauses;
        self.counters.core_wait_ticks += held_beyond_pauses;
        self.off_cpu.total += off.saturating_sub(paused + held_beyond_pauses);
    }

    #[inline]
    fn enter(
        &mut self,
        function: u32,
        shape: HookShape,
        ts: u64,
        roots: &(impl RootFunctions + ?Sized),
    ) {
        self.latest_ts = ts;
        let node = match self.frames.last() {
            Some(caller) if caller.node != DISCARDED => {
                let node = self.arena.child(caller.node, function);
                self.arena.node_mut(node).calls += 1;
                node
            }
            _ => self.enter_outside_roots(function, roots),
        };
        match self.open_per_function.get_mut(function as usize) {
            Some(open) => *open += 1,
            None => self.first_open_of(function),
        }
        self.frames.push(Frame {
            node,
            function,
            shape,
            entry_ts: ts,
            paused_at_entry: self.paused_ticks,
            off_cpu_at_entry: self.off_cpu.total,
            descendant_outer_ticks: 0.0,
        });
    }

    /// An entry with no recorded frame to nest in: a root starts a context at the top;
    /// anything else was called from frames the tree never saw, and is discarded.
    #[cold]
    #[inline(never)]
    fn enter_outside_roots(&mut self, function: u32, roots: &(impl RootFunctions + ?Sized)) -> u32 {
        if roots.is_root(function) {
            self.joined = true;
            let node = self.arena.child(TOP, function);
            self.arena.node_mut(node).calls += 1;
            node
        } else {
            self.counters.discarded_calls += 1;
            DISCARDED
        }
    }

    /// A frame closed earlier by an unwind returned after all: its stack had been left
    /// and is running again. Consecutive ones are one switch back to that stack.
    #[cold]
    fn resumed(&mut self, ts: u64) {
        self.latest_ts = self.latest_ts.max(ts);
        self.counters.dropped_frames += 1;
        self.counters.stack_switches += u64::from(!self.resuming);
        self.resuming = true;
    }

    #[cold]
    fn first_open_of(&mut self, function: u32) {
        self.open_per_function.resize(function as usize + 1, 0);
        self.open_per_function[function as usize] = 1;
    }

    #[inline]
    fn exit(&mut self, function: u32, ts: u64, unwound: bool, correction: &Correction) {
        self.latest_ts = ts;
        match self.frames.last() {
            Some(top) if top.function == function => self.close_top(ts, unwound, correction),
            _ => self.exit_below_top(function, ts, unwound, correction),
        }
    }

    /// An exit of a function that is not the innermost open frame: the frames above it
    /// were left without an exit event (unwound); if it is not open at all, ignore it.
    #[cold]
    #[inline(never)]
    fn exit_below_top(&mut self, function: u32, ts: u64, unwound: bool, correction: &Correction) {
        let open = self.open_per_function.get(function as usize).copied();
        if open.unwrap_or(0) == 0 {
            if self.joined || !self.frames.is_empty() {
                self.counters.unmatched_exits += 1;
            } else {
                self.counters.stale_exits += 1;
            }
            return;
        }
        while self
            .frames
            .last()
            .is_some_and(|top| top.function != function)
        {
            self.close_top(ts, true, correction);
        }
        self.close_top(ts, unwound, correction);
    }

    #[inline]
    fn close_top(&mut self, ts: u64, unwound: bool, correction: &Correction) {
        let Some(frame) = self.frames.pop() else {
            return;
        };
        self.open_per_function[frame.function as usize] -= 1;
        if frame.node == DISCARDED {
            return;
        }
        let (charged, charged_cpu) =
            self.charge_at(&frame, ts, frame.descendant_outer_ticks, correction);
        let node = self.arena.node_mut(frame.node);
        node.total_ticks += charged;
        node.cpu_ticks += charged_cpu;
        if let Some(caller) = self.frames.last_mut() {
            // Every hook below a frame ran inside its time.
            caller.descendant_outer_ticks += outer_of_call(&frame, correction);
        }
        self.counters.unwound_exits += u64::from(unwound);
    }

    /// The corrected wall and CPU times of `frame` if it ended at `ts`, with
    /// `outer_inside` ticks of hook cost from the instrumented calls made inside it.
    #[inline]
    fn charge_at(
        &self,
        frame: &Frame,
        ts: u64,
        outer_inside: f64,
        correction: &Correction,
    ) -> (f64, f64) {
        let paused = self.paused_ticks - frame.paused_at_entry;
        let measured = ts.saturating_sub(frame.entry_ts).saturating_sub(paused);
        let off_cpu = self.off_cpu.total - frame.off_cpu_at_entry;
        (
            correction.charge(measured, frame.shape, outer_inside),
            correction.charge(measured.saturating_sub(off_cpu), frame.shape, outer_inside),
        )
    }

    /// Closes every open frame as unwound at `at_ts` (the thread exited, or recording
    /// ended).
    pub fn finish(&mut self, at_ts: u64, correction: &Correction) {
        self.latest_ts = self.latest_ts.max(at_ts);
        while !self.frames.is_empty() {
            self.close_top(at_ts, true, correction);
        }
    }

    /// The recording stopped watching this thread at `at_ts` (a pause, a root change,
    /// a detach): every open frame ends there, and the stream that follows, if any,
    /// begins afresh — the exits of those frames will come without their entries, and
    /// calls made inside them are not nested under them (see the module comment).
    pub fn stop_watching(&mut self, at_ts: u64, correction: &Correction) {
        self.finish(at_ts, correction);
        self.joined = false;
        self.resuming = false;
    }

    /// Every node's total in ticks as of now: completed invocations, plus the frames
    /// still open counted up to the latest event. Read-only.
    pub fn totals_now(&self, correction: &Correction) -> Vec<f64> {
        self.times_now(correction, false)
    }

    /// [`ThreadTree::totals_now`] for on-CPU time.
    pub fn cpu_totals_now(&self, correction: &Correction) -> Vec<f64> {
        self.times_now(correction, true)
    }

    fn times_now(&self, correction: &Correction, cpu: bool) -> Vec<f64> {
        let mut totals: Vec<f64> = self
            .arena
            .nodes()
            .iter()
            .map(|n| if cpu { n.cpu_ticks } else { n.total_ticks })
            .collect();
        // The frames open above a frame are calls made inside it too.
        let mut open_above = 0.0;
        for frame in self.frames.iter().rev() {
            if frame.node == DISCARDED {
                continue;
            }
            let outer_inside = frame.descendant_outer_ticks + open_above;
            let (wall, on_cpu) = self.charge_at(frame, self.latest_ts, outer_inside, correction);
            totals[frame.node as usize] += if cpu { on_cpu } else { wall };
            open_above += outer_of_call(frame, correction);
        }
        totals
    }
}

/// The hook cost a frame's caller is charged for it: its own call's `t_O`, and the
/// calls made inside it.
#[inline]
fn outer_of_call(frame: &Frame, correction: &Correction) -> f64 {
    frame.descendant_outer_ticks + correction.outer_ticks(frame.shape)
}
