//! Moving the agent's events into the calling context trees, with the threads' off-CPU
//! intervals before them.
//!
//! The one idea: an off-CPU interval must reach a thread's tree before the events that
//! follow it. Each poll reads the TSC, then the context-switch records, then the agent's
//! rings. A thread is switched in before it runs, so every interval that ended before
//! that TSC reading is in by then; the events after it (the rings are read a moment
//! later) are held back to the next poll, when their intervals are in too.

use super::*;
use crate::terminal_text::say;
use std::time::Instant;

/// How long a poll reads rings before adaptive timing is judged again meanwhile.
const DRAIN_SLICE: std::time::Duration = std::time::Duration::from_millis(100);

/// Where one thread's stream of events stands within a drain, which may hand it over
/// in two slices (a ring that wrapped).
#[derive(Debug, Default, Clone, Copy)]
struct StreamCut {
    /// The stream passed the stop: what follows is dropped.
    past_stop: bool,
    /// Some of it is held back: what follows is held back too.
    holding: bool,
}

/// Divides a slice of a thread's events, which are in time order, into those the trees
/// get now and those held back to the next poll (from the first timed one after
/// `cutoff` on), dropping those after the stop. A ring that wrapped comes in two
/// slices: once the first was cut, the second follows its cut whole. The second
/// slice's first events are often untimed calls, which carry no timestamp; given now
/// while the first slice's end was held back, they were counted ahead of it, under the
/// wrong frame (a block's calls under the block before it).
fn divide<'e>(
    events: &'e [Event],
    stopped_at: Option<u64>,
    cutoff: u64,
    cut: &mut StreamCut,
) -> (&'e [Event], &'e [Event]) {
    if cut.past_stop {
        return (&[], &[]);
    }
    let first_from = |events: &[Event], limit: u64| {
        events
            .iter()
            .position(|e| e.has_timestamp() && e.value >= limit)
    };
    let mut events = events;
    if let Some(stop) = stopped_at
        && let Some(at) = first_from(events, stop.saturating_add(1))
    {
        events = &events[..at];
        cut.past_stop = true;
    }
    let split = match cut.holding {
        true => 0,
        false => first_from(events, cutoff).unwrap_or(events.len()),
    };
    let (now, later) = events.split_at(split);
    cut.holding |= !later.is_empty();
    (now, later)
}

/// What receives a thread's events (and keeps those held back): the recorder's fields,
/// borrowed apart from the rings.
struct Receivers<'a> {
    pid: i32,
    builder: &'a mut CctBuilder,
    trace: &'a mut Option<crate::profile::trace::TraceCapture>,
    gross: &'a mut Option<GrossTimes>,
    off_cpu: &'a mut Option<OffCpuWatch>,
    last_timestamps: &'a mut HashMap<i32, u64>,
    ring_threads: &'a mut HashMap<usize, i32>,
    held_back: &'a mut HashMap<i32, Vec<Event>>,
    call_sites: &'a mut call_sites::CallSites,
    symbols: &'a ProcessSymbols,
    rings: &'a Rings,
}

impl Recorder {
    /// Moves the rings' new events into the trees. Returns the number of events.
    ///
    /// A poll reads every ring once, however long that takes; while it does, adaptive
    /// timing is judged every [`DRAIN_SLICE`] or so, not only at its end. A thousand
    /// threads fill their rings faster than they are read until their hot tiny
    /// functions are untimed, and a poll of full rings takes seconds: judged only after
    /// it, they went on writing every call's events for those seconds.
    pub fn poll(&mut self) -> u64 {
        crate::recording::drain_priority::read_ahead_of_the_target();
        let cutoff = match self.off_cpu.is_some() {
            true => tsc::read(),
            false => u64::MAX,
        };
        self.map_new_segments();
        self.give_held_back();
        let mut drained = 0;
        let mut first_ring = 0;
        loop {
            let until = Instant::now() + DRAIN_SLICE;
            let Some((count, next_ring)) = self.drain_rings(first_ring, until, cutoff) else {
                return drained;
            };
            drained += count;
            self.events += count;
            match next_ring {
                Some(next) => {
                    first_ring = next;
                    self.judge_timing();
                }
                None => break,
            }
        }
        self.follow_late_modules();
        self.follow_in_situ();
        self.judge_timing();
        drained
    }

    /// Gives the trees the new events of the rings from `first_ring` on, events after
    /// `cutoff` held back, until `until` passes (see [`Rings::drain_from`]); `None`
    /// when there is nothing to read them into.
    fn drain_rings(
        &mut self,
        first_ring: usize,
        until: Instant,
        cutoff: u64,
    ) -> Option<(u64, Option<usize>)> {
        let stopped_at = self.stopped_at;
        let (rings, mut receivers) = self.receivers()?;
        let mut cuts: HashMap<i32, StreamCut> = HashMap::new();
        Some(rings.drain_from(first_ring, until, |ring, tid, events| {
            let cut = cuts.entry(tid).or_default();
            cut.holding |= receivers.held_back.contains_key(&tid);
            let (now, later) = divide(events, stopped_at, cutoff, cut);
            if !later.is_empty() {
                receivers
                    .held_back
                    .entry(tid)
                    .or_default()
                    .extend_from_slice(later);
            }
            if !now.is_empty() {
                receivers.note_ring_owner(ring, tid);
                receivers.give(tid, now);
            }
        }))
    }

    /// Maps the extra segments of rings the agent added since the last poll (every
    /// ring was taken by a live thread). A segment that cannot be had would leave its
    /// threads waiting for room for ever, so the recording stops, keeping its data.
    fn map_new_segments(&mut self) {
        let Some(rings) = self.rings.as_mut() else {
            return;
        };
        while rings.mapped_segments() < rings.published_segments() {
            let index = rings.mapped_segments() as u32 + 1;
            let fd = match self.session.request(&Request::RingSegment { index }) {
                Ok(Response::RingSegment { .. }) => self
                    .session
                    .take_received_descriptor()
                    .ok_or_else(|| "the agent sent no descriptor with its answer".to_string()),
                Ok(other) => Err(format!("the agent answered {other:?}")),
                Err(error) => Err(error.to_string()),
            };
            let mapped = fd.and_then(|fd| rings.add_segment(fd).map_err(|e| e.to_string()));
            if let Err(why) = mapped {
                say!(
                    "more threads record than the rings had room for, and ring segment \
                     {index} could not be mapped ({why}); the recording stops here"
                );
                let _ = self.end();
                return;
            }
        }
    }

    /// Reads the off-CPU intervals up to now, then gives the trees every event held
    /// back (call before the frames are ended at a pause or at the end).
    pub(super) fn give_held_back(&mut self) {
        let Some((_, mut receivers)) = self.receivers() else {
            return;
        };
        receivers.read_off_cpu();
        for (tid, events) in std::mem::take(receivers.held_back) {
            receivers.give(tid, &events);
        }
    }

    /// The rings, and what receives their events, borrowed apart.
    fn receivers(&mut self) -> Option<(&Rings, Receivers<'_>)> {
        let receivers = Receivers {
            pid: self.target.pid,
            builder: self.builder.as_mut()?,
            trace: &mut self.trace,
            gross: &mut self.gross,
            off_cpu: &mut self.off_cpu,
            last_timestamps: &mut self.last_timestamps,
            ring_threads: &mut self.ring_threads,
            held_back: &mut self.held_back,
            call_sites: &mut self.call_sites,
            symbols: &self.symbols,
            rings: self.rings.as_ref()?,
        };
        Some((self.rings.as_ref()?, receivers))
    }
}

impl Receivers<'_> {
    /// Gives the trees the off-CPU intervals read since the last time.
    fn read_off_cpu(&mut self) {
        if let Some(watch) = self.off_cpu.as_mut() {
            let builder = &mut *self.builder;
            watch.watch_own_thread();
            watch.drain(|off| {
                builder.push_off_cpu(off.tid, off.out_tsc, off.in_tsc, off.held_by_tendril)
            });
        }
    }

    /// A ring that changed hands: its old thread has exited, and its frames end at
    /// its last event.
    fn note_ring_owner(&mut self, ring: usize, tid: i32) {
        if let Some(old) = self.ring_threads.insert(ring, tid)
            && old != tid
            && let Some(&at) = self.last_timestamps.get(&old)
        {
            self.builder.finish_thread(old as u32, at);
        }
    }

    /// Gives thread `tid`'s next events to the trees, the trace and the gross times.
    fn give(&mut self, tid: i32, events: &[Event]) {
        if !self.last_timestamps.contains_key(&tid) {
            if let Some(watch) = self.off_cpu.as_mut() {
                watch.watch_thread(tid);
            }
            let name = crate::process::thread_name(self.pid, tid);
            self.builder.set_thread_name(tid as u32, name);
        }
        if let Some(last) = events.iter().rev().find(|e| e.has_timestamp()) {
            self.last_timestamps.insert(tid, last.value);
        }
        if let Some(trace) = self.trace.as_mut() {
            let builder = &*self.builder;
            trace.ignore_functions(builder.ignored_functions());
            trace.push(tid as u32, events, || builder.open_functions(tid as u32));
        }
        match self.call_sites.resolve(events, self.symbols, self.rings) {
            Some(resolved) => self.builder.push_events(tid as u32, &resolved),
            None => self.builder.push_events(tid as u32, events),
        }
        if let Some(gross) = self.gross.as_mut() {
            gross.push_events(tid, events);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tendril_wire::events::EventKind;

    fn call() -> Event {
        Event::new(EventKind::Call, 7, 0x1000)
    }

    fn timed(kind: EventKind, at: u64) -> Event {
        Event::new(kind, 3, at)
    }

    #[test]
    fn a_wrapped_rings_second_slice_follows_the_first_slices_hold_back() {
        let first = [call(), timed(EventKind::Entry, 5), call()];
        let second = [call(), call(), timed(EventKind::Exit, 9)];
        let mut cut = StreamCut::default();
        let (now, later) = divide(&first, None, 4, &mut cut);
        assert_eq!((now.len(), later.len()), (1, 2));
        // The untimed calls that open the second slice come after the entry held back.
        let (now, later) = divide(&second, None, 4, &mut cut);
        assert_eq!((now.len(), later.len()), (0, 3));
        // A stream not held back gives untimed calls now.
        let (now, later) = divide(&second, None, 10, &mut StreamCut::default());
        assert_eq!((now.len(), later.len()), (3, 0));
    }

    #[test]
    fn nothing_after_the_stop_is_given_even_in_a_wrapped_rings_second_slice() {
        let first = [
            timed(EventKind::Entry, 5),
            call(),
            timed(EventKind::Exit, 7),
            call(),
        ];
        let mut cut = StreamCut::default();
        let (now, later) = divide(&first, Some(6), u64::MAX, &mut cut);
        assert_eq!((now.len(), later.len()), (2, 0));
        let second = [call(), call()];
        let (now, later) = divide(&second, Some(6), u64::MAX, &mut cut);
        assert!(now.is_empty() && later.is_empty());
    }
}
