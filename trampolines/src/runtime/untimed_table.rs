//! Adaptive timing's per-thread table of untimed calls (issue 32).
//!
//! The one idea: the untimed hook writes nothing to the ring. It counts its call in a
//! small table in the thread's state, one slot per (function, return address) — the
//! return address says which function made the call — and only a pair it does not
//! find there takes the slow path ([`untimed_miss`]), which inserts it. A flush keeps
//! the pairs with their counts at 0, so a timed frame that calls what the one before
//! called counts it in place: the hook lists a pair again when its count leaves 0 (on
//! CPython's json encoder, a slow call per pair and timed frame made the target 45×
//! slower; BENCHMARKS.md). The counts
//! become `Call` events, one per pair in the order the pairs were first seen, just
//! before the thread's next timed event (its entry, exit or unwind), when the table is
//! full, when a pair's slot is taken, or every 2^16 calls of a pair (so a root that
//! runs on shows its callees' counts live): inserting sets the ring's limit to 0, so the
//! next recording hook takes its ring-space slow path, which writes them ([`flush`]).
//! Between two timed events of a thread, untimed calls then cost a table increment,
//! and the controller still places each pair under its caller, inside the right timed
//! frame. The time a flush takes is tendril's: an Adjust event removes it.

use super::recording;
use super::thread_state::with_own_state;
use crate::hooks::handler_abi::SavedRegisters;
use crate::hooks::state_access::StatePtr;
use crate::hooks::thread_layout::UNTIMED_SLOTS;
use crate::sys;
use std::sync::atomic::Ordering::Relaxed;
use tendril_wire::events::{CALL_ADDRESS_BITS, CALL_ADDRESS_MASK, Event, EventKind};

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
            true => {
                flush(state);
                // A pair the flush did not take (not listed: the list was full, which
                // only a signal handler's hook interleaved with the hook's can make
                // it) is listed now, so its counts are written with the next flush.
                if state.untimed_slot(slot, 2).load(Relaxed) != 0 {
                    list(state, slot);
                }
            }
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
    state.untimed_slot(slot, 0).store(return_address, Relaxed);
    state.untimed_slot(slot, 1).store(function, Relaxed);
    state.untimed_slot(slot, 2).store(1, Relaxed);
    list(state, slot);
}

/// Lists `slot` for the next flush (the untimed hook does the same in assembly when a
/// kept pair's count leaves 0).
fn list(state: StatePtr, slot: usize) {
    let used = state.untimed_used().load(Relaxed);
    if used as usize >= UNTIMED_SLOTS {
        return;
    }
    state
        .untimed_order(used as usize)
        .store(slot as u64, Relaxed);
    state.untimed_used().store(used + 1, Relaxed);
    // The next recording hook of the thread goes through `flush` first.
    state.ring_limit().store(0, Relaxed);
}

/// Writes the thread's counts as `Call` events, in the order the pairs were first
/// seen, and empties the table; nothing if it is empty.
pub fn flush(state: StatePtr) {
    let used = state.untimed_used().load(Relaxed) as usize;
    if used == 0 {
        return;
    }
    let current = state.untimed_generation().load(Relaxed) == recording::generation();
    let started = sys::rdtsc();
    let mut wrote = false;
    for index in 0..used.min(UNTIMED_SLOTS) {
        let slot = state.untimed_order(index).load(Relaxed) as usize % UNTIMED_SLOTS;
        let return_address = state.untimed_slot(slot, 0).load(Relaxed);
        let function = state.untimed_slot(slot, 1).load(Relaxed) as u32;
        let mut count = state.untimed_slot(slot, 2).load(Relaxed);
        // The pair stays: the next timed frame that calls it counts it without a slow
        // call (the hook lists it again when its count leaves 0).
        state.untimed_slot(slot, 2).store(0, Relaxed);
        while current && count > 0 {
            let calls = count.min(MAX_CALLS_PER_EVENT);
            count -= calls;
            let value = (return_address & CALL_ADDRESS_MASK) | (calls - 1) << CALL_ADDRESS_BITS;
            recording::emit(state, Event::new(EventKind::Call, function, value));
            wrote = true;
        }
    }
    state.untimed_used().store(0, Relaxed);
    if wrote {
        let took = sys::rdtsc().saturating_sub(started);
        recording::add_to_header(tendril_wire::rings::header::PAUSE_TICKS, took);
        recording::emit(state, Event::new(EventKind::Adjust, 0, took));
    }
    if state.ring_events().load(Relaxed) != 0 {
        recording::update_limit(state);
    }
}

/// Empties every registered thread's table, before a recording starts: no untimed hook
/// is installed then (a thread still inside one of an earlier recording's loses a
/// count of that recording, which is over).
pub fn forget_all() {
    for state in super::thread_state::registered_threads() {
        forget(state);
    }
}

/// Empties the table of `state` without writing anything.
pub fn forget(state: StatePtr) {
    for slot in 0..UNTIMED_SLOTS {
        state.untimed_slot(slot, 2).store(0, Relaxed);
        state.untimed_slot(slot, 0).store(0, Relaxed);
    }
    state.untimed_used().store(0, Relaxed);
}
