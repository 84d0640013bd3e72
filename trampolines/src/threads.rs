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
        .filter(|&tid| !is_agent_thread(tid))
        .count()
}

/// Runs `body` on a new named agent thread with every signal blocked, so signals meant
/// for the target are never delivered to (and never run handlers on) an agent thread.
pub fn spawn_agent_thread<F>(name: &str, body: F) -> std::io::Result<()>
where
    F: FnOnce() + Send + 'static,
{
    // SAFETY: sigset_t is plain data; sigfillset initialises it fully before use, and
    // pthread_sigmask only swaps the calling thread's mask, which is restored below.
    let previous_mask = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut previous: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut previous);
        previous
    };
    // The new thread inherits the all-blocked mask from this thread.
    let spawned = std::thread::Builder::new()
        .name(format!("{AGENT_THREAD_PREFIX}{name}"))
        .spawn(body);
    // SAFETY: restores the mask saved above for the calling (target) thread.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &previous_mask, std::ptr::null_mut());
    }
    spawned.map(|_| ())
}

/// True for threads the agent created.
pub fn is_agent_thread(tid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
        .is_ok_and(|comm| comm.starts_with(AGENT_THREAD_PREFIX))
}

