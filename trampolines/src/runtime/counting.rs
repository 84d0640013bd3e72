//! Reading the call and return counters the hooks keep per thread.
//!
//! The one idea: counters are plain per-thread words that only their thread writes, so
//! reading them needs no coordination — a read gives a recent value, and a count taken
//! after the hooks are gone is exact. A function's counters are set to zero just before
//! its hooks go in ([`reset_before_patching`]): no hook of it runs then, so nothing is
//! written to them concurrently, and every count from then on is this session's — the
//! calls made while the hooks went in included.

use crate::runtime::thread_state::{self, StatePtr};
use crate::sys::tasks;
use std::sync::atomic::Ordering;
use tendril_wire::ThreadCounters;

/// The counters of `ids` for every registered thread that has a non-zero one.
pub fn read_counters(ids: &[u32]) -> Vec<ThreadCounters> {
    let valid = |id: u32| (id as usize) < thread_state::MAX_FUNCTION_IDS;
    thread_state::registered_threads()
        .into_iter()
        .filter_map(|state| {
            let calls: Vec<u64> = ids
                .iter()
                .map(|&id| {
                    if valid(id) {
                        state.calls(id).load(Ordering::Relaxed)
                    } else {
                        0
                    }
                })
                .collect();
            let returns: Vec<u64> = ids
                .iter()
                .map(|&id| {
                    if valid(id) {
                        state.returns(id).load(Ordering::Relaxed)
                    } else {
                        0
                    }
                })
                .collect();
            let counted = calls.iter().chain(&returns).any(|&n| n != 0);
            counted.then(|| ThreadCounters {
                tid: state.tid().load(Ordering::Relaxed),
                name: thread_name(state),
                calls,
                returns,
                unwound_frames: state.unwound_frames().load(Ordering::Relaxed),
                shadow_overflows: state.shadow_overflows().load(Ordering::Relaxed),
            })
        })
        .collect()
}

/// Zeroes function `id`'s call and return counters on every registered thread. Call
/// only while no hook of `id` is in the code (before it is patched): a function is
/// patched again with the id it had, and its counters still hold the last session's
/// counts.
pub fn reset_before_patching(id: u32) {
    if id as usize >= thread_state::MAX_FUNCTION_IDS {
        return;
    }
    for state in thread_state::registered_threads() {
        for counter in [state.calls(id), state.returns(id)] {
            // Only counters that hold something are written: writing a zero would
            // commit a page of the region that reading leaves uncommitted. No hook of
            // `id` runs now, so no thread writes the counter meanwhile.
            if counter.load(Ordering::Relaxed) != 0 {
                counter.store(0, Ordering::Relaxed);
            }
        }
    }
}

/// The thread's current name if it still runs, else the name it had when it registered.
fn thread_name(state: StatePtr) -> String {
    let mut buffer = [0u8; 64];
    let registered = state.name();
    let current = tasks::name(state.tid().load(Ordering::Relaxed), &mut buffer);
    let bytes = current.unwrap_or(&registered);
    let end = bytes
        .iter()
        .position(|&b| b == 0 || b == b'\n')
        .unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}
