//! The patch layer's global state: every static of `patching` in one struct, [`STATE`],
//! with this module as its one owner (see `sys::state` for the pattern).
//!
//! Most of it is read in the stop signal's handler or while other threads are parked,
//! where no lock may be taken and nothing allocated: those fields are atomics and fixed
//! arrays, each with its ordering contract where it is declared.

use crate::patching::sites::{Engine, PendingPad, RuntimeHooks};
use crate::sys::error::AgentError;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Mutex, MutexGuard, Once, OnceLock};

/// Most threads one stop can park.
pub const MAX_PARKED: usize = 4096;
/// Signal restorers remembered (one per distinct `sa_restorer`; libc has one).
pub const MAX_RESTORERS: usize = 8;
/// How far above a stack pointer signal frames are looked for.
pub const SCAN_WINDOW: usize = 64 * 1024;
/// Most moves one peek carries (`stop_world::peek`): pads restored or retargeted at once.
pub const MAX_PEEK_MOVES: usize = 1024;
/// Most threads remembered as blocking the park signal (`stop_world::waiting`).
pub const MAX_KNOWN_BLOCKERS: usize = 1024;
/// Slots of the lock-free record of the bytes patched now.
pub const PATCHED_NOW_CAPACITY: usize = 1 << 16;

/// The patch layer's statics.
pub struct PatchingState {
    // --- stop_world: the stop signal's handler and the stopper ---
    /// The stop in progress (0 when none): handlers park only for their own stop.
    pub stop_in_progress: AtomicU32,
    /// The last stop whose threads were released; parked handlers wait until it is theirs.
    pub released: AtomicU32,
    /// Parked threads of this stop: slots taken in `parked_contexts`/`parked_tids`.
    pub arrived: AtomicUsize,
    /// Threads inside the park handler now (parked, or leaving after a release).
    pub in_handler: AtomicUsize,
    /// Each parked thread's context (published after its tid).
    pub parked_contexts: [AtomicPtr<libc::ucontext_t>; MAX_PARKED],
    /// Bumped by every thread that parks, so the stopper can sleep until one does (a
    /// stopper that spins keeps a core from the very threads it waits for).
    pub arrival_signal: AtomicU32,
    /// The thread id of each parked context, so the stopper knows who is still missing.
    pub parked_tids: [AtomicI32; MAX_PARKED],
    /// The signal chosen for parking, once installed.
    pub park_signal: AtomicI32,
    /// The stop in progress when it is a peek (0 otherwise): its handlers move their own
    /// thread by `peek_moves` and return at once instead of parking.
    pub peek_stop: AtomicU32,
    /// A peek's moves, each (start, end, to): a pc in `start..end` goes on at `to`.
    /// Written only between stops, while no handler is inside (`in_handler` is 0).
    pub peek_moves: [[AtomicU64; 3]; MAX_PEEK_MOVES],
    /// How many of `peek_moves` the peek in progress uses.
    pub peek_move_count: AtomicUsize,
    /// The check each signalled thread of the stop in progress runs on itself in the
    /// handler (a `stop_world::SelfCheck`; 0 for none), set between stops.
    pub self_check: AtomicUsize,
    /// Threads that a stop found running with the park signal blocked (by tid; a tid
    /// reused since only costs its new thread a longer look), and how many.
    pub known_blockers: [AtomicI32; MAX_KNOWN_BLOCKERS],
    pub known_blocker_count: AtomicUsize,
    /// One stop at a time; holds the number of the last stop.
    pub stop_lock: Mutex<u32>,
    /// The runtime's `stop_world::ParkObserver`, as an address (0: none); stored once
    /// with Release before the first stop, loaded with Acquire in the handler.
    pub park_observer: AtomicUsize,
    /// Registered for `membarrier`'s expedited sync-core command.
    pub membarrier_registered: Once,

    // --- signal_frames ---
    /// The signal restorers learnt (published before `restorer_count` covers them).
    pub restorers: [AtomicU64; MAX_RESTORERS],
    pub restorer_count: AtomicUsize,
    /// The restorer of tendril's own stop signal's handler (0 until learnt).
    pub own_restorer: AtomicU64,
    /// The scan's buffer; scans run one at a time, from the stopper (which holds the
    /// stop lock) or a peeked thread's handler (which parks for no one), so no parked
    /// thread ever holds this one.
    pub scan_window: Mutex<[u64; SCAN_WINDOW / 8]>,

    // --- patch_protocol ---
    /// Pads whose restore could not stop the process yet; retried on every restore.
    pub pending_pads: Mutex<Vec<PendingPad>>,
    /// A lock-free record of the bytes patched now, for the child of a fork, where the
    /// engine's lock may be held by a thread that does not exist: each slot's address
    /// (0: free; published with Release after its original bytes)...
    pub patched_now_address: [AtomicU64; PATCHED_NOW_CAPACITY],
    /// ...up to 7 original bytes, and their count in the top byte...
    pub patched_now_original: [AtomicU64; PATCHED_NOW_CAPACITY],
    /// ...the bytes tendril wrote there, packed the same way (a library unloaded while
    /// patched has other bytes there, which a restore must not touch)...
    pub patched_now_written: [AtomicU64; PATCHED_NOW_CAPACITY],
    /// ...and where the search for a free slot starts (slots are reused).
    pub patched_now_next: AtomicUsize,

    // --- patcher ---
    /// The engine (sites, ids, trampolines, originals): one lock for all of it.
    pub engine: Mutex<Option<Engine>>,
    /// The runtime's callbacks, installed once before the first patch.
    pub runtime: OnceLock<RuntimeHooks>,
    /// Why the lingering unwinder hooks could not come out at the last try.
    pub lingering_because: Mutex<Option<AgentError>>,
}

/// The one instance.
pub static STATE: PatchingState = PatchingState {
    stop_in_progress: AtomicU32::new(0),
    released: AtomicU32::new(0),
    arrived: AtomicUsize::new(0),
    in_handler: AtomicUsize::new(0),
    parked_contexts: [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_PARKED],
    arrival_signal: AtomicU32::new(0),
    parked_tids: [const { AtomicI32::new(0) }; MAX_PARKED],
    park_signal: AtomicI32::new(0),
    peek_stop: AtomicU32::new(0),
    peek_moves: [const { [const { AtomicU64::new(0) }; 3] }; MAX_PEEK_MOVES],
    peek_move_count: AtomicUsize::new(0),
    self_check: AtomicUsize::new(0),
    known_blockers: [const { AtomicI32::new(0) }; MAX_KNOWN_BLOCKERS],
    known_blocker_count: AtomicUsize::new(0),
    stop_lock: Mutex::new(0),
    park_observer: AtomicUsize::new(0),
    membarrier_registered: Once::new(),
    restorers: [const { AtomicU64::new(0) }; MAX_RESTORERS],
    restorer_count: AtomicUsize::new(0),
    own_restorer: AtomicU64::new(0),
    scan_window: Mutex::new([0; SCAN_WINDOW / 8]),
    pending_pads: Mutex::new(Vec::new()),
    patched_now_address: [const { AtomicU64::new(0) }; PATCHED_NOW_CAPACITY],
    patched_now_original: [const { AtomicU64::new(0) }; PATCHED_NOW_CAPACITY],
    patched_now_written: [const { AtomicU64::new(0) }; PATCHED_NOW_CAPACITY],
    patched_now_next: AtomicUsize::new(0),
    engine: Mutex::new(None),
    runtime: OnceLock::new(),
    lingering_because: Mutex::new(None),
};

/// The engine, locked (a poisoned lock is taken over: the engine's tables stay
/// consistent between its own statements).
pub fn engine() -> MutexGuard<'static, Option<Engine>> {
    STATE
        .engine
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The runtime's callbacks, once installed.
pub fn runtime() -> Result<&'static RuntimeHooks, AgentError> {
    STATE.runtime.get().ok_or(AgentError::RuntimeNotInstalled)
}
