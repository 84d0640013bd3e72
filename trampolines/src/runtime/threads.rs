//! Starting the agent's own threads, and counting the target's.
//!
//! An agent thread starts with the target's signals blocked and its hooks stepping aside
//! (its slot points at the shared pass-through state), registered in
//! `sys::agent_threads`, and only between code changes when asked.

use crate::sys::agent_threads::{AGENT_THREAD_PREFIX, AgentThread, code_change};

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
            crate::sys::tasks::name(tid, &mut buffer)
                .is_some_and(|name| !name.starts_with(AGENT_THREAD_PREFIX.as_bytes()))
        })
        .count()
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
        for synchronous in crate::sys::SYNCHRONOUS_SIGNALS {
            libc::sigdelset(&mut blocked, synchronous);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &blocked, &mut previous);
        previous
    };
    // The new thread inherits the mask from this thread.
    let spawned = std::thread::Builder::new()
        .name(format!("{AGENT_THREAD_PREFIX}{name}"))
        .spawn(move || {
            crate::runtime::thread_state::mark_current_thread_as_agent();
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
