//! A coarse program-counter sampler over ptrace, used to suggest where a process spends
//! its time before any function is instrumented ("hottest-looking" functions).
//!
//! Every thread of the target is seized once; then, at each tick, each thread that is
//! running (not blocked in the kernel) is interrupted, its pc read, and resumed. Each stop lasts a few microseconds. This is
//! statistical and coarse: tendril's real measurements come from instrumentation.

use crate::inject::tracee::Tracee;
use crate::process::{self, AttachError};
use std::time::{Duration, Instant};

/// Samples the pcs of every thread of `pid` (agent threads excepted) every `interval`
/// for `duration`. Threads that start meanwhile are not sampled.
pub fn sample_pcs(
    pid: i32,
    duration: Duration,
    interval: Duration,
) -> Result<Vec<u64>, AttachError> {
    let mut tracees = Vec::new();
    for tid in process::thread_ids(pid)? {
        if process::thread_name(pid, tid).starts_with("tendril-") {
            continue;
        }
        match Tracee::seize(pid, tid, Duration::from_secs(1)) {
            Ok(mut tracee) => {
                tracee.resume(None)?;
                tracees.push(tracee);
            }
            Err(AttachError::Exited(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    let mut pcs = Vec::new();
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline {
        for tracee in &mut tracees {
            // A thread blocked in the kernel is not spending cpu time: leave it be.
            if !process::thread_is_running(pid, tracee.tid()) {
                continue;
            }
            if tracee.interrupt_and_wait(Duration::from_secs(1)).is_err() {
                continue;
            }
            // orig_rax is a syscall number when the thread was stopped inside one.
            if let Ok(regs) = tracee.get_registers()
                && regs.orig_rax as i64 == -1
            {
                pcs.push(regs.rip);
            }
            tracee.resume(None)?;
        }
        std::thread::sleep(interval);
    }
    // Dropping each tracee stops it and detaches; nothing of it was changed.
    Ok(pcs)
}
