//! Choosing a thread, and a moment, at which calling `dlopen` cannot deadlock.
//!
//! `dlopen` allocates and takes the loader's lock. If the thread we borrow was stopped
//! while holding the allocator's lock (inside `malloc`) or the loader's lock, our call
//! would wait forever on a lock its own thread holds. So a thread is borrowed only when
//! neither its pc nor any return address on its stack lies in a function that takes
//! those locks. The return addresses come from walking the stack with the modules'
//! unwind tables (`stack_walk`); above a frame the tables cannot describe, every stack
//! word that follows a `call` counts. Threads blocked in a system call are tried first:
//! they are the least likely to be in the middle of anything.

use super::loader::LoaderEntryPoints;
use super::stack_walk::StackWalker;
use super::tracee::Tracee;
use crate::process::{self, AttachError};
use crate::symbols::maps;
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
    let maps = maps::read_maps(pid).map_err(|e| AttachError::Other {
        pid,
        message: e.to_string(),
    })?;
    let mut walker = StackWalker::new(pid, &maps);
    loop {
        if process::is_gone_or_exiting(pid) {
            return Err(AttachError::Exited(pid));
        }
        let mut tids = process::thread_ids(pid)?;
        tids.retain(|&tid| !process::thread_name(pid, tid).starts_with("tendril-"));
        blocked_first(&mut tids, |tid| process::thread_is_in_syscall(pid, tid));
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
            if is_safe(&tracee, entry_points, &mut walker) {
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

/// Orders `tids` with the threads blocked in a system call first, keeping the order
/// within each group (the main thread first). Each thread is looked at once: its state
/// changes while the threads are sorted, and a key that changes mid-sort breaks the
/// sort's order (Rust's sort then panics, as it did on a busy 1,000-thread target).
fn blocked_first(tids: &mut [i32], in_syscall: impl Fn(i32) -> bool) {
    tids.sort_by_cached_key(|&tid| !in_syscall(tid));
}

fn is_safe(tracee: &Tracee, entry_points: &LoaderEntryPoints, walker: &mut StackWalker) -> bool {
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
    let walk = walker.walk(regs, |address| {
        let mut word = [0u8; 8];
        (tracee.read_memory(address, &mut word) == 8).then(|| u64::from_le_bytes(word))
    });
    if walk.return_addresses.iter().any(|&ra| in_unsafe_code(ra)) {
        return false;
    }
    let Some(unknown_from) = walk.stopped_at else {
        return true;
    };
    // Above a frame the tables cannot describe, assume the worst of every word that
    // looks like a return address.
    let window = STACK_WINDOW.saturating_sub(unknown_from.saturating_sub(regs.rsp) as usize);
    let mut stack = vec![0u8; window];
    let read = tracee.read_memory(unknown_from, &mut stack);
    !stack[..read]
        .chunks_exact(8)
        .map(|word| u64::from_le_bytes(word.try_into().unwrap()))
        .any(|word| in_unsafe_code(word) && follows_a_call(tracee, word))
}

/// True when a `call` instruction ends exactly at `address`, i.e. `address` is a return
/// address rather than, say, a pointer to a function kept in a local variable.
fn follows_a_call(tracee: &Tracee, address: u64) -> bool {
    use iced_x86::{Decoder, DecoderOptions, FlowControl};
    const LONGEST_CALL: usize = 7;
    let mut code = [0u8; LONGEST_CALL];
    let start = address - LONGEST_CALL as u64;
    if tracee.read_memory(start, &mut code) != LONGEST_CALL {
        return true; // Unreadable: assume the worst.
    }
    (2..=LONGEST_CALL).any(|length| {
        let offset = LONGEST_CALL - length;
        let mut decoder = Decoder::with_ip(
            64,
            &code[offset..],
            start + offset as u64,
            DecoderOptions::NONE,
        );
        let instruction = decoder.decode();
        !instruction.is_invalid()
            && instruction.len() == length
            && matches!(
                instruction.flow_control(),
                FlowControl::Call | FlowControl::IndirectCall
            )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn threads_whose_state_changes_while_sorted_are_ordered_by_one_look_each() {
        // Each look flips the answer, as a thousand busy threads do between two reads.
        let looks = Cell::new(0u32);
        let flipping = |tid: i32| {
            looks.set(looks.get() + 1);
            (tid + looks.get() as i32) % 2 == 0
        };
        let mut tids: Vec<i32> = (1..=1000).collect();
        blocked_first(&mut tids, flipping);
        assert_eq!(looks.get(), 1000);
        // What each thread was seen as, in order: blocked ones first, each group by tid.
        let mut seen = Vec::new();
        let looks = Cell::new(0u32);
        for tid in 1..=1000 {
            looks.set(looks.get() + 1);
            seen.push(((tid + looks.get() as i32) % 2 != 0, tid));
        }
        seen.sort();
        assert_eq!(tids, seen.iter().map(|&(_, tid)| tid).collect::<Vec<_>>());
    }
}
