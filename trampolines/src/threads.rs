//! Facts about the target's threads as seen from inside the target.
//!
//! The agent's own threads are named with the [`AGENT_THREAD_PREFIX`] so that anything
//! counting or stopping the target's threads can leave them out.

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

/// Runs `body` on a new named agent thread. Signals meant for the target are blocked
/// there, so they never run the target's handlers on an agent thread — all but the
/// synchronous ones (a trap or fault raised while blocked would kill the process). The
/// thread's hooks step aside, so the agent never counts or hooks its own calls.
pub fn spawn_agent_thread<F>(name: &str, body: F) -> std::io::Result<()>
where
    F: FnOnce() + Send + 'static,
{
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
            body()
        });
    // SAFETY: restores the mask saved above for the calling thread.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &previous_mask, std::ptr::null_mut());
    }
    spawned.map(|_| ())
}
