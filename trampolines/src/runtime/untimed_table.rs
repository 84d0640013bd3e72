//! Adaptive timing's per-thread table of untimed calls (issue 32).
//!
//! The one idea: the untimed hook writes nothing to the ring. It counts its call in a
//! small table in the thread's state, one slot per (function, return address) — the
//! return address says which function made the call — and only a pair it does not
//! find there takes the slow path ([`untimed_miss`]), which inserts it. The counts
//! become `Call` events, one per pair in the order the pairs were first seen, just
//! before the thread's next timed event (its entry, exit or unwind), when the table is
//! full, when a pair's slot is taken, or every 2^16 calls of a pair (so a root that
//! runs on shows its callees' counts live): inserting sets the ring's limit to 0, so the
//! next recording hook takes its ring-space slow path, which writes them ([`flush`]).
//! Between two timed events of a thread, untimed calls then cost a table increment,
//! and the controller still places each pair under its caller, inside the right timed
//! frame. The time a flush takes is tendril's: an Adjust event removes it.
//!
//! **Kept past the outermost exit.** A root called over and over with its callees
//! untimed wrote its table at every exit: 18 events per call for 16 pairs, where the
//! entry and exit are 2. A thousand threads doing so made more events than the
//! controller could read (issue 31). So at the exit of the thread's outermost frame
//! the table is kept, and the next call of the same root adds to it: every outermost
//! call of a root has the same node, so the calls land where they would have. It is
//! written out before the next entry of another root (at depth 0: the controller
//! places calls made outside any open frame under the outermost frame closed last),
//! at any timed event inside the root as before, after [`KEEP_EXITS`] exits or
//! [`KEEP_TICKS`], and when the recording ends. A thread that went idle or exited
//! meanwhile writes nothing more, so a kept table is *offered* once its exit is
//! written (`untimed_deferral`): the agent thread that ends the recording takes each
//! offered table and writes it into its thread's ring ([`write_out_kept_tables`]);
//! a thread that needs its table back takes it back first ([`take_back_kept_table`]). A thread
//! that exits writes its own out first, from a thread-specific data destructor
//! ([`prepare_exit_write_out`]): its ring may be another thread's after it is gone.

use super::recording;
use super::state::STATE;
use super::thread_state::{
    ENTRY_ID_MASK, ENTRY_RECORDED, registered_threads, take_back_kept_table, with_own_state,
};
use crate::hooks::handler_abi::SavedRegisters;
use crate::hooks::state_access::StatePtr;
use crate::hooks::thread_layout::{DEFERRAL_OFFERED, DEFERRAL_OWN, DEFERRAL_TAKEN, UNTIMED_SLOTS};
use crate::sys;
use std::sync::atomic::Ordering;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use tendril_wire::events::{CALL_ADDRESS_BITS, CALL_ADDRESS_MASK, Event, EventKind};
use tendril_wire::rings::{header, ring};

/// The most exits of its outermost frame a thread keeps its table past.
const KEEP_EXITS: u64 = 64;
/// The longest (`rdtsc` ticks, 4–17 ms at 1–4 GHz) a thread keeps its table past the
/// outermost exits, so that a live view shows the counts as they come.
const KEEP_TICKS: u64 = 1 << 24;
/// The longest the agent thread writing kept tables out waits, over all threads, for
/// exits that threads are writing: the controller waits for the end of the recording
/// meanwhile, and reads no ring.
const WRITE_OUT_WAIT_NS: u64 = 100_000_000;

/// `STATE.untimed_exit_key`, the thread-specific data key whose destructor writes a
/// thread's kept calls out as it exits: [`NO_KEY_YET`], or [`NO_KEY`] if none could be
/// had below [`KEYS_WITHOUT_ALLOCATION`] (tables are then never kept).
const NO_KEY_YET: u32 = u32::MAX;
const NO_KEY: u32 = u32::MAX - 1;
/// glibc keeps the values of the first 32 keys in the thread itself: setting one
/// allocates nothing and takes no lock, as a hook's slow path requires.
const KEYS_WITHOUT_ALLOCATION: u32 = 32;

/// The most calls one `Call` event carries (its count field).
const MAX_CALLS_PER_EVENT: u64 = 1 << (64 - CALL_ADDRESS_BITS);
const _: () = assert!(crate::hooks::thread_layout::UNTIMED_FLUSH_EVERY <= MAX_CALLS_PER_EVENT);

/// The slot of a return address; the untimed hook computes the same.
pub fn slot_of(return_address: u64) -> usize {
    ((return_address ^ (return_address >> 5)) as usize) & (UNTIMED_SLOTS - 1)
}

/// The untimed hook's slow path: function id in `rdx`, return address in `rax`. The
/// pair is not in the table (it is inserted), or its count, which already holds this
/// call, reached a multiple of `UNTIMED_FLUSH_EVERY` (the table is written out).
pub extern "C" fn untimed_miss(registers: &mut SavedRegisters) {
    let (function, return_address) = (registers.rdx, registers.rax);
    with_own_state(|state| {
        let slot = slot_of(return_address);
        let counted = state.untimed_slot(slot, 0).load(Relaxed) == return_address
            && state.untimed_slot(slot, 1).load(Relaxed) == function
            && state.untimed_slot(slot, 2).load(Relaxed) != 0;
        match counted {
            true => flush(state),
            false => insert(state, function, return_address),
        }
    });
}

/// Counts a first call of `function` from `return_address` on the thread of `state`.
pub fn insert(state: StatePtr, function: u64, return_address: u64) {
    let generation = recording::generation();
    if state.untimed_generation().load(Relaxed) != generation {
        // Counts of an earlier recording: dropped.
        forget(state);
        state.untimed_generation().store(generation, Relaxed);
    }
    let slot = slot_of(return_address);
    if state.untimed_slot(slot, 2).load(Relaxed) != 0 {
        flush(state);
    }
    let used = state.untimed_used().load(Relaxed);
    if used == 0 {
        state
            .untimed_root()
            .store(outermost_recorded_function(state), Relaxed);
    }
    state.untimed_slot(slot, 0).store(return_address, Relaxed);
    state.untimed_slot(slot, 1).store(function, Relaxed);
    state.untimed_slot(slot, 2).store(1, Relaxed);
    state
        .untimed_order(used as usize)
        .store(slot as u64, Relaxed);
    state.untimed_used().store(used + 1, Relaxed);
    // The next recording hook of the thread goes through `flush` first.
    state.ring_limit().store(0, Relaxed);
}

/// The function of the thread's outermost recorded frame (0 if none is open).
fn outermost_recorded_function(state: StatePtr) -> u64 {
    state
        .shadow_entries(Relaxed)
        .map(|entry| entry.load().function)
        .find(|function| function & ENTRY_RECORDED != 0)
        .map_or(0, |function| function & ENTRY_ID_MASK)
}

/// Writes the thread's counts as `Call` events, in the order the pairs were first
/// seen, and empties the table; nothing if it is empty.
pub fn flush(state: StatePtr) {
    state.untimed_closed().store(0, Relaxed);
    state.untimed_kept_exits().store(0, Relaxed);
    if state.untimed_used().load(Relaxed) == 0 {
        return;
    }
    let started = sys::rdtsc();
    let (wrote, _) = take_calls(state, |event| {
        recording::emit(state, event);
        true
    });
    if wrote > 0 {
        let took = sys::rdtsc().saturating_sub(started);
        recording::add_to_header(header::PAUSE_TICKS, took);
        recording::emit(state, Event::new(EventKind::Adjust, 0, took));
    }
    if state.ring_events().load(Relaxed) != 0 {
        recording::update_limit(state);
    }
}

/// Empties the table of `state`, passing its counts as `Call` events to `write` (if
/// they are of the current recording) until it returns false. Returns the events
/// written, and those left unwritten after `write` refused one.
fn take_calls(state: StatePtr, mut write: impl FnMut(Event) -> bool) -> (u64, u64) {
    let used = state.untimed_used().load(Relaxed) as usize;
    // Empty from now on: the ring limit the writes set is the real one.
    state.untimed_used().store(0, Relaxed);
    let current = state.untimed_generation().load(Relaxed) == recording::generation();
    let (mut written, mut unwritten) = (0, 0);
    for index in 0..used.min(UNTIMED_SLOTS) {
        let slot = state.untimed_order(index).load(Relaxed) as usize % UNTIMED_SLOTS;
        let return_address = state.untimed_slot(slot, 0).load(Relaxed);
        let function = state.untimed_slot(slot, 1).load(Relaxed) as u32;
        let mut count = state.untimed_slot(slot, 2).load(Relaxed);
        state.untimed_slot(slot, 2).store(0, Relaxed);
        state.untimed_slot(slot, 0).store(0, Relaxed);
        while current && count > 0 {
            let calls = count.min(MAX_CALLS_PER_EVENT);
            count -= calls;
            let value = (return_address & CALL_ADDRESS_MASK) | (calls - 1) << CALL_ADDRESS_BITS;
            if unwritten == 0 && write(Event::new(EventKind::Call, function, value)) {
                written += 1;
            } else {
                unwritten += 1;
            }
        }
    }
    (written, unwritten)
}

/// From a recording hook's ring-space slow path, before its event: writes the table
/// out, or keeps it. True if the event is the exit of the thread's outermost frame and
/// the table is kept past it: once the exit has room, [`keep_past_exit`].
pub fn before_recorded_event(state: StatePtr) -> bool {
    take_back_kept_table(state);
    if state.untimed_used().load(Relaxed) == 0 {
        state.untimed_closed().store(0, Relaxed);
        return false;
    }
    let depth = state.graph_depth().load(Relaxed);
    if state.untimed_closed().load(Relaxed) != 0 {
        // The first recording event since the outermost exit: an outermost entry (the
        // stub counted it in the depth already). The same root's calls go on adding.
        state.untimed_closed().store(0, Relaxed);
        let root = state.untimed_root().load(Relaxed);
        let same_root = depth == 1
            && state
                .top_entry()
                .is_some_and(|entry| entry.load().function & ENTRY_ID_MASK == root);
        if !(same_root && may_keep(state)) {
            flush(state);
        }
        return false;
    }
    if depth == 0 && may_keep(state) {
        return true;
    }
    flush(state);
    false
}

/// Whether the thread may keep its table past one more outermost exit.
fn may_keep(state: StatePtr) -> bool {
    let kept = state.untimed_kept_exits().load(Relaxed);
    STATE.untimed_exit_key.load(Relaxed) < KEYS_WITHOUT_ALLOCATION
        && STATE.untimed_keep_refused.load(Relaxed) == 0
        && recording::is_active()
        && state.untimed_generation().load(Relaxed) == recording::generation()
        && kept < KEEP_EXITS
        && (kept == 0
            || sys::rdtsc().saturating_sub(state.untimed_kept_since().load(Relaxed)) < KEEP_TICKS)
}

/// The outermost exit about to be written has room: keeps the table past it, and
/// offers the table (see the module comment). Returns whether the exit still has room
/// (false: it is dropped, the recording has ended).
pub fn keep_past_exit(state: StatePtr) -> bool {
    let kept = state.untimed_kept_exits().load(Relaxed);
    if kept == 0 {
        state.untimed_kept_since().store(sys::rdtsc(), Relaxed);
    }
    state.untimed_kept_exits().store(kept + 1, Relaxed);
    state.untimed_closed().store(1, Relaxed);
    // The thread writes the table out if it exits while it keeps it (`may_keep` saw a
    // key of the first block: no allocation, no lock).
    // SAFETY: sets this thread's value of a key this agent created and never deletes.
    unsafe {
        libc::pthread_setspecific(
            STATE.untimed_exit_key.load(Relaxed),
            std::ptr::NonNull::<u8>::dangling().as_ptr().cast(),
        )
    };
    // The stub writes the exit here, right after this returns.
    state
        .untimed_exit_position()
        .store(state.ring_head().load(Relaxed), Relaxed);
    // Every recording hook comes to the slow path while the table is kept.
    state.ring_limit().store(0, Relaxed);
    let offer = state.untimed_deferral();
    offer.store(DEFERRAL_OFFERED, SeqCst);
    if STATE.untimed_keep_refused.load(SeqCst) == 0 {
        return true;
    }
    // The recording ends, and the agent thread that writes kept tables out may have
    // looked at this thread already: the table goes out now, before the exit, unless
    // that thread has just taken it.
    if offer
        .compare_exchange(DEFERRAL_OFFERED, DEFERRAL_OWN, SeqCst, SeqCst)
        .is_err()
    {
        return true;
    }
    flush(state);
    recording::make_room(state)
}

/// As a recording ends, before it is marked inactive (an agent thread): no thread
/// keeps its table past an exit from now on, and every offered table — of a thread
/// idle or gone since it kept it — is written into its thread's ring.
pub fn write_out_kept_tables() {
    STATE.untimed_keep_refused.store(1, SeqCst);
    let deadline = sys::monotonic_ns() + WRITE_OUT_WAIT_NS;
    for state in registered_threads() {
        let offer = state.untimed_deferral();
        let taken = offer.load(SeqCst) == DEFERRAL_OFFERED
            && offer
                .compare_exchange(DEFERRAL_OFFERED, DEFERRAL_TAKEN, SeqCst, SeqCst)
                .is_ok();
        if taken {
            write_out_for(state, deadline);
            offer.store(DEFERRAL_OWN, Release);
        }
    }
}

/// Writes the taken table of `state`'s thread into that thread's ring, after the exit
/// it was kept past (waited for until `deadline`, `monotonic_ns`); counts as lost what
/// it cannot write (no room: the controller reads no ring meanwhile).
fn write_out_for(state: StatePtr, deadline: u64) {
    let lent = borrow_ring(state);
    let exit_position = state.untimed_exit_position().load(Relaxed);
    let exit_written = lent.is_some() && wait_for_head_past(state, exit_position, deadline);
    let (_, unwritten) = take_calls(state, |event| exit_written && write_for(state, event));
    recording::add_to_header(header::LOST_EVENTS, unwritten);
    if let Some(tid) = lent {
        give_ring_back(state, tid);
    }
    state.untimed_closed().store(0, Relaxed);
    state.untimed_kept_exits().store(0, Relaxed);
}

/// For an agent thread about to write into the ring of `state`'s thread (its kept
/// untimed calls, `untimed_table`): marks the ring as written for that thread, so that
/// no thread takes it over meanwhile (its thread may have exited). Returns the
/// thread's id, for [`give_ring_back`]; `None` if the ring is not that thread's.
fn borrow_ring(state: StatePtr) -> Option<u32> {
    let ring_header = state.ring_header().load(Relaxed);
    if state.ring_events().load(Relaxed) == 0 || ring_header == 0 {
        return None;
    }
    let tid = state.tid().load(Relaxed) as u32;
    recording::word32_at(ring_header + ring::TID as u64)
        .compare_exchange(
            tid,
            tid | ring::TID_WRITTEN_FOR,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .ok()
}

/// Ends a [`borrow_ring`].
fn give_ring_back(state: StatePtr, tid: u32) {
    let ring_header = state.ring_header().load(Relaxed);
    recording::word32_at(ring_header + ring::TID as u64).store(tid, Ordering::Release);
}

/// Waits (an agent thread, until `deadline`, `monotonic_ns`) until the thread of
/// `state` has written its ring past `position`.
fn wait_for_head_past(state: StatePtr, position: u64, deadline: u64) -> bool {
    let head = recording::word_at(state.ring_header().load(Relaxed) + ring::HEAD as u64);
    while head.load(Ordering::Acquire) <= position {
        if sys::monotonic_ns() > deadline {
            return false;
        }
        sys::yield_cpu();
    }
    true
}

/// Writes `event` into the borrowed ring of `state`'s thread (an agent thread, see
/// [`borrow_ring`]) if it has room; false if not. The thread's ring limit stays 0: it
/// comes to its slow path before it writes again.
fn write_for(state: StatePtr, event: Event) -> bool {
    let ring_header = state.ring_header().load(Relaxed);
    let tail = recording::word_at(ring_header + ring::TAIL as u64).load(Ordering::Acquire);
    let room = state.ring_head().load(Relaxed) < tail + recording::ring_capacity(state);
    if room {
        recording::write_event(state, event);
    }
    room
}

/// Empties every registered thread's table, before a recording starts: no untimed hook
/// is installed then (a thread still inside one of an earlier recording's loses a
/// count of that recording, which is over). Threads keep tables past exits again.
pub fn forget_all() {
    for state in registered_threads() {
        let offer = state.untimed_deferral();
        let offered = offer.load(SeqCst) == DEFERRAL_OFFERED
            && offer
                .compare_exchange(DEFERRAL_OFFERED, DEFERRAL_TAKEN, SeqCst, SeqCst)
                .is_ok();
        forget(state);
        state.untimed_closed().store(0, Relaxed);
        state.untimed_kept_exits().store(0, Relaxed);
        if offered {
            offer.store(DEFERRAL_OWN, Release);
        }
    }
    STATE.untimed_keep_refused.store(0, SeqCst);
}

/// Empties the table of `state` without writing anything.
pub fn forget(state: StatePtr) {
    for slot in 0..UNTIMED_SLOTS {
        state.untimed_slot(slot, 2).store(0, Relaxed);
        state.untimed_slot(slot, 0).store(0, Relaxed);
    }
    state.untimed_used().store(0, Relaxed);
}

/// Creates the thread-specific data key whose destructor writes an exiting thread's
/// kept calls out (an agent thread, before a recording starts; once).
pub fn prepare_exit_write_out() {
    if STATE.untimed_exit_key.load(Acquire) != NO_KEY_YET {
        return;
    }
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: creates a key with a destructor that stays valid: the agent is never
    // unloaded.
    let created = unsafe { libc::pthread_key_create(&mut key, Some(write_out_at_exit)) } == 0;
    let usable = created && key < KEYS_WITHOUT_ALLOCATION;
    if created && !usable {
        // SAFETY: the key was just created and no thread has a value for it.
        unsafe { libc::pthread_key_delete(key) };
    }
    STATE
        .untimed_exit_key
        .store(if usable { key } else { NO_KEY }, Release);
}

/// The key's destructor, on a thread that exits while it keeps its table.
extern "C" fn write_out_at_exit(_value: *mut libc::c_void) {
    with_own_state(|state| {
        take_back_kept_table(state);
        flush(state);
    });
}
