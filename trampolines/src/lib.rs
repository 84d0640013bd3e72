//! The tendril agent: the shared library tendril loads into a target process. Its
//! package is `tendril-agent`, in the folder `trampolines/`.
//!
//! Loading it (a remote `dlopen` made by the controller) runs [`agent_init`] from
//! `.init_array`, which starts the agent's control thread and returns at once, so the
//! target's thread that performed the `dlopen` goes straight back to what it was doing.
//! The library stays resident after a detach and is reused by the next attach; it never
//! unloads, because trampolines it creates must outlive every thread that may be in them.

mod code;
mod control;
mod hooks;
mod patching;
mod runtime;
mod sys;

/// Every allocation of the agent's Rust code; see `alloc` for why not the target's.
///
/// Not under Miri: Miri tracks the borrows of each allocation it knows of, and every
/// block this allocator carves out of a 1 MiB mapping is part of that one allocation
/// for Miri, so the tests' thousands of blocks (iced-x86's tables) made each access
/// cost as much as all of them: one test of `code::relocate` ran for more than 17
/// minutes. There the tests allocate from Miri's own allocator, and `sys::alloc`'s
/// tests check this one directly.
#[cfg_attr(not(miri), global_allocator)]
#[cfg_attr(miri, allow(dead_code))]
static AGENT_ALLOCATOR: sys::alloc::AgentAllocator = sys::alloc::AgentAllocator::new();

/// Runs when the library is loaded. Must never panic or block: it runs inside the
/// target's `dlopen`, under the dynamic loader's lock.
#[cfg_attr(miri, allow(dead_code))]
extern "C" fn agent_init() {
    tendril_agent_start();
}

// SAFETY: placing a function pointer in .init_array is the documented ELF mechanism for
// a shared-library constructor; `agent_init` has the required `extern "C" fn()` ABI and
// is safe to run at load time (it only spawns a thread).
// Not under Miri: there the unit tests run in an interpreter, not in a target, and the
// control thread's system calls (sockets, memfd) are outside what Miri models.
#[cfg(not(miri))]
#[used]
#[unsafe(link_section = ".init_array")]
static AGENT_INIT: extern "C" fn() = agent_init;

/// Starts the control thread if it is not running in this process image. Exported so
/// the controller can call it directly in a forked child, where the library is mapped
/// but the parent's control thread does not exist. Returns 0 on success, -1 on failure
/// (the reason is written to the agent error file).
#[unsafe(no_mangle)]
pub extern "C" fn tendril_agent_start() -> i32 {
    control::start_once()
}
