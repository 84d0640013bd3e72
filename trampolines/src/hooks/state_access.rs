//! Sound access to a thread's state region: [`StatePtr`] and [`EntryPtr`].
//!
//! The one idea: a thread's region is shared memory, never a Rust object one can borrow.
//! Its owner writes it with plain stores from the stubs' assembly, and from Rust; other
//! threads (the counters' readers, `retire`) read and write words of it at the same
//! time. So nothing ever holds a `&ThreadState` or `&mut ThreadState`: a `StatePtr` is
//! the region's base pointer — the one `mmap` returned, whose provenance covers the
//! whole region, counters included — and every word is reached from it by a raw field
//! projection or an offset, and accessed as an atomic. `Relaxed` loads and stores of
//! aligned words are plain `mov`s on x86-64, so the owner's accesses cost what they did;
//! a stronger order is asked for only where another thread must see an order.

use crate::hooks::thread_layout::{
    self, CALLS_OFFSET, ENTRY_SIZE, FLAG_PASSTHROUGH, GRAVEYARD_ENTRIES, MAX_FUNCTION_IDS,
    MAX_NESTED_UNWINDERS, RETURNS_OFFSET, SHADOW_ENTRIES, SHADOW_OFFSET, ShadowEntry, ThreadState,
};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

/// A thread's state region, by its base pointer. Copyable; the region lives for the
/// life of the process (regions are never unmapped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatePtr(NonNull<ThreadState>);

// SAFETY: a StatePtr only ever reaches the region through atomics (see the module
// comment), which any thread may use.
unsafe impl Send for StatePtr {}
// SAFETY: as above.
unsafe impl Sync for StatePtr {}

/// Accessors of the header's `u64` words, as atomics.
macro_rules! words {
    ($($(#[$doc:meta])* $name:ident;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(self) -> &'static AtomicU64 {
                // SAFETY: the field lies in the header of a live region (`from_raw`'s
                // contract), is 8-byte aligned (`repr(C)`, asserted offsets), and every
                // concurrent access to it is atomic or a whole-word store from the stubs.
                unsafe { AtomicU64::from_ptr(&raw mut (*self.0.as_ptr()).$name) }
            }
        )*
    };
}

impl StatePtr {
    /// # Safety
    /// `state` is null or the base of a region of `REGION_BYTES` (with provenance over
    /// all of it), 4096-aligned, that stays allocated for the rest of the process.
    pub unsafe fn from_raw(state: *mut ThreadState) -> Option<StatePtr> {
        NonNull::new(state).map(StatePtr)
    }

    /// Sets up a fresh, zeroed region's header: an empty shadow stack in the region.
    /// `tid` and `slow_depth_address` as `ThreadState` describes them.
    pub fn initialise(self, tid: i32, slow_depth_address: u64) {
        let base = self.as_ptr() as u64 + SHADOW_OFFSET as u64;
        self.shadow_base().store(base, Ordering::Relaxed);
        self.shadow_top().store(base, Ordering::Relaxed);
        let limit = base + (SHADOW_ENTRIES * ENTRY_SIZE as usize) as u64;
        self.shadow_limit().store(limit, Ordering::Relaxed);
        self.tid().store(tid, Ordering::Relaxed);
        self.slow_depth_address()
            .store(slow_depth_address, Ordering::Relaxed);
    }

    /// The top shadow entry, if any.
    pub fn top_entry(self) -> Option<EntryPtr> {
        let len = self.shadow_len(Ordering::Relaxed);
        (len > 0).then(|| self.shadow_at(len - 1))
    }

    /// Takes the top shadow entry off (owner thread only).
    pub fn pop_entry(self) -> Option<ShadowEntry> {
        let top = self.top_entry()?.load();
        let shadow_top = self.shadow_top();
        shadow_top.store(
            shadow_top.load(Ordering::Relaxed) - ENTRY_SIZE as u64,
            Ordering::Release,
        );
        Some(top)
    }

    /// The region's base, as the stubs hold it in `rcx`.
    pub fn as_ptr(self) -> *mut ThreadState {
        self.0.as_ptr()
    }

    words! {
        /// Address of the next free shadow entry.
        shadow_top;
        /// Address of the first shadow entry.
        shadow_base;
        /// One past the last shadow entry.
        shadow_limit;
        /// `FLAG_*` bits.
        flags;
        /// Calls that got no return hook because the shadow stack was full.
        shadow_overflows;
        /// Frames found gone instead of returning.
        unwound_frames;
        /// Frames open inside the recorded call graph.
        graph_depth;
        /// The ring's events (0 before the thread has a ring).
        ring_events;
        /// The ring's index mask.
        ring_mask;
        /// Events written to the ring.
        ring_head;
        /// How far writing may go before the consumer's tail is read again.
        ring_limit;
        /// The ring's header.
        ring_header;
        /// The top of the discovery stack (0 until first used).
        discovery_stack;
        /// Unwinders noted in `unwinders`.
        unwinder_count;
        /// Entries ever moved to the graveyard.
        graveyard_next;
        /// Address of the thread's slow-call depth.
        slow_depth_address;
        /// Returns through frames dropped as gone.
        resumed_frames;
        /// `FORK_HOLD` and the pass-through bit from before a fork.
        flags_before_fork;
        /// Slots taken in the untimed-call table.
        untimed_used;
        /// The recording the untimed-call table's counts belong to.
        untimed_generation;
        /// How far the ring has room, as the slow path last found (0: not known).
        ring_room_limit;
    }

    /// Word `index` of the untimed-call table's order (`< UNTIMED_SLOTS`).
    pub fn untimed_order(self, index: usize) -> &'static AtomicU64 {
        assert!(index < thread_layout::UNTIMED_SLOTS);
        // SAFETY: an in-bounds element of the header's array; as for `words!`.
        unsafe {
            let array = &raw mut (*self.0.as_ptr()).untimed_order;
            AtomicU64::from_ptr(array.cast::<u64>().add(index))
        }
    }

    /// Word `word` (return address 0, function 1, count 2) of untimed-table slot `slot`.
    pub fn untimed_slot(self, slot: usize, word: usize) -> &'static AtomicU64 {
        assert!(slot < thread_layout::UNTIMED_SLOTS && word < 4);
        // SAFETY: an in-bounds element of the header's array; as for `words!`.
        unsafe {
            let array = &raw mut (*self.0.as_ptr()).untimed_slots;
            AtomicU64::from_ptr(array.cast::<u64>().add(slot * 4 + word))
        }
    }

    /// The thread id the state was registered for.
    pub fn tid(self) -> &'static AtomicI32 {
        // SAFETY: as for the `words!` accessors, for a 4-byte-aligned `i32`.
        unsafe { AtomicI32::from_ptr(&raw mut (*self.0.as_ptr()).tid) }
    }

    /// Nonzero for the agent threads' shared state.
    pub fn is_agent(self) -> &'static AtomicU32 {
        // SAFETY: as for `tid`.
        unsafe { AtomicU32::from_ptr(&raw mut (*self.0.as_ptr()).is_agent) }
    }

    /// The thread's name when it registered. Written only before the state is
    /// registered (`set_name`), so a plain read is never concurrent with a write.
    pub fn name(self) -> [u8; 16] {
        // SAFETY: the field lies in the live header; see above for why it is not raced.
        unsafe { (&raw const (*self.0.as_ptr()).name).read() }
    }

    /// Where `prctl(PR_GET_NAME)` writes the name; only before the state is shared.
    pub fn name_buffer(self) -> *mut u8 {
        // SAFETY: a field projection inside the live header; nothing is accessed.
        unsafe { (&raw mut (*self.0.as_ptr()).name).cast() }
    }

    /// Unwinder stack pointer `index` (`< MAX_NESTED_UNWINDERS`).
    pub fn unwinder(self, index: usize) -> &'static AtomicU64 {
        assert!(index < MAX_NESTED_UNWINDERS);
        // SAFETY: an in-bounds element of the header's array; as for `words!`.
        unsafe {
            let array = &raw mut (*self.0.as_ptr()).unwinders;
            AtomicU64::from_ptr(array.cast::<u64>().add(index))
        }
    }

    /// Graveyard entry `index` (`< GRAVEYARD_ENTRIES`).
    pub fn graveyard(self, index: usize) -> EntryPtr {
        assert!(index < GRAVEYARD_ENTRIES);
        // SAFETY: an in-bounds element of the header's array.
        let entry = unsafe {
            let array = &raw mut (*self.0.as_ptr()).graveyard;
            array.cast::<ShadowEntry>().add(index)
        };
        EntryPtr(entry)
    }

    /// Function `id`'s call counter (`id < MAX_FUNCTION_IDS`).
    pub fn calls(self, id: u32) -> &'static AtomicU64 {
        self.counter(CALLS_OFFSET, id)
    }

    /// Function `id`'s return counter (`id < MAX_FUNCTION_IDS`).
    pub fn returns(self, id: u32) -> &'static AtomicU64 {
        self.counter(RETURNS_OFFSET, id)
    }

    fn counter(self, table: usize, id: u32) -> &'static AtomicU64 {
        assert!((id as usize) < MAX_FUNCTION_IDS);
        // SAFETY: the counter lies inside the region (the tables end at REGION_BYTES),
        // reached from the region's base pointer, whose provenance covers it; it is
        // 8-byte aligned, and the stubs write it with whole-word stores.
        unsafe {
            let word = self.0.as_ptr().cast::<u8>().add(table + id as usize * 8);
            AtomicU64::from_ptr(word.cast::<u64>())
        }
    }

    /// Live shadow entries: `shadow_top` read once (`order`), oldest first. The owner
    /// may pop entries meanwhile; their memory stays in the region.
    pub fn shadow_len(self, order: Ordering) -> usize {
        let top = self.shadow_top().load(order);
        let base = self.shadow_base().load(Ordering::Relaxed);
        let count = top.saturating_sub(base) / ENTRY_SIZE as u64;
        count.min(SHADOW_ENTRIES as u64) as usize
    }

    /// Shadow entry `index` (from the oldest), `index < SHADOW_ENTRIES`.
    pub fn shadow_at(self, index: usize) -> EntryPtr {
        assert!(index < SHADOW_ENTRIES);
        // SAFETY: the shadow stack lies in the region at SHADOW_OFFSET (`initialise`
        // points `shadow_base` there), so the entry is in bounds; it is reached from the
        // base pointer, whose provenance covers the region.
        let entry = unsafe {
            let stack = self.0.as_ptr().cast::<u8>().add(SHADOW_OFFSET);
            stack.cast::<ShadowEntry>().add(index)
        };
        EntryPtr(entry)
    }

    /// The entries below the top, oldest first (`shadow_top` read once with `order`).
    pub fn shadow_entries(
        self,
        order: Ordering,
    ) -> impl DoubleEndedIterator<Item = EntryPtr> + ExactSizeIterator {
        (0..self.shadow_len(order)).map(move |index| self.shadow_at(index))
    }
}

/// The calling thread's state, if it has one (registered, or the agent's shared state).
pub fn current_state() -> Option<StatePtr> {
    // SAFETY: the slot only ever holds null or a region's base (`set_current_slot`'s
    // callers pass mapped regions, which are never unmapped).
    unsafe { StatePtr::from_raw(thread_layout::current()) }
}

/// Runs `body` with the hooks of `state` — the calling thread's own — stepping aside,
/// then puts `FLAG_PASSTHROUGH` back as it was (keeping the other flags `body` set).
/// Nests: the thread may have been inside another such call, or inside a hook, when a
/// signal handler makes this one.
pub fn with_hooks_stepping_aside<R>(state: StatePtr, body: impl FnOnce() -> R) -> R {
    let flags = state.flags();
    let previous = flags.load(Ordering::Relaxed);
    flags.store(previous | FLAG_PASSTHROUGH, Ordering::Relaxed);
    let result = body();
    let now = flags.load(Ordering::Relaxed);
    flags.store(
        (now & !FLAG_PASSTHROUGH) | (previous & FLAG_PASSTHROUGH),
        Ordering::Relaxed,
    );
    result
}

/// One shadow entry (of the stack or the graveyard), by pointer. `retire` marks an
/// entry's `function` word from another thread, so every word is accessed atomically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryPtr(*mut ShadowEntry);

/// Accessors of an entry's words, as atomics.
macro_rules! entry_words {
    ($($(#[$doc:meta])* $name:ident;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(self) -> &'static AtomicU64 {
                // SAFETY: an EntryPtr is only made for an in-bounds entry of a live
                // region (`StatePtr::shadow_at`, `StatePtr::graveyard`); the word is
                // aligned and every concurrent access to it is atomic.
                unsafe { AtomicU64::from_ptr(&raw mut (*self.0).$name) }
            }
        )*
    };
}

impl EntryPtr {
    entry_words! {
        /// Address of the stack slot that held the return address.
        slot;
        /// The real return address.
        return_address;
        /// The function id and `ENTRY_*` marks.
        function;
        /// The trampoline exit the slot holds while the hook is installed.
        exit;
    }

    /// The entry's words, each read once (relaxed).
    pub fn load(self) -> ShadowEntry {
        ShadowEntry {
            slot: self.slot().load(Ordering::Relaxed),
            return_address: self.return_address().load(Ordering::Relaxed),
            function: self.function().load(Ordering::Relaxed),
            exit: self.exit().load(Ordering::Relaxed),
        }
    }

    /// Writes every word (relaxed).
    pub fn store(self, entry: ShadowEntry) {
        self.slot().store(entry.slot, Ordering::Relaxed);
        self.return_address()
            .store(entry.return_address, Ordering::Relaxed);
        self.function().store(entry.function, Ordering::Relaxed);
        self.exit().store(entry.exit, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
