//! Per-thread state: mapping each thread's region and registering it.
//!
//! The region's layout is `hooks::thread_layout` (re-exported here). A thread's slot is
//! 0 until it first runs a hook; the stub then takes its slow path, which maps the
//! thread's state region — with system calls only, since the thread may be inside
//! `malloc` — and registers it. Regions are never unmapped: a frame may return through
//! them long after a detach.
//!
//! The agent's own threads point their slot at a shared state whose `PASSTHROUGH` flag
//! makes every hook step aside, so the agent never counts or hooks its own calls.

use crate::hooks::slow_call::SavedRegisters;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

pub use crate::hooks::thread_layout::*;

/// Threads the registry can list.
const MAX_THREADS: usize = 1 << 16;

/// `ThreadState::flags_before_fork`: the thread is between fork's prepare handler and
/// its parent or child handler.
const FORK_HOLD: u64 = 1 << 63;

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
        (*state).slow_depth_address = crate::hooks::slow_call::current_depth_address();
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
