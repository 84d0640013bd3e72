//! Measuring what the recording hooks themselves cost, so the controller can take it
//! out of every measured time (JFluid §5.3).
//!
//! The agent hooks a function of its own — `tendril_calibration_target`, three
//! instructions — with the recording hook, calls it in batches on the calling agent
//! thread (given a private thread state and ring for the purpose), and calls an
//! identical unhooked twin the same way. Per batch:
//!
//! * inner time `t_I` = mean of (exit timestamp − entry timestamp): the part of the
//!   hooks that lands inside a measured interval;
//! * outer time `t_O` = mean time per hooked call − mean time per bare call: all that
//!   one instrumented call adds to its caller's measured time.
//!
//! The one idea (JFluid's): each is the minimum over many batches, the batch least
//! disturbed by interrupts and other threads. How far the median batch lies above that
//! minimum is reported too (the *spread*): the hooks in real code cost more than in the
//! undisturbed batch, so it bounds the error of the cost removed per call.

use crate::patching::patcher::{self, PatchRequest};
use crate::runtime::thread_state;
use crate::sys::error::AgentError;
use crate::{runtime::recording, sys};
use std::hint::black_box;
use std::sync::atomic::Ordering;
use tendril_wire::Hook;
use tendril_wire::events::{Event, EventKind};

/// Calls per batch, and batches (JFluid: 10,000 pairs in batches of 100).
const CALLS_PER_BATCH: usize = 100;
const BATCHES: usize = 100;
/// The owner of the calibration patch (no control session has this number).
const CALIBRATION_OWNER: u64 = patcher::SELF_TEST_OWNER;
/// Bytes of each calibration function.
const FUNCTION_BYTES: u64 = 8;

// Leaf functions: the CFI says only that they are functions (the CFA stays rsp + 8),
// which is all an unwinder needs to go on to the caller.
core::arch::global_asm!(
    ".pushsection .text",
    ".balign 16",
    ".globl tendril_calibration_target",
    ".hidden tendril_calibration_target",
    ".type tendril_calibration_target, @function",
    "tendril_calibration_target:",
    ".cfi_startproc",
    "mov rax, rdi",
    "add rax, 1",
    "ret",
    ".cfi_endproc",
    ".size tendril_calibration_target, . - tendril_calibration_target",
    ".balign 16",
    ".globl tendril_calibration_twin",
    ".hidden tendril_calibration_twin",
    ".type tendril_calibration_twin, @function",
    "tendril_calibration_twin:",
    ".cfi_startproc",
    "mov rax, rdi",
    "add rax, 1",
    "ret",
    ".cfi_endproc",
    ".size tendril_calibration_twin, . - tendril_calibration_twin",
    ".popsection",
);

unsafe extern "C" {
    fn tendril_calibration_target(value: u64) -> u64;
    fn tendril_calibration_twin(value: u64) -> u64;
}

/// The hooks' cost in TSC ticks: (inner, outer).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HookCost {
    pub inner_ticks: f64,
    pub outer_ticks: f64,
    /// Median − minimum over the batches, per call.
    pub inner_spread_ticks: f64,
    pub outer_spread_ticks: f64,
    /// What one call through the untimed hook adds to its caller's time, and its spread.
    pub untimed_ticks: f64,
    pub untimed_spread_ticks: f64,
}

/// Measures the recording hooks' cost (see the module comment): the timed hook's, then
/// the untimed one's. Runs on an agent thread, with a recording file open (the hooks
/// need its invoked table).
pub fn calibrate() -> Result<HookCost, AgentError> {
    let timed = measure_hooked(Hook::RecordRoot)?;
    let untimed = measure_hooked(Hook::Untimed)?;
    Ok(HookCost {
        untimed_ticks: untimed.outer_ticks,
        untimed_spread_ticks: untimed.outer_spread_ticks,
        ..timed
    })
}

/// Hooks the calibration target with `kind`, measures it, and takes the hook out.
fn measure_hooked(kind: Hook) -> Result<HookCost, AgentError> {
    let target = tendril_calibration_target as *const () as u64;
    let twin = tendril_calibration_twin as *const () as u64;
    let request = PatchRequest {
        address: target,
        size: FUNCTION_BYTES,
        kind,
    };
    let ranges = [(target, FUNCTION_BYTES), (twin, FUNCTION_BYTES)];
    let id = patcher::patch(CALIBRATION_OWNER, &[request], &ranges)
        .pop()
        .ok_or_else(|| AgentError::Unusable("calibration: no patch result".into()))??;
    recording::set_invoked_quietly(id);
    let result = measure(kind == Hook::Untimed);
    patcher::restore(Some(CALIBRATION_OWNER));
    result
}

/// Times the batches. The untimed hook records only inside the call graph, so for it the
/// thread is put one level inside, and there is no inner time to take.
fn measure(untimed: bool) -> Result<HookCost, AgentError> {
    const RING: usize = 1024;
    let mut events = vec![Event::default(); RING];
    let mut ring_header = [0u64; 32];
    let state = thread_state::map_private_state()
        .ok_or_else(|| AgentError::Unusable("calibration: cannot map a state".into()))?;
    // The state is this thread's alone; the ring fields point at `events` and
    // `ring_header`, which outlive every use below (the slot is switched back before
    // they are dropped). The hooked calls write the state and the events behind the
    // compiler's back, so both are only reached through raw pointers and atomics.
    let events_base = events.as_mut_ptr();
    state
        .ring_events()
        .store(events_base as u64, Ordering::Relaxed);
    state.ring_mask().store(RING as u64 - 1, Ordering::Relaxed);
    state
        .ring_header()
        .store(ring_header.as_mut_ptr() as u64, Ordering::Relaxed);
    let previous = thread_state::current();
    thread_state::set_current_slot(state.as_ptr());
    let mut inner = f64::MAX;
    let mut hooked = f64::MAX;
    let mut bare = f64::MAX;
    // Per batch, per call: the inner time, and hooked − bare.
    let mut inner_batches = Vec::with_capacity(BATCHES);
    let mut outer_batches = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        state.ring_head().store(0, Ordering::Relaxed);
        state.ring_limit().store(RING as u64, Ordering::Relaxed);
        state
            .graph_depth()
            .store(u64::from(untimed), Ordering::Relaxed);
        let started = sys::rdtsc();
        for i in 0..CALLS_PER_BATCH {
            // SAFETY: a plain function with the C ABI, hooked or not.
            black_box(unsafe { tendril_calibration_target(black_box(i as u64)) });
        }
        let hooked_batch = sys::rdtsc().saturating_sub(started);
        let started = sys::rdtsc();
        for i in 0..CALLS_PER_BATCH {
            // SAFETY: as above.
            black_box(unsafe { tendril_calibration_twin(black_box(i as u64)) });
        }
        let bare_batch = sys::rdtsc().saturating_sub(started);
        let written = state.ring_head().load(Ordering::Relaxed).min(RING as u64) as usize;
        // SAFETY: the hooks wrote `written` events into `events` (through the ring
        // pointer, derived from `events_base`) and are done: the calls have returned.
        let recorded = unsafe { std::slice::from_raw_parts(events_base, written) };
        let mean_inner = match untimed {
            true => all_calls(recorded).then_some(0.0),
            false => mean_inner_time(recorded),
        };
        if let Some(mean_inner) = mean_inner {
            inner = inner.min(mean_inner);
            inner_batches.push(mean_inner);
        }
        hooked = hooked.min(hooked_batch as f64 / CALLS_PER_BATCH as f64);
        bare = bare.min(bare_batch as f64 / CALLS_PER_BATCH as f64);
        outer_batches.push((hooked_batch as f64 - bare_batch as f64) / CALLS_PER_BATCH as f64);
    }
    thread_state::set_current_slot(previous);
    if inner == f64::MAX {
        return Err(AgentError::Unusable(
            "calibration: the hook recorded no events".into(),
        ));
    }
    let outer = (hooked - bare).max(0.0);
    Ok(HookCost {
        inner_ticks: inner,
        outer_ticks: outer,
        inner_spread_ticks: (median(&mut inner_batches) - inner).max(0.0),
        outer_spread_ticks: (median(&mut outer_batches) - outer).max(0.0),
        untimed_ticks: 0.0,
        untimed_spread_ticks: 0.0,
    })
}

/// Whether a batch through the untimed hook recorded one `Call` event per call.
fn all_calls(events: &[Event]) -> bool {
    events.len() == CALLS_PER_BATCH
        && events
            .iter()
            .all(|event| event.kind() == Some(EventKind::Call))
}

/// The median of `values` (0 for none).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// The mean of exit − entry over the entry/exit pairs of a batch.
fn mean_inner_time(events: &[Event]) -> Option<f64> {
    let pairs: Vec<u64> = events
        .chunks_exact(2)
        .filter(|pair| {
            pair[0].kind() == Some(EventKind::Entry) && pair[1].kind() == Some(EventKind::Exit)
        })
        .map(|pair| pair[1].value.saturating_sub(pair[0].value))
        .collect();
    (pairs.len() == CALLS_PER_BATCH).then(|| pairs.iter().sum::<u64>() as f64 / pairs.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks::unwind_probe;

    #[test]
    fn a_backtrace_at_every_step_of_a_calibration_function_reaches_its_caller() {
        for (name, routine) in [
            (
                "tendril_calibration_target",
                tendril_calibration_target as *const () as u64,
            ),
            (
                "tendril_calibration_twin",
                tendril_calibration_twin as *const () as u64,
            ),
        ] {
            let steps = unwind_probe::step_through(routine, [41, 0, 0, 0]);
            unwind_probe::assert_every_walk_reaches_the_caller(name, routine, &steps);
        }
    }
}
