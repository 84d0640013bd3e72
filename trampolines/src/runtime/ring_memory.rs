//! A ring's memory, faulted in ahead of its producer: by the agent's raised thread when
//! there is one, else by the producer itself.
//!
//! The one idea: each 4 KiB of a ring's first lap costs its writer a page fault, so the
//! memory is faulted in a part at a time ahead of the head, and the ring limit stops at
//! the end of what is in memory (`ring::POPULATED`). A producer that reaches that end
//! faults the next part in itself, a wait tendril causes. On a thousand busy threads
//! such a producer is preempted inside its faults and holds its call for as long, so
//! when the agent's discoverer thread runs raised (`discoverer`), the producer asks it
//! first: halfway through the part in memory, its limit stops at a mark, where it posts
//! how far it wants the memory (`ring::POPULATE_WANTED`) and goes on. The discoverer
//! faults that part in while the producer writes the part before. Whoever faults a part
//! in holds the ring's `ring::POPULATE_LOCK`: faulting writes each page's first word
//! back, so the producer must not write there meanwhile, and the two never fault the
//! same part in twice.

use crate::runtime::ring_segments;
use crate::runtime::state::STATE;
use crate::runtime::thread_state::StatePtr;
use crate::sys;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64};
use tendril_wire::events::Event;
use tendril_wire::rings::{self, ring};

/// Events faulted in at a time ahead of the producer, at most: 256 KiB, 64 pages.
const POPULATE_EVENTS: u64 = 1 << 14;

/// Events faulted in first, when a thread takes a ring: one page. Each part after is
/// as large as all before it, up to [`POPULATE_EVENTS`]. A thousand threads entering a
/// root at once each faulted 256 KiB in at their first call (256 MB, queued on the
/// memory map's lock), which held that call for up to 0.2 s; a root call writes tens
/// of events.
const FIRST_POPULATE_EVENTS: u64 = 1 << 8;

/// Who holds a ring's `POPULATE_LOCK`.
const LOCK_FREE: u32 = 0;
const LOCK_PRODUCER: u32 = 1;
const LOCK_AGENT: u32 = 2;

/// The longest a producer sleeps at once while the agent faults its ring in (it is
/// woken as soon as the agent is done).
const LOCK_WAIT_NS: u64 = 1_000_000;

/// The part faulted in after `populated` events are: as many again, within bounds.
fn next_part(populated: u64) -> u64 {
    populated.clamp(FIRST_POPULATE_EVENTS, POPULATE_EVENTS)
}

/// Where a producer asks for the part after `populated`: halfway through the last.
fn ask_mark(populated: u64) -> u64 {
    populated.saturating_sub(next_part(populated) / 2)
}

/// Whether the agent's discoverer faults rings in for their producers now: it runs
/// raised, among enough threads that a producer may wait for a core.
fn agent_faults_in() -> bool {
    STATE.discoverer_raised.load(Acquire)
        && STATE.registered_count.load(Acquire) >= STATE.hand_over_from_threads.load(Acquire)
}

/// The end of the room the memory gives the producer of the ring at `ring_header`: the
/// end of what is in memory, or, when it should ask the agent for the next part and
/// has not yet, the mark where it asks.
pub fn room_end(ring_header: u64, capacity: u64) -> u64 {
    let populated = word_at(ring_header + ring::POPULATED as u64).load(Acquire);
    let wanted = word_at(ring_header + ring::POPULATE_WANTED as u64).load(Relaxed);
    if populated < capacity && wanted <= populated && agent_faults_in() {
        ask_mark(populated)
    } else {
        populated
    }
}

/// Faults the next part of the calling thread's ring in when its head has reached the
/// end of what is in memory (waiting, instead, for the agent if it is faulting that
/// part in now); then, past the mark, asks the agent for the part after. Returns the
/// TSC ticks the producer waited (0 when the memory was there).
pub fn fault_in_ahead(state: StatePtr) -> u64 {
    let ring_header = state.ring_header().load(Relaxed);
    let capacity = state.ring_mask().load(Relaxed) + 1;
    let populated = word_at(ring_header + ring::POPULATED as u64);
    let head = state.ring_head().load(Relaxed);
    let mut waited = 0;
    if head + 2 > populated.load(Acquire) {
        let started = sys::rdtsc();
        let lock = word32_at(ring_header + ring::POPULATE_LOCK as u64);
        while lock
            .compare_exchange(LOCK_FREE, LOCK_PRODUCER, Acquire, Relaxed)
            .is_err()
        {
            sys::futex_wait_timeout(lock, LOCK_AGENT, LOCK_WAIT_NS);
        }
        let until = populated.load(Acquire);
        if head + 2 > until {
            // Slot by slot from where the memory stops; the whole ring once a lap is in.
            let step = next_part(until);
            let from = until.max(head - head % step);
            let to = (from + step).max(head + 2);
            let events = state.ring_events().load(Relaxed);
            // SAFETY: the slots are inside the thread's mapped, writable, 16-byte aligned
            // ring, past its head (only this thread writes them, and not while it is
            // here), and this thread holds the ring's populate lock, so the agent does
            // not fault them in meanwhile.
            unsafe { fault_in_slots(events, from, to, capacity) };
            populated.store(if to >= capacity { u64::MAX } else { to }, Release);
        }
        lock.store(LOCK_FREE, Release);
        waited = sys::rdtsc().saturating_sub(started);
    }
    ask_ahead(ring_header, head, capacity);
    waited
}

/// Posts, past the mark, how far the producer of the ring at `ring_header` wants its
/// memory, and wakes the discoverer to fault it in.
fn ask_ahead(ring_header: u64, head: u64, capacity: u64) {
    let populated = word_at(ring_header + ring::POPULATED as u64).load(Acquire);
    let wanted = word_at(ring_header + ring::POPULATE_WANTED as u64);
    if populated >= capacity
        || wanted.load(Relaxed) > populated
        || head < ask_mark(populated)
        || !agent_faults_in()
    {
        return;
    }
    wanted.store((populated + next_part(populated)).min(capacity), Release);
    STATE.ring_memory_asked.store(true, Release);
    STATE.discovery_jobs_posted.fetch_add(1, Release);
    sys::futex_wake_all(&STATE.discovery_jobs_posted);
}

/// The discoverer's part: faults in, for every ring whose producer asked, the part it
/// wants (skipping a ring its producer is faulting in itself, to look again later).
///
/// It reads the rings' headers only when a producer asked since it last looked: each
/// header is a page of the rings file, and a walk over all of them, every time the
/// discoverer woke, made 512 KiB of headers resident (more with segments added) in a
/// target whose one thread had asked for nothing.
pub fn fault_in_what_rings_want() {
    let base = STATE.rings.load(Acquire);
    if base.is_null() || !STATE.ring_memory_asked.swap(false, AcqRel) {
        return;
    }
    for index in 0..ring_segments::ring_count() {
        let Some(ring_header) = ring_segments::ring_address(base, index) else {
            continue;
        };
        let populated = word_at(ring_header + ring::POPULATED as u64);
        let wanted = word_at(ring_header + ring::POPULATE_WANTED as u64).load(Acquire);
        if wanted <= populated.load(Acquire) {
            continue;
        }
        let lock = word32_at(ring_header + ring::POPULATE_LOCK as u64);
        if lock
            .compare_exchange(LOCK_FREE, LOCK_AGENT, Acquire, Relaxed)
            .is_err()
        {
            STATE.ring_memory_asked.store(true, Release);
            continue;
        }
        // A recording that ended gives its rings' memory back (`ring_segments`), under
        // the rings' lock: never fault it in again after that.
        let held = STATE.rings_fd.lock().unwrap_or_else(|p| p.into_inner());
        let from = populated.load(Acquire);
        let capacity = rings::ring_capacity(index) as u64;
        if STATE.recording_active.load(Acquire) != 0 && wanted > from {
            let events = ring_header + rings::RING_HEADER_BYTES as u64;
            // SAFETY: the slots from `from` on are inside the ring's mapped, writable,
            // 16-byte aligned events and past its producer's head (its limit stops at
            // `from`, and it writes nothing there while this thread holds the populate
            // lock, which it waits for); the controller reads only below the head.
            unsafe { fault_in_slots(events, from, wanted, capacity) };
            populated.store(if wanted >= capacity { u64::MAX } else { wanted }, Release);
        }
        drop(held);
        lock.store(LOCK_FREE, Release);
        sys::futex_wake_all(lock);
    }
}

/// Faults slots `[from, to)` of the ring whose events start at `events` in for writing
/// (within its `capacity`).
///
/// # Safety
/// As for [`sys::populate_for_writing`]: the slots are mapped and writable, and no one
/// writes them meanwhile.
unsafe fn fault_in_slots(events: u64, from: u64, to: u64, capacity: u64) {
    let (first, last) = (from.min(capacity), to.min(capacity));
    if first < last {
        let size = Event::SIZE as u64;
        // SAFETY: the caller's promise.
        unsafe { sys::populate_for_writing(events + first * size, (last - first) * size) };
    }
}

fn word_at(address: u64) -> &'static AtomicU64 {
    // SAFETY: `address` is an 8-byte ring header field inside the mapped rings file or
    // an extra segment, both mapped for the life of the process.
    unsafe { &*(address as *const AtomicU64) }
}

fn word32_at(address: u64) -> &'static AtomicU32 {
    // SAFETY: as in `word_at`, for a 4-byte field.
    unsafe { &*(address as *const AtomicU32) }
}
