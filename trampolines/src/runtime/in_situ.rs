//! Calibrating the recording hooks where they run: on the target's own threads, into
//! their own rings, while the recording runs (issue 15).
//!
//! The calibration at the start of a recording (`calibration`) runs on an agent thread
//! into a private ring of 1,024 events. In the target the same hooks cost more, and
//! by an amount that moves: a ring the controller drains close behind its producer, a
//! core shared with the controller, caches the program itself fills. So, now and then
//! (every [`PERIOD_EVENTS`] events of a thread), the ring-space slow path of a
//! recording hook runs one small batch on that thread. For each shape a hooked entry
//! takes ([`HookShape`]: a 5-byte jump, a 2-byte jump through a pad, a call thunk), a
//! function of that shape is hooked with the inner recording hook (`Hook::Record`,
//! patched for the whole recording): [`CALLS`] calls of it, writing their events into
//! the thread's real ring, then as many calls of an unhooked twin; all of it twice,
//! the first pass only warming up (a batch measured cold, in a thread that records
//! rarely, costs several times a warm one). Each call takes the previous call's result
//! as its argument, as a program's calls mostly do (`acc = f(acc)`, `fib(n-1) +
//! fib(n-2)`): the hooks save and restore the argument and result registers, which
//! lengthens such a chain by more than independent calls show, and batches of
//! independent calls measured 1.2–1.5 ns less than `tightcall`'s own calls paid. Per
//! shape and batch:
//!
//! * inner time = mean of (exit − entry) over the batch's events;
//! * outer time = (hooked − bare) / calls: all that one call adds to its caller.
//!
//! Each goes into the header's sample ring of its shape; the controller corrects each
//! function's calls with the median of their shape's samples (an Entry event says its
//! shape). The batch's whole time is an Adjust event, removed from the frames open
//! around it like any other wait tendril causes, and the controller leaves the
//! calibration functions' events out of the trees (`header::IN_SITU_FUNCTIONS`).
//!
//! Patching the three never stops the target's threads: each entry is one instruction
//! (`mov eax, imm32`; `lea` under a pad jump; `call`). Restoring the pad, which a
//! thread may be on, stops them once, at the end of a recording, as any pad does.

use crate::hooks::slow_call::SavedRegisters;
use crate::patching::patcher::{self, PatchRequest};
use crate::runtime::recording::{self, RingRoom};
use crate::runtime::thread_state::{FLAG_PASSTHROUGH, StatePtr, with_own_state};
use crate::sys;
use crate::sys::error::AgentError;
use std::hint::black_box;
use std::sync::atomic::Ordering::Relaxed;
use tendril_wire::Hook;
use tendril_wire::events::{Event, EventKind, HOOK_SHAPES, HookShape};
use tendril_wire::rings::{self, header};

/// Calls per batch and shape (each writes two events).
const CALLS: u64 = 32;
/// A thread runs a batch every this many events of its own (512 KiB of its ring): at
/// 30 ns a hooked call, a batch of about 10 µs every 0.5 ms, under 2% of the thread's
/// time, which is removed from its frames like every pause.
pub const PERIOD_EVENTS: u64 = 1 << 15;
/// Events one shape's part of a batch writes: the calls' entries and exits, twice (a
/// warm-up pass, then the measured one).
const SHAPE_EVENTS: u64 = 4 * CALLS;
/// Events a batch writes: every shape's part, and its Adjust.
pub const BATCH_EVENTS: u64 = SHAPE_EVENTS * HOOK_SHAPES as u64 + 1;
/// The owner of the in-situ patches, the same as the start calibration's (no control
/// session has it); the two never overlap: the start calibration restores its own
/// patch before these are made.
const OWNER: u64 = patcher::SELF_TEST_OWNER;

// Leaf functions, as `calibration`'s: the CFI says only that they are functions. Each
// hooked function's first instruction is the whole patch its shape writes: 5 bytes; a
// 2-byte `jmp` in a function too short for 5, with 12 bytes of `int3` padding after it
// for the pad; a `call`. Each twin is its function's copy, never hooked.
core::arch::global_asm!(
    ".pushsection .text",
    ".balign 16",
    ".globl tendril_in_situ_target",
    ".hidden tendril_in_situ_target",
    ".type tendril_in_situ_target, @function",
    "tendril_in_situ_target:",
    ".cfi_startproc",
    "mov eax, 1",
    "add rax, rdi",
    "ret",
    ".cfi_endproc",
    ".size tendril_in_situ_target, . - tendril_in_situ_target",
    ".balign 16",
    ".globl tendril_in_situ_twin",
    ".hidden tendril_in_situ_twin",
    ".type tendril_in_situ_twin, @function",
    "tendril_in_situ_twin:",
    ".cfi_startproc",
    "mov eax, 1",
    "add rax, rdi",
    "ret",
    ".cfi_endproc",
    ".size tendril_in_situ_twin, . - tendril_in_situ_twin",
    ".balign 16",
    ".globl tendril_in_situ_pad_target",
    ".hidden tendril_in_situ_pad_target",
    ".type tendril_in_situ_pad_target, @function",
    "tendril_in_situ_pad_target:",
    ".cfi_startproc",
    "lea eax, [rdi + 1]",
    "ret",
    ".cfi_endproc",
    ".size tendril_in_situ_pad_target, . - tendril_in_situ_pad_target",
    ".fill 12, 1, 0xcc",
    ".balign 16",
    ".globl tendril_in_situ_pad_twin",
    ".hidden tendril_in_situ_pad_twin",
    ".type tendril_in_situ_pad_twin, @function",
    "tendril_in_situ_pad_twin:",
    ".cfi_startproc",
    "lea eax, [rdi + 1]",
    "ret",
    ".cfi_endproc",
    ".size tendril_in_situ_pad_twin, . - tendril_in_situ_pad_twin",
    ".balign 16",
    ".globl tendril_in_situ_thunk_target",
    ".hidden tendril_in_situ_thunk_target",
    ".type tendril_in_situ_thunk_target, @function",
    "tendril_in_situ_thunk_target:",
    ".cfi_startproc",
    "call tendril_in_situ_leaf",
    "ret",
    ".cfi_endproc",
    ".size tendril_in_situ_thunk_target, . - tendril_in_situ_thunk_target",
    ".balign 16",
    ".globl tendril_in_situ_thunk_twin",
    ".hidden tendril_in_situ_thunk_twin",
    ".type tendril_in_situ_thunk_twin, @function",
    "tendril_in_situ_thunk_twin:",
    ".cfi_startproc",
    "call tendril_in_situ_leaf",
    "ret",
    ".cfi_endproc",
    ".size tendril_in_situ_thunk_twin, . - tendril_in_situ_thunk_twin",
    ".balign 16",
    ".globl tendril_in_situ_leaf",
    ".hidden tendril_in_situ_leaf",
    ".type tendril_in_situ_leaf, @function",
    "tendril_in_situ_leaf:",
    ".cfi_startproc",
    "lea eax, [rdi + 1]",
    "ret",
    ".cfi_endproc",
    ".size tendril_in_situ_leaf, . - tendril_in_situ_leaf",
    ".popsection",
);

unsafe extern "C" {
    fn tendril_in_situ_target(value: u64) -> u64;
    fn tendril_in_situ_twin(value: u64) -> u64;
    fn tendril_in_situ_pad_target(value: u64) -> u64;
    fn tendril_in_situ_pad_twin(value: u64) -> u64;
    fn tendril_in_situ_thunk_target(value: u64) -> u64;
    fn tendril_in_situ_thunk_twin(value: u64) -> u64;
    fn tendril_in_situ_leaf(value: u64) -> u64;
}

/// One shape's calibration functions: the hooked one, its unhooked twin, and their
/// size in bytes (the symbols' sizes).
struct ShapeFunctions {
    shape: HookShape,
    target: unsafe extern "C" fn(u64) -> u64,
    twin: unsafe extern "C" fn(u64) -> u64,
    bytes: u64,
}

const SHAPES: [ShapeFunctions; HOOK_SHAPES] = [
    ShapeFunctions {
        shape: HookShape::Jump,
        target: tendril_in_situ_target,
        twin: tendril_in_situ_twin,
        bytes: 9,
    },
    ShapeFunctions {
        shape: HookShape::PadJump,
        target: tendril_in_situ_pad_target,
        twin: tendril_in_situ_pad_twin,
        bytes: 4,
    },
    ShapeFunctions {
        shape: HookShape::CallThunk,
        target: tendril_in_situ_thunk_target,
        twin: tendril_in_situ_thunk_twin,
        bytes: 6,
    },
];

fn address(function: unsafe extern "C" fn(u64) -> u64) -> u64 {
    function as *const () as u64
}

/// Patches the calibration functions for the recording that starts (after
/// `recording::start`, which clears the invoked flags and the samples' counts). A
/// shape whose function is refused is not calibrated in situ (the controller uses
/// the start calibration for it); the error is the first refusal.
pub fn start() -> Result<(), AgentError> {
    let requests: Vec<PatchRequest> = SHAPES
        .iter()
        .map(|functions| PatchRequest {
            address: address(functions.target),
            size: functions.bytes,
            kind: Hook::Record,
        })
        .collect();
    // Every function's range, so the padding after the pad function is known to be
    // padding.
    let mut ranges: Vec<(u64, u64)> = SHAPES
        .iter()
        .flat_map(|f| [(address(f.target), f.bytes), (address(f.twin), f.bytes)])
        .collect();
    ranges.push((address(tendril_in_situ_leaf), 4));
    let results = patcher::patch(OWNER, &requests, &ranges);
    let mut first_error = None;
    for (functions, result) in SHAPES.iter().zip(results) {
        match result {
            Ok(id) => {
                recording::set_invoked_quietly(id);
                let word = header::in_situ_function(functions.shape as usize);
                recording::set_header(word, id as u64 + 1);
            }
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Takes the calibration functions' hooks out (the recording stops; no thread starts
/// a batch once the recording is inactive).
pub fn stop() {
    for shape in 0..HOOK_SHAPES {
        recording::set_header(header::in_situ_function(shape), 0);
    }
    patcher::restore(Some(OWNER));
}

/// Slow path of a recording stub whose thread's ring has no room (or no ring yet), or
/// whose head reached the next in-situ batch: makes room, runs the batch if it is due,
/// and sets the caller's `rdx` to 0 when there is room now, 1 if the event is dropped.
pub extern "C" fn ring_space(registers: &mut SavedRegisters) {
    let room = with_own_state(|state| {
        // The thread's untimed calls come before the event the hook is about to write.
        super::untimed_table::flush(state);
        let room = recording::make_room(state);
        if room {
            calibrate_if_due(state, recording::ring_room(state));
            recording::update_limit(state);
        }
        room
    })
    .unwrap_or(false);
    registers.rdx = u64::from(!room);
}

/// Runs a batch on the calling thread if its ring's head has reached the next batch's
/// and `room` (the ring's free slots, all in memory) holds one; sets when the next
/// batch is due. From the ring-space slow path of a recording hook, between the hook's
/// timestamp and its event: the hook times its event again after this returns.
pub fn calibrate_if_due(state: StatePtr, room: RingRoom) {
    let head = state.ring_head().load(Relaxed);
    let next = room.in_situ_next;
    if head < next.load(Relaxed) {
        return;
    }
    next.store(head + PERIOD_EVENTS, Relaxed);
    if !recording::is_active() || head + BATCH_EVENTS + 1 > room.end {
        return;
    }
    let started = sys::rdtsc();
    for functions in &SHAPES {
        let word = header::in_situ_function(functions.shape as usize);
        let id = recording::header_value(word);
        if id == 0 {
            continue;
        }
        let head = state.ring_head().load(Relaxed);
        let (hooked, bare) = run_batch(state, head, functions);
        let inner = mean_inner_ticks(state, head + 2 * CALLS, id as u32 - 1);
        if let Some(inner) = inner {
            let outer = (hooked as f64 - bare as f64) / CALLS as f64;
            let sample = rings::in_situ_sample(inner, outer);
            recording::sample_in_situ(functions.shape, sample);
        }
    }
    let waited = sys::rdtsc().saturating_sub(started);
    recording::add_to_header(header::PAUSE_TICKS, waited);
    recording::write_event(state, Event::new(EventKind::Adjust, 0, waited));
}

/// One shape's hooked calls, then the bare ones, with the hooks on for this thread (the
/// slow path turned them off); returns the ticks of each loop.
fn run_batch(state: StatePtr, head: u64, functions: &ShapeFunctions) -> (u64, u64) {
    let flags = state.flags();
    let saved_flags = flags.load(Relaxed);
    let depth = state.graph_depth();
    let saved_depth = depth.load(Relaxed);
    let limit = state.ring_limit();
    let saved_limit = limit.load(Relaxed);
    // The inner hook records only inside the graph; the batch's events fit below the
    // limit (the caller checked the room), so no hook of the batch takes a slow path.
    depth.store(saved_depth.max(1), Relaxed);
    limit.store(head + SHAPE_EVENTS, Relaxed);
    flags.store(saved_flags & !FLAG_PASSTHROUGH, Relaxed);
    // A first pass warms the code, the data and the branch predictors up (a batch runs
    // rarely); the second is measured. Each call's argument is the last one's result
    // (see the module comment).
    let mut hooked = 0;
    let mut bare = 0;
    for pass in 0..2 {
        // SAFETY: both are plain functions with the C ABI, the target hooked and its
        // twin never.
        hooked = unsafe { ticks_of_chained_calls(functions.target, pass) };
        // SAFETY: as above.
        bare = unsafe { ticks_of_chained_calls(functions.twin, pass) };
    }
    flags.store(saved_flags, Relaxed);
    depth.store(saved_depth, Relaxed);
    limit.store(saved_limit, Relaxed);
    (hooked, bare)
}

/// The ticks [`CALLS`] calls of `function` take, each given the last one's result
/// (the first `seed`).
///
/// # Safety
/// `function` is a function with the C ABI that takes and returns a `u64` and may be
/// called with any value.
#[inline(always)]
unsafe fn ticks_of_chained_calls(function: unsafe extern "C" fn(u64) -> u64, seed: u64) -> u64 {
    let started = sys::rdtsc();
    let mut chained = black_box(seed);
    for _ in 0..CALLS {
        // SAFETY: the caller's promise.
        chained = unsafe { function(chained) };
    }
    black_box(chained);
    sys::rdtsc().saturating_sub(started)
}

/// The mean of exit − entry over the measured pass's events, from `head` (the last
/// events written), if they are the calls' entry/exit pairs (a signal handler's
/// recorded calls in between spoil it).
fn mean_inner_ticks(state: StatePtr, head: u64, id: u32) -> Option<f64> {
    if state.ring_head().load(Relaxed) != head + 2 * CALLS {
        return None;
    }
    let mut sum = 0;
    for call in 0..CALLS {
        let entry = recording::event_at(state, head + 2 * call);
        let exit = recording::event_at(state, head + 2 * call + 1);
        let is = |event: Event, kind| event.kind() == Some(kind) && event.function == id;
        if !is(entry, EventKind::Entry) || !is(exit, EventKind::Exit) {
            return None;
        }
        sum += exit.value.saturating_sub(entry.value);
    }
    Some(sum as f64 / CALLS as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks::unwind_probe;

    #[test]
    fn the_in_situ_functions_compute_and_unwind_at_every_step() {
        let mut functions: Vec<(&str, unsafe extern "C" fn(u64) -> u64)> = Vec::new();
        for (shape, names) in SHAPES.iter().zip([
            ["tendril_in_situ_target", "tendril_in_situ_twin"],
            ["tendril_in_situ_pad_target", "tendril_in_situ_pad_twin"],
            ["tendril_in_situ_thunk_target", "tendril_in_situ_thunk_twin"],
        ]) {
            functions.push((names[0], shape.target));
            functions.push((names[1], shape.twin));
        }
        functions.push(("tendril_in_situ_leaf", tendril_in_situ_leaf));
        for (name, function) in functions {
            let routine = address(function);
            let steps = unwind_probe::step_through(routine, [41, 0, 0, 0]);
            unwind_probe::assert_every_walk_reaches_the_caller(name, routine, &steps);
            // SAFETY: plain functions with the C ABI, not hooked in a test.
            assert_eq!(unsafe { function(41) }, 42, "{name}");
        }
        // The first instruction is the whole patch of each shape.
        // SAFETY: the functions' first bytes, in this library's text.
        let first = |function| unsafe { *(address(function) as *const u8) };
        assert_eq!(first(tendril_in_situ_target), 0xb8, "mov eax, imm32");
        assert_eq!(first(tendril_in_situ_pad_target), 0x8d, "lea");
        assert_eq!(first(tendril_in_situ_thunk_target), 0xe8, "call rel32");
    }
}
