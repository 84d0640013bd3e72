//! The shared memory a recording travels through: a header the agent fills in, the
//! function registry (id → address), and one single-producer ring of [`Event`]s per
//! recording thread.
//!
//! The one idea: the agent's hook stubs write events with plain stores and publish a
//! ring's `head` after each event; the controller reads up to `head`, then publishes
//! `tail`. Each index has a cache line of its own, so producer and consumer never
//! write the same line. The agent creates the memory (a sealed memfd, never a file in a
//! directory) and hands its descriptor to the controller over the control socket; both
//! map it and use the offsets below.
//!
//! [`Event`]: crate::events::Event

/// The file's first word.
pub const MAGIC: u64 = u64::from_le_bytes(*b"tendrlr1");

/// Bytes of the header page.
pub const HEADER_BYTES: usize = 4096;
/// Ids the function registry has room for (the agent's id limit).
pub const MAX_FUNCTIONS: usize = 1 << 18;
/// Where the registry starts: `u64` addresses indexed by function id (0 = none yet).
pub const REGISTRY_OFFSET: usize = HEADER_BYTES;
/// Where the per-function "invoked" bytes start (1 once the function ran in the graph).
pub const INVOKED_OFFSET: usize = REGISTRY_OFFSET + MAX_FUNCTIONS * 8;
/// Where the first ring starts.
pub const RINGS_OFFSET: usize = INVOKED_OFFSET + MAX_FUNCTIONS;
/// Rings in a file: threads that record at once.
pub const RING_COUNT: usize = 128;
/// Events per ring (a power of two): 8 MiB, a few tens of milliseconds of a thread
/// that does nothing but call instrumented functions.
pub const RING_EVENTS: usize = 1 << 19;
/// Events per ring of an extra segment (a power of two): 512 KiB. The file's rings go
/// to the first threads; past them rings are smaller, so that the rings of a thousand
/// threads that fill them (a drain that cannot keep up) hold 1.4 GiB rather than 8.
pub const SEGMENT_RING_EVENTS: usize = 1 << 15;

/// The events ring `index` holds (numbered as in [`ring_place`]).
pub const fn ring_capacity(index: usize) -> usize {
    if index < RING_COUNT {
        RING_EVENTS
    } else {
        SEGMENT_RING_EVENTS
    }
}

/// Bytes of a ring's header: tid/state, `head` and `tail` each on a line of its own.
pub const RING_HEADER_BYTES: usize = 256;
/// Bytes of one ring, header included.
pub const RING_BYTES: usize = RING_HEADER_BYTES + RING_EVENTS * crate::events::Event::SIZE;
/// Bytes of the whole file.
pub const FILE_BYTES: usize = RINGS_OFFSET + RING_COUNT * RING_BYTES;

/// Rings in each extra segment: a memfd of rings only, which the agent adds when every
/// ring is taken by a live thread (a thousand threads recording at once).
pub const SEGMENT_RINGS: usize = 256;
/// Bytes of an extra segment.
pub const SEGMENT_BYTES: usize = SEGMENT_RINGS * RING_BYTES;
/// Extra segments at most: with the file's own rings, [`MAX_RINGS`] threads record at
/// once (a ring whose thread has exited is taken over, so these are live threads).
pub const MAX_SEGMENTS: usize = 1024;
/// Rings at most, over the file and every extra segment.
pub const MAX_RINGS: usize = RING_COUNT + MAX_SEGMENTS * SEGMENT_RINGS;

/// Where ring `index` (numbered over the file, then the extra segments in order) lies:
/// its segment (0 for the file itself, `k` for the `k`-th extra one) and the offset of
/// its header there.
pub const fn ring_place(index: usize) -> (usize, usize) {
    if index < RING_COUNT {
        (0, ring_offset(index))
    } else {
        let extra = index - RING_COUNT;
        (
            1 + extra / SEGMENT_RINGS,
            (extra % SEGMENT_RINGS) * RING_BYTES,
        )
    }
}

/// Offsets of the header's fields (all `u64`, written by the agent unless noted).
pub mod header {
    /// [`super::MAGIC`].
    pub const MAGIC: usize = 0;
    /// Rings claimed so far (a ring once claimed stays its thread's).
    pub const RINGS_CLAIMED: usize = 8;
    /// Extra segments of rings the agent has added (see [`super::SEGMENT_RINGS`]):
    /// published once each is mapped, for the controller to ask for its memory.
    pub const SEGMENTS: usize = 240;
    /// Functions patched with a recording hook in this recording.
    pub const INSTRUMENTED: usize = 16;
    /// Functions that ran inside the call graph.
    pub const INVOKED: usize = 24;
    /// Indirect call sites (`call reg`, `call [mem]`, tail jumps through a pointer) met by
    /// discovery.
    pub const INDIRECT_CALL_SITES: usize = 32;
    /// Events that could not be written (no ring left for a thread).
    pub const LOST_EVENTS: usize = 40;
    /// TSC ticks threads spent waiting for discovery or ring space.
    pub const PAUSE_TICKS: usize = 48;
    /// Calibration, in TSC ticks: the inner time of an entry/exit pair.
    pub const INNER_TICKS: usize = 56;
    /// Calibration, in TSC ticks: the whole cost an instrumented call adds to its caller.
    pub const OUTER_TICKS: usize = 64;
    /// Calls that found their function's direct callees unpatchable (not instrumented).
    pub const REFUSED_CALLEES: usize = 72;
    /// Discoveries (first invocations that instrumented their callees) and their total
    /// pause in ticks.
    pub const DISCOVERIES: usize = 80;
    pub const DISCOVERY_TICKS: usize = 88;
    /// Calls whose return could not be hooked because the shadow stack was full.
    pub const SHADOW_OVERFLOWS: usize = 96;
    /// The most recent discovery pauses, in TSC ticks: a ring of
    /// [`DISCOVERY_SAMPLES`] words from [`DISCOVERY_SAMPLE_WORDS`], the next index
    /// (monotonic) at [`DISCOVERY_SAMPLE_NEXT`].
    pub const DISCOVERY_SAMPLE_NEXT: usize = 104;
    /// The TSC when the recording stopped (0 while it runs): the code is restored one
    /// function after another after it, so an event later than it belongs to no
    /// consistent cut of the threads and is not part of the recording.
    pub const STOPPED_AT_TICKS: usize = 112;
    /// Threads that reached a function while another thread was discovering it (or
    /// discovering another function), and waited (count and total ticks).
    pub const DISCOVERY_WAITS: usize = 120;
    pub const DISCOVERY_WAIT_TICKS: usize = 128;
    /// Indirect call sites met by discovery from which a thread was seen entering an
    /// instrumented function for the first time (a lower bound of the sites followed).
    pub const INDIRECT_SITES_FOLLOWED: usize = 136;
    /// Address-taken functions that ran inside the call graph (distinct targets of
    /// calls through pointers found).
    pub const INDIRECT_TARGETS: usize = 144;
    /// The functions the agent calibrates the hooks with on the target's own threads
    /// while the recording runs, one per [`HookShape`](crate::events::HookShape): a
    /// word each from here, the shape's index apart (its id + 1; 0 for none). Their
    /// events are tendril's, and the controller leaves them out of every tree.
    pub const IN_SITU_FUNCTIONS: usize = 152;
    /// In-situ calibration samples so far, per shape (monotonic; a word each from
    /// here): the most recent are a ring of [`IN_SITU_SAMPLES`] words per shape from
    /// [`IN_SITU_SAMPLE_WORDS`], each one batch's mean per call in 1/256 TSC ticks:
    /// inner time in the low 32 bits, the whole cost an instrumented call adds to its
    /// caller in the high 32 (see [`super::in_situ_sample`]).
    pub const IN_SITU_SAMPLE_NEXT: usize = 176;
    /// Ticks threads spent waiting for room in their full ring (the drain behind), and
    /// faulting their ring's memory in: two of the pauses `PAUSE_TICKS` sums.
    pub const RING_WAIT_TICKS: usize = 200;
    pub const RING_FAULT_TICKS: usize = 208;
    pub const IN_SITU_SAMPLE_WORDS: usize = 256;
    pub const IN_SITU_SAMPLES: usize = 10;
    const _: () = assert!(
        IN_SITU_SAMPLE_NEXT >= IN_SITU_FUNCTIONS + 8 * crate::events::HOOK_SHAPES
            && IN_SITU_SAMPLE_NEXT + 8 * crate::events::HOOK_SHAPES <= RING_WAIT_TICKS
            && RING_FAULT_TICKS + 8 <= SEGMENTS
            && SEGMENTS + 8 <= IN_SITU_SAMPLE_WORDS
            && IN_SITU_SAMPLE_WORDS + 8 * IN_SITU_SAMPLES * crate::events::HOOK_SHAPES
                <= DISCOVERY_SAMPLE_WORDS
    );

    /// The word holding the id + 1 of shape `shape`'s in-situ function.
    pub const fn in_situ_function(shape: usize) -> usize {
        IN_SITU_FUNCTIONS + 8 * shape
    }

    /// The word counting shape `shape`'s in-situ samples.
    pub const fn in_situ_sample_next(shape: usize) -> usize {
        IN_SITU_SAMPLE_NEXT + 8 * shape
    }

    /// The word of shape `shape`'s in-situ sample number `count` (kept while fewer
    /// than [`IN_SITU_SAMPLES`] came after it).
    pub const fn in_situ_sample(shape: usize, count: u64) -> usize {
        IN_SITU_SAMPLE_WORDS
            + 8 * (shape * IN_SITU_SAMPLES + (count % IN_SITU_SAMPLES as u64) as usize)
    }
    pub const DISCOVERY_SAMPLE_WORDS: usize = 512;
    pub const DISCOVERY_SAMPLES: usize = (super::HEADER_BYTES - DISCOVERY_SAMPLE_WORDS) / 8;
}

/// Offsets inside a ring's header.
pub mod ring {
    /// The producing thread's id (`i32`) and state (`u32`: [`super::RING_FREE`]...).
    pub const TID: usize = 0;
    pub const STATE: usize = 4;
    /// How far (`u64`, in the head's units) the ring's memory is known to be faulted
    /// in: the agent faults it in ahead of the producer, a part at a time, and past one
    /// lap all of it is (`u64::MAX`). The agent's alone; the controller never reads it.
    pub const POPULATED: usize = 8;
    /// How far (`u64`, as `POPULATED`) the producer wants its memory faulted in, asked
    /// of the agent's discoverer thread ahead of need; and who faults a part in now
    /// (`u32`: 0 no one, 1 the producer, 2 the agent). The agent's alone.
    pub const POPULATE_WANTED: usize = 32;
    pub const POPULATE_LOCK: usize = 40;
    /// The head (`u64`) at which the ring's thread next runs an in-situ calibration
    /// batch (0: not set yet). The agent's alone.
    pub const IN_SITU_NEXT: usize = 16;
    /// 1 (`u32`) while the ring's thread waits for room: it waits on the low half of
    /// [`TAIL`] (a futex), and the controller, after moving the tail, wakes it.
    pub const WAITING: usize = 24;
    /// Events written (`u64`, monotonic; the event index is `head` modulo the ring's
    /// [`super::ring_capacity`]).
    pub const HEAD: usize = 64;
    /// Events consumed by the controller (`u64`, written by the controller only).
    pub const TAIL: usize = 128;
}

/// One in-situ calibration batch's sample word: `(inner, outer)` ticks per call, in
/// 1/256 tick, packed as the header keeps them.
pub fn in_situ_sample(inner_ticks: f64, outer_ticks: f64) -> u64 {
    let fixed = |ticks: f64| (ticks.max(0.0) * 256.0).min(u32::MAX as f64) as u64;
    fixed(inner_ticks) | fixed(outer_ticks) << 32
}

/// The `(inner, outer)` ticks per call of an [`in_situ_sample`] word.
pub fn in_situ_ticks(sample: u64) -> (f64, f64) {
    (
        (sample & 0xffff_ffff) as f64 / 256.0,
        (sample >> 32) as f64 / 256.0,
    )
}

/// A ring's state: unused, or claimed by a thread.
pub const RING_FREE: u32 = 0;
pub const RING_ACTIVE: u32 = 1;

/// Offset of ring `index` in the file.
pub const fn ring_offset(index: usize) -> usize {
    RINGS_OFFSET + index * RING_BYTES
}

const _: () = assert!(RING_EVENTS.is_power_of_two());
const _: () = assert!(SEGMENT_RING_EVENTS.is_power_of_two() && SEGMENT_RING_EVENTS <= RING_EVENTS);

#[cfg(test)]
mod segment_tests {
    use super::*;

    #[test]
    fn rings_are_numbered_over_the_file_then_the_extra_segments() {
        assert_eq!(ring_place(0), (0, RINGS_OFFSET));
        assert_eq!(ring_place(RING_COUNT - 1), (0, ring_offset(RING_COUNT - 1)));
        assert_eq!(ring_place(RING_COUNT), (1, 0));
        assert_eq!(ring_place(RING_COUNT + 1), (1, RING_BYTES));
        assert_eq!(ring_place(RING_COUNT + SEGMENT_RINGS), (2, 0));
        assert_eq!(ring_place(MAX_RINGS - 1).0, MAX_SEGMENTS);
    }
}

#[cfg(test)]
mod in_situ_tests {
    use super::*;

    #[test]
    fn an_in_situ_sample_keeps_both_times_to_a_256th_of_a_tick() {
        let (inner, outer) = in_situ_ticks(in_situ_sample(23.5, 51.25));
        assert_eq!((inner, outer), (23.5, 51.25));
        assert_eq!(
            in_situ_ticks(in_situ_sample(-3.0, 1e12)).0,
            0.0,
            "clamped, never negative"
        );
        assert_eq!(in_situ_ticks(in_situ_sample(1.0 / 512.0, 0.0)), (0.0, 0.0));
    }
}
