//! The agent's own threads, known by id, and the lock that keeps them from starting or
//! ending while code changes.
//!
//! The agent's threads are named with the [`AGENT_THREAD_PREFIX`] so that anything
//! counting or stopping the target's threads can leave them out; the registry answers
//! "is this an agent thread?" from memory, since it is asked for every thread before
//! each patch.

use std::sync::{Mutex, MutexGuard};

/// Every thread the agent creates has a name starting with this prefix.
pub const AGENT_THREAD_PREFIX: &str = "tendril-";

/// The agent's threads that are running, by thread id (see `runtime::threads::spawn_agent_thread`).
static AGENT_THREADS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

fn agent_threads() -> MutexGuard<'static, Vec<i32>> {
    AGENT_THREADS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The calling agent thread's entry in [`AGENT_THREADS`], removed when the thread ends
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

/// Held while the target's code holds a transient `int3` (a patch going in or coming
/// out), and while an agent thread starts or ends.
///
/// glibc starts and ends a thread with every signal blocked, SIGTRAP included, and
/// runs libc functions meanwhile (`__ctype_init`, `madvise`, `free`...). A thread that
/// meets an `int3` with SIGTRAP blocked is not sent to tendril's handler: the kernel
/// ends the whole process. So the agent starts threads only while no `int3` is in the
/// code, and a thread whose work is done ends only while another thread holds this lock
/// and waits for it to be gone (see `session_threads`).
static CODE_CHANGE: Mutex<()> = Mutex::new(());

/// Holds off agent thread starts and ends while code changes (see [`CODE_CHANGE`]).
pub fn code_change() -> MutexGuard<'static, ()> {
    CODE_CHANGE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
