//! Taking the return hooks out of the frames that still hold them, before the
//! unwinder's hooks come out.
//!
//! A return hook leaves its trampoline's exit in the frame's return slot until the
//! frame returns, and restoring the function's entry does not change that: a thread
//! deep inside a hooked function when the hooks come out, or a frame that never returns
//! (a thread's main loop), still holds an exit. An unwinder that meets an exit cannot
//! step through it (a Rust panic aborts with "failed to initiate panic, error 5", a C++
//! exception terminates, `pthread_exit` aborts); while the unwinder's entry points are
//! hooked, they put the real return addresses back first (`shadow`). So those hooks may
//! only come out once no frame holds an exit and none can get one again.
//!
//! The one idea: with every running thread parked, each live thread's shadow stack is
//! walked from the top, and every slot that still holds its exit gets its real return
//! address back — with a compare-and-swap, so a slot that meanwhile changed is left
//! alone — and every entry is marked retired, so nothing puts an exit back in its slot
//! again (`shadow` skips retired entries). A thread caught inside a return hook's
//! trampoline, or in agent code called from one (its stack holds a return into the
//! trampoline), could still write an exit afterwards, so the pass only counts if no
//! thread was: otherwise it is tried again a little later. Threads inside the
//! unwinder's own hooks are no obstacle (they put real addresses back, and never an
//! exit in a retired entry's slot); their trampolines are told apart by address.

use crate::code_memory;
use crate::stop_world::{self, ParkedThread};
use crate::tasks;
use crate::thread_state::{self, ENTRY_RESTORED, ENTRY_RETIRED, ShadowEntry, ThreadState};
use crate::{sys, threads};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// How many passes are tried before giving up for now.
const ATTEMPTS: usize = 40;
/// The pause between two passes, for a thread inside tendril's code to leave it.
const PAUSE_MICROSECONDS: u64 = 2_000;
/// How much of a thread's stack above its stack pointer is searched for a return into
/// a return hook's trampoline (its slow path saves every register, calls the agent,
/// which may call libc).
const STACK_WINDOW: usize = 8192;
/// Most threads one pass looks at.
const MAX_THREADS: usize = 4096;
/// Most trampolines of the unwinder's hooks known.
const MAX_INTERNAL: usize = 64;

/// (start, end) of each trampoline of an unwinder hook, for [`in_return_hook_code`].
static INTERNAL_TRAMPOLINES: [(AtomicU64, AtomicU64); MAX_INTERNAL] =
    [const { (AtomicU64::new(0), AtomicU64::new(0)) }; MAX_INTERNAL];
static INTERNAL_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Notes that `start..end` holds the trampoline of one of the unwinder's hooks.
pub fn note_internal_trampoline(start: u64, end: u64) {
    let index = INTERNAL_COUNT.load(Ordering::Acquire);
    if index < MAX_INTERNAL {
        INTERNAL_TRAMPOLINES[index].1.store(end, Ordering::Release);
        INTERNAL_TRAMPOLINES[index]
            .0
            .store(start, Ordering::Release);
        INTERNAL_COUNT.store(index + 1, Ordering::Release);
    }
}

/// Puts the real return address back in every frame that holds a trampoline exit, in
/// every thread, so that the unwinder's hooks can come out. Returns false if some
/// thread stayed inside tendril's code through every attempt (the hooks must stay).
pub fn retire_all_exits() -> bool {
    let states = live_states();
    (0..ATTEMPTS).any(|attempt| {
        if attempt > 0 {
            sys::sleep_microseconds(PAUSE_MICROSECONDS);
        }
        stop_world::with_world_stopped(|parked| retire_pass(&states, parked)).unwrap_or(false)
    })
}

/// The state of every live target thread: the most recently registered one for each
/// thread id that still exists (a thread id can be reused after a thread ends).
fn live_states() -> Vec<&'static ThreadState> {
    let registered = thread_state::registered_threads();
    let mut live: Vec<&'static ThreadState> = Vec::new();
    for state in registered.into_iter().rev() {
        if state.is_agent == 0
            && !live.iter().any(|l| l.tid == state.tid)
            && tasks::state(state.tid) != tasks::TaskState::Gone
        {
            live.push(state);
        }
    }
    live
}

/// One pass with the world stopped: retires every live thread's entries, and says
/// whether every target thread was outside tendril's code. Allocates nothing.
fn retire_pass(states: &[&'static ThreadState], parked: &mut [ParkedThread]) -> bool {
    for state in states {
        retire_entries(state);
    }
    let me = sys::gettid();
    let mut clean = true;
    let mut seen = 0;
    tasks::for_each_thread(|tid| {
        seen += 1;
        if tid == me || !clean || seen > MAX_THREADS || threads::is_agent_thread(tid) {
            return;
        }
        let position = parked
            .iter()
            .find(|p| p.tid() == tid)
            .map(|p| (p.pc(), p.sp()));
        clean = match position.or_else(|| tasks::user_position(tid)) {
            Some((pc, sp)) => !in_return_hook_code(pc) && !stack_returns_into_hook(sp),
            // Running without having parked, or gone meanwhile: look again next pass.
            None => !sys::thread_exists(tid),
        };
    });
    // An exit written back while the pass ran (a hook that was already past its check
    // of the retired mark) shows up here.
    clean && states.iter().all(|state| !holds_an_exit(state))
}

/// Retires `state`'s entries, from the top: the newest entry for a slot claims it.
fn retire_entries(state: &ThreadState) {
    for entry in entries(state).iter().rev() {
        let function = word(&entry.function);
        if read_word(entry.slot) == Some(entry.exit) {
            // SAFETY: the slot was just read, so it is mapped; it lies on the stack of a
            // live thread, which is parked or asleep, or inside a return that stores the
            // same real address. A compare-and-swap changes it only if it still holds
            // the exit.
            let slot = unsafe { AtomicU64::from_ptr(entry.slot as *mut u64) };
            let _ = slot.compare_exchange(
                entry.exit,
                entry.return_address,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        }
        function.fetch_or(ENTRY_RETIRED, Ordering::SeqCst);
    }
}

/// Whether some entry's slot still holds its exit, or will get it back (an entry whose
/// address was put back for an unwinder and is not retired).
fn holds_an_exit(state: &ThreadState) -> bool {
    entries(state).iter().any(|entry| {
        let flags = word(&entry.function).load(Ordering::SeqCst);
        read_word(entry.slot) == Some(entry.exit)
            || (flags & ENTRY_RESTORED != 0 && flags & ENTRY_RETIRED == 0)
    })
}

/// The entries below the top of `state`'s shadow stack (the owner may pop some
/// meanwhile; their memory stays valid).
fn entries(state: &ThreadState) -> &[ShadowEntry] {
    let top = word(&state.shadow_top).load(Ordering::SeqCst);
    let count = top.saturating_sub(state.shadow_base) / thread_state::ENTRY_SIZE as u64;
    let count = count.min(thread_state::SHADOW_ENTRIES as u64) as usize;
    // SAFETY: [shadow_base, shadow_top) lies in the state's region, which is never
    // unmapped; entries are plain words, and the ones this module changes are changed
    // with atomic operations.
    unsafe { std::slice::from_raw_parts(state.shadow_base as *const ShadowEntry, count) }
}

/// A word of a thread's state, seen as an atomic (other threads write it too).
fn word(value: &u64) -> &AtomicU64 {
    // SAFETY: the word is aligned and lives in a region that is never unmapped; every
    // concurrent access to it is a whole-word load or store.
    unsafe { AtomicU64::from_ptr(value as *const u64 as *mut u64) }
}

/// The word at `address`, or `None` if it is not mapped (a gone frame's slot on an
/// alternate signal stack that was freed).
fn read_word(address: u64) -> Option<u64> {
    let mut bytes = [0u8; 8];
    code_memory::read_memory(address, &mut bytes).then(|| u64::from_ne_bytes(bytes))
}

/// Whether `address` lies in a trampoline other than the unwinder hooks' (the only
/// ones that write exits). Noted when a trampoline is built, so a thread cannot be in
/// one that is not listed yet.
fn in_return_hook_code(address: u64) -> bool {
    let count = INTERNAL_COUNT.load(Ordering::Acquire).min(MAX_INTERNAL);
    code_memory::is_trampoline_code(address)
        && !INTERNAL_TRAMPOLINES[..count].iter().any(|(start, end)| {
            (start.load(Ordering::Acquire)..end.load(Ordering::Acquire)).contains(&address)
        })
}

/// Whether a word of the stack just above `sp` points into a return hook's trampoline:
/// the thread may be in a call made from its slow path (the agent registering the
/// thread, which calls libc's `mmap`, say).
fn stack_returns_into_hook(sp: u64) -> bool {
    let mut window = [0u8; STACK_WINDOW];
    // The window may run past the top of the stack: read what is mapped.
    let mut length = STACK_WINDOW;
    while length > 0 && !code_memory::read_memory(sp, &mut window[..length]) {
        length /= 2;
    }
    window[..length]
        .chunks_exact(8)
        .map(|bytes| u64::from_ne_bytes(bytes.try_into().unwrap_or_default()))
        .any(in_return_hook_code)
}
