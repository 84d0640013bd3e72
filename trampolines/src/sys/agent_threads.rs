//! The agent's own threads, known by id, and the lock that keeps them from starting or
//! ending while code changes.
//!
//! The agent's threads are named with the [`AGENT_THREAD_PREFIX`] so that anything
//! counting or stopping the target's threads can leave them out; the registry answers
//! "is this an agent thread?" from memory, since it is asked for every thread before
//! each patch.

use crate::sys::state::STATE;
use std::sync::MutexGuard;

/// Every thread the agent creates has a name starting with this prefix.
pub const AGENT_THREAD_PREFIX: &str = "tendril-";

fn agent_threads() -> MutexGuard<'static, Vec<i32>> {
    STATE
        .agent_threads
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The calling agent thread's entry in `STATE.agent_threads`, removed when the thread ends
/// (returning or unwinding), so a later thread given the same id is not taken for one.
pub struct AgentThread(i32);

impl AgentThread {
    pub fn register() -> AgentThread {
        let tid = crate::sys::gettid();
        agent_threads().push(tid);
        AgentThread(tid)
    }
}

impl Drop for AgentThread {
    fn drop(&mut self) {
        agent_threads().retain(|&agent| agent != self.0);
    }
}

/// Whether thread `tid` is one of the agent's own. Asked for every thread before each
/// patch, so it is answered from memory rather than from `/proc`.
pub fn is_agent_thread(tid: i32) -> bool {
    agent_threads().contains(&tid)
}

/// Held while code changes (a patch going in or out) and while an agent thread starts
/// or ends.
///
/// The patcher leaves the agent's own threads out when it stops the target's, so an
/// agent thread must not be inside the target's code while that code changes. glibc
/// starts and ends a thread with every signal blocked and runs libc functions
/// meanwhile (`__ctype_init`, `madvise`, `free`...), any of which may be the function
/// being patched. So the agent starts threads only between code changes, and a thread
/// whose work is done ends only while another thread holds this lock and waits for it
/// to be gone (see `session_threads`).
pub fn code_change() -> MutexGuard<'static, ()> {
    STATE
        .code_change
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
