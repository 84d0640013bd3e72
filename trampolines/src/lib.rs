//! The tendril agent: the shared library tendril loads into a target process.
//!
//! Loading it (a remote `dlopen` made by the controller) runs [`agent_init`] from
//! `.init_array`, which starts the agent's control thread and returns at once, so the
//! target's thread that performed the `dlopen` goes straight back to what it was doing.
//! The library stays resident after a detach and is reused by the next attach; it never
//! unloads, because trampolines it creates must outlive every thread that may be in them.

mod alloc;
mod branch_index;
mod calibration;
mod code_memory;
mod control;
mod control_listener;
mod counting;
mod discovery;
mod lingering;
mod padding;
mod patch_protocol;
mod patch_targets;
mod patcher;
mod recording;
mod relocate;
mod retire;
mod session_threads;
mod shadow;
mod slow_call;
mod stop_world;
mod stubs;
mod sys;
mod tasks;
mod thread_state;
mod threads;
mod traps;

/// Every allocation of the agent's Rust code; see `alloc` for why not the target's.
#[global_allocator]
static AGENT_ALLOCATOR: alloc::AgentAllocator = alloc::AgentAllocator::new();

use std::sync::atomic::{AtomicBool, Ordering};

/// Set once the control thread has been started in this process image.
static CONTROL_STARTED: AtomicBool = AtomicBool::new(false);

/// Runs when the library is loaded. Must never panic or block: it runs inside the
/// target's `dlopen`, under the dynamic loader's lock.
extern "C" fn agent_init() {
    tendril_agent_start();
}

// SAFETY: placing a function pointer in .init_array is the documented ELF mechanism for
// a shared-library constructor; `agent_init` has the required `extern "C" fn()` ABI and
// is safe to run at load time (it only spawns a thread).
#[used]
#[unsafe(link_section = ".init_array")]
static AGENT_INIT: extern "C" fn() = agent_init;

/// Starts the control thread if it is not running in this process image. Exported so
/// the controller can call it directly in a forked child, where the library is mapped
/// but the parent's control thread does not exist. Returns 0 on success, -1 on failure
/// (the reason is written to the agent error file).
#[unsafe(no_mangle)]
pub extern "C" fn tendril_agent_start() -> i32 {
    if CONTROL_STARTED.swap(true, Ordering::AcqRel) {
        return 0;
    }
    match std::panic::catch_unwind(control::spawn_control_thread) {
        Ok(Ok(())) => 0,
        Ok(Err(error)) => {
            CONTROL_STARTED.store(false, Ordering::Release);
            control::report_startup_error(&error);
            -1
        }
        Err(_) => {
            CONTROL_STARTED.store(false, Ordering::Release);
            -1
        }
    }
}

/// Whether `address` lies in the agent library's own code: it is never instrumented.
pub(crate) fn is_agent_code(address: u64) -> bool {
    use std::sync::OnceLock;
    static RANGES: OnceLock<Vec<(u64, u64)>> = OnceLock::new();
    let ranges = RANGES.get_or_init(|| {
        // SAFETY: dladdr fills `info` for an address inside a loaded object; this
        // function's own address is one.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        if unsafe { libc::dladdr(is_agent_code as *const libc::c_void, &mut info) } == 0
            || info.dli_fname.is_null()
        {
            return Vec::new();
        }
        // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
        let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        maps.lines()
            .filter(|line| line.ends_with(&path))
            .filter_map(|line| {
                let (start, end) = line.split_whitespace().next()?.split_once('-')?;
                Some((
                    u64::from_str_radix(start, 16).ok()?,
                    u64::from_str_radix(end, 16).ok()?,
                ))
            })
            .collect()
    });
    ranges
        .iter()
        .any(|&(start, end)| (start..end).contains(&address))
}

/// A forked child inherits the mapped agent and the patched code, but not the agent's
/// threads and not the controller's session: it gets its original code back at once
/// (it has a single thread, so no stop is needed), lets go of the recording's shared
/// rings (they are its parent's), and a later attach may start a fresh control thread
/// in it. The forking thread's hooks stepped aside from the prepare handler on (see
/// [`before_fork`]), so nothing the child ran before this handler reached the rings;
/// they work again once the rings are gone (frames opened before the fork return
/// through their exits and record nothing).
extern "C" fn after_fork_in_child() {
    patch_protocol::restore_all_in_forked_child();
    recording::forget_in_forked_child();
    CONTROL_STARTED.store(false, Ordering::Release);
    thread_state::release_after_fork();
}

/// Prepare handler: the forking thread records nothing until the parent or child
/// handler runs. Registered last, it runs before every other prepare handler.
extern "C" fn before_fork() {
    thread_state::hold_for_fork();
}

/// Parent handler: the forking thread's hooks work as before.
extern "C" fn after_fork_in_parent() {
    thread_state::release_after_fork();
}

/// Registers the fork handlers once, from the constructor path.
pub(crate) fn register_fork_handler() {
    // SAFETY: pthread_atfork only records the function pointers. The handlers only
    // touch the calling thread's own state and the agent's atomics, with no lock and
    // no allocation, as handlers around fork must.
    unsafe {
        libc::pthread_atfork(
            Some(before_fork),
            Some(after_fork_in_parent),
            Some(after_fork_in_child),
        );
    }
}
