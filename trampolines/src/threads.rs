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
        .filter(|&tid| thread_name(tid).is_some_and(|name| !name.starts_with(AGENT_THREAD_PREFIX)))
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

/// The name (`comm`) of a thread of this process; `None` once it has ended.
fn thread_name(tid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok()
}
