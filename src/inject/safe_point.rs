//! Choosing a thread, and a moment, at which calling `dlopen` cannot deadlock.
//!
//! `dlopen` allocates and takes the loader's lock. If the thread we borrow was stopped
//! while holding the allocator's lock (inside `malloc`) or the loader's lock, our call
//! would wait forever on a lock its own thread holds. So a thread is borrowed only when
//! neither its pc nor any return address near the top of its stack lies in a function
//! that takes those locks. Threads blocked in a system call are tried first: they are the
//! least likely to be in the middle of anything.

use super::loader::LoaderEntryPoints;
use super::tracee::Tracee;
use crate::process::{self, AttachError};
use std::time::{Duration, Instant};

/// How much of the stack above rsp is checked for return addresses.
const STACK_WINDOW: usize = 4096;
/// How long to keep looking for a safe moment before giving up.
const SEARCH_TIMEOUT: Duration = Duration::from_secs(3);

/// Seizes a thread of `pid` that is at a safe point, or explains why none was found.
pub fn seize_thread_at_safe_point(
    pid: i32,
    entry_points: &LoaderEntryPoints,
) -> Result<Tracee, AttachError> {
    let deadline = Instant::now() + SEARCH_TIMEOUT;
    loop {
        if process::is_gone_or_exiting(pid) {
            return Err(AttachError::Exited(pid));
        }
        let mut tids = process::thread_ids(pid)?;
        tids.retain(|&tid| !process::thread_name(pid, tid).starts_with("tendril-"));
        // Blocked threads first, then the rest; main thread first within each group.
        tids.sort_by_key(|&tid| !process::thread_is_in_syscall(pid, tid));
        for tid in tids {
            let mut tracee = match Tracee::seize(pid, tid, Duration::from_secs(1)) {
                Ok(tracee) => tracee,
                // The thread ended meanwhile; the process may still be there.
                Err(AttachError::Exited(_))
                    if std::path::Path::new(&format!("/proc/{pid}")).exists() =>
                {
                    continue;
                }
                Err(e) => return Err(e),
            };
            tracee.save_registers()?;
            if is_safe(&tracee, entry_points) {
                return Ok(tracee);
            }
            tracee.restore_and_detach()?;
        }
        if Instant::now() >= deadline {
            return Err(AttachError::Other {
                pid,
                message: format!(
                    "no thread was outside the allocator and the dynamic loader for {} s; try again",
                    SEARCH_TIMEOUT.as_secs()
                ),
            });
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn is_safe(tracee: &Tracee, entry_points: &LoaderEntryPoints) -> bool {
    let regs = &tracee.saved().general;
    let in_unsafe_code = |address: u64| {
        entry_points
            .unsafe_ranges
            .iter()
            .any(|r| r.contains(&address))
    };
    if in_unsafe_code(regs.rip) {
        return false;
    }
    let mut stack = vec![0u8; STACK_WINDOW];
    let read = tracee.read_memory(regs.rsp, &mut stack);
    !stack[..read]
        .chunks_exact(8)
        .map(|word| u64::from_le_bytes(word.try_into().unwrap()))
        .any(in_unsafe_code)
}
