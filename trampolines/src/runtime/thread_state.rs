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
use crate::runtime::state::{MAX_REGISTERED, STATE};
use crate::sys::agent_threads::AGENT_THREAD_PREFIX;
use crate::sys::error::AgentError;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::hooks::state_access::with_hooks_stepping_aside;
pub use crate::hooks::state_access::{EntryPtr, StatePtr, current_state};
pub use crate::hooks::thread_layout::*;

/// `ThreadState::flags_before_fork`: the thread is between fork's prepare handler and
/// its parent or child handler.
const FORK_HOLD: u64 = 1 << 63;

/// A zeroed, lazily committed region, made ahead ([`reserve_regions`]) or mapped now,
/// with system calls only.
fn map_region() -> Option<StatePtr> {
    let mapped = match RegionPool::shared().take() {
        Some(region) => region,
        None => map_own_region()?,
    };
    // SAFETY: a fresh, page-aligned, zeroed mapping of REGION_BYTES (its own, or one of
    // the regions made ahead, each handed out once) that is never unmapped; `mmap`'s
    // pointer has provenance over all of it.
    let state = unsafe { StatePtr::from_raw(mapped.cast::<ThreadState>()) }?;
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    state.initialise(tid, crate::hooks::slow_call::current_depth_address());
    // SAFETY: the name field holds 16 bytes, what PR_GET_NAME writes; the state is not
    // shared yet.
    unsafe { libc::prctl(libc::PR_GET_NAME, state.name_buffer()) };
    Some(state)
}

/// Maps `count` regions ahead in one mapping, for threads that register later (once
/// per process; `runtime::room_ahead` says why). Runs on an agent thread.
pub fn reserve_regions(count: usize) {
    RegionPool::shared().reserve(count);
}

/// Regions made ahead in one mapping: its address (0 before), how many it holds, and
/// how many were handed out.
struct RegionPool<'a> {
    base: &'a AtomicU64,
    regions: &'a AtomicUsize,
    taken: &'a AtomicUsize,
}

impl RegionPool<'static> {
    /// The process's pool, in the runtime's state.
    fn shared() -> RegionPool<'static> {
        RegionPool {
            base: &STATE.pool_base,
            regions: &STATE.pool_regions,
            taken: &STATE.pool_taken,
        }
    }
}

impl RegionPool<'_> {
    /// Maps `count` regions in one mapping, unless it holds regions already.
    fn reserve(&self, count: usize) {
        if count == 0 || self.base.load(Ordering::Acquire) != 0 {
            return;
        }
        // SAFETY: an anonymous private mapping with no address hint; the result is
        // checked against MAP_FAILED. Never unmapped, as every thread's region.
        let mapped = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                count * REGION_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if mapped == libc::MAP_FAILED {
            return;
        }
        self.regions.store(count, Ordering::Release);
        self.base.store(mapped as u64, Ordering::Release);
    }

    /// The next region not handed out, if one is left (no system call: the thread may
    /// be anywhere).
    fn take(&self) -> Option<*mut libc::c_void> {
        let base = self.base.load(Ordering::Acquire);
        let regions = self.regions.load(Ordering::Acquire);
        if base == 0 || self.taken.load(Ordering::Relaxed) >= regions {
            return None;
        }
        let index = self.taken.fetch_add(1, Ordering::AcqRel);
        (index < regions).then(|| (base + (index * REGION_BYTES) as u64) as *mut libc::c_void)
    }
}

/// Maps a region of the calling thread's own.
fn map_own_region() -> Option<*mut libc::c_void> {
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
    (mapped != libc::MAP_FAILED).then_some(mapped)
}

/// A fresh state region for agent code that records on its own thread (calibration);
/// never registered, so no collector reads it.
pub fn map_private_state() -> Option<StatePtr> {
    map_region()
}

/// Prepares what the stubs rely on; call before the first patch.
pub fn prepare() -> Result<(), AgentError> {
    agent_state().map(drop)
}

fn agent_state() -> Result<StatePtr, AgentError> {
    let state = *STATE.agent_thread_state.get_or_init(|| {
        let state = map_region()?;
        state.flags().store(FLAG_PASSTHROUGH, Ordering::Relaxed);
        state.is_agent().store(1, Ordering::Relaxed);
        // A full shadow stack: nothing is ever pushed on the shared state.
        let base = state.shadow_base().load(Ordering::Relaxed);
        state.shadow_limit().store(base, Ordering::Relaxed);
        Some(state)
    });
    state.ok_or_else(|| AgentError::Unusable("cannot map the agent threads' state".into()))
}

/// Points the calling agent thread's slot at the shared pass-through state.
pub fn mark_current_thread_as_agent() {
    if let Ok(state) = agent_state() {
        set_current_slot(state.as_ptr());
    }
}

/// Slow path of a stub whose thread has no state yet: registers the thread and returns
/// its state in the caller's `rcx`. Runs on a target thread that may hold any lock, so
/// it only makes system calls.
pub extern "C" fn register_current_thread(registers: &mut SavedRegisters) {
    // Until the state is listed, only this count says the thread is inside a hook.
    STATE.registering.fetch_add(1, Ordering::SeqCst);
    let passthrough = STATE
        .agent_thread_state
        .get()
        .copied()
        .flatten()
        .map_or(std::ptr::null_mut(), StatePtr::as_ptr);
    // Hooks hit while registering (mmap may be patched) step aside.
    set_current_slot(passthrough);
    if is_agent_thread_starting() {
        // Its slot stays on the pass-through state, as marking it would leave it.
        registers.rcx = passthrough as u64;
        STATE.registering.fetch_sub(1, Ordering::SeqCst);
        return;
    }
    let index = STATE.registered_count.fetch_add(1, Ordering::SeqCst);
    match map_region() {
        None => registers.rcx = passthrough as u64,
        Some(state) => {
            if index < MAX_REGISTERED {
                STATE.registered[index].store(state.as_ptr(), Ordering::SeqCst);
            }
            set_current_slot(state.as_ptr());
            registers.rcx = state.as_ptr() as u64;
        }
    }
    STATE.registering.fetch_sub(1, Ordering::SeqCst);
}

/// Whether the calling thread is an agent thread that has not marked itself yet: glibc's
/// and Rust's thread start run libc functions (`__ctype_init`, `mmap`, `sigaltstack`...)
/// before the thread's body, and a hook there must not discover or record. The agent
/// may start the thread while it holds `code_change`, which a patcher holding the
/// loader's lock waits for: a discovery here would wait for that lock, and the three
/// threads for each other. A new thread takes its creator's name until it is given its
/// own, so an agent thread's name has the agent's prefix from its first instruction.
/// System calls only.
fn is_agent_thread_starting() -> bool {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes, the buffer's size.
    let read = unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) } == 0;
    read && name.starts_with(AGENT_THREAD_PREFIX.as_bytes())
}

/// Threads registering now, and how many registrations were ever started: a pass that
/// sees both unchanged from its start saw every thread that is inside a hook.
pub fn registration_progress() -> (usize, usize) {
    (
        STATE.registering.load(Ordering::SeqCst),
        STATE.registered_count.load(Ordering::SeqCst),
    )
}

/// Runs `body` on the calling thread's state with its hooks stepping aside (agent code
/// running on a target thread must not re-enter the hooks). `None` for agent threads
/// and threads without state. Only the calling thread writes its state's words (other
/// threads read them, and `retire` marks entries atomically), so `body` may read a word
/// and store it back.
pub fn with_own_state<R>(body: impl FnOnce(StatePtr) -> R) -> Option<R> {
    let state = current_state()?;
    if state.is_agent().load(Ordering::Relaxed) != 0 {
        return None;
    }
    Some(with_hooks_stepping_aside(state, || body(state)))
}

/// `pthread_atfork` prepare handler: no hook of the forking thread records or counts
/// anything until the parent or child handler ([`release_after_fork`]). In the child,
/// the code that runs before the child handlers (glibc's own: unlocking malloc...)
/// would otherwise write into rings that belong to the parent.
pub fn hold_for_fork() {
    let Some(state) = current_state() else {
        return;
    };
    if state.is_agent().load(Ordering::Relaxed) != 0 {
        return;
    }
    // The calling thread's own state: only it writes these words.
    let flags = state.flags().load(Ordering::Relaxed);
    state
        .flags_before_fork()
        .store(FORK_HOLD | (flags & FLAG_PASSTHROUGH), Ordering::Relaxed);
    state
        .flags()
        .store(flags | FLAG_PASSTHROUGH, Ordering::Relaxed);
}

/// `pthread_atfork` parent and child handler (the child's after it let go of the
/// rings): the hooks of the thread work as before the fork.
pub fn release_after_fork() {
    let Some(state) = current_state() else {
        return;
    };
    let before = state.flags_before_fork().load(Ordering::Relaxed);
    if before & FORK_HOLD == 0 {
        return;
    }
    let flags = state.flags().load(Ordering::Relaxed);
    state.flags().store(
        (flags & !FLAG_PASSTHROUGH) | (before & FLAG_PASSTHROUGH),
        Ordering::Relaxed,
    );
    state.flags_before_fork().store(0, Ordering::Relaxed);
}

/// Every registered target thread's state, in registration order.
pub fn registered_threads() -> Vec<StatePtr> {
    let count = STATE
        .registered_count
        .load(Ordering::Acquire)
        .min(MAX_REGISTERED);
    STATE.registered[..count]
        .iter()
        // SAFETY: the registry holds only null or regions from `map_region`, which are
        // never unmapped.
        .filter_map(|r| unsafe { StatePtr::from_raw(r.load(Ordering::Acquire)) })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_named_as_the_agent_s_steps_aside_from_its_first_hook_unregistered() {
        prepare().unwrap();
        let passthrough = agent_state().unwrap().as_ptr() as u64;
        let starting = std::thread::Builder::new()
            .name(format!("{AGENT_THREAD_PREFIX}starting"))
            .spawn(move || {
                let mut registers = SavedRegisters::default();
                register_current_thread(&mut registers);
                // Registered, the thread's slot would hold a state of its own.
                (
                    registers.rcx == passthrough,
                    current() as u64 == passthrough,
                )
            })
            .unwrap();
        assert_eq!(starting.join().unwrap(), (true, true));
    }

    #[test]
    fn regions_made_ahead_are_handed_out_once_each_then_none() {
        let (base, regions, taken) = (AtomicU64::new(0), AtomicUsize::new(0), AtomicUsize::new(0));
        let pool = RegionPool {
            base: &base,
            regions: &regions,
            taken: &taken,
        };
        assert_eq!(pool.take(), None);
        pool.reserve(3);
        let handed: Vec<u64> = (0..3)
            .map(|_| pool.take().expect("a region made ahead") as u64)
            .collect();
        let first = base.load(Ordering::Acquire);
        let size = REGION_BYTES as u64;
        assert_eq!(handed, vec![first, first + size, first + 2 * size]);
        assert_eq!(pool.take(), None);
        // Made once: a second reservation adds none.
        pool.reserve(3);
        assert_eq!(pool.take(), None);
        // SAFETY: the region was mapped above, readable and writable, never unmapped.
        unsafe {
            let word = handed[2] as *mut u64;
            assert_eq!(*word, 0, "a region made ahead is zeroed");
            *word = 7;
            assert_eq!(*word, 7);
        }
    }
}
