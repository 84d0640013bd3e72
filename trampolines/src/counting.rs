//! Reading the call and return counters the hooks keep per thread.
//!
//! The one idea: counters are plain per-thread words that only their thread writes, so
//! reading them needs no coordination — a read gives a recent value, and a count taken
//! after the hooks are gone is exact.

use crate::tasks;
use crate::thread_state::{self, ThreadState};
use tendril_wire::ThreadCounters;

/// The counters of `ids` for every registered thread that has a non-zero one.
pub fn read_counters(ids: &[u32]) -> Vec<ThreadCounters> {
    let valid = |id: u32| (id as usize) < thread_state::MAX_FUNCTION_IDS;
    thread_state::registered_threads()
        .into_iter()
        .filter_map(|state| {
            let calls: Vec<u64> = ids
                .iter()
                .map(|&id| if valid(id) { state.calls(id) } else { 0 })
                .collect();
            let returns: Vec<u64> = ids
                .iter()
                .map(|&id| if valid(id) { state.returns(id) } else { 0 })
                .collect();
            let counted = calls.iter().chain(&returns).any(|&n| n != 0);
            counted.then(|| ThreadCounters {
                tid: state.tid,
                name: thread_name(state),
                calls,
                returns,
                unwound_frames: state.unwound_frames,
                shadow_overflows: state.shadow_overflows,
            })
        })
        .collect()
}

/// The thread's current name if it still runs, else the name it had when it registered.
fn thread_name(state: &ThreadState) -> String {
    let mut buffer = [0u8; 64];
    let current = tasks::name(state.tid, &mut buffer);
    let bytes = current.unwrap_or(&state.name);
    let end = bytes
        .iter()
        .position(|&b| b == 0 || b == b'\n')
        .unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}
