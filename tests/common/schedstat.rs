//! How long a fixture's threads have waited for a core (runnable, but not running), and
//! how long they have run.
//!
//! The one idea: the kernel counts both per thread, as the first two fields
//! (`sum_exec_runtime` and `run_delay`, in ns) of `/proc/PID/task/TID/schedstat`, so a
//! test or bench can bound what tendril reports as waits by what the kernel saw, a bench
//! can say how much of a run's time was such a wait, and a test can tell a deadlock
//! (nobody runs) from a slow machine (someone runs, slowly).

/// How long thread `tid` of process `pid` has waited for a core, in ns; 0 once the
/// thread is gone.
pub fn thread_waited_for_a_core_ns(pid: i32, tid: i32) -> u64 {
    let path = format!("/proc/{pid}/task/{tid}/schedstat");
    let schedstat = std::fs::read_to_string(path).unwrap_or_default();
    schedstat
        .split_whitespace()
        .nth(1)
        .map_or(0, |run_delay| run_delay.parse().unwrap())
}

/// How long all the threads of `pid` alive now have run on a core, in ns; 0 once the
/// process is gone.
pub fn ran_on_a_core_ns(pid: i32) -> u64 {
    tendril::process::thread_ids(pid)
        .unwrap_or_default()
        .into_iter()
        .map(|tid| {
            let path = format!("/proc/{pid}/task/{tid}/schedstat");
            let schedstat = std::fs::read_to_string(path).unwrap_or_default();
            schedstat
                .split_whitespace()
                .next()
                .map_or(0, |ran| ran.parse().unwrap_or(0))
        })
        .sum()
}

/// How long all the threads of `pid` alive now have waited for a core, in ns.
pub fn waited_for_a_core_ns(pid: i32) -> u64 {
    tendril::process::thread_ids(pid)
        .unwrap()
        .into_iter()
        .map(|tid| thread_waited_for_a_core_ns(pid, tid))
        .sum()
}
