//! Who is where in one stop: the threads listed before it, sorted by what their plan
//! became once the signalled ones had their time, and the stopped and peeked threads
//! handed to the stop's work.

use super::*;

/// Lists every thread of the process but `me` in `threads` (by tid, so that each thread
/// that parks is found at once: `wait_for_parks`), each to be left alone until planned;
/// refuses when more started meanwhile than `threads` has room for.
pub(super) fn list_other_threads(
    threads: &mut Vec<(i32, Plan)>,
    me: i32,
) -> Result<(), AgentError> {
    threads.clear();
    let mut overflow = false;
    tasks::for_each_thread(|tid| {
        if tid == me {
        } else if threads.len() < threads.capacity() {
            threads.push((tid, Plan::Leave));
        } else {
            overflow = true;
        }
    });
    if overflow {
        return Err(AgentError::NotStopped(
            "threads started faster than tendril could list them; nothing was patched".into(),
        ));
    }
    threads.sort_unstable_by_key(|&(tid, _)| tid);
    Ok(())
}

/// Once the signalled threads had their time to park: marks those of the `arrived`
/// that were to be traced as parked (a thread found blocking the signal may have parked
/// after all), and lists the threads to trace, those left asleep (halted ones too) and
/// the halted ones.
pub(super) fn sort_by_plan(
    threads: &mut [(i32, Plan)],
    arrived: usize,
    traced: &mut Vec<i32>,
    asleep: &mut Vec<i32>,
    halted: &mut Vec<i32>,
) {
    for parked in &STATE.parked_tids[..arrived] {
        let tid = parked.load(Ordering::Acquire);
        if let Ok(index) = threads.binary_search_by_key(&tid, |&(tid, _)| tid)
            && threads[index].1 == Plan::Trace
        {
            threads[index].1 = Plan::Parked;
        }
    }
    let with = |wanted: fn(Plan) -> bool| {
        threads
            .iter()
            .filter(move |&&(_, plan)| wanted(plan))
            .map(|&(tid, _)| tid)
    };
    traced.extend(with(|plan| plan == Plan::Trace));
    asleep.extend(with(|plan| matches!(plan, Plan::Leave | Plan::Halted)));
    halted.extend(with(|plan| plan == Plan::Halted));
}

/// Lists the stopped threads in `parked`: the `arrived` that parked on the signal,
/// then those the helper traced.
pub(super) fn list_stopped(
    parked: &mut Vec<ParkedThread>,
    arrived: usize,
    traced: Option<&TracedThreads>,
) {
    parked.extend(
        STATE.parked_contexts[..arrived]
            .iter()
            .zip(&STATE.parked_tids[..arrived])
            .map(|(context, tid)| ParkedThread {
                held: Held::Signal(context.load(Ordering::Acquire)),
                tid: tid.load(Ordering::Acquire),
            }),
    );
    if let Some(traced) = traced {
        parked.extend((0..traced.len()).filter_map(|index| {
            traced.thread(index).map(|(tid, _, _)| ParkedThread {
                tid,
                held: Held::Ptrace(index),
            })
        }));
    }
}

/// Lists the `arrived` threads of a peek in `peeked`, sorted.
pub(super) fn list_peeked(peeked: &mut Vec<i32>, arrived: usize) {
    peeked.extend(
        STATE.parked_tids[..arrived]
            .iter()
            .map(|tid| tid.load(Ordering::Acquire)),
    );
    peeked.sort_unstable();
}
