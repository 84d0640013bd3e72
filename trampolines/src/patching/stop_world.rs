//! Stopping the process's other threads for the microseconds a code patch needs.
//!
//! The one idea: a thread may be *between* two of the instructions a patch overwrites,
//! and would resume in the middle of the new bytes. Only threads that are executing
//! user code can be there. So the agent sends a private real-time signal to every
//! thread that is running (or in an uninterruptible sleep, such as a page fault on the
//! function's first page); the handler publishes the interrupted context (`ucontext`)
//! and parks on a futex, and the patcher moves any parked pc that lies inside the
//! overwritten bytes to the same instruction in the trampoline's copy. Threads sleeping
//! in a system call are left alone — their pc follows a `syscall`, which the planner
//! never lets sit inside a patch, and a signal would make calls like `nanosleep` or
//! `epoll_wait` fail with EINTR. A thread that blocks the signal is handled whatever
//! its mask: asleep in a system call (`/proc/self/task/TID/syscall`), it is left alone
//! like the others; running user code, it is stopped with ptrace from a helper process
//! (`thread_tracer`) and its pc moved like any other. No thread is refused.
//!
//! A process may leave no real-time signal free: Go's runtime installs a handler on
//! every signal. Then there is no park signal ([`NO_FREE_SIGNAL`]) and every thread
//! that runs user code is held with ptrace, as if it blocked the signal; threads asleep
//! in a system call are left alone as always. Slower (a helper process, a stop per
//! thread), and a held thread's pause is not taken out of its recorded frames, but the
//! patch is as safe.
//!
//! A *peek* (`peek`) is the same round without the parking: for bytes no thread can
//! reach any more, only be on (a pad whose entry is restored), each handler moves its
//! own thread off them and returns at once, so no thread waits for the others.
//!
//! A peek may also carry a *self-check* (`with_every_thread_checking_itself`): each
//! signalled thread runs it on itself in the handler, knowing where it was interrupted,
//! and goes on. A retire pass (`runtime::retire`) has each running thread retire its
//! own return hooks that way, instead of holding a thousand threads while one thread
//! walks every stack.
//!
//! Every signal carries the number of the stop it belongs to, so a signal that arrives
//! late never counts as a thread parked for a later stop. Nothing here allocates once
//! the first signal is sent: a parked thread may hold the allocator's lock.

use crate::hooks::state_access::{self, current_state};
use crate::patching::signal_frames;
use crate::patching::state::{MAX_PARKED, STATE};
use crate::sys;
use crate::sys::error::AgentError;
use crate::sys::tasks::{self, TaskState};
use crate::sys::thread_tracer::{self, TracedThreads};
use roster::{list_other_threads, list_peeked, list_stopped, sort_by_plan};
use std::sync::atomic::Ordering;
use std::time::Duration;
use waiting::{all_published, plan_for, send_park, stop_the_woken, wait_for_parks};

mod peek;
mod roster;
mod waiting;

/// How long running threads may take to park, or signal-blocking ones to fall asleep:
/// far more than a thousand threads take on a loaded machine (milliseconds), as a stop
/// that gives up patches nothing.
const STOP_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a signalled thread may take to park before the stopper checks whether it
/// has blocked signals since (reading its status costs more than most parks take).
const BLOCKED_AFTER_SIGNAL_CHECK: Duration = Duration::from_millis(1);

/// The longest the stopper sleeps before it looks at the threads again.
const STOPPER_NAP_NS: u64 = 200_000;

/// `STATE.park_signal` when every real-time signal has a handler of the target's: the
/// stopper holds every running thread with ptrace instead.
const NO_FREE_SIGNAL: i32 = -1;

/// Told, on a parked thread just released, where it was (`pc`) and how many TSC ticks
/// it was parked: the runtime removes the pause from the frames it fell in. Called in
/// the stop signal's handler, so it must be async-signal-safe.
pub type ParkObserver = fn(pc: u64, ticks: u64);

/// What each signalled thread of a self-checking peek runs on itself in the stop
/// signal's handler, given the pc it was interrupted at: it must be async-signal-safe
/// (no allocation, no lock another thread may hold while interrupted).
pub type SelfCheck = fn(pc: u64);

/// Sets the [`ParkObserver`] (the runtime's, installed once before the first stop).
pub fn set_park_observer(observer: ParkObserver) {
    STATE
        .park_observer
        .store(observer as usize, Ordering::Release);
}

/// A stopped thread's interrupted user context, which the patcher may edit: parked in
/// the stop signal's handler, or held by the ptrace helper.
pub struct ParkedThread {
    tid: i32,
    held: Held,
}

enum Held {
    /// Its `ucontext`, in its park handler's frame.
    Signal(*mut libc::ucontext_t),
    /// Its index among the helper's threads.
    Ptrace(usize),
}

impl ParkedThread {
    pub fn tid(&self) -> i32 {
        self.tid
    }

    pub fn pc(&self) -> u64 {
        match self.held {
            // SAFETY: the context belongs to a thread parked in our handler until
            // release; the kernel-provided ucontext stays valid while that frame exists.
            Held::Signal(context) => unsafe {
                (*context).uc_mcontext.gregs[libc::REG_RIP as usize] as u64
            },
            Held::Ptrace(index) => thread_tracer::held_position(index).0,
        }
    }

    /// Whether it is held with ptrace (it blocked the stop signal) rather than parked:
    /// its pc and stack pointer are then where it is now, which may be inside a handler.
    pub fn held_with_ptrace(&self) -> bool {
        matches!(self.held, Held::Ptrace(_))
    }

    /// The stack pointer where it was interrupted.
    pub fn sp(&self) -> u64 {
        match self.held {
            // SAFETY: as in `pc`.
            Held::Signal(context) => unsafe {
                (*context).uc_mcontext.gregs[libc::REG_RSP as usize] as u64
            },
            Held::Ptrace(index) => thread_tracer::held_position(index).1,
        }
    }

    pub fn set_pc(&mut self, pc: u64) {
        match self.held {
            // SAFETY: as in `pc`; the parked thread does not touch its context until
            // release, and the kernel restores the edited rip when the handler returns.
            Held::Signal(context) => unsafe {
                (*context).uc_mcontext.gregs[libc::REG_RIP as usize] = pc as i64
            },
            Held::Ptrace(index) => thread_tracer::move_held(index, pc),
        }
    }
}

/// What `work` gets while the world is stopped: the stopped threads, and the threads
/// left alone (their stacks may still hold signal frames), by tid: asleep in a system
/// call, or `halted`.
pub struct StoppedWorld<'a> {
    pub stopped: &'a mut [ParkedThread],
    pub asleep: &'a [i32],
    /// Those of `asleep` that were stopped (job control, a tracer) or gone, rather than
    /// in a system call: they may be anywhere.
    pub halted: &'a [i32],
    /// The threads that took a peek's signal and went on (sorted): a self-checking
    /// peek's threads ran the check. Empty for a stop.
    pub peeked: &'a [i32],
}

/// The stop signal, once installed (0 before, and when no signal was free).
pub fn park_signal() -> i32 {
    STATE.park_signal.load(Ordering::Acquire).max(0)
}

/// Installs the park handler on a free real-time signal; with none free, stops will
/// hold every running thread with ptrace (module comment). Idempotent; returns the
/// signal, or 0 when there is none.
pub fn install() -> Result<i32, AgentError> {
    let installed = STATE.park_signal.load(Ordering::Acquire);
    if installed != 0 {
        return Ok(installed.max(0));
    }
    // Prefer high real-time signals, which applications rarely use; skip any the
    // target has a handler for.
    for signal in (libc::SIGRTMIN() + 4..=libc::SIGRTMAX()).rev() {
        // SAFETY: a zeroed sigaction is a valid output buffer; with a null new action
        // sigaction only reports the current disposition.
        let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::sigaction(signal, std::ptr::null(), &mut current) } != 0
            || current.sa_sigaction != libc::SIG_DFL
        {
            continue;
        }
        // SAFETY: installs an SA_SIGINFO handler with the matching signature. The mask
        // blocks every other signal while a thread is parked, except the synchronous
        // ones, which must stay deliverable.
        let done = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = park_handler as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigfillset(&mut action.sa_mask);
            for synchronous in sys::SYNCHRONOUS_SIGNALS {
                libc::sigdelset(&mut action.sa_mask, synchronous);
            }
            libc::sigaction(signal, &action, std::ptr::null_mut()) == 0
        };
        if done {
            STATE.park_signal.store(signal, Ordering::Release);
            return Ok(signal);
        }
    }
    // Every signal is the target's (Go's runtime handles them all).
    STATE.park_signal.store(NO_FREE_SIGNAL, Ordering::Release);
    Ok(0)
}

extern "C" fn park_handler(
    _signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    STATE.in_handler.fetch_add(1, Ordering::AcqRel);
    with_hooks_stepping_aside(|| park(info, context));
    STATE.in_handler.fetch_sub(1, Ordering::AcqRel);
}

/// Runs the handler's `body` with the thread's hooks stepping aside. The handler calls
/// libc now and then (a contended `Mutex` waits through libc's `syscall`), and with all
/// of libc patched a hook there would discover: the thread would wait, inside the
/// stop's handler, for the loader's lock the stopper holds, and the stopper for the
/// handler to end.
fn with_hooks_stepping_aside(body: impl FnOnce()) {
    match current_state().filter(|state| state.is_agent().load(Ordering::Relaxed) == 0) {
        Some(state) => state_access::with_hooks_stepping_aside(state, body),
        None => body(),
    }
}

fn park(info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes the siginfo of the signal being handled.
    let stop = unsafe { sys::signal_value(info) };
    if stop == 0 || STATE.stop_in_progress.load(Ordering::Acquire) != stop {
        return; // A late signal of a stop that has ended.
    }
    let peek = STATE.peek_stop.load(Ordering::Acquire) == stop;
    if peek {
        // Moved before it counts itself in: once every thread has, the stopper may
        // rewrite the bytes it was on.
        peek::move_own(context.cast());
    }
    // Checked before it counts itself in, too: once every thread has, the stopper
    // reads what the checks found.
    peek::run_self_check(context.cast());
    let parked_at = sys::rdtsc();
    let slot = STATE.arrived.fetch_add(1, Ordering::AcqRel);
    if slot < MAX_PARKED {
        // The context first: a published tid says its context is there (none for a
        // peek, which leaves at once).
        let context = if peek { std::ptr::null_mut() } else { context };
        STATE.parked_contexts[slot].store(context.cast(), Ordering::Release);
        STATE.parked_tids[slot].store(sys::gettid(), Ordering::Release);
    }
    STATE.arrival_signal.fetch_add(1, Ordering::AcqRel);
    sys::futex_wake_all(&STATE.arrival_signal);
    if peek {
        return;
    }
    loop {
        let released = STATE.released.load(Ordering::Acquire);
        if released >= stop {
            break;
        }
        sys::futex_wait(&STATE.released, released);
    }
    // The stop was tendril's pause: take it out of this thread's open frames. The pc
    // (possibly moved by the patcher) says where the thread will go on.
    // SAFETY: the kernel passes a valid ucontext to an SA_SIGINFO handler.
    let pc = unsafe {
        (*context.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_RIP as usize] as u64
    };
    let observer = STATE.park_observer.load(Ordering::Acquire);
    if observer != 0 {
        // SAFETY: only `set_park_observer` stores here, always a `ParkObserver`.
        let observer: ParkObserver =
            unsafe { std::mem::transmute::<usize, ParkObserver>(observer) };
        observer(pc, sys::rdtsc().saturating_sub(parked_at));
    }
}

/// How a thread is handled by one stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Asleep in a system call: nothing to do.
    Leave,
    /// Stopped (job control, a tracer) or gone: nothing to do, wherever it is.
    Halted,
    /// Signalled; expected to park.
    Park,
    /// Signalled, and parked.
    Parked,
    /// Running with the park signal blocked: stopped with ptrace.
    Trace,
}

/// The memory one stop needs, allocated ahead: a stop made while guards are in place
/// must not allocate (the allocator may call code that a guard holds).
pub struct StopBuffers {
    threads: Vec<(i32, Plan)>,
    parked: Vec<ParkedThread>,
    asleep: Vec<i32>,
    halted: Vec<i32>,
    traced: Vec<i32>,
    peeked: Vec<i32>,
}

impl StopBuffers {
    /// Room for the process's threads now, and as many more starting meanwhile.
    pub fn new() -> StopBuffers {
        let room = 2 * tasks::thread_count() + 64;
        StopBuffers {
            threads: Vec::with_capacity(room),
            parked: Vec::with_capacity(room),
            asleep: Vec::with_capacity(room),
            halted: Vec::with_capacity(room),
            traced: Vec::with_capacity(room),
            peeked: Vec::with_capacity(room),
        }
    }
}

/// Runs `work` with every thread of the process that runs user code stopped — parked
/// by the stop signal, or held with ptrace if it blocks that signal (see the module
/// comment) — passing their contexts and the threads left asleep. Returns an error —
/// without calling `work` — if some thread could not be stopped in time. `work` must
/// not allocate or lock.
pub fn with_world_stopped<R>(work: impl FnOnce(StoppedWorld<'_>) -> R) -> Result<R, AgentError> {
    install()?;
    thread_tracer::prepare()?;
    with_world_stopped_in(&mut StopBuffers::new(), work)
}

/// [`with_world_stopped`] with buffers allocated beforehand; after [`install`] and
/// `thread_tracer::prepare`, this allocates nothing and calls no libc function, so it
/// may run while guards are in place (until it formats an error).
pub fn with_world_stopped_in<R>(
    buffers: &mut StopBuffers,
    work: impl FnOnce(StoppedWorld<'_>) -> R,
) -> Result<R, AgentError> {
    stop_threads(buffers, None, None, work)
}

/// [`with_world_stopped_in`], running `fence` as soon as every thread that ran user
/// code is stopped: the guards of a patch, which from then on hold any thread that
/// wakes. A thread left asleep may have woken before the fence and be anywhere, even
/// between two instructions `work` overwrites: each is looked at again after the
/// fence, and one no longer inside a system call is stopped too before `work` runs.
/// If the stop fails after the fence, `work` does not run (undo the fence).
pub fn with_world_stopped_behind<R>(
    buffers: &mut StopBuffers,
    fence: &dyn Fn(),
    work: impl FnOnce(StoppedWorld<'_>) -> R,
) -> Result<R, AgentError> {
    stop_threads(buffers, None, Some(fence), work)
}

/// A peek's moves (each (start, end, to): a pc in `start..end` goes on at `to`) and
/// the check each thread runs on itself.
#[derive(Clone, Copy)]
struct Peek<'a> {
    moves: &'a [(u64, u64, u64)],
    self_check: Option<SelfCheck>,
}

/// Runs `work` once every thread of the process that runs user code has *peeked*
/// (`peek`): taken the stop signal and moved its own pc by `moves` — each (start, end,
/// to): a pc in `start..end` goes on at `to` — then gone on at once. `work` gets only
/// the threads held with ptrace (they block the signal), to move the same way, and the
/// threads left asleep. For bytes no thread can reach any more, only be on: unlike a
/// stop, a peek holds no thread while it waits for the others. Falls back to a stop
/// with more moves than a peek carries. As [`with_world_stopped`] otherwise.
pub fn with_every_thread_peeked<R>(
    moves: &[(u64, u64, u64)],
    work: impl FnOnce(StoppedWorld<'_>) -> R,
) -> Result<R, AgentError> {
    install()?;
    thread_tracer::prepare()?;
    with_every_thread_peeked_in(&mut StopBuffers::new(), moves, work)
}

/// [`with_every_thread_peeked`] with buffers allocated beforehand (as
/// [`with_world_stopped_in`]).
pub fn with_every_thread_peeked_in<R>(
    buffers: &mut StopBuffers,
    moves: &[(u64, u64, u64)],
    work: impl FnOnce(StoppedWorld<'_>) -> R,
) -> Result<R, AgentError> {
    let peek = Peek {
        moves,
        self_check: None,
    };
    stop_threads(buffers, Some(peek), None, work)
}

/// Runs `work` once every thread of the process that runs user code has taken the stop
/// signal, run `check` on itself in the handler (given the pc it was interrupted at)
/// and gone on at once: a peek with no moves. `work` gets the threads held with ptrace
/// (they block the signal, so they ran no check), the threads left asleep, and those
/// that `peeked`. No thread is held while the others are signalled. As
/// [`with_world_stopped`] otherwise.
pub fn with_every_thread_checking_itself<R>(
    check: SelfCheck,
    work: impl FnOnce(StoppedWorld<'_>) -> R,
) -> Result<R, AgentError> {
    install()?;
    thread_tracer::prepare()?;
    let peek = Peek {
        moves: &[],
        self_check: Some(check),
    };
    stop_threads(&mut StopBuffers::new(), Some(peek), None, work)
}

/// A stop (`peek_spec` `None`), behind a `fence` if one is given, or a peek.
fn stop_threads<R>(
    buffers: &mut StopBuffers,
    peek_spec: Option<Peek<'_>>,
    fence: Option<&dyn Fn()>,
    work: impl FnOnce(StoppedWorld<'_>) -> R,
) -> Result<R, AgentError> {
    let signal = match STATE.park_signal.load(Ordering::Acquire) {
        0 => {
            return Err(AgentError::NotStopped(
                "the stop signal is not installed".into(),
            ));
        }
        signal => signal,
    };
    let me = sys::gettid();
    // Threads still leaving the handler after the last stop run with every signal
    // blocked (the handler's mask) and would look like threads that block ours.
    let settle = sys::monotonic_ns() + STOP_TIMEOUT.as_nanos() as u64;
    while STATE.in_handler.load(Ordering::Acquire) > 0 && sys::monotonic_ns() < settle {
        sys::yield_cpu();
    }
    let StopBuffers {
        threads,
        parked,
        asleep,
        halted,
        traced: traced_tids,
        peeked,
    } = buffers;
    peeked.clear();
    parked.clear();
    asleep.clear();
    halted.clear();
    traced_tids.clear();
    list_other_threads(threads, me)?;
    let mut last_stop = STATE.stop_lock.lock().unwrap_or_else(|p| p.into_inner());
    let stop = *last_stop + 1;
    *last_stop = stop;
    let previous = STATE.arrived.swap(0, Ordering::AcqRel).min(MAX_PARKED);
    for parked in &STATE.parked_tids[..previous] {
        parked.store(0, Ordering::Release);
    }
    // Between stops, with no handler inside: the moves and the check are the handlers'
    // to read once the stop's number is published. With more moves than a peek
    // carries, this is a stop (whose parked threads still run the check).
    let peek = peek_spec.is_some_and(|spec| peek::set_moves(spec.moves));
    peek::set_self_check(peek_spec.and_then(|spec| spec.self_check));
    STATE
        .peek_stop
        .store(if peek { stop } else { 0 }, Ordering::Release);
    STATE.stop_in_progress.store(stop, Ordering::Release);

    // From here until release: no allocation. Each running thread is signalled as soon
    // as it is seen running: with a thousand threads the look at them all takes
    // milliseconds, in which threads arriving at a guard spin and take the cores.
    let signalled_at = sys::monotonic_ns();
    for (tid, plan) in threads.iter_mut() {
        *plan = plan_for(*tid, signal);
        send_park(*tid, plan, signal, stop);
    }
    let deadline = sys::monotonic_ns() + STOP_TIMEOUT.as_nanos() as u64;
    // A peek need not chase a thread that was asleep: it cannot reach the bytes a peek
    // is for, unless a handler of the program's own, which it may be running since it
    // woke, returns onto them (so with handlers, it looks at its stack itself).
    // A peek with no moves (a self-check) has nothing for such a thread to look at.
    let moves = peek_spec.is_some_and(|spec| !spec.moves.is_empty());
    let chase_woken = !peek || (moves && signal_frames::any_restorers());
    let ready = wait_for_parks(threads, signal, stop, (signalled_at, deadline), chase_woken);
    let ready = match fence {
        Some(fence) if ready && !peek => {
            fence();
            stop_the_woken(threads, signal, stop, deadline)
        }
        _ => ready,
    };
    let arrived = STATE.arrived.load(Ordering::Acquire).min(MAX_PARKED);
    sort_by_plan(threads, arrived, traced_tids, asleep, halted);
    // A thread counts itself in before it publishes its context: wait for the last
    // arrivals to finish publishing (a few instructions, unless it was preempted).
    let ready = ready && all_published(arrived, deadline);
    let traced = hold_the_blocking(ready, arrived, threads, traced_tids, deadline);
    let result = match traced {
        Ok(mut traced) => {
            list_stopped(parked, if peek { 0 } else { arrived }, traced.as_ref());
            if peek {
                list_peeked(peeked, arrived);
            }
            let outcome = work(StoppedWorld {
                stopped: parked.as_mut_slice(),
                asleep: asleep.as_slice(),
                halted: halted.as_slice(),
                peeked: peeked.as_slice(),
            });
            if let Some(traced) = traced.as_mut() {
                traced.release();
            }
            Ok(outcome)
        }
        Err(error) => Err(error),
    };
    STATE.stop_in_progress.store(0, Ordering::Release);
    STATE.peek_stop.store(0, Ordering::Release);
    peek::set_self_check(None);
    STATE.released.store(stop, Ordering::Release);
    sys::futex_wake_all(&STATE.released);
    drop(last_stop);
    result
}

/// Once the signalled threads had their time (`ready`: every one arrived and published
/// its context), holds with ptrace those that block the signal (`traced_tids`), until
/// `deadline`; or says how many threads of `threads` failed to stop.
fn hold_the_blocking(
    ready: bool,
    arrived: usize,
    threads: &[(i32, Plan)],
    traced_tids: &[i32],
    deadline: u64,
) -> Result<Option<TracedThreads>, AgentError> {
    if !ready {
        return Err(AgentError::NotStopped(format!(
            "only {arrived} of {} running threads stopped within {} ms; nothing was patched",
            threads
                .iter()
                .filter(|(_, p)| matches!(p, Plan::Park | Plan::Parked))
                .count(),
            STOP_TIMEOUT.as_millis()
        )));
    }
    if traced_tids.is_empty() {
        return Ok(None);
    }
    let left = Duration::from_nanos(deadline.saturating_sub(sys::monotonic_ns()));
    thread_tracer::stop(traced_tids, left.max(BLOCKED_AFTER_SIGNAL_CHECK))
        .map(Some)
        .map_err(|e| AgentError::NotStopped(format!("{e}; nothing was patched")))
}

/// Makes every core discard prefetched instructions of this process, so that no thread
/// executes stale bytes of code that was just rewritten.
pub fn serialize_all_cores() {
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE: u64 = 1 << 5;
    const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE: u64 = 1 << 6;
    // SAFETY: membarrier takes no pointers; registering first is what the kernel
    // requires before the expedited sync-core command may be used.
    unsafe {
        STATE.membarrier_registered.call_once(|| {
            sys::syscall4(
                libc::SYS_membarrier,
                MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE,
                0,
                0,
                0,
            );
        });
        sys::syscall4(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE,
            0,
            0,
            0,
        );
    }
}

#[cfg(test)]
mod tests;
