//! The per-thread state's layout: what hook stubs reach in one instruction.
//!
//! `tendril_thread_slot` is an initial-exec TLS variable, so its address is a constant
//! offset from the thread pointer (`fs`) in every thread: a stub loads the thread's
//! state with `mov rcx, fs:[offset]`. (Stable Rust cannot choose a TLS model, so the
//! variable is declared in assembly and its offset read from the GOT, where the loader
//! put it.) A thread's region holds, at fixed offsets the stubs use as displacements:
//! the [`ThreadState`] header, the shadow stack of return addresses, and the call and
//! return counters indexed by function id. Every offset a stub uses is checked against
//! the `#[repr(C)]` layout at compile time. The runtime (`runtime::thread_state`) maps,
//! registers and reads the regions; this module only says where things are.

/// Function ids the counter tables have room for (ids are never reused).
pub const MAX_FUNCTION_IDS: usize = 1 << 18;
/// Entries of a shadow stack; deeper recursion runs without return hooks.
pub const SHADOW_ENTRIES: usize = 32 * 1024;

/// `ThreadState::flags`: every hook on this thread steps aside (agent threads, and
/// target threads while they run agent code).
pub const FLAG_PASSTHROUGH: u64 = 1;
/// `ThreadState::flags`: some shadow entries had their return address put back for an
/// unwinder; the next hook re-installs the ones whose frames still exist.
pub const FLAG_RECONCILE: u64 = 2;

/// One saved return address (32 bytes; the stubs use these offsets).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ShadowEntry {
    /// Address of the stack slot that held the return address (rsp at function entry).
    pub slot: u64,
    /// The real return address.
    pub return_address: u64,
    /// The function's id; bit 63 set when the real address was put back in the slot.
    pub function: u64,
    /// The trampoline exit the slot holds while the hook is installed.
    pub exit: u64,
}

/// `ShadowEntry::function` bit: the return address is back in its slot.
pub const ENTRY_RESTORED: u64 = 1 << 63;
/// `ShadowEntry::function` bit: the hooks came out and the real address went back in
/// the slot for good (`retire`); nothing may put the exit back.
pub const ENTRY_RETIRED: u64 = 1 << 62;
/// `ShadowEntry::function` bit: pushed by a recording hook (its frame is in the graph
/// and its exit is an event).
pub const ENTRY_RECORDED: u64 = 1 << 30;
/// The function id in `ShadowEntry::function`.
pub const ENTRY_ID_MASK: u64 = ENTRY_RECORDED - 1;

pub const ENTRY_SLOT: i32 = 0;
pub const ENTRY_RETURN_ADDRESS: i32 = 8;
pub const ENTRY_FUNCTION: i32 = 16;
pub const ENTRY_EXIT: i32 = 24;
pub const ENTRY_SIZE: i32 = 32;
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(offset_of!(ShadowEntry, slot) == ENTRY_SLOT as usize);
    assert!(offset_of!(ShadowEntry, return_address) == ENTRY_RETURN_ADDRESS as usize);
    assert!(offset_of!(ShadowEntry, function) == ENTRY_FUNCTION as usize);
    assert!(offset_of!(ShadowEntry, exit) == ENTRY_EXIT as usize);
    assert!(size_of::<ShadowEntry>() == ENTRY_SIZE as usize);
};

/// The header of a thread's region (offsets below are used by the stubs).
#[repr(C)]
pub struct ThreadState {
    /// Address of the next free shadow entry.
    pub shadow_top: u64,
    pub shadow_base: u64,
    /// One past the last shadow entry.
    pub shadow_limit: u64,
    /// `FLAG_*` bits.
    pub flags: u64,
    /// Calls that got no return hook because the shadow stack was full.
    pub shadow_overflows: u64,
    /// Frames found gone (longjmp, exceptions, cancellation) instead of returning.
    pub unwound_frames: u64,
    /// Recording hooks: the thread's frames open inside the call graph (0 outside it).
    pub graph_depth: u64,
    /// The thread's recording ring (see `recording`): its events (0 before the thread
    /// has a ring), the index mask, the events written, how far writing may go before
    /// the consumer's progress must be read again, and the ring's header.
    pub ring_events: u64,
    pub ring_mask: u64,
    pub ring_head: u64,
    pub ring_limit: u64,
    pub ring_header: u64,
    pub tid: i32,
    /// True for the shared state of the agent's own threads.
    pub is_agent: u32,
    /// The thread's name when it registered (`comm`, NUL-padded).
    pub name: [u8; 16],
    /// The top of the stack discovery runs on (0 until the thread first discovers).
    pub discovery_stack: u64,
    /// Stack pointers at which unwinders were entered and may still be walking the
    /// stack (innermost last); an unwinder is done once a hook runs above its frame.
    pub unwinders: [u64; MAX_NESTED_UNWINDERS],
    pub unwinder_count: u64,
    /// Recently dropped entries, searched if a return comes through an exit whose entry
    /// was dropped (a frame thought gone that was not: another stack, a coroutine).
    pub graveyard: [ShadowEntry; GRAVEYARD_ENTRIES],
    pub graveyard_next: u64,
    /// Address of the thread's `tendril_slow_depth` (see `slow_call`): nonzero while
    /// the thread is inside a hook's slow path.
    pub slow_depth_address: u64,
    /// Returns through frames that had been dropped as gone: their stack was left and
    /// resumed (coroutines).
    pub resumed_frames: u64,
    /// While this thread forks: `FORK_HOLD` and its `FLAG_PASSTHROUGH` bit from before.
    pub flags_before_fork: u64,
    /// Bytes of `path_stack` in use above its sentinel entry 0 (`hooks::path_register`).
    pub path_depth: u64,
    /// The path registers of the open calls of functions whose paths are counted,
    /// innermost last; entry 0, all zeros, is a sentinel no call ever pops.
    pub path_stack: [PathEntry; PATH_STACK_ENTRIES],
    /// Adaptive timing: the untimed calls made since the thread's last timed event,
    /// counted per (function, return address) in a small table the untimed hook
    /// updates (`runtime::untimed_table`). `untimed_used` slots have counts, in the
    /// order `untimed_order` lists them (a slot whose count is 0 keeps its pair for the
    /// next timed frame); the recording they belong to is `untimed_generation`.
    pub untimed_used: u64,
    pub untimed_generation: u64,
    pub untimed_order: [u64; UNTIMED_SLOTS],
    /// Slot `i` is words `4i..4i + 4`: return address, function id, count, unused.
    pub untimed_slots: [u64; UNTIMED_SLOTS * 4],
    /// The ring limit the slow path last set (`runtime::recording::update_limit`): how
    /// far the ring has room. `ring_limit` is lowered to 0 to bring the next recording
    /// hook to its untimed calls, and that hook writes them out itself, up to this
    /// (0: not known, the slow path does it).
    pub ring_room_limit: u64,
}

/// Slots of a thread's untimed-call table (a power of two).
pub const UNTIMED_SLOTS: usize = 512;
/// Slots a pair may take, from its home slot on: pairs that share a home slot and
/// alternate would otherwise evict each other at every call, each time a slow call.
pub const UNTIMED_PROBES: usize = 8;
/// The multiplier of the pair's hash (Fibonacci hashing: the top bits of the product
/// of (function << 32 ^ return address) and 2^64/φ).
pub const UNTIMED_HASH_MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

/// The home slot of the pair (`function`, `return_address`) in the untimed-call table:
/// the untimed hook computes the same in assembly (`stubs::untimed`), the runtime's
/// table here (`runtime::untimed_table`). The function is part of the key: one call
/// site that calls several functions through a pointer (an interpreter's type slots)
/// would otherwise evict its own pairs, each time a slow call.
pub fn untimed_home_slot(function: u64, return_address: u64) -> usize {
    let key = (function << 32) ^ return_address;
    (key.wrapping_mul(UNTIMED_HASH_MULTIPLIER) >> (64 - UNTIMED_SLOTS.trailing_zeros())) as usize
}
/// A pair's count at which the untimed hook writes the table out (a power of two, the
/// most calls one `Call` event carries).
pub const UNTIMED_FLUSH_EVERY: u64 = 1 << 16;
/// Bytes of one slot, and its words' offsets.
pub const UNTIMED_SLOT_SIZE: i32 = 32;
pub const UNTIMED_SLOT_RETURN_ADDRESS: i32 = 0;
pub const UNTIMED_SLOT_FUNCTION: i32 = 8;
pub const UNTIMED_SLOT_COUNT: i32 = 16;

/// One open call's path register (16 bytes; the path code uses these offsets).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PathEntry {
    /// `!rsp` at the call's entry: larger for deeper calls, so an entry left by a call
    /// that never returned (an exception, a `longjmp`) is found and dropped.
    pub not_entry_rsp: u64,
    /// The path number so far, xor `path_register`'s mask; bit 63 clear means the
    /// number is lost (the sentinel's zero, or a poisoned register).
    pub register: u64,
}

/// Path stack entries, the sentinel included: deeper nesting loses paths, counted.
pub const PATH_STACK_ENTRIES: usize = 128;
pub const PATH_ENTRY_KEY: i32 = 0;
pub const PATH_ENTRY_REGISTER: i32 = 8;
pub const PATH_ENTRY_SIZE: i32 = 16;

/// Dropped entries kept: a coroutine's frames must still be here when it is resumed.
pub const GRAVEYARD_ENTRIES: usize = 128;
/// Unwinders active at once on one thread (an exception thrown while another unwinds).
pub const MAX_NESTED_UNWINDERS: usize = 16;

pub const STATE_SHADOW_TOP: i32 = 0;
pub const STATE_SHADOW_BASE: i32 = 8;
pub const STATE_SHADOW_LIMIT: i32 = 16;
pub const STATE_FLAGS: i32 = 24;
pub const STATE_SHADOW_OVERFLOWS: i32 = 32;
pub const STATE_GRAPH_DEPTH: i32 = 48;
pub const STATE_RING_EVENTS: i32 = 56;
pub const STATE_RING_MASK: i32 = 64;
pub const STATE_RING_HEAD: i32 = 72;
pub const STATE_RING_LIMIT: i32 = 80;
pub const STATE_RING_HEADER: i32 = 88;
pub const STATE_PATH_DEPTH: i32 = std::mem::offset_of!(ThreadState, path_depth) as i32;
pub const STATE_PATH_STACK: i32 = std::mem::offset_of!(ThreadState, path_stack) as i32;
pub const STATE_UNTIMED_SLOTS: i32 = std::mem::offset_of!(ThreadState, untimed_slots) as i32;
pub const STATE_UNTIMED_USED: i32 = std::mem::offset_of!(ThreadState, untimed_used) as i32;
pub const STATE_UNTIMED_ORDER: i32 = std::mem::offset_of!(ThreadState, untimed_order) as i32;
pub const STATE_UNTIMED_GENERATION: i32 =
    std::mem::offset_of!(ThreadState, untimed_generation) as i32;
pub const STATE_RING_ROOM_LIMIT: i32 = std::mem::offset_of!(ThreadState, ring_room_limit) as i32;
// Every offset a stub uses, checked against the layout the runtime accesses.
const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(ThreadState, shadow_top) == STATE_SHADOW_TOP as usize);
    assert!(offset_of!(ThreadState, shadow_base) == STATE_SHADOW_BASE as usize);
    assert!(offset_of!(ThreadState, shadow_limit) == STATE_SHADOW_LIMIT as usize);
    assert!(offset_of!(ThreadState, flags) == STATE_FLAGS as usize);
    assert!(offset_of!(ThreadState, shadow_overflows) == STATE_SHADOW_OVERFLOWS as usize);
    assert!(offset_of!(ThreadState, graph_depth) == STATE_GRAPH_DEPTH as usize);
    assert!(offset_of!(ThreadState, ring_events) == STATE_RING_EVENTS as usize);
    assert!(offset_of!(ThreadState, ring_mask) == STATE_RING_MASK as usize);
    assert!(offset_of!(ThreadState, ring_head) == STATE_RING_HEAD as usize);
    assert!(offset_of!(ThreadState, ring_limit) == STATE_RING_LIMIT as usize);
    assert!(offset_of!(ThreadState, ring_header) == STATE_RING_HEADER as usize);
    assert!(offset_of!(PathEntry, not_entry_rsp) == PATH_ENTRY_KEY as usize);
    assert!(offset_of!(PathEntry, register) == PATH_ENTRY_REGISTER as usize);
    assert!(std::mem::size_of::<PathEntry>() == PATH_ENTRY_SIZE as usize);
    // The shadow stack and the counter tables follow the header in the region.
    assert!(SHADOW_OFFSET >= std::mem::size_of::<ThreadState>());
    assert!(CALLS_OFFSET >= SHADOW_OFFSET + SHADOW_ENTRIES * ENTRY_SIZE as usize);
    assert!(CALLS_OFFSET.is_multiple_of(8) && RETURNS_OFFSET.is_multiple_of(8));
};

/// Region layout: header page, shadow stack, call counters, return counters.
pub const HEADER_BYTES: usize = 32768;
pub const SHADOW_OFFSET: usize = HEADER_BYTES;
pub const CALLS_OFFSET: usize = SHADOW_OFFSET + SHADOW_ENTRIES * ENTRY_SIZE as usize + 0x840;
pub const RETURNS_OFFSET: usize = CALLS_OFFSET + MAX_FUNCTION_IDS * 8;
pub const REGION_BYTES: usize = RETURNS_OFFSET + MAX_FUNCTION_IDS * 8;
const _: () = assert!(std::mem::size_of::<ThreadState>() <= HEADER_BYTES);
const _: () = assert!(REGION_BYTES < i32::MAX as usize);

/// Displacement of function `id`'s call counter from the state pointer.
pub fn calls_displacement(id: u32) -> i32 {
    (CALLS_OFFSET + id as usize * 8) as i32
}

/// Displacement of function `id`'s return counter from the state pointer.
pub fn returns_displacement(id: u32) -> i32 {
    (RETURNS_OFFSET + id as usize * 8) as i32
}

core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".balign 8",
    ".globl tendril_thread_slot",
    ".hidden tendril_thread_slot",
    ".type tendril_thread_slot, @object",
    ".size tendril_thread_slot, 8",
    "tendril_thread_slot:",
    ".zero 8",
    ".popsection",
);

/// Offset of the slot from the thread pointer; the same in every thread.
pub fn slot_offset() -> i32 {
    let offset: i64;
    // SAFETY: reads the GOT entry the dynamic loader filled with the slot's TP offset.
    unsafe {
        std::arch::asm!(
            "mov {}, qword ptr [rip + tendril_thread_slot@GOTTPOFF]",
            out(reg) offset,
            options(nostack, readonly, preserves_flags)
        );
    }
    offset as i32
}

/// Points the calling thread's slot at `state`.
pub(crate) fn set_current_slot(state: *mut ThreadState) {
    let offset = slot_offset() as i64;
    // SAFETY: an fs-relative store to this thread's own initial-exec TLS slot.
    unsafe {
        std::arch::asm!(
            "mov qword ptr fs:[{}], {}",
            in(reg) offset,
            in(reg) state,
            options(nostack, preserves_flags)
        );
    }
}

/// The calling thread's state, or null before it registered.
pub fn current() -> *mut ThreadState {
    let offset = slot_offset() as i64;
    let state: *mut ThreadState;
    // SAFETY: an fs-relative load from this thread's own initial-exec TLS slot.
    unsafe {
        std::arch::asm!(
            "mov {}, qword ptr fs:[{}]",
            out(reg) state,
            in(reg) offset,
            options(nostack, readonly, preserves_flags)
        );
    }
    state
}
