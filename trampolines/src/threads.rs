//! Facts about the target's threads as seen from inside the target.
//!
//! The agent's own threads are named with the [`AGENT_THREAD_PREFIX`] so that anything
//! counting or stopping the target's threads can leave them out.

use std::sync::{Mutex, MutexGuard};

/// Every thread the agent creates has a name starting with this prefix.
pub const AGENT_THREAD_PREFIX: &str = "tendril-";

/// Number of threads of this process that are not the agent's own.
pub fn target_thread_count() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|task| task.file_name().to_str().and_then(|s| s.parse().ok()))
        // A thread that ended since the listing has no comm left: it is not counted.
        .filter(|&tid| {
            let mut buffer = [0u8; 64];
            crate::tasks::name(tid, &mut buffer)
                .is_some_and(|name| !name.starts_with(AGENT_THREAD_PREFIX.as_bytes()))
        })
        .count()
}

/// The agent's threads that are running, by thread id (see [`spawn_agent_thread`]).
static AGENT_THREADS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

fn agent_threads() -> MutexGuard<'static, Vec<i32>> {
    AGENT_THREADS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The calling agent thread's entry in [`AGENT_THREADS`], removed when the thread ends
/// (returning or unwinding), so a later thread given the same id is not taken for one.
struct AgentThread(i32);

impl AgentThread {
    fn register() -> AgentThread {
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

/// When a new agent thread may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// At once: the agent's first thread, started inside `dlopen` (under the loader's
    /// lock, which a starting thread may need) before anything is patched.
    Immediately,
    /// Once no code is changing; the spawn returns when the thread runs (glibc has
    /// given it its signal mask back).
    BetweenCodeChanges,
}

/// Runs `body` on a new named agent thread, started as `start` says. Signals meant for
/// the target are blocked there, so they never run the target's handlers on an agent
/// thread — all but the synchronous ones (a trap or fault raised while blocked would
/// kill the process). The thread's hooks step aside, so the agent never counts or
/// hooks its own calls. The thread may only be joined while [`code_change`] is held.
pub fn spawn_agent_thread<F>(
    name: &str,
    start: Start,
    body: F,
) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    let _no_code_change = (start == Start::BetweenCodeChanges).then(code_change);
    let (started_sender, started) = std::sync::mpsc::channel::<()>();
    // SAFETY: sigset_t is plain data; sigfillset initialises it fully before use, and
    // pthread_sigmask only swaps the calling thread's mask, which is restored below.
    let previous_mask = unsafe {
        let mut blocked: libc::sigset_t = std::mem::zeroed();
        let mut previous: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut blocked);
        for synchronous in crate::stop_world::SYNCHRONOUS_SIGNALS {
            libc::sigdelset(&mut blocked, synchronous);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &blocked, &mut previous);
        previous
    };
    // The new thread inherits the mask from this thread.
    let spawned = std::thread::Builder::new()
        .name(format!("{AGENT_THREAD_PREFIX}{name}"))
        .spawn(move || {
            crate::thread_state::mark_current_thread_as_agent();
            let _registered = AgentThread::register();
            let _ = started_sender.send(());
            body()
        });
    // SAFETY: restores the mask saved above for the calling thread.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &previous_mask, std::ptr::null_mut());
    }
    if spawned.is_ok() && start == Start::BetweenCodeChanges {
        // An error means the thread ended before it said so: it runs no more code.
        let _ = started.recv();
    }
    spawned
}
