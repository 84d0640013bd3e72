//! The agent's threads run ahead of the target's while a session lasts.
//!
//! The agent's threads patch code, stop the world and answer the controller; while they
//! do, the target's threads wait for them (at a patch's guard, in a stop, for room in a
//! ring). On a target that keeps the cores busy (a thousand threads on two cores) a
//! thread at the default priority gets a thousandth of a core: a three-function timing
//! switch waited 8–20 s for the agent's thread to run, and recordings failed with "the
//! agent did not answer" (issue 31, `BENCHMARKS.md`). So the controller gives the
//! agent's threads [`AGENT_NICE`] when a session opens and gives them back their own
//! when it closes. The agent's work is short and it sleeps between requests: it takes
//! from the target only the time the target would spend waiting for it.
//!
//! Only with the right (root, or `CAP_SYS_NICE`); only from a controller at the default
//! priority (a user who runs `nice tendril` asked for less); only threads named with the
//! agent's prefix, and at most [`MOST_AGENT_THREADS`] of them: the target's user could
//! name threads of their own so, and would get no more than that many, for as long as
//! the session lasts.

use crate::agent_connection::AgentConnection;
use crate::process;
use std::cell::Cell;

/// The nice value of the agent's threads during a session (lower runs first; -20 is
/// the highest a nice value goes).
pub const AGENT_NICE: i32 = -20;
/// The agent runs a control thread, a session thread per connection, a discoverer while
/// a session is open, a restorer and a thread tracer: no more are raised (the first
/// ones by thread id, which are those of the first sessions).
const MOST_AGENT_THREADS: usize = 8;
/// The agent's thread names begin with this (`tendril_agent::sys::agent_threads`).
const AGENT_THREAD_PREFIX: &str = "tendril-";

/// Raises the agent's threads in `pid` for as long as `session` is open, then puts
/// back the nice value each had (threads the agent started meanwhile, and threads a
/// killed controller left raised, get the main thread's). Does nothing where it may
/// not.
pub fn raise_for(pid: i32, session: &mut AgentConnection) {
    if controller_nice() != Some(0) {
        return;
    }
    // What an agent thread gets back when its own value is not known: the main
    // thread's, which the agent's threads inherit when the agent starts.
    let fallback = nice_of(pid).unwrap_or(0);
    let mut raised = Vec::new();
    for tid in agent_threads(pid) {
        match nice_of(tid) {
            Some(before) if before > AGENT_NICE => {
                if set_nice(tid, AGENT_NICE) {
                    raised.push((tid, before));
                } else if nix::errno::Errno::last() != nix::errno::Errno::ESRCH {
                    // No right to (not root, no CAP_SYS_NICE): none will be raised.
                    break;
                }
            }
            // Raised already: by a controller killed before it could put it back.
            Some(_) => raised.push((tid, fallback)),
            None => {}
        }
    }
    if !raised.is_empty() {
        session.when_closed(move || put_back(pid, &raised, fallback));
    }
}

/// Gives the agent's threads in `pid` back the nice values in `raised`, and `fallback`
/// to those that started later at [`AGENT_NICE`] (inherited from a raised thread).
fn put_back(pid: i32, raised: &[(i32, i32)], fallback: i32) {
    for tid in agent_threads(pid) {
        let before = raised
            .iter()
            .find(|(raised_tid, _)| *raised_tid == tid)
            .map(|&(_, before)| before);
        match before {
            Some(before) => {
                set_nice(tid, before);
            }
            None if nice_of(tid) == Some(AGENT_NICE) => {
                set_nice(tid, fallback);
            }
            None => {}
        }
    }
}

/// The threads of `pid` named as the agent's, at most [`MOST_AGENT_THREADS`].
fn agent_threads(pid: i32) -> Vec<i32> {
    let tids = process::thread_ids(pid).unwrap_or_default();
    tids.into_iter()
        .filter(|&tid| process::thread_name(pid, tid).starts_with(AGENT_THREAD_PREFIX))
        .take(MOST_AGENT_THREADS)
        .collect()
}

/// The nice value of thread `tid` (0: the calling thread), or `None` if it is gone.
fn nice_of(tid: i32) -> Option<i32> {
    nix::errno::Errno::clear();
    // SAFETY: getpriority only reads a thread's nice value; -1 is also a valid value,
    // so errno (cleared above) tells a failure apart.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) };
    (nice != -1 || nix::errno::Errno::last_raw() == 0).then_some(nice)
}

/// Sets thread `tid`'s nice value; false if refused (no right, or the thread is gone).
fn set_nice(tid: i32, nice: i32) -> bool {
    // SAFETY: setpriority changes only thread `tid`'s nice value.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) == 0 }
}

/// The nice value the controller was started with (read once, before any of its
/// threads is raised).
fn controller_nice() -> Option<i32> {
    static STARTED_WITH: std::sync::OnceLock<Option<i32>> = std::sync::OnceLock::new();
    // SAFETY: gettid takes no argument and cannot fail.
    *STARTED_WITH.get_or_init(|| nice_of(unsafe { libc::gettid() }))
}

thread_local! {
    /// This thread has asked already.
    static ASKED: Cell<bool> = const { Cell::new(false) };
}

/// Gives the calling thread of the controller [`AGENT_NICE`] the first time it asks, if
/// it runs at the default priority and may have a higher one. From the attach on, the
/// target waits for this thread: the thread it injects into waits for the injection,
/// the patches it asks for stop every thread, and a recording's threads wait for it to
/// read their rings. Among a thousand busy threads on two cores, at the default
/// priority, `record` took 3.5–46 s from the agent's first answer to its first patch
/// (opening a perf event per thread, at 0.2% of a core); 0.14–0.4 s at this priority
/// (`BENCHMARKS.md`). The work is short and the thread sleeps
/// between: it takes from the target only the time the target would wait for it.
pub fn run_ahead_of_the_target() {
    if ASKED.with(|asked| asked.replace(true)) {
        return;
    }
    // SAFETY: gettid takes no argument and cannot fail.
    let tid = unsafe { libc::gettid() };
    if controller_nice() == Some(0) && nice_of(tid) == Some(0) {
        // Refused (no right to raise it), the thread goes on at the priority it has.
        set_nice(tid, AGENT_NICE);
    }
}
