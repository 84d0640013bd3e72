//! The state accessors on a region-sized buffer: what the stubs write at their offsets
//! is what the accessors read, and the owner and another thread can use one region at
//! once without a data race (run under Miri: see docs/GUIDE.md, "How long the tests
//! take, and Miri").

use super::*;
use crate::hooks::thread_layout::{
    ENTRY_RECORDED, ENTRY_RETIRED, REGION_BYTES, STATE_FLAGS, STATE_GRAPH_DEPTH, STATE_SHADOW_TOP,
    calls_displacement, returns_displacement,
};
use std::alloc::Layout;

/// A zeroed region of `REGION_BYTES`, freed when dropped (the agent's own regions
/// never are, but a test's would be a leak, which Miri reports).
struct Region {
    base: *mut u8,
    state: StatePtr,
}

impl Region {
    fn layout() -> Layout {
        Layout::from_size_align(REGION_BYTES, 4096).unwrap()
    }

    fn new() -> Region {
        // SAFETY: the layout has a nonzero size.
        let base = unsafe { std::alloc::alloc_zeroed(Region::layout()) };
        assert!(!base.is_null());
        // SAFETY: a zeroed, 4096-aligned allocation of REGION_BYTES, alive until the
        // Region is dropped, after every use of `state` in the test.
        let state = unsafe { StatePtr::from_raw(base.cast()) }.unwrap();
        state.initialise(7, 0);
        Region { base, state }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, and no longer used.
        unsafe { std::alloc::dealloc(self.base, Region::layout()) };
    }
}

/// The word at `displacement` from the region's base, as a stub addresses it.
fn stub_word(state: StatePtr, displacement: i32) -> *mut u64 {
    // SAFETY: every displacement used below lies inside the region.
    unsafe {
        state
            .as_ptr()
            .cast::<u8>()
            .add(displacement as usize)
            .cast()
    }
}

/// Pushes an entry the way a stub does: at `shadow_top`, then moves the top.
fn stub_push(state: StatePtr, entry: ShadowEntry) {
    let top = stub_word(state, STATE_SHADOW_TOP);
    // SAFETY: the top lies in the region's shadow stack; this thread owns the state.
    unsafe {
        let offset = *top - state.as_ptr() as u64;
        let slot = state.as_ptr().cast::<u8>().add(offset as usize);
        slot.cast::<ShadowEntry>().write(entry);
        *top += ENTRY_SIZE as u64;
    }
}

fn entry(n: u64) -> ShadowEntry {
    ShadowEntry {
        slot: 0x7000 - n * 64,
        return_address: 0x4000 + n,
        function: n | ENTRY_RECORDED,
        exit: 0x9000 + n,
    }
}

#[test]
fn counters_are_where_the_stubs_count() {
    let region = Region::new();
    let state = region.state;
    let last = MAX_FUNCTION_IDS as u32 - 1;
    for id in [0, 1, 4096, last] {
        // SAFETY: the counters lie in the region; nothing else runs.
        unsafe {
            *stub_word(state, calls_displacement(id)) += u64::from(id) + 1;
            *stub_word(state, returns_displacement(id)) += 2 * u64::from(id) + 1;
        }
        assert_eq!(state.calls(id).load(Ordering::Relaxed), u64::from(id) + 1);
        assert_eq!(
            state.returns(id).load(Ordering::Relaxed),
            2 * u64::from(id) + 1
        );
    }
    state.calls(last).store(0, Ordering::Relaxed);
    // SAFETY: as above.
    assert_eq!(unsafe { *stub_word(state, calls_displacement(last)) }, 0);
    assert_eq!(state.calls(2).load(Ordering::Relaxed), 0);
}

#[test]
fn header_words_are_where_the_stubs_read_them() {
    let region = Region::new();
    let state = region.state;
    state.flags().store(3, Ordering::Relaxed);
    state.graph_depth().store(5, Ordering::Relaxed);
    // SAFETY: header words of the region.
    unsafe {
        assert_eq!(*stub_word(state, STATE_FLAGS), 3);
        assert_eq!(*stub_word(state, STATE_GRAPH_DEPTH), 5);
    }
    assert_eq!(state.tid().load(Ordering::Relaxed), 7);
    assert_eq!(state.shadow_len(Ordering::Relaxed), 0);
    state
        .unwinder(MAX_NESTED_UNWINDERS - 1)
        .store(9, Ordering::Relaxed);
    assert_eq!(
        state
            .unwinder(MAX_NESTED_UNWINDERS - 1)
            .load(Ordering::Relaxed),
        9
    );
}

#[test]
fn shadow_entries_pushed_by_stubs_are_seen_and_popped() {
    let region = Region::new();
    let state = region.state;
    for n in 1..=3 {
        stub_push(state, entry(n));
    }
    assert_eq!(state.shadow_len(Ordering::Relaxed), 3);
    let seen: Vec<ShadowEntry> = state
        .shadow_entries(Ordering::Relaxed)
        .map(EntryPtr::load)
        .collect();
    assert_eq!(
        seen.iter().map(|e| e.return_address).collect::<Vec<_>>(),
        [0x4001, 0x4002, 0x4003]
    );
    assert_eq!(state.top_entry().map(|e| e.load().exit), Some(0x9003));
    assert_eq!(
        state.pop_entry().map(|e| e.function),
        Some(3 | ENTRY_RECORDED)
    );
    assert_eq!(state.shadow_len(Ordering::Relaxed), 2);
    state.graveyard(GRAVEYARD_ENTRIES - 1).store(entry(3));
    assert_eq!(
        state.graveyard(GRAVEYARD_ENTRIES - 1).load().slot,
        entry(3).slot
    );
}

/// The owner pushes, pops and counts while another thread reads the counters and marks
/// entries retired, as `counting` and `retire` do: Miri reports any data race.
#[test]
fn owner_and_collector_share_a_region_without_races() {
    let region = Region::new();
    let state = region.state;
    stub_push(state, entry(1));
    let collector = std::thread::spawn(move || {
        let mut seen = 0;
        for _ in 0..50 {
            seen = seen.max(state.calls(3).load(Ordering::Relaxed));
            for pointer in state.shadow_entries(Ordering::SeqCst) {
                pointer.function().fetch_or(ENTRY_RETIRED, Ordering::SeqCst);
            }
        }
        seen
    });
    for round in 1..=50u64 {
        let calls = state.calls(3);
        calls.store(calls.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        state.graph_depth().store(round, Ordering::Relaxed);
    }
    let seen = collector.join().unwrap();
    assert!(seen <= 50);
    assert_eq!(state.calls(3).load(Ordering::Relaxed), 50);
    let bottom = state.shadow_at(0).load();
    assert_eq!(bottom.function & !ENTRY_RETIRED, 1 | ENTRY_RECORDED);
}
