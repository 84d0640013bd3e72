//! Adaptive timing's per-thread table of untimed calls (issue 32).
//!
//! The one idea: the untimed hook writes nothing to the ring. It counts its call in a
//! table in the thread's state, one slot per (function, return address) — the return
//! address says which function made the call; a pair's slot is found by a hash of the
//! pair and a few slots probed from there (`thread_layout::untimed_home_slot`, [`find`]) — and only a pair it
//! does not find there takes the slow path ([`untimed_miss`]), which inserts it. A
//! flush keeps the pairs with their counts at 0, so a timed frame that calls what the
//! one before called counts it in place: the hook lists a pair again when its count
//! leaves 0 (on CPython's json encoder, a slow call per pair and timed frame made the
//! target 45× slower; BENCHMARKS.md). The counts become `Call` events, one per pair in
//! the order the pairs were first seen, just before the thread's next timed event (its
//! entry, exit or unwind), when the table is full, when all of a pair's slots count
//! others, or every 2^16 calls of a pair (so a root that runs on shows its callees'
//! counts live): inserting sets the ring's limit to 0, so the next recording hook comes
//! to its ring path, where it writes them itself (`hooks::stubs::untimed_flush`) or,
//! when it cannot, its ring-space slow path does ([`flush`]).
//! Between two timed events of a thread, untimed calls then cost a table increment,
//! and the controller still places each pair under its caller, inside the right timed
//! frame. The time a flush through the slow path takes is tendril's: an Adjust event
//! removes it (the hook's own write-out, a few ns a pair, stays in the caller's time).

use super::recording;
use super::thread_state::with_own_state;
use crate::hooks::handler_abi::SavedRegisters;
use crate::hooks::state_access::StatePtr;
use crate::hooks::thread_layout::{UNTIMED_PROBES, UNTIMED_SLOTS, untimed_home_slot as slot_of};
use crate::sys;
use std::sync::atomic::Ordering::Relaxed;
use tendril_wire::events::{CALL_ADDRESS_BITS, CALL_ADDRESS_MASK, Event, EventKind};

/// The most calls one `Call` event carries (its count field).
const MAX_CALLS_PER_EVENT: u64 = 1 << (64 - CALL_ADDRESS_BITS);
const _: () = assert!(crate::hooks::thread_layout::UNTIMED_FLUSH_EVERY <= MAX_CALLS_PER_EVENT);

/// The untimed hook's slow path: function id in `rdx`, return address in `rax`. The
/// pair is not in the table (it is inserted), or its count, which already holds this
/// call, reached a multiple of `UNTIMED_FLUSH_EVERY` (the table is written out).
pub extern "C" fn untimed_miss(registers: &mut SavedRegisters) {
    let (function, return_address) = (registers.rdx, registers.rax);
    with_own_state(|state| {
        let found = find(state, function, return_address);
        match found.filter(|&slot| state.untimed_slot(slot, 2).load(Relaxed) != 0) {
            Some(slot) => {
                flush(state);
                // A pair the flush did not take (not listed: the list was full, which
                // only a signal handler's hook interleaved with the hook's can make
                // it) is listed now, so its counts are written with the next flush.
                if state.untimed_slot(slot, 2).load(Relaxed) != 0 {
                    list(state, slot);
                }
            }
            None => insert(state, function, return_address),
        }
    });
}

/// The slots a pair may take, its home slot first (the untimed hook probes the same).
fn probes(function: u64, return_address: u64) -> impl Iterator<Item = usize> {
    let home = slot_of(function, return_address);
    (0..UNTIMED_PROBES).map(move |k| (home + k) % UNTIMED_SLOTS)
}

/// The slot that holds (`function`, `return_address`), if one does.
fn find(state: StatePtr, function: u64, return_address: u64) -> Option<usize> {
    probes(function, return_address).find(|&slot| {
        state.untimed_slot(slot, 0).load(Relaxed) == return_address
            && state.untimed_slot(slot, 1).load(Relaxed) == function
    })
}

/// Counts a first call of `function` from `return_address` on the thread of `state`.
pub fn insert(state: StatePtr, function: u64, return_address: u64) {
    let generation = recording::generation();
    if state.untimed_generation().load(Relaxed) != generation {
        // Counts of an earlier recording: dropped.
        forget(state);
        state.untimed_generation().store(generation, Relaxed);
    }
    // A free slot among the pair's, else one whose pair has no count now (kept from an
    // earlier timed frame); else the counts are written out and the home slot taken.
    let count = |slot: usize| state.untimed_slot(slot, 2).load(Relaxed);
    let slot = probes(function, return_address)
        .find(|&slot| state.untimed_slot(slot, 0).load(Relaxed) == 0)
        .or_else(|| probes(function, return_address).find(|&slot| count(slot) == 0));
    let slot = match slot {
        Some(slot) => slot,
        None => {
            flush(state);
            slot_of(function, return_address)
        }
    };
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
        // Only slots in use are written: the table's pages a thread never used stay
        // unmapped (16 KiB a thread, a thousand threads at every recording's start).
        if state.untimed_slot(slot, 0).load(Relaxed) != 0 {
            state.untimed_slot(slot, 2).store(0, Relaxed);
            state.untimed_slot(slot, 0).store(0, Relaxed);
        }
    }
    state.untimed_used().store(0, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pairs shaped like an interpreter's: a few dozen functions, each called from a few
    /// call sites close together in one library, some sites calling several functions.
    fn interpreter_like_pairs() -> Vec<(u64, u64)> {
        let library = 0x7f3c_7900_0000u64;
        (0..240u64)
            .map(|i| (i % 43, library + 0x1_2345 + i * 0x6c + (i % 7) * 0x1000))
            .collect()
    }

    #[test]
    fn every_pair_of_a_busy_table_finds_a_slot_among_its_probes() {
        let mut taken = [false; UNTIMED_SLOTS];
        for (function, return_address) in interpreter_like_pairs() {
            let free = probes(function, return_address).find(|&slot| !taken[slot]);
            let slot = free.expect("a free slot within the probes");
            taken[slot] = true;
        }
    }

    #[test]
    fn probes_start_at_the_home_slot_and_wrap_around_the_table() {
        let (function, return_address) = (5, 0x7f00_0000_4321);
        let home = slot_of(function, return_address);
        let slots: Vec<usize> = probes(function, return_address).collect();
        assert_eq!(slots.len(), UNTIMED_PROBES);
        assert_eq!(slots[0], home);
        for pair in slots.windows(2) {
            assert_eq!(pair[1], (pair[0] + 1) % UNTIMED_SLOTS);
        }
        assert!(slots.iter().all(|&slot| slot < UNTIMED_SLOTS));
    }

    #[test]
    fn the_function_is_part_of_the_key() {
        let return_address = 0x7f00_0000_4321;
        let homes: std::collections::HashSet<usize> = (0..16)
            .map(|function| slot_of(function, return_address))
            .collect();
        assert!(homes.len() > 8, "one call site's targets spread: {homes:?}");
    }
}
