//! Finishing a restore that had to wait: the unwinder's hooks a restore left in come
//! out by themselves.
//!
//! A restore takes every function's hook out at once, but the unwinder's hooks may only
//! come out once no thread is inside a hook (`retire`). When some thread stays inside
//! one through every pass of the restore — or runs with tendril's stop signal blocked,
//! so where it is cannot be known — those hooks stay in, listed as pending, and the
//! controller is told so. The one idea: a single agent thread, started the first time
//! that happens and never ended (see `session_threads` for why agent threads live on),
//! tries again with growing pauses until they are out, then waits for the next time.

use crate::runtime::state::STATE;
use crate::{patching::patcher, runtime::threads, sys};
use std::sync::atomic::Ordering;

/// The first pause between two tries, and the longest: every try stops the world, so a
/// thread that keeps the hooks in for long is asked less and less often.
const FIRST_PAUSE_MICROSECONDS: u64 = 10_000;
const LONGEST_PAUSE_MICROSECONDS: u64 = 1_000_000;

/// Makes sure hooks a restore left in come out by themselves. Call after a restore,
/// with no lock of the patcher held.
pub fn finish_in_background() {
    if patcher::pending_restore().0 == 0 {
        return;
    }
    *STATE
        .lingering_work
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner()) = true;
    STATE.lingering_work_arrived.notify_one();
    if STATE.lingering_started.swap(true, Ordering::AcqRel) {
        return;
    }
    let spawned =
        threads::spawn_agent_thread("restorer", threads::Start::BetweenCodeChanges, serve);
    if spawned.is_err() {
        // A later restore tries again, and so does the next start.
        STATE.lingering_started.store(false, Ordering::Release);
    }
}

fn serve() {
    loop {
        {
            let mut work = STATE
                .lingering_work
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            while !*work {
                work = STATE
                    .lingering_work_arrived
                    .wait(work)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            *work = false;
        }
        let mut pause = FIRST_PAUSE_MICROSECONDS;
        while patcher::retry_pending_restore(1) > 0 {
            sys::sleep_microseconds(pause);
            pause = (pause * 2).min(LONGEST_PAUSE_MICROSECONDS);
        }
    }
}
