//! A thread of the agent's that makes discoveries for the target's threads, when the
//! controller has raised it above them.
//!
//! The one idea: a thousand threads of a busy server enter a root as it goes in, and
//! all but the one discovering a callee wait for it (`discovery_turn`). At the default
//! priority, that one thread got a thousandth of the cores like the rest: each of the
//! 999 others waited 80–200 ms for its discovery (issue 31). So the thread whose turn it
//! is hands the work to this thread, which the controller raises with the agent's
//! others (nice −20), and waits asleep like them. When the thread is not raised (the
//! controller may not raise it, or no session is open), or the target has too few
//! threads to keep the cores busy (fewer than [`THREADS_PER_CPU`] per core), a context
//! switch would only add to the wait (a discovery's median pause went from 26–32 µs to
//! 97–104 µs with three threads): the caller does the work itself, as it does when the
//! hand-over is not
//! taken up within [`TAKE_UP_NS`] (a thread inside the loader's lock, say, which the
//! discovery needs) or not done within [`DONE_NS`].
//!
//! The control thread runs the discoverer while a session is open (it is then raised
//! with the agent's other threads) and ends it, joined while no code changes, when the
//! last one closes: an agent that serves nobody leaves only its control thread.

use crate::runtime::recording;
use crate::runtime::ring_memory;
pub use crate::runtime::state::DiscoveryJob as Job;
use crate::runtime::state::STATE;
use crate::sys;
use std::sync::atomic::Ordering;

/// How long a hand-over may wait to be taken up before its thread does the work itself.
const TAKE_UP_NS: u64 = 20_000_000;
/// How long a hand-over taken up may take before its thread does the work itself (it
/// then waits for the loader's lock, which the discoverer holds until it is done).
const DONE_NS: u64 = 500_000_000;
/// Threads per core from which discoveries are handed over: below it, the thread whose
/// turn it is seldom waits for a core.
const THREADS_PER_CPU: usize = 4;
/// How long the discoverer sleeps before it looks again at whether it is raised.
const NAP_NS: u64 = 100_000_000;

/// Has the discoverer make `job` and waits for it. Returns false, with nothing done,
/// when the calling thread is to make it itself.
pub fn hand_over(job: Job) -> bool {
    let threads = STATE.registered_count.load(Ordering::Acquire);
    if !STATE.discoverer_raised.load(Ordering::Acquire)
        || threads < STATE.hand_over_from_threads.load(Ordering::Acquire)
    {
        return false;
    }
    jobs().push(job);
    STATE.discovery_jobs_posted.fetch_add(1, Ordering::AcqRel);
    sys::futex_wake_all(&STATE.discovery_jobs_posted);
    let started = sys::monotonic_ns();
    loop {
        // Read before looking: a discovery ending from now on changes it.
        let ended = STATE.discoveries_ended.load(Ordering::Acquire);
        if recording::is_invoked(job.id) {
            return true;
        }
        let waited = sys::monotonic_ns().saturating_sub(started);
        if waited >= TAKE_UP_NS && take_back(job) || waited >= DONE_NS {
            return false;
        }
        sys::futex_wait_timeout(&STATE.discoveries_ended, ended, TAKE_UP_NS / 4);
    }
}

/// Takes `job` back if the discoverer has not taken it up; whether it did.
fn take_back(job: Job) -> bool {
    let mut jobs = jobs();
    match jobs.iter().position(|&queued| queued == job) {
        Some(at) => {
            jobs.swap_remove(at);
            true
        }
        None => false,
    }
}

/// The forked child has no discoverer: its threads discover for themselves (the jobs
/// list, which the parent's threads may have held at the fork, is not used again).
pub fn forget_in_forked_child() {
    STATE.discoverer_raised.store(false, Ordering::Release);
}

/// Asks the discoverer to end once its current job is done (the control thread then
/// joins it); jobs still queued are taken back by their threads.
pub fn ask_to_end() {
    STATE.discoverer_ending.store(true, Ordering::Release);
    STATE.discoverer_raised.store(false, Ordering::Release);
    STATE.discovery_jobs_posted.fetch_add(1, Ordering::AcqRel);
    sys::futex_wake_all(&STATE.discovery_jobs_posted);
}

fn jobs() -> std::sync::MutexGuard<'static, Vec<Job>> {
    STATE
        .discovery_jobs
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The discoverer's loop, on an agent thread the control thread started: makes each job
/// handed over with `make`, and says whether it runs raised, until asked to end.
pub fn serve(make: fn(Job)) {
    STATE.discoverer_ending.store(false, Ordering::Release);
    let cpus = cpus_to_run_on();
    STATE
        .hand_over_from_threads
        .store(THREADS_PER_CPU * cpus, Ordering::Release);
    loop {
        let posted = STATE.discovery_jobs_posted.load(Ordering::Acquire);
        if STATE.discoverer_ending.load(Ordering::Acquire) {
            STATE.discoverer_raised.store(false, Ordering::Release);
            return;
        }
        STATE
            .discoverer_raised
            .store(runs_raised(), Ordering::Release);
        // Rings' memory first: a producer that asked must not reach the part it wants.
        ring_memory::fault_in_what_rings_want();
        let job = jobs().pop();
        match job {
            Some(job) => {
                make(job);
                STATE.discoveries_ended.fetch_add(1, Ordering::AcqRel);
                sys::futex_wake_all(&STATE.discoveries_ended);
            }
            None => sys::futex_wait_timeout(&STATE.discovery_jobs_posted, posted, NAP_NS),
        }
    }
}

/// Whether the calling thread runs above the default priority.
fn runs_raised() -> bool {
    let tid = sys::gettid();
    // SAFETY: the getpriority system call only reads the calling thread's nice value.
    // It returns 20 − nice (1 to 40), or −1 if refused (taken for not raised).
    let twenty_less_nice = unsafe { libc::syscall(libc::SYS_getpriority, libc::PRIO_PROCESS, tid) };
    twenty_less_nice > 20
}

/// The cores the calling thread may run on (1 if that cannot be read).
fn cpus_to_run_on() -> usize {
    // SAFETY: cpu_set_t is plain data, all zeroes a valid empty set; sched_getaffinity
    // writes at most its size into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        match libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) {
            0 => (libc::CPU_COUNT(&set) as usize).max(1),
            _ => 1,
        }
    }
}
