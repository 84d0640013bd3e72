//! Per-thread state that hook stubs reach in one instruction, and its registration.
//!
//! `tendril_thread_slot` is an initial-exec TLS variable, so its address is a constant
//! offset from the thread pointer (`fs`) in every thread: a stub loads the thread's
//! state with `mov rcx, fs:[offset]`. (Stable Rust cannot choose a TLS model, so the
//! variable is declared in assembly and its offset read from the GOT, where the loader
//! put it.)
//!
//! The slot is 0 until a thread first runs a hook; the stub then takes its slow path,
//! which maps the thread's state region — with system calls only, since the thread may
//! be inside `malloc` — and registers it. A region holds, at fixed offsets the stubs use
//! as displacements: the [`ThreadState`] header, the shadow stack of return addresses,
//! and the call and return counters indexed by function id. Regions are never unmapped:
//! a frame may return through them long after a detach.
//!
//! The agent's own threads point their slot at a shared state whose `PASSTHROUGH` flag
//! makes every hook step aside, so the agent never counts or hooks its own calls.

use crate::slow_call::SavedRegisters;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// Function ids the counter tables have room for (ids are never reused).
pub const MAX_FUNCTION_IDS: usize = 1 << 18;
/// Entries of a shadow stack; deeper recursion runs without return hooks.
pub const SHADOW_ENTRIES: usize = 32 * 1024;
/// Threads the registry can list.
const MAX_THREADS: usize = 1 << 16;

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
const _: () = assert!(std::mem::size_of::<ShadowEntry>() == ENTRY_SIZE as usize);

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
}

/// `ThreadState::flags_before_fork`: the thread is between fork's prepare handler and
/// its parent or child handler.
const FORK_HOLD: u64 = 1 << 63;

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
const _: () = assert!(std::mem::offset_of!(ThreadState, shadow_overflows) == 32);
const _: () = assert!(std::mem::offset_of!(ThreadState, graph_depth) == 48);
const _: () = assert!(std::mem::offset_of!(ThreadState, ring_header) == 88);

/// Region layout: header page, shadow stack, call counters, return counters.
const HEADER_BYTES: usize = 8192;
const SHADOW_OFFSET: usize = HEADER_BYTES;
pub const CALLS_OFFSET: usize = SHADOW_OFFSET + SHADOW_ENTRIES * ENTRY_SIZE as usize + 0x840;
pub const RETURNS_OFFSET: usize = CALLS_OFFSET + MAX_FUNCTION_IDS * 8;
const REGION_BYTES: usize = RETURNS_OFFSET + MAX_FUNCTION_IDS * 8;
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

static REGISTERED: [AtomicPtr<ThreadState>; MAX_THREADS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_THREADS];
static REGISTERED_COUNT: AtomicUsize = AtomicUsize::new(0);
/// Threads inside [`register_current_thread`]: inside a hook, but not yet listed.
static REGISTERING: AtomicUsize = AtomicUsize::new(0);
static AGENT_STATE: OnceLock<usize> = OnceLock::new();

/// Maps a zeroed, lazily committed region with system calls only.
fn map_region() -> *mut ThreadState {
    // SAFETY: an anonymous private mapping with no address hint has no preconditions;
    // the result is checked against MAP_FAILED.
    let mapped = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            REGION_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if mapped == libc::MAP_FAILED {
        return std::ptr::null_mut();
    }
    let state = mapped.cast::<ThreadState>();
    let base = mapped as u64 + SHADOW_OFFSET as u64;
    // SAFETY: the mapping is fresh, zeroed and large enough for the header.
    unsafe {
        (*state).shadow_base = base;
        (*state).shadow_top = base;
        (*state).shadow_limit = base + (SHADOW_ENTRIES * ENTRY_SIZE as usize) as u64;
        (*state).tid = libc::gettid();
        (*state).slow_depth_address = crate::slow_call::current_depth_address();
        libc::prctl(libc::PR_GET_NAME, (*state).name.as_mut_ptr());
    }
    state
}

/// A fresh state region for agent code that records on its own thread (calibration);
/// never registered, so no collector reads it.
pub fn map_private_state() -> Option<*mut ThreadState> {
    let state = map_region();
    (!state.is_null()).then_some(state)
}

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

/// Prepares what the stubs rely on; call before the first patch.
pub fn prepare() -> Result<(), String> {
    agent_state().map(drop)
}

fn agent_state() -> Result<*mut ThreadState, String> {
    let state = *AGENT_STATE.get_or_init(|| {
        let state = map_region();
        if !state.is_null() {
            // SAFETY: the region was just mapped and is not shared yet.
            unsafe {
                (*state).flags = FLAG_PASSTHROUGH;
                (*state).is_agent = 1;
                // A full shadow stack: nothing is ever pushed on the shared state.
                (*state).shadow_limit = (*state).shadow_base;
            }
        }
        state as usize
    });
    if state == 0 {
        return Err("cannot map the agent threads' state".into());
    }
    Ok(state as *mut ThreadState)
}

/// Points the calling agent thread's slot at the shared pass-through state.
pub fn mark_current_thread_as_agent() {
    if let Ok(state) = agent_state() {
        set_current_slot(state);
    }
}

/// Slow path of a stub whose thread has no state yet: registers the thread and returns
/// its state in the caller's `rcx`. Runs on a target thread that may hold any lock, so
/// it only makes system calls.
pub extern "C" fn register_current_thread(registers: &mut SavedRegisters) {
    // Until the state is listed, only this count says the thread is inside a hook.
    REGISTERING.fetch_add(1, Ordering::SeqCst);
    let passthrough = AGENT_STATE.get().copied().unwrap_or(0) as *mut ThreadState;
    // Hooks hit while registering (mmap may be patched) step aside.
    set_current_slot(passthrough);
    let state = map_region();
    let index = REGISTERED_COUNT.fetch_add(1, Ordering::SeqCst);
    if state.is_null() {
        registers.rcx = passthrough as u64;
    } else {
        if index < MAX_THREADS {
            REGISTERED[index].store(state, Ordering::SeqCst);
        }
        set_current_slot(state);
        registers.rcx = state as u64;
    }
    REGISTERING.fetch_sub(1, Ordering::SeqCst);
}

/// Threads registering now, and how many registrations were ever started: a pass that
/// sees both unchanged from its start saw every thread that is inside a hook.
pub fn registration_progress() -> (usize, usize) {
    (
        REGISTERING.load(Ordering::SeqCst),
        REGISTERED_COUNT.load(Ordering::SeqCst),
    )
}

/// Runs `body` on the calling thread's state with its hooks stepping aside (agent code
/// running on a target thread must not re-enter the hooks). `None` for agent threads
/// and threads without state.
pub fn with_own_state<R>(body: impl FnOnce(&mut ThreadState) -> R) -> Option<R> {
    let state = current();
    if state.is_null() {
        return None;
    }
    // SAFETY: a thread's state is written only by that thread (the agent's collectors
    // only read counters); the region is mapped for the life of the process.
    let state = unsafe { &mut *state };
    if state.is_agent != 0 {
        return None;
    }
    let previous = state.flags;
    state.flags |= FLAG_PASSTHROUGH;
    let result = body(state);
    state.flags = (state.flags & !FLAG_PASSTHROUGH) | (previous & FLAG_PASSTHROUGH);
    Some(result)
}

/// `pthread_atfork` prepare handler: no hook of the forking thread records or counts
/// anything until the parent or child handler ([`release_after_fork`]). In the child,
/// the code that runs before the child handlers (glibc's own: unlocking malloc...)
/// would otherwise write into rings that belong to the parent.
pub fn hold_for_fork() {
    let state = current();
    if state.is_null() {
        return;
    }
    // SAFETY: the calling thread's own state; only it writes its flags.
    let state = unsafe { &mut *state };
    if state.is_agent != 0 {
        return;
    }
    state.flags_before_fork = FORK_HOLD | (state.flags & FLAG_PASSTHROUGH);
    state.flags |= FLAG_PASSTHROUGH;
}

/// `pthread_atfork` parent and child handler (the child's after it let go of the
/// rings): the hooks of the thread work as before the fork.
pub fn release_after_fork() {
    let state = current();
    if state.is_null() {
        return;
    }
    // SAFETY: as in `hold_for_fork`.
    let state = unsafe { &mut *state };
    if state.flags_before_fork & FORK_HOLD == 0 {
        return;
    }
    state.flags = (state.flags & !FLAG_PASSTHROUGH) | (state.flags_before_fork & FLAG_PASSTHROUGH);
    state.flags_before_fork = 0;
}

/// Every registered target thread's state, in registration order.
pub fn registered_threads() -> Vec<&'static ThreadState> {
    let count = REGISTERED_COUNT.load(Ordering::Acquire).min(MAX_THREADS);
    REGISTERED[..count]
        .iter()
        .map(|r| r.load(Ordering::Acquire))
        .filter(|r| !r.is_null())
        // SAFETY: registered regions are never unmapped.
        .map(|state| unsafe { &*state })
        .collect()
}

impl ThreadState {
    /// The call counter of function `id`.
    pub fn calls(&self, id: u32) -> u64 {
        self.counter(CALLS_OFFSET, id)
    }

    /// The return counter of function `id`.
    pub fn returns(&self, id: u32) -> u64 {
        self.counter(RETURNS_OFFSET, id)
    }

    /// Sets function `id`'s call and return counters to zero (see
    /// `counting::reset_before_patching` for when that is safe).
    pub fn reset_counters(&self, id: u32) {
        assert!((id as usize) < MAX_FUNCTION_IDS);
        let base = self as *const ThreadState as *mut u8;
        for offset in [CALLS_OFFSET, RETURNS_OFFSET] {
            // Only counters that hold something are written: writing a zero would
            // commit a page of the region that reading leaves uncommitted.
            if self.counter(offset, id) == 0 {
                continue;
            }
            // SAFETY: the counter lies inside this thread's region, mapped for the life
            // of the process; no hook of `id` runs now, so no thread writes it.
            unsafe {
                std::ptr::write_volatile(base.add(offset + id as usize * 8).cast::<u64>(), 0)
            };
        }
    }

    fn counter(&self, offset: usize, id: u32) -> u64 {
        assert!((id as usize) < MAX_FUNCTION_IDS);
        let base = self as *const ThreadState as *const u8;
        // SAFETY: the counter lies inside this thread's region, which is mapped for the
        // life of the process. Other threads write it concurrently with plain stores of
        // whole words, so a volatile read sees some recent value.
        unsafe { std::ptr::read_volatile(base.add(offset + id as usize * 8).cast::<u64>()) }
    }

    /// The live shadow entries, oldest first.
    ///
    /// # Safety
    /// Only the owning thread may call this, with its hooks stepping aside.
    pub unsafe fn shadow_entries(&mut self) -> &mut [ShadowEntry] {
        let count = (self.shadow_top - self.shadow_base) as usize / ENTRY_SIZE as usize;
        // SAFETY: [shadow_base, shadow_top) holds initialised entries of this region,
        // and the caller is the owning thread (see above).
        unsafe { std::slice::from_raw_parts_mut(self.shadow_base as *mut ShadowEntry, count) }
    }
}
