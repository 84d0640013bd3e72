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
//! The one idea: each live thread's shadow stack is walked from the top, and every slot
//! that still holds its exit gets its real return address back — with a
//! compare-and-swap, so a slot that meanwhile changed is left alone — and every entry
//! is marked retired, so nothing puts an exit back in its slot again (`shadow` skips
//! retired entries). Every entry but the unwinder's is restored by then, so a thread
//! gets no new exit unless it is inside a hook already: it could still push a new
//! entry and write an exit afterwards, so the pass only counts if no thread was, and
//! that is known exactly, never guessed from stack memory (a sleeping thread's stack
//! may hold a dead hook address for ever): a thread is inside a hook while its PC is in
//! a return hook's trampoline or in the agent's code, while its slow-call depth
//! (`slow_call`, counted by `tendril_slow_call` itself) is not zero, or while it
//! registers (`thread_state::registration_progress`).
//!
//! No thread is held for the pass. Each running thread takes the stop signal and, in
//! its handler, retires its own entries and looks at where it was interrupted
//! (`stop_world::with_every_thread_checking_itself`), then goes on: a thread that was
//! outside every hook then gets no exit again, whenever the others look. The threads
//! that did not take the signal — asleep, stopped, or held with ptrace because they
//! block it — are retired and judged by the thread that runs the pass. (Parking a
//! thousand threads for the pass held each for up to 90 ms.) Threads inside the unwinder's
//! own hooks' trampolines are no obstacle (they put real addresses back, and never an
//! exit in a retired entry's slot); their trampolines are told apart by address. Nor
//! is a thread the stop found asleep in a system call that has woken since (with
//! hundreds of threads that sleep a few milliseconds, some always have by the time
//! the pass looks): outside a slow call then, as its count of finished slow calls
//! shows, it was outside every hook, and nothing it ran since can write an exit.
//!
//! A pass that cannot count (a thread stays inside a hook, or runs with the stop signal
//! blocked) leaves the unwinder's hooks in; `patcher` keeps them as lingering and
//! `lingering` tries again in the background until they are out.

use crate::hooks::slow_call;
use crate::hooks::state_access::current_state;
use crate::hooks::thread_layout::ShadowEntry;
use crate::patching::stop_world::{self, StoppedWorld};
use crate::runtime::state::{MAX_INTERNAL, STATE};
use crate::runtime::thread_state::{self, ENTRY_RESTORED, ENTRY_RETIRED, StatePtr};
use crate::sys::code_memory;
use crate::sys::error::AgentError;
use crate::sys::tasks;
use crate::sys::{self, agent_threads};
use std::sync::atomic::{AtomicU64, Ordering};

/// The shortest pause between two passes, for a thread inside tendril's code to leave
/// it.
const PAUSE_MICROSECONDS: u64 = 2_000;
/// The pause after a pass is at least this many times as long as its stop took, so
/// that passes tried again and again leave the target running most of the time (with
/// a thousand threads, a stop takes tens of milliseconds).
const PAUSE_PER_STOPPED: u64 = 4;
/// The longest pause between two passes (microseconds).
const LONGEST_PAUSE: u64 = 50_000;
/// Most threads one pass looks at.
const MAX_THREADS: usize = 4096;

/// Notes that `start..end` holds the trampoline of one of the unwinder's hooks.
pub fn note_internal_trampoline(start: u64, end: u64) {
    let index = STATE.internal_count.load(Ordering::Acquire);
    if index < MAX_INTERNAL {
        STATE.internal_trampolines[index]
            .1
            .store(end, Ordering::Release);
        STATE.internal_trampolines[index]
            .0
            .store(start, Ordering::Release);
        STATE.internal_count.store(index + 1, Ordering::Release);
    }
}

/// Puts the real return address back in every frame that holds a trampoline exit, in
/// every thread, so that the unwinder's hooks can come out, trying up to `attempts`
/// passes. Fails with what kept the last pass from counting (the hooks must stay).
pub fn retire_all_exits(attempts: usize) -> Result<(), Obstacle> {
    let mut obstacle = Obstacle::Unknown;
    let mut pause_microseconds = PAUSE_MICROSECONDS;
    for attempt in 0..attempts {
        if attempt > 0 {
            sys::sleep_microseconds(pause_microseconds);
        }
        let began = sys::monotonic_ns();
        let registrations = thread_state::registration_progress();
        let states = live_states();
        let finished = finished_slow_calls(&states);
        // Made ready before the threads check themselves: the first look at the agent's
        // code reads the memory map (it allocates), which a signal handler must not.
        crate::sys::own_code::is_agent_code(0);
        STATE.self_check_obstacles.store(0, Ordering::Release);
        match stop_world::with_every_thread_checking_itself(retire_own_entries, |world| {
            retire_pass(&states, registrations, &finished, &world)
        }) {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(found)) => obstacle = found,
            Err(_) => obstacle = Obstacle::Unknown,
        }
        let stopped_microseconds = sys::monotonic_ns().saturating_sub(began) / 1_000;
        pause_microseconds =
            (PAUSE_PER_STOPPED * stopped_microseconds).clamp(PAUSE_MICROSECONDS, LONGEST_PAUSE);
    }
    Err(obstacle)
}

/// Why a pass did not count: what the unwinder's hooks are waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Obstacle {
    /// Thread `tid` is inside a hook (or tendril's code called from one).
    InsideHook(i32),
    /// Thread `tid` runs with tendril's stop signal blocked, so where it is is unknown.
    Unstoppable(i32),
    /// A thread was registering, or a frame got its exit back during the pass.
    Moving,
    /// The world could not be stopped.
    Unknown,
}

impl std::fmt::Display for Obstacle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Obstacle::InsideHook(tid) => write!(f, "thread {tid} is inside tendril's hook code"),
            Obstacle::Unstoppable(tid) => write!(
                f,
                "thread {tid} runs with tendril's stop signal blocked, so where it is is unknown"
            ),
            Obstacle::Moving => write!(f, "threads were entering tendril's hooks"),
            Obstacle::Unknown => write!(f, "the process's threads could not be stopped"),
        }
    }
}

/// What keeps the unwinder's hooks in, as the reason the controller shows.
impl From<Obstacle> for AgentError {
    fn from(obstacle: Obstacle) -> AgentError {
        AgentError::HooksStillNeeded(obstacle.to_string())
    }
}

/// The state of every live target thread: the most recently registered one for each
/// thread id that still exists (a thread id can be reused after a thread ends).
fn live_states() -> Vec<StatePtr> {
    let registered = thread_state::registered_threads();
    let threads: Vec<(i32, bool)> = registered
        .iter()
        .map(|&state| (tid_of(state), state.is_agent().load(Ordering::Relaxed) != 0))
        .collect();
    latest_of_live_threads(&threads, |tid| tasks::state(tid) == tasks::TaskState::Gone)
        .into_iter()
        .map(|index| registered[index])
        .collect()
}

/// Of the registrations `(tid, is_agent)`, oldest first, the indexes of the newest one
/// of each target thread that is not `gone`, newest first.
fn latest_of_live_threads(registered: &[(i32, bool)], gone: impl Fn(i32) -> bool) -> Vec<usize> {
    let mut live: Vec<usize> = Vec::new();
    for (index, &(tid, is_agent)) in registered.iter().enumerate().rev() {
        if !is_agent && !live.iter().any(|&l| registered[l].0 == tid) && !gone(tid) {
            live.push(index);
        }
    }
    live
}

/// For each of `states` (by tid), where its count of finished slow calls is and what it
/// is now: read before a stop, so that a pass can tell a thread that was asleep in a
/// system call at the stop, and has run since, from one that was inside a slow call.
fn finished_slow_calls(states: &[StatePtr]) -> Vec<(i32, u64, u64)> {
    let mut finished: Vec<(i32, u64, u64)> = states
        .iter()
        .filter_map(|&state| {
            let depth = state.slow_depth_address().load(Ordering::Relaxed);
            let address = depth.checked_add(slow_call::FINISHED_OFFSET)?;
            (depth != 0).then(|| (tid_of(state), address, read_word(address).unwrap_or(0)))
        })
        .collect();
    finished.sort_unstable_by_key(|&(tid, _, _)| tid);
    finished
}

/// Whether thread `tid`, which neither parked nor sleeps in the kernel now, cannot be
/// inside a hook: the stop found it asleep in a system call (not stopped at any pc),
/// so outside every hook but a slow call's, and it finished no slow call since
/// `finished` was read (before the stop) — nor is it in one (`inside_slow_call`,
/// checked first). What it ran since cannot write an exit: every entry but the
/// unwinder's is restored, and the frames' exits are retired. A thread that never
/// registered has no slow call to be in (one registering is `Obstacle::Moving`).
/// `read_word` reads a thread's count.
fn asleep_at_the_stop(
    tid: i32,
    world: &StoppedWorld<'_>,
    finished: &[(i32, u64, u64)],
    read_word: impl Fn(u64) -> Option<u64>,
) -> bool {
    if world.asleep.binary_search(&tid).is_err() || world.halted.binary_search(&tid).is_ok() {
        return false;
    }
    match finished.binary_search_by_key(&tid, |&(tid, _, _)| tid) {
        Ok(index) => {
            let (_, address, before) = finished[index];
            read_word(address) == Some(before)
        }
        Err(_) => true,
    }
}

/// In the stop signal's handler of a pass, on a target thread interrupted at `pc`:
/// retires the thread's own entries, and notes it (`self_check_obstacles`) if it was
/// inside a hook. Allocates nothing and takes no lock. An agent thread (its pc is in
/// the agent's code) is noted too, and left out by [`retire_pass`].
fn retire_own_entries(pc: u64) {
    let state = current_state();
    if let Some(state) = state {
        if state.is_agent().load(Ordering::Relaxed) != 0 {
            return;
        }
        retire_entries(state);
    }
    let inside = state.is_some_and(inside_slow_call)
        || in_return_hook_code(pc)
        || crate::sys::own_code::is_agent_code(pc);
    if inside {
        let slot = STATE.self_check_obstacles.fetch_add(1, Ordering::AcqRel);
        if let Some(noted) = STATE.obstacle_tids.get(slot) {
            noted.store(sys::gettid(), Ordering::Release);
        }
    }
}

/// Which thread the self-checks found inside a hook, if any: agent threads aside, and
/// `Obstacle::Moving` when more were noted than there are slots for.
fn self_check_verdict() -> Result<(), Obstacle> {
    let noted = STATE.self_check_obstacles.load(Ordering::Acquire);
    if noted > STATE.obstacle_tids.len() {
        return Err(Obstacle::Moving);
    }
    match STATE.obstacle_tids[..noted]
        .iter()
        .map(|tid| tid.load(Ordering::Acquire))
        .find(|&tid| !agent_threads::is_agent_thread(tid))
    {
        Some(tid) => Err(Obstacle::InsideHook(tid)),
        None => Ok(()),
    }
}

/// One pass, once every running thread has retired its own entries (`world.peeked`):
/// retires the other live threads' entries, and says whether every target thread was
/// outside tendril's hooks (or which was not).
/// `registrations` is `thread_state::registration_progress` from before `states` was
/// listed, `finished` is [`finished_slow_calls`] from before the stop. Allocates
/// nothing.
fn retire_pass(
    states: &[StatePtr],
    registrations: (usize, usize),
    finished: &[(i32, u64, u64)],
    world: &StoppedWorld<'_>,
) -> Result<(), Obstacle> {
    let peeked = |state: StatePtr| world.peeked.binary_search(&tid_of(state)).is_ok();
    for &state in states.iter().filter(|&&state| !peeked(state)) {
        retire_entries(state);
    }
    registration_verdict(registrations, thread_state::registration_progress())?;
    self_check_verdict()?;
    if let Some(&state) = states
        .iter()
        .find(|&&state| !peeked(state) && inside_slow_call(state))
    {
        return Err(Obstacle::InsideHook(tid_of(state)));
    }
    let me = sys::gettid();
    let mut verdict = Ok(());
    let mut seen = 0;
    tasks::for_each_thread(|tid| {
        seen += 1;
        if tid == me
            || verdict.is_err()
            || world.peeked.binary_search(&tid).is_ok()
            || seen > MAX_THREADS
            || agent_threads::is_agent_thread(tid)
        {
            return;
        }
        let position = world
            .stopped
            .iter()
            .find(|p| p.tid() == tid)
            .map(|p| p.pc())
            .or_else(|| tasks::user_position(tid).map(|(pc, _)| pc));
        // Woken since the stop: with a thousand threads that wake every few
        // milliseconds, some always have; where it was at the stop settles it.
        if position.is_none() && asleep_at_the_stop(tid, world, finished, read_word) {
            return;
        }
        let in_hook_code = |pc| in_return_hook_code(pc) || crate::sys::own_code::is_agent_code(pc);
        verdict = thread_verdict(tid, position, in_hook_code, || sys::thread_exists(tid));
    });
    verdict?;
    // An exit written back while the pass ran (a hook that was already past its check
    // of the retired mark) shows up here.
    if states.iter().any(|&state| holds_an_exit(state)) {
        return Err(Obstacle::Moving);
    }
    Ok(())
}

/// Whether threads registered while a pass ran: `before` and `now` are
/// `thread_state::registration_progress` (registering, registered) from before the
/// states were listed and after the entries were retired. A thread that registered
/// meanwhile is not among the states; one registering now is inside a hook.
fn registration_verdict(before: (usize, usize), now: (usize, usize)) -> Result<(), Obstacle> {
    let (registering, registered) = now;
    if registering != 0 || registered != before.1 {
        return Err(Obstacle::Moving);
    }
    Ok(())
}

/// What thread `tid` at `position` (its PC, parked or asleep; `None` when it neither
/// parked nor sleeps in the kernel) says of the pass: it keeps the hooks in while it is
/// in hook code, or while it runs where no one knows.
fn thread_verdict(
    tid: i32,
    position: Option<u64>,
    in_hook_code: impl Fn(u64) -> bool,
    still_exists: impl FnOnce() -> bool,
) -> Result<(), Obstacle> {
    match position {
        Some(pc) if in_hook_code(pc) => Err(Obstacle::InsideHook(tid)),
        Some(_) => Ok(()),
        // Running without having parked, or gone meanwhile.
        None if still_exists() => Err(Obstacle::Unstoppable(tid)),
        None => Ok(()),
    }
}

/// Whether the thread of `state` is inside a slow call (a hook's slow path): read from
/// its own thread-local depth, which stays mapped while the thread lives.
fn inside_slow_call(state: StatePtr) -> bool {
    let address = state.slow_depth_address().load(Ordering::Relaxed);
    address != 0 && read_word(address).is_some_and(|d| d != 0)
}

/// The thread id `state` was registered for.
fn tid_of(state: StatePtr) -> i32 {
    state.tid().load(Ordering::Relaxed)
}

/// The stack words shadow entries name, as a retire pass reaches them.
trait StackWords {
    /// The word at `address`, or `None` if it is not mapped.
    fn read(&self, address: u64) -> Option<u64>;
    /// Puts `new` at `address` if it still holds `current`.
    fn replace(&self, address: u64, current: u64, new: u64);
}

/// The live process's stacks.
struct LiveStacks;

impl StackWords for LiveStacks {
    fn read(&self, address: u64) -> Option<u64> {
        read_word(address)
    }

    fn replace(&self, address: u64, current: u64, new: u64) {
        // SAFETY: only called for a slot just read (so mapped); it lies on the stack of
        // a live thread, which is parked or asleep, or inside a return that stores the
        // same real address. A compare-and-swap changes it only if it still holds
        // `current`.
        let slot = unsafe { AtomicU64::from_ptr(address as *mut u64) };
        let _ = slot.compare_exchange(current, new, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// Retires `state`'s entries (see [`retire_entry`]), from the top.
fn retire_entries(state: StatePtr) {
    for pointer in state.shadow_entries(Ordering::SeqCst).rev() {
        retire_entry(pointer.load(), &LiveStacks);
        pointer.function().fetch_or(ENTRY_RETIRED, Ordering::SeqCst);
    }
}

/// Puts `entry`'s real return address back in its slot if the slot still holds the
/// entry's exit. Called from the top of a shadow stack down, so the newest entry for
/// a slot claims it: an older one finds its exit gone and leaves the slot alone.
/// Every entry is then marked retired by the caller, whether its slot changed or not.
fn retire_entry(entry: ShadowEntry, stacks: &impl StackWords) {
    if stacks.read(entry.slot) == Some(entry.exit) {
        stacks.replace(entry.slot, entry.exit, entry.return_address);
    }
}

/// Whether some entry's slot still holds its exit, or will get it back.
fn holds_an_exit(state: StatePtr) -> bool {
    state.shadow_entries(Ordering::SeqCst).any(|pointer| {
        let flags = pointer.function().load(Ordering::SeqCst);
        entry_holds_an_exit(pointer.load(), flags, &LiveStacks)
    })
}

/// Whether `entry` (its `function` word now `flags`) keeps an exit: its slot holds
/// it, or its address was put back for an unwinder and, not retired, the next hook
/// would put the exit back.
fn entry_holds_an_exit(entry: ShadowEntry, flags: u64, stacks: &impl StackWords) -> bool {
    stacks.read(entry.slot) == Some(entry.exit)
        || (flags & ENTRY_RESTORED != 0 && flags & ENTRY_RETIRED == 0)
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
    let count = STATE
        .internal_count
        .load(Ordering::Acquire)
        .min(MAX_INTERNAL);
    let internal = STATE.internal_trampolines[..count]
        .iter()
        .map(|(start, end)| (start.load(Ordering::Acquire), end.load(Ordering::Acquire)));
    code_memory::is_hook_code(address) && !in_any(address, internal)
}

/// Whether `address` lies in one of the `(start, end)` ranges.
fn in_any(address: u64, mut ranges: impl Iterator<Item = (u64, u64)>) -> bool {
    ranges.any(|(start, end)| (start..end).contains(&address))
}

#[cfg(test)]
mod tests;
