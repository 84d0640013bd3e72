//! How a stop plans each thread and waits for the signalled ones: which threads are
//! signalled, held with ptrace or left asleep, and when a stop has everyone it needs.
//!
//! The one idea: with a thousand threads, every look at a thread costs a read of one of
//! its files, so each thread is looked at once to plan it and signalled at once if it
//! runs, arrivals are found by tid in a sorted list, and the threads still missing are
//! looked at again only every few milliseconds.

use super::*;
use crate::patching::state::MAX_KNOWN_BLOCKERS;
use crate::sys::tasks::Whereabouts;

/// How one stop handles thread `tid`, given the park signal (or [`NO_FREE_SIGNAL`]).
/// One file of the thread's is read for most threads: with a thousand threads, each
/// stop reads a thousand. Its `syscall` file first (half the cost of `status`): a
/// thread asleep in a system call is left alone, and a running one is signalled
/// unless it is known to block the signal — one that does is found by
/// [`wait_for_parks`] when it does not park, and remembered. Any other thread is
/// planned from its `status`.
pub(super) fn plan_for(tid: i32, signal: i32) -> Plan {
    if signal != NO_FREE_SIGNAL {
        match tasks::whereabouts(tid) {
            Whereabouts::InSystemCall => return Plan::Leave,
            Whereabouts::Running if !known_blocker(tid) => return Plan::Park,
            _ => {}
        }
    }
    let (state, blocks) = if signal == NO_FREE_SIGNAL {
        (tasks::state(tid), true)
    } else {
        tasks::state_and_blocking(tid, signal)
    };
    match state {
        TaskState::Stopped | TaskState::Gone => Plan::Halted,
        // A thread that cannot take the signal is left asleep only inside a system call
        // (not in a page fault, say, at any pc).
        TaskState::Sleeping if blocks && tasks::in_system_call(tid).is_none() => Plan::Trace,
        TaskState::Sleeping => Plan::Leave,
        _ if blocks => Plan::Trace,
        _ => Plan::Park,
    }
}

/// Whether a stop found thread `tid` running with the park signal blocked before.
pub(super) fn known_blocker(tid: i32) -> bool {
    let count = STATE.known_blocker_count.load(Ordering::Acquire);
    // Once the memory is full, every running thread is looked at closely.
    count >= MAX_KNOWN_BLOCKERS
        || STATE.known_blockers[..count]
            .iter()
            .any(|known| known.load(Ordering::Relaxed) == tid)
}

/// Remembers that thread `tid` ran with the park signal blocked: later stops read its
/// `status` before they signal it, rather than queue it a signal it holds back.
fn remember_blocker(tid: i32) {
    if known_blocker(tid) {
        return;
    }
    let slot = STATE.known_blocker_count.load(Ordering::Acquire);
    if let Some(known) = STATE.known_blockers.get(slot) {
        known.store(tid, Ordering::Relaxed);
    }
    // Only the stopper (which holds the stop lock) writes here.
    STATE.known_blocker_count.store(slot + 1, Ordering::Release);
}

/// How often, after [`BLOCKED_AFTER_SIGNAL_CHECK`], the threads still to park are
/// looked at again (each look reads a file of theirs: a thousand threads make it
/// costly).
const RECHECK_EVERY_NS: u64 = 10_000_000;

/// Sends the park signal of stop `stop` to `tid` if its plan is to park (with no free
/// signal there is none to send: it is held with ptrace instead).
pub(super) fn send_park(tid: i32, plan: &mut Plan, signal: i32, stop: u32) {
    if *plan == Plan::Park
        && signal != NO_FREE_SIGNAL
        && !sys::signal_thread_with_value(tid, signal, stop)
    {
        *plan = Plan::Halted; // Exited meanwhile.
    }
}

/// Waits until every thread signalled (`Plan::Park`, sorted by tid) has parked, has
/// exited, or turns out to block the signal (then `Plan::Trace`); false if the deadline
/// passes first or more threads parked than there are slots. Each arrival is found by
/// its tid in `threads` once, so a thousand threads cost a thousand searches, not a
/// million comparisons; the threads' files are read only now and then. With
/// `chase_woken`, a thread left asleep that has woken since (it would spin at a guard,
/// taking a core from the threads this stop waits for) is planned again and signalled
/// then.
pub(super) fn wait_for_parks(
    threads: &mut [(i32, Plan)],
    signal: i32,
    stop: u32,
    (signalled_at, deadline): (u64, u64),
    chase_woken: bool,
) -> bool {
    let mut pending = threads
        .iter()
        .filter(|(_, plan)| *plan == Plan::Park)
        .count();
    let mut seen = 0;
    let mut next_check = signalled_at + BLOCKED_AFTER_SIGNAL_CHECK.as_nanos() as u64;
    loop {
        let arrivals_seen = STATE.arrival_signal.load(Ordering::Acquire);
        let arrived = STATE.arrived.load(Ordering::Acquire).min(MAX_PARKED);
        // Arrivals publish their tid last: stop at the first one still publishing.
        while seen < arrived {
            let tid = STATE.parked_tids[seen].load(Ordering::Acquire);
            if tid == 0 {
                break;
            }
            if let Ok(index) = threads.binary_search_by_key(&tid, |&(tid, _)| tid)
                && threads[index].1 == Plan::Park
            {
                threads[index].1 = Plan::Parked;
                pending -= 1;
            }
            seen += 1;
        }
        if pending == 0 {
            return STATE.arrived.load(Ordering::Acquire) <= MAX_PARKED;
        }
        let now = sys::monotonic_ns();
        if now >= deadline {
            return false;
        }
        if now >= next_check {
            next_check = now + RECHECK_EVERY_NS;
            for (tid, plan) in threads.iter_mut() {
                match *plan {
                    // A signalled thread that blocked signals before the signal came (it
                    // began a discovery, say, and now waits for the lock this stop's
                    // caller holds) will not park until it unblocks them: ptrace holds it.
                    // One that took the signal and is in the handler (whose mask blocks
                    // every signal) is on its way: held with ptrace there, a peeking one
                    // could be stopped holding the signal-frame scan's lock, which this
                    // stop's work then waits for.
                    Plan::Park if !sys::thread_exists(*tid) => {
                        *plan = Plan::Halted;
                        pending -= 1;
                    }
                    Plan::Park if tasks::holds_back_signal(*tid, signal) => {
                        remember_blocker(*tid);
                        *plan = Plan::Trace;
                        pending -= 1;
                    }
                    Plan::Leave | Plan::Halted
                        if chase_woken && tasks::state(*tid) == TaskState::Running =>
                    {
                        *plan = plan_for(*tid, signal);
                        send_park(*tid, plan, signal, stop);
                        pending += usize::from(*plan == Plan::Park);
                    }
                    _ => {}
                }
            }
            continue;
        }
        sys::futex_wait_timeout(&STATE.arrival_signal, arrivals_seen, STOPPER_NAP_NS);
    }
}

/// After a stop's fence (see `with_world_stopped_behind`): looks again at each thread
/// of `threads` left asleep, and stops each that is no longer inside a system call —
/// it woke since it was planned, and may be anywhere — waiting for it as for the
/// others. One file is read per sleeper. False if one does not park by `deadline`.
pub(super) fn stop_the_woken(
    threads: &mut [(i32, Plan)],
    signal: i32,
    stop: u32,
    deadline: u64,
) -> bool {
    let signalled_at = sys::monotonic_ns();
    let mut any_signalled = false;
    for (tid, plan) in threads.iter_mut() {
        if *plan != Plan::Leave || tasks::whereabouts(*tid) == Whereabouts::InSystemCall {
            continue;
        }
        *plan = match plan_for(*tid, signal) {
            // Asleep, but not in a system call (a page fault, say): at any pc.
            Plan::Leave if tasks::whereabouts(*tid) != Whereabouts::InSystemCall => {
                if signal == NO_FREE_SIGNAL {
                    Plan::Trace
                } else {
                    Plan::Park
                }
            }
            plan => plan,
        };
        send_park(*tid, plan, signal, stop);
        any_signalled |= *plan == Plan::Park;
    }
    !any_signalled || wait_for_parks(threads, signal, stop, (signalled_at, deadline), false)
}

/// Waits until the first `arrived` parked threads have published their contexts.
pub(super) fn all_published(arrived: usize, deadline: u64) -> bool {
    loop {
        if STATE.parked_tids[..arrived]
            .iter()
            .all(|parked| parked.load(Ordering::Acquire) != 0)
        {
            return true;
        }
        if sys::monotonic_ns() >= deadline {
            return false;
        }
        sys::yield_cpu();
    }
}
