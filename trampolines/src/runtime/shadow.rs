//! The shadow stack's slow paths: frames that never return normally, and unwinders.
//!
//! The return hook keeps each hooked frame's real return address in the thread's shadow
//! stack, keyed by the address of the stack slot it came from. Frames can leave without
//! returning — `longjmp`, a C++ exception or Rust panic, thread exit or cancellation —
//! and an unwinder must never find a trampoline address in a return slot (it has no
//! unwind information, and the program would abort). The one idea: the shadow stack is
//! kept consistent *lazily*, by comparing slot addresses with the stack pointer:
//!
//! * an entry whose slot lies at or below a new frame's slot belongs to a frame that is
//!   gone: it is dropped when the next entry is pushed, or when a return skips it;
//! * when an unwinder starts (`_Unwind_RaiseException`, `_Unwind_Resume`, forced
//!   unwinding for `pthread_exit`, `_Unwind_Backtrace`...), every hooked slot of the
//!   thread gets its real return address back, and the unwinder's stack pointer is
//!   noted. A hook that later runs *above* that frame proves the unwinder is done (it
//!   returned, or jumped to a landing pad up the stack): the entries of frames that are
//!   gone are dropped, and the hooks of frames that survived go back in. A catch
//!   (`__cxa_begin_catch`, Rust's `__rust_panic_cleanup`) is such a hook, so a frame
//!   that catches an exception still has its return counted.
//!
//! The unwinder's hooks therefore go in before any return hook and come out only once
//! `retire` has put the real address back in every slot that still holds an exit; a
//! retired entry never gets its exit back.
//!
//! A return that finds no entry at all would have nowhere to go; dropped entries are
//! kept in a small graveyard for that case, and if even that fails the process is
//! stopped with a message rather than sent to a random address. A frame found in the
//! graveyard was not gone: its stack was left and resumed (ucontext coroutines, green
//! threads). Its Unwind already closed it in the profile, so its return is reported as
//! `Resumed` — the profile then says how many frames it cut short — and never as an
//! exit, which the controller could not match.

use crate::hooks::slow_call::SavedRegisters;
use crate::runtime::state::STATE;
use crate::runtime::thread_state::{
    self, ENTRY_RESTORED, ENTRY_RETIRED, EntryPtr, FLAG_RECONCILE, GRAVEYARD_ENTRIES,
    MAX_NESTED_UNWINDERS, ShadowEntry, StatePtr, with_own_state,
};
use crate::{runtime::recording, sys};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{self, Relaxed};
use tendril_wire::events::{Event, EventKind};

/// Reads the word at `address` of this thread's stack.
fn read_slot(address: u64) -> u64 {
    // SAFETY: `address` is a return-address slot the shadow stack recorded for a frame
    // of the calling thread that lies above the current stack pointer.
    unsafe { std::ptr::read_volatile(address as *const u64) }
}

fn write_slot(address: u64, value: u64) {
    // SAFETY: as in `read_slot`; the slot belongs to a live frame of this thread.
    unsafe { std::ptr::write_volatile(address as *mut u64, value) }
}

/// Replaces the slot's word `current` by `new` unless it changed; whether it did.
/// (`retire` changes slots of this thread from another thread, the same way.)
fn swap_slot(address: u64, current: u64, new: u64) -> bool {
    // SAFETY: as in `read_slot`; the slot is an aligned word.
    let slot = unsafe { AtomicU64::from_ptr(address as *mut u64) };
    slot.compare_exchange(current, new, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
}

/// Entry slow path of a hook with return hooking (a gone frame on top, or hooks to
/// re-install). `PUSHES` words lie between the stub's stack pointer and the new frame's
/// return slot (the stub's saved registers, and for a call thunk its return address).
pub extern "C" fn before_push<const PUSHES: u64>(registers: &mut SavedRegisters) {
    let new_slot = registers.caller_stack_pointer() + PUSHES * 8;
    with_own_state(|state| reconcile(state, new_slot));
}

/// Brings the shadow stack up to date for a hook running with its return slot at
/// `slot`: entries of frames at or below `slot` are gone; if no unwinder is walking the
/// stack, the hooks it took out of surviving frames go back in.
fn reconcile(state: StatePtr, slot: u64) {
    prune(state, slot);
    if state.unwinder_count().load(Relaxed) == 0
        && state.flags().load(Relaxed) & FLAG_RECONCILE != 0
    {
        reinstall_hooks(state);
    }
}

/// Drops the entries, from the top, whose frames are gone given that a frame's return
/// slot is now at `slot` — on the same stack: entries on another stack (a signal
/// handler on its alternate stack) are kept, and so is a frame that tail-called.
fn prune(state: StatePtr, slot: u64) {
    let alternate = sys::on_alternate_signal_stack();
    let same_stack = |entry_slot: u64| match alternate {
        Some((low, high)) => (low..high).contains(&entry_slot) == (low..high).contains(&slot),
        None => true,
    };
    while let Some(top) = state.top_entry().map(EntryPtr::load) {
        if top.slot > slot || !same_stack(top.slot) {
            return;
        }
        // The same slot, holding the top frame's exit: the top function tail-called the
        // new one, which will return through that exit. The top frame is not gone.
        if top.slot == slot && top.function & ENTRY_RESTORED == 0 && read_slot(slot) == top.exit {
            return;
        }
        drop_top(state);
    }
}

/// Moves the top entry to the graveyard and counts its frame as unwound; a frame of the
/// recorded call graph leaves with an Unwind event.
fn drop_top(state: StatePtr) {
    let Some(entry) = state.pop_entry() else {
        return;
    };
    if entry.function & thread_state::ENTRY_RECORDED != 0 {
        let id = (entry.function & thread_state::ENTRY_ID_MASK) as u32;
        decrement(state.graph_depth());
        super::untimed_table::flush(state);
        recording::emit(state, Event::new(EventKind::Unwind, id, sys::rdtsc()));
    }
    let next = state.graveyard_next().load(Relaxed);
    state
        .graveyard(next as usize % GRAVEYARD_ENTRIES)
        .store(entry);
    state.graveyard_next().store(next + 1, Relaxed);
    increment(state.unwound_frames());
}

/// Adds one to a word of the calling thread's own state (only it writes the word; a
/// plain load and store, as the stubs do, rather than a locked add).
fn increment(word: &AtomicU64) {
    word.store(word.load(Relaxed).wrapping_add(1), Relaxed);
}

/// Takes one from a word of the calling thread's own state, stopping at zero.
fn decrement(word: &AtomicU64) {
    word.store(word.load(Relaxed).saturating_sub(1), Relaxed);
}

/// Puts the exit back in the slots whose real return address was restored for an
/// unwinder, where the frame is still there (the slot still holds that address) —
/// unless the entry is retired: its hooks are coming out. The mark is checked again
/// after the exit went in, and the exit taken out if the mark came meanwhile.
fn reinstall_hooks(state: StatePtr) {
    for entry in state.shadow_entries(Relaxed) {
        let ShadowEntry {
            slot,
            return_address: real,
            exit,
            ..
        } = entry.load();
        let flags = entry.function();
        let marks = flags.load(Ordering::SeqCst);
        if marks & ENTRY_RESTORED == 0 || marks & ENTRY_RETIRED != 0 {
            continue;
        }
        if swap_slot(slot, real, exit) {
            if flags.load(Ordering::SeqCst) & ENTRY_RETIRED != 0 {
                swap_slot(slot, exit, real);
            } else {
                flags.fetch_and(!ENTRY_RESTORED, Ordering::SeqCst);
            }
        }
    }
    let flags = state.flags().load(Relaxed);
    state.flags().store(flags & !FLAG_RECONCILE, Relaxed);
}

/// Exit slow path: the return's slot is not the top entry's. Finds the entry (dropping
/// the entries above it, whose frames were skipped), writes the real return address
/// into the slot the exit reserved, and counts the return — or, for a recorded frame,
/// writes its Exit event (the recording exit stub passes the timestamp in `rax`).
/// `PUSHES` registers lie between the stub's stack pointer and the reserved slot.
pub extern "C" fn mismatched_return<const PUSHES: u64>(registers: &mut SavedRegisters) {
    let slot = registers.caller_stack_pointer() + PUSHES * 8;
    let timestamp = registers.rax;
    let stub = registers.return_address;
    let found = with_own_state(|state| {
        let position = state
            .shadow_entries(Relaxed)
            .rposition(|e| e.slot().load(Relaxed) == slot);
        let entry = match position {
            Some(index) => {
                while state.shadow_len(Relaxed) > index + 1 {
                    drop_top(state);
                }
                state.pop_entry().map(ReturningFrame::Open)
            }
            None => take_from_graveyard(state, slot, stub).map(|entry| {
                increment(state.resumed_frames());
                ReturningFrame::Resumed(entry)
            }),
        };
        let entry = entry.map(|returning| {
            let (entry, kind) = match returning {
                ReturningFrame::Open(entry) => (entry, EventKind::Exit),
                ReturningFrame::Resumed(entry) => (entry, EventKind::Resumed),
            };
            let id = (entry.function & thread_state::ENTRY_ID_MASK) as u32;
            if entry.function & thread_state::ENTRY_RECORDED == 0 {
                if (id as usize) < thread_state::MAX_FUNCTION_IDS {
                    increment(state.returns(id));
                }
            } else if kind == EventKind::Exit {
                decrement(state.graph_depth());
                super::untimed_table::flush(state);
                recording::emit(state, Event::new(kind, id, timestamp));
            } else {
                // Its Unwind closed the frame and took it out of the graph depth when
                // it was dropped: only say that it came back.
                recording::emit(state, Event::new(kind, id, timestamp));
            }
            entry
        });
        if entry.is_some() {
            // The frame returned normally: anything below it is gone, and an unwinder
            // that ran below it is done.
            reconcile(state, slot);
        }
        entry
    });
    match found {
        Some(Some(entry)) => write_slot(slot, entry.return_address),
        _ => sys::fatal(
            "tendril: a hooked function returned through a frame tendril has no record of; \
             stopping the process rather than returning to an unknown address\n",
        ),
    }
}

/// The frame a return came back through.
enum ReturningFrame {
    /// Still on the shadow stack.
    Open(ShadowEntry),
    /// Dropped earlier, as if gone, and found in the graveyard: the thread had left its
    /// stack (a coroutine switched away) and came back to it.
    Resumed(ShadowEntry),
}

/// The dropped entry for `slot` whose exit is the one the return came through, taken
/// out of the graveyard. Frames that tail-called share a slot, so the slot alone does
/// not say which one returns: the exit does. The exit stub's slow path (where `stub`
/// points) lies after its exit in the same trampoline, so the exit nearest below
/// `stub` is the one; the most recently dropped entry wins a tie.
fn take_from_graveyard(state: StatePtr, slot: u64, stub: u64) -> Option<ShadowEntry> {
    let newest = state.graveyard_next().load(Relaxed) as usize;
    let distance = |entry: &ShadowEntry| stub.checked_sub(entry.exit).unwrap_or(u64::MAX);
    let index = (0..GRAVEYARD_ENTRIES.min(newest))
        .map(|age| (newest - 1 - age) % GRAVEYARD_ENTRIES)
        .filter(|&index| {
            let entry = state.graveyard(index).load();
            entry.slot == slot && entry.return_address != 0
        })
        .min_by_key(|&index| distance(&state.graveyard(index).load()))?;
    let entry = state.graveyard(index);
    let taken = entry.load();
    entry.return_address().store(0, Relaxed);
    Some(taken)
}

/// Internal hook on the unwinder's entry points. The hooked function's return slot is
/// just above the internal hook's pushed `r11`.
pub extern "C" fn unwinder_starts(registers: &mut SavedRegisters) {
    let slot = registers.caller_stack_pointer() + 8;
    with_own_state(|state| begin_unwinding(state, slot));
}

/// Every hooked slot of the thread gets its real return address back, and the
/// unwinder's frame is noted. An unwinder entered from a frame below this one is over:
/// `_Unwind_Resume` from a cleanup landing pad continues the exception whose
/// `_Unwind_RaiseException` ran further down.
fn begin_unwinding(state: StatePtr, slot: u64) {
    let mut count = state.unwinder_count().load(Relaxed) as usize;
    while count > 0 && state.unwinder(count - 1).load(Relaxed) <= slot {
        count -= 1;
    }
    if count < MAX_NESTED_UNWINDERS {
        state.unwinder(count).store(slot, Relaxed);
        count += 1;
    }
    state.unwinder_count().store(count as u64, Relaxed);
    for entry in state.shadow_entries(Relaxed) {
        let ShadowEntry {
            slot,
            return_address: real,
            exit,
            ..
        } = entry.load();
        let flags = entry.function();
        if flags.load(Ordering::SeqCst) & (ENTRY_RESTORED | ENTRY_RETIRED) == 0
            && swap_slot(slot, exit, real)
        {
            flags.fetch_or(ENTRY_RESTORED, Ordering::SeqCst);
        }
    }
    let flags = state.flags().load(Relaxed);
    state.flags().store(flags | FLAG_RECONCILE, Relaxed);
}

/// Internal hook on the functions a catch calls (`__cxa_begin_catch`, Rust's
/// `__rust_panic_cleanup`): the innermost exception's unwinding is over, frames below
/// the catch are gone, and — unless another unwinder is still walking — the frames
/// that survived get their return hooks back.
pub extern "C" fn exception_caught(registers: &mut SavedRegisters) {
    let slot = registers.caller_stack_pointer() + 8;
    with_own_state(|state| {
        decrement(state.unwinder_count());
        reconcile(state, slot);
    });
}

/// Stands in for `_Unwind_Backtrace`: the walk sees the real return addresses, and the
/// hooks go back in as soon as it returns (it unwinds nothing).
pub extern "C" fn backtrace_replacement(
    trace: *mut libc::c_void,
    argument: *mut libc::c_void,
) -> libc::c_int {
    type Backtrace = extern "C" fn(*mut libc::c_void, *mut libc::c_void) -> libc::c_int;
    // Our own return slot: the stand-in was jumped to, so the caller's return address
    // is where our frame begins.
    let slot = stack_pointer_at_entry();
    with_own_state(|state| begin_unwinding(state, slot));
    let body = STATE
        .backtrace_body
        .load(std::sync::atomic::Ordering::Acquire);
    // SAFETY: STATE.backtrace_body holds the relocated entry of the real _Unwind_Backtrace,
    // which has exactly this signature; it is set before the patch that leads here.
    let real: Backtrace = unsafe { std::mem::transmute(body as usize) };
    let result = real(trace, argument);
    with_own_state(|state| {
        let count = state.unwinder_count().load(Relaxed) as usize;
        if count > 0 && state.unwinder(count - 1).load(Relaxed) == slot {
            state.unwinder_count().store(count as u64 - 1, Relaxed);
        }
        reconcile(state, slot);
    });
    result
}

/// An address just below the caller's frame: every frame of the caller's callees,
/// and no frame of the caller, lies below it.
#[inline(always)]
fn stack_pointer_at_entry() -> u64 {
    let stack_pointer: u64;
    // SAFETY: reads rsp.
    unsafe { std::arch::asm!("mov {}, rsp", out(reg) stack_pointer, options(nomem, nostack)) };
    stack_pointer
}
