//! Peeking at every thread instead of parking it, where a patch only needs each thread
//! moved off some bytes, not held while they change.
//!
//! The one idea: some bytes can no longer be reached by the time they are rewritten —
//! a pad whose entry jump was restored, or whose entry is guarded while the pad's jump
//! changes — so a thread that is not on them now never will be. Each running thread
//! then only needs to look at where it was interrupted, once: the stop signal's handler
//! moves its own pc (and the resume points of the signal frames above it) by the
//! peek's moves, and returns at once. No thread waits for another, so a thousand
//! threads are each held for microseconds rather than for the whole stop; the stopper
//! still waits until every one has looked (threads that block the signal are held with
//! ptrace for that moment, as in a stop).

use super::SelfCheck;
use crate::patching::signal_frames::{self, Frames};
use crate::patching::state::{MAX_PEEK_MOVES, STATE};
use std::sync::atomic::Ordering;

/// Sets the moves of the next peek; false if there are more than a peek carries. Only
/// between stops, once no handler is inside (`in_handler` 0).
pub(super) fn set_moves(moves: &[(u64, u64, u64)]) -> bool {
    if moves.len() > MAX_PEEK_MOVES {
        return false;
    }
    for (slot, &(start, end, to)) in STATE.peek_moves.iter().zip(moves) {
        slot[0].store(start, Ordering::Relaxed);
        slot[1].store(end, Ordering::Relaxed);
        slot[2].store(to, Ordering::Relaxed);
    }
    // Published by the Release store of the peek's stop number, which handlers read
    // with Acquire before they look at the moves.
    STATE.peek_move_count.store(moves.len(), Ordering::Relaxed);
    true
}

/// Where a thread interrupted at `pc` goes on, by the peek's moves.
pub fn resume_point(pc: u64) -> Option<u64> {
    let count = STATE.peek_move_count.load(Ordering::Relaxed);
    STATE.peek_moves[..count.min(MAX_PEEK_MOVES)]
        .iter()
        .map(|slot| {
            (
                slot[0].load(Ordering::Relaxed),
                slot[1].load(Ordering::Relaxed),
                slot[2].load(Ordering::Relaxed),
            )
        })
        .find(|&(start, end, _)| (start..end).contains(&pc))
        .map(|(_, _, to)| to)
}

/// In the stop signal's handler of a peek: moves this thread's interrupted pc, and the
/// resume points saved in signal frames above it (a handler of the program's own that
/// interrupted it on those bytes), by the peek's moves. Allocates nothing.
pub(super) fn move_own(context: *mut libc::ucontext_t) {
    // SAFETY: the kernel passes a valid ucontext to an SA_SIGINFO handler; this thread
    // owns it until the handler returns, and the kernel resumes at the edited rip.
    let gregs = unsafe { &mut (*context).uc_mcontext.gregs };
    let pc = gregs[libc::REG_RIP as usize] as u64;
    if let Some(to) = resume_point(pc) {
        gregs[libc::REG_RIP as usize] = to as i64;
    }
    let sp = gregs[libc::REG_RSP as usize] as u64;
    signal_frames::move_saved_pcs(sp, Frames::ProgramsOnly, &resume_point);
}

/// Sets the self-check of the next stop (`None`: none). Only between stops, as
/// [`set_moves`]; cleared again once the stop's threads are released.
pub(super) fn set_self_check(check: Option<SelfCheck>) {
    let check = check.map_or(0, |check| check as usize);
    STATE.self_check.store(check, Ordering::Release);
}

/// In the stop signal's handler: runs the stop's self-check, if it has one, on this
/// thread, interrupted at the pc its context holds (moved already, for a peek).
pub(super) fn run_self_check(context: *mut libc::ucontext_t) {
    let check = STATE.self_check.load(Ordering::Acquire);
    if check == 0 {
        return;
    }
    // SAFETY: only `set_self_check` stores here, always a `SelfCheck` or 0.
    let check = unsafe { std::mem::transmute::<usize, SelfCheck>(check) };
    // SAFETY: the kernel passes a valid ucontext to an SA_SIGINFO handler.
    let pc = unsafe { (*context).uc_mcontext.gregs[libc::REG_RIP as usize] as u64 };
    check(pc);
}
