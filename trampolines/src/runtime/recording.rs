//! The recording's shared memory: the rings file (`tendril_wire::rings`), a ring per
//! recording thread, and the events agent code writes itself.
//!
//! The agent creates the memory once (a sealed memfd, handed to the controller over the
//! control socket) and keeps it mapped for the life of the process: a hook still running after a
//! recording ended may write one more event, and must find memory there. A thread
//! claims a ring the first time it records and keeps it; a new recording simply starts
//! reading every ring from where its producer is (stale events left by frames of an
//! older recording are exits without entries, which the controller ignores).
//!
//! The one idea of the write protocol, shared with the hook stubs: the producer owns
//! `ring_head` and `ring_limit` in its thread state; it writes the 16-byte event at
//! `head % capacity`, then publishes `head + 1` in the ring header. Only when `head`
//! reaches `ring_limit` does it read the consumer's `tail` again, and if the ring is
//! really full it waits — the wait is tendril's pause, reported as an Adjust event.
//! The limit also stops at the end of the ring memory faulted in so far, which the same
//! slow path (or the agent's discoverer thread, `ring_memory`) extends ahead of the
//! producer, so the hooks never take a page fault.

use crate::runtime::ring_memory;
use crate::runtime::ring_segments;
use crate::runtime::state::STATE;
use crate::runtime::thread_state::{StatePtr, current_state};
use crate::sys;
use crate::sys::error::AgentError;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use tendril_wire::events::{Event, EventKind, HOOK_SHAPES, HookShape};
use tendril_wire::rings::{self, header, ring};

/// The mapped file's base, if there is one.
fn base() -> Option<*mut u8> {
    let base = STATE.rings.load(Ordering::Acquire);
    (!base.is_null()).then_some(base)
}

/// A `u64` of the file, as an atomic.
fn word(offset: usize) -> Option<&'static AtomicU64> {
    // SAFETY: the file is mapped for the life of the process and `offset` is one of the
    // 8-byte-aligned offsets of the layout, inside the file.
    base().map(|base| unsafe { &*(base.add(offset) as *const AtomicU64) })
}

/// Adds `amount` to a header counter.
pub fn add_to_header(field: usize, amount: u64) {
    if let Some(counter) = word(field) {
        counter.fetch_add(amount, Ordering::Relaxed);
    }
}

/// Keeps one discovery pause in the header's sample ring.
pub fn sample_discovery(ticks: u64) {
    if let Some(next) = word(header::DISCOVERY_SAMPLE_NEXT) {
        let index = next.fetch_add(1, Ordering::AcqRel) as usize % header::DISCOVERY_SAMPLES;
        set_header(header::DISCOVERY_SAMPLE_WORDS + index * 8, ticks);
    }
}

/// Sets a header field.
pub fn set_header(field: usize, value: u64) {
    if let Some(counter) = word(field) {
        counter.store(value, Ordering::Relaxed);
    }
}

/// Creates (once per process) and maps the rings' memory; returns a descriptor of it for
/// the controller. The memory is a memfd, not a file: nothing of it appears in a
/// directory, so nothing there can be swapped for something else, and nothing is left
/// behind when the process ends. It is sealed against shrinking and growing, so the
/// controller's mapping can never lose its pages under it (no `SIGBUS`).
pub fn open_rings() -> Result<std::os::fd::OwnedFd, AgentError> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let mut held = STATE.rings_fd.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(fd) = held.as_ref()
        && base().is_some()
    {
        return fd
            .try_clone()
            .map_err(|e| AgentError::io("cannot share the rings", e));
    }
    let fail = |what: &str| AgentError::last_os(format!("cannot {what} the rings"));
    // SAFETY: memfd_create reads a valid NUL-terminated name and returns a new fd or -1.
    let raw = unsafe {
        libc::memfd_create(
            c"tendril-rings".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if raw < 0 {
        return Err(fail("create"));
    }
    // SAFETY: `raw` is a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: plain system calls on the descriptor owned by `fd`.
    let sized = unsafe { libc::ftruncate(fd.as_raw_fd(), rings::FILE_BYTES as libc::off_t) };
    if sized != 0 {
        return Err(fail("size"));
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(fail("seal"));
    }
    // SAFETY: maps the whole memfd, which has just been sized (and can no longer
    // shrink); shared, so the controller sees the writes. Never unmapped (see the
    // module comment).
    let mapped = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            rings::FILE_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if mapped == libc::MAP_FAILED {
        return Err(fail("map"));
    }
    STATE.rings.store(mapped.cast(), Ordering::Release);
    set_header(header::MAGIC, rings::MAGIC);
    crate::patching::patcher::for_each_id(register_function);
    let shared = fd
        .try_clone()
        .map_err(|e| AgentError::io("cannot share the rings", e))?;
    // In a forked child this drops the parent's descriptor inherited by the fork.
    *held = Some(fd);
    Ok(shared)
}

/// Starts a recording: clears the statistics and the invoked flags, and lets threads
/// claim rings.
pub fn start() {
    for field in [
        header::INSTRUMENTED,
        header::INVOKED,
        header::INDIRECT_CALL_SITES,
        header::LOST_EVENTS,
        header::PAUSE_TICKS,
        header::REFUSED_CALLEES,
        header::DISCOVERIES,
        header::DISCOVERY_TICKS,
        header::SHADOW_OVERFLOWS,
        header::DISCOVERY_SAMPLE_NEXT,
        header::STOPPED_AT_TICKS,
        header::DISCOVERY_WAITS,
        header::DISCOVERY_WAIT_TICKS,
        header::RING_WAIT_TICKS,
        header::RING_FAULT_TICKS,
        header::INDIRECT_SITES_FOLLOWED,
        header::INDIRECT_TARGETS,
    ] {
        set_header(field, 0);
    }
    for shape in 0..HOOK_SHAPES {
        set_header(header::in_situ_function(shape), 0);
        set_header(header::in_situ_sample_next(shape), 0);
    }
    // Byte by byte, as the stubs and `mark_invoked` access them: a hook of a frame
    // from an earlier recording may mark one meanwhile.
    for id in 0..rings::MAX_FUNCTIONS as u32 {
        if let Some(flag) = invoked_flag(id) {
            flag.store(0, Relaxed);
        }
    }
    STATE.recording_generation.fetch_add(1, Ordering::AcqRel);
    STATE.recording_active.store(1, Ordering::Release);
}

/// The recording now (or last) running, as [`start`] numbers them.
pub fn generation() -> u64 {
    STATE.recording_generation.load(Ordering::Acquire)
}

/// Address of the word [`generation`] reads (the recording hooks read it in place).
pub fn generation_word() -> u64 {
    &STATE.recording_generation as *const AtomicU64 as u64
}

/// Ends a recording: marks where it ends (before any code is restored), and threads
/// without a ring no longer claim one.
pub fn stop() {
    set_header(header::STOPPED_AT_TICKS, sys::rdtsc());
    STATE.recording_active.store(0, Ordering::Release);
}

/// In a forked child: the rings are shared with the parent, so the child must never
/// write to them. The only thread of the child lets go of its ring, and no ring can be
/// claimed any more (the child's code is restored; only frames still open at the fork
/// can run a hook, and their events are dropped).
pub fn forget_in_forked_child() {
    STATE.recording_active.store(0, Ordering::Release);
    ring_segments::forget_in_forked_child();
    if let Some(state) = current_state() {
        // After fork only this thread exists, and this is its own state.
        state.ring_events().store(0, Relaxed);
        state.ring_head().store(0, Relaxed);
        state.ring_limit().store(0, Relaxed);
        state.ring_room_limit().store(0, Relaxed);
    }
    STATE.rings.store(std::ptr::null_mut(), Ordering::Release);
}

/// Address of the invoked bytes (the stubs test `invoked[id]`), or 0 before a file.
pub fn invoked_table() -> u64 {
    base().map_or(0, |base| base as u64 + rings::INVOKED_OFFSET as u64)
}

/// Function `id`'s invoked byte. The stubs test it with a plain byte load; agent code
/// reads and writes it only through this atomic, never with plain or volatile accesses.
fn invoked_flag(id: u32) -> Option<&'static AtomicU8> {
    let base = base()?;
    if id as usize >= rings::MAX_FUNCTIONS {
        return None;
    }
    // SAFETY: the byte lies inside the mapped file's invoked table, mapped for the life
    // of the process; every access to it from Rust is atomic.
    Some(unsafe { AtomicU8::from_ptr(base.add(rings::INVOKED_OFFSET + id as usize)) })
}

/// Whether function `id` has run inside the call graph; marks it so.
pub fn mark_invoked(id: u32) -> bool {
    let Some(flag) = invoked_flag(id) else {
        return false;
    };
    let was = flag.swap(1, Ordering::AcqRel);
    if was == 0 {
        add_to_header(header::INVOKED, 1);
    }
    was != 0
}

/// Marks function `id` invoked without counting it (tendril's own calibration).
pub fn set_invoked_quietly(id: u32) {
    if let Some(flag) = invoked_flag(id) {
        flag.store(1, Ordering::Release);
    }
}

/// Whether function `id` is marked as invoked.
pub fn is_invoked(id: u32) -> bool {
    invoked_flag(id).is_some_and(|flag| flag.load(Ordering::Acquire) != 0)
}

/// The address registered for function `id`.
pub fn registered_address(id: u32) -> Option<u64> {
    if id as usize >= rings::MAX_FUNCTIONS {
        return None;
    }
    word(rings::REGISTRY_OFFSET + id as usize * 8)
        .map(|entry| entry.load(Ordering::Acquire))
        .filter(|&address| address != 0)
}

/// Records function `id`'s address in the registry, for the controller to name it.
pub fn register_function(id: u32, address: u64) {
    if (id as usize) < rings::MAX_FUNCTIONS
        && let Some(entry) = word(rings::REGISTRY_OFFSET + id as usize * 8)
    {
        entry.store(address, Ordering::Release);
    }
}

/// Gives the calling thread a ring (a free one, or one whose thread has exited and
/// whose events were all read), adding a segment of rings when every one is taken
/// (`ring_segments`). Signal-safe, no allocation.
///
/// A thousand threads may claim at once (a root's hook going in): each looks for a
/// free ring from where the last claim ended, and one thread at a time looks for the
/// rings of exited threads (a system call per ring); the others add a segment or wait
/// for the one being added. Walking every ring, and asking after every ring's thread,
/// in each of a thousand threads held their first root call for up to 0.3 s.
fn claim_ring(state: StatePtr) -> bool {
    let Some(base) = base() else { return false };
    loop {
        if STATE.recording_active.load(Ordering::Acquire) == 0 {
            return false;
        }
        let segments = ring_segments::segment_count();
        let count = ring_segments::rings_in(segments);
        let hint = STATE.claim_hint.load(Ordering::Relaxed).min(count);
        let free = (hint..count).chain(0..hint).find(|&index| {
            ring_segments::ring_address(base, index).is_some_and(|ring| {
                take_ring(state, ring, rings::ring_capacity(index) as u64, false)
            })
        });
        let claimed = free.or_else(|| reclaim_one(state, base, count));
        if let Some(index) = claimed {
            STATE.claim_hint.store(index + 1, Ordering::Relaxed);
            add_to_header(header::RINGS_CLAIMED, 1);
            return true;
        }
        if !ring_segments::add_segment(segments, |count| set_header(header::SEGMENTS, count)) {
            return false;
        }
    }
}

/// Takes over one of the first `count` rings whose thread has exited, unless another
/// thread is looking for one already; returns its index.
fn reclaim_one(state: StatePtr, base: *mut u8, count: usize) -> Option<usize> {
    if STATE
        .reclaiming
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return None;
    }
    let found = (0..count).find(|&index| {
        ring_segments::ring_address(base, index)
            .is_some_and(|ring| take_ring(state, ring, rings::ring_capacity(index) as u64, true))
    });
    STATE.reclaiming.store(false, Ordering::Release);
    found
}

/// Takes the ring whose header is at `ring`, of `capacity` events, for the calling
/// thread, if it is free or, when `reclaiming`, if its thread is gone and its events
/// were read.
fn take_ring(state: StatePtr, ring: u64, capacity: u64, reclaiming: bool) -> bool {
    let ring_state = word32_at(ring + ring::STATE as u64);
    let claimed = if reclaiming {
        reclaim(ring, ring_state)
    } else {
        ring_state
            .compare_exchange(
                rings::RING_FREE,
                rings::RING_ACTIVE,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    };
    if !claimed {
        return false;
    }
    word32_at(ring + ring::TID as u64).store(state.tid().load(Relaxed) as u32, Ordering::Release);
    let head = word_at(ring + ring::HEAD as u64).load(Ordering::Acquire);
    let tail = word_at(ring + ring::TAIL as u64).load(Ordering::Acquire);
    state.ring_header().store(ring, Relaxed);
    let events = ring + rings::RING_HEADER_BYTES as u64;
    state.ring_events().store(events, Relaxed);
    state.ring_mask().store(capacity - 1, Relaxed);
    state.ring_head().store(head, Relaxed);
    state.ring_limit().store(tail + capacity, Relaxed);
    word_at(ring + ring::IN_SITU_NEXT as u64).store(head + FIRST_IN_SITU_BATCH_AFTER, Relaxed);
    true
}

/// Events a thread writes into a ring it claimed before its first in-situ calibration
/// batch (`in_situ`).
const FIRST_IN_SITU_BATCH_AFTER: u64 = 1 << 12;

/// Takes over the ring whose header is at `ring` if its thread is gone and its events
/// were read.
fn reclaim(ring: u64, ring_state: &AtomicU32) -> bool {
    let tid = word32_at(ring + ring::TID as u64);
    let (head, tail) = (
        word_at(ring + ring::HEAD as u64),
        word_at(ring + ring::TAIL as u64),
    );
    let owner = tid.load(Ordering::Acquire) as i32;
    ring_state.load(Ordering::Acquire) == rings::RING_ACTIVE
        && owner > 0
        && head.load(Ordering::Acquire) == tail.load(Ordering::Acquire)
        && !sys::thread_exists(owner)
        && tid
            .compare_exchange(owner as u32, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
}

/// Makes room for one event in the calling thread's ring: claims a ring if it has none,
/// and waits for the controller if the ring is full. Returns false if the event must
/// be dropped (no ring to be had); the wait, if any, is recorded as an Adjust event.
pub fn make_room(state: StatePtr) -> bool {
    // After a recording, the frames still open write their exits into nothing: they
    // are not lost, the recording is over.
    let active = STATE.recording_active.load(Ordering::Acquire) != 0;
    if state.ring_events().load(Relaxed) == 0 && !claim_ring(state) {
        if active {
            add_to_header(header::LOST_EVENTS, 1);
        }
        return false;
    }
    let ring_header = state.ring_header().load(Relaxed);
    let tail = word_at(ring_header + ring::TAIL as u64);
    let capacity = ring_capacity(state);
    let mut waited_from = 0;
    loop {
        let limit = tail.load(Ordering::Acquire) + capacity;
        // Room for the event, and for the Adjust event of a wait.
        let needed = if waited_from == 0 { 1 } else { 2 };
        if state.ring_head().load(Relaxed) + needed <= limit {
            state.ring_limit().store(limit, Relaxed);
            break;
        }
        if waited_from == 0 {
            waited_from = sys::rdtsc();
        }
        if STATE.recording_active.load(Ordering::Acquire) == 0 {
            return false;
        }
        wait_for_the_drain(
            ring_header,
            state.ring_head().load(Relaxed) + needed - capacity,
        );
    }
    if waited_from != 0 {
        let waited = sys::rdtsc().saturating_sub(waited_from);
        add_to_header(header::PAUSE_TICKS, waited);
        add_to_header(header::RING_WAIT_TICKS, waited);
        write_event(state, Event::new(EventKind::Adjust, 0, waited));
    }
    let faulting = ring_memory::fault_in_ahead(state);
    if faulting != 0 {
        add_to_header(header::PAUSE_TICKS, faulting);
        add_to_header(header::RING_FAULT_TICKS, faulting);
        write_event(state, Event::new(EventKind::Adjust, 0, faulting));
    }
    update_limit(state);
    true
}

/// The events the calling thread's ring holds.
fn ring_capacity(state: StatePtr) -> u64 {
    state.ring_mask().load(Relaxed) + 1
}

/// The longest a thread waits for room before it looks again by itself: the controller
/// wakes it as soon as it reads the ring; this only bounds a wake-up that never comes
/// (a recording ending, a controller gone).
const ROOM_WAIT_NS: u64 = 20_000_000;

/// Sleeps until the controller has read the ring at `ring_header` up to `wanted_tail`
/// (or for [`ROOM_WAIT_NS`]). A thousand threads whose rings are full must not poll: a
/// sleep of a few microseconds each, over and over, kept both cores busy scheduling
/// them and starved the very drain they waited for. The thread sleeps on the tail's
/// low half (a futex in the shared memory), and says so in the ring's `WAITING` word
/// for the controller, which wakes it after it moves the tail.
fn wait_for_the_drain(ring_header: u64, wanted_tail: u64) {
    let tail = word_at(ring_header + ring::TAIL as u64);
    let tail_low = word32_at(ring_header + ring::TAIL as u64);
    let waiting = word32_at(ring_header + ring::WAITING as u64);
    waiting.store(1, Ordering::SeqCst);
    // Read after saying so: a tail the controller moves from now on is followed by its
    // wake-up, and one moved before is seen here.
    let seen = tail.load(Ordering::SeqCst);
    if seen < wanted_tail {
        sys::futex_wait_shared_timeout(tail_low, seen as u32, ROOM_WAIT_NS);
    }
    waiting.store(0, Ordering::Relaxed);
}

/// Where the calling thread's ring stops having room for its producer: its free slots
/// that are in memory end at `end`; the next in-situ calibration batch is due at the
/// head `in_situ_next` holds.
pub struct RingRoom {
    pub end: u64,
    pub in_situ_next: &'static AtomicU64,
}

pub fn ring_room(state: StatePtr) -> RingRoom {
    let ring_header = state.ring_header().load(Relaxed);
    let tail = word_at(ring_header + ring::TAIL as u64).load(Ordering::Acquire);
    let capacity = ring_capacity(state);
    RingRoom {
        end: (tail + capacity).min(ring_memory::room_end(ring_header, capacity)),
        in_situ_next: word_at(ring_header + ring::IN_SITU_NEXT as u64),
    }
}

/// Sets the ring limit the stubs check: the end of the room, or the next in-situ
/// batch if that comes first (the stubs then come to the slow path for it).
pub fn update_limit(state: StatePtr) {
    let room = ring_room(state);
    let limit = room.end.min(room.in_situ_next.load(Relaxed));
    state.ring_limit().store(limit, Relaxed);
    state.ring_room_limit().store(limit, Relaxed);
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

/// Writes one event with the stubs' protocol; there must be room (`make_room`).
pub(crate) fn write_event(state: StatePtr, event: Event) {
    let head = state.ring_head().load(Relaxed);
    let index = head & state.ring_mask().load(Relaxed);
    let slot = state.ring_events().load(Relaxed) + index * Event::SIZE as u64;
    // SAFETY: the slot is inside the thread's ring, which only this thread writes; the
    // consumer reads it only after the release store of the head below.
    unsafe { (slot as *mut Event).write_volatile(event) };
    state.ring_head().store(head + 1, Relaxed);
    let header = state.ring_header().load(Relaxed);
    word_at(header + ring::HEAD as u64).store(head + 1, Ordering::Release);
}

/// The event the calling thread wrote at `position` of its ring (not yet overwritten:
/// the caller wrote it moments ago).
pub(crate) fn event_at(state: StatePtr, position: u64) -> Event {
    let index = position & state.ring_mask().load(Relaxed);
    let slot = state.ring_events().load(Relaxed) + index * Event::SIZE as u64;
    // SAFETY: the slot is inside the thread's ring, which only this thread writes.
    unsafe { (slot as *const Event).read_volatile() }
}

/// A header field's value (0 without a rings file).
pub fn header_value(field: usize) -> u64 {
    word(field).map_or(0, |value| value.load(Ordering::Acquire))
}

/// Whether a recording is running.
pub fn is_active() -> bool {
    STATE.recording_active.load(Ordering::Acquire) != 0
}

/// Keeps one in-situ calibration batch's sample word for hook shape `shape` in the
/// header's sample ring of that shape.
pub fn sample_in_situ(shape: HookShape, sample: u64) {
    let shape = shape as usize;
    if let Some(next) = word(header::in_situ_sample_next(shape)) {
        let count = next.fetch_add(1, Ordering::AcqRel);
        set_header(header::in_situ_sample(shape, count), sample);
    }
}

/// Records a stop of the process (the calling thread was parked for `ticks`) as an
/// Adjust event — from the park signal handler, so only when the thread was not in the
/// middle of writing an event itself (its pc is not in a hook or in agent code), and
/// only if its ring has room (a handler cannot wait).
pub fn adjust_after_park(pc: u64, ticks: u64) {
    if crate::sys::code_memory::is_hook_code(pc) || crate::sys::own_code::is_agent_code(pc) {
        return;
    }
    let Some(state) = current_state() else {
        return;
    };
    if base().is_none() {
        return;
    }
    // The calling thread's own state; the hooks it interrupted were not touching it
    // (its pc is outside them, see above).
    if state.is_agent().load(Relaxed) != 0
        || state.graph_depth().load(Relaxed) == 0
        || state.ring_events().load(Relaxed) == 0
        || state.ring_head().load(Relaxed) >= state.ring_limit().load(Relaxed)
    {
        return;
    }
    add_to_header(header::PAUSE_TICKS, ticks);
    write_event(state, Event::new(EventKind::Adjust, 0, ticks));
}

/// Writes an event from agent code running on a target thread (slow paths).
pub fn emit(state: StatePtr, event: Event) {
    if state.ring_head().load(Relaxed) >= state.ring_limit().load(Relaxed) && !make_room(state) {
        return;
    }
    write_event(state, event);
}
