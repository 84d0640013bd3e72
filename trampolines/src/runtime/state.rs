//! The runtime layer's global state: every static of `runtime` in one struct, [`STATE`],
//! with this module as its one owner (see `sys::state` for the pattern).
//!
//! Most of it is read by hooks' slow paths and by collectors without a lock: those
//! fields are atomics and fixed arrays, published in the order their comments give.

use crate::hooks::state_access::StatePtr;
use crate::hooks::thread_layout::ThreadState;
use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize,
};
use std::sync::{Condvar, Mutex, OnceLock};
use tendril_wire::rings::{MAX_FUNCTIONS, MAX_SEGMENTS};

/// Threads the registry can list.
pub const MAX_REGISTERED: usize = 1 << 16;
/// Most trampolines of the unwinder's hooks known.
pub const MAX_INTERNAL: usize = 64;
/// Most threads a retire pass's self-checks note as inside a hook (agent threads count:
/// a few).
pub const MAX_OBSTACLES_NOTED: usize = 64;

/// The runtime layer's statics.
pub struct RuntimeState {
    // --- thread_state ---
    /// Every registered thread's state (published before `registered_count` covers it).
    pub registered: [AtomicPtr<ThreadState>; MAX_REGISTERED],
    pub registered_count: AtomicUsize,
    /// Threads inside `register_current_thread`: inside a hook, but not yet listed.
    pub registering: AtomicUsize,
    /// The state the agent's own threads share (its `PASSTHROUGH` flag makes every
    /// hook step aside); `None` if it could not be mapped.
    pub agent_thread_state: OnceLock<Option<StatePtr>>,
    /// The regions made ahead (`thread_state::RegionPool`): the mapping's address (0
    /// before; published last), how many regions it holds, how many were handed out.
    pub pool_base: AtomicU64,
    pub pool_regions: AtomicUsize,
    pub pool_taken: AtomicUsize,

    // --- recording ---
    /// The mapped rings file (null before the first recording).
    pub rings: AtomicPtr<u8>,
    /// Non-zero while a recording is active: hooks that find no ring may claim one.
    pub recording_active: AtomicU32,
    /// Recordings started so far: the untimed-call tables' counts of an earlier one are
    /// dropped (`untimed_table`).
    pub recording_generation: AtomicU64,
    /// The rings' memory (a sealed memfd), kept open to hand to each recording's
    /// controller.
    pub rings_fd: Mutex<Option<OwnedFd>>,

    // --- ring_segments ---
    /// Each extra segment's mapping (published before `segment_count` covers it).
    pub segments: [AtomicPtr<u8>; MAX_SEGMENTS],
    /// Each extra segment's memfd, kept open to hand to the controller (published with
    /// the mapping).
    pub segment_fds: [AtomicI32; MAX_SEGMENTS],
    pub segment_count: AtomicUsize,
    /// Held by the one thread adding a segment.
    pub adding_segment: AtomicBool,
    /// Where the next claim starts looking for a free ring: one past the last taken, so
    /// that a thousand threads claiming at once do not each walk every ring before it.
    pub claim_hint: AtomicUsize,
    /// Held by the one thread looking for rings of exited threads (a system call per
    /// ring): the others add a segment, or wait for the one being added, instead.
    pub reclaiming: AtomicBool,
    /// Segment additions ended so far (added or not), a futex word: the threads waiting
    /// for one wake together.
    pub segment_adds_ended: AtomicU32,

    // --- discovery ---
    /// What discovery knows of the recording; one lock, taken by discovering threads.
    pub discovery: Mutex<Option<DiscoveryContext>>,
    /// Functions a thread is discovering now, one flag per id (`turn_to_discover`).
    pub discovering: [AtomicU8; MAX_FUNCTIONS],
    /// Discoveries ended so far, a futex word: the threads waiting for one wake together.
    pub discoveries_ended: AtomicU32,
    /// Roots whose callees were instrumented before their hooks went in, to be marked
    /// invoked as they do; a leaf lock (no other is taken while it is held).
    pub discovered_ahead: Mutex<Vec<u64>>,

    // --- discoverer ---
    /// The discoverer runs above the default priority: discoveries are handed to it.
    pub discoverer_raised: AtomicBool,
    /// The discoverer is to end.
    pub discoverer_ending: AtomicBool,
    /// Registered threads from which discoveries are handed to the discoverer.
    pub hand_over_from_threads: AtomicUsize,
    /// Discoveries handed over and not taken up yet; a leaf lock.
    pub discovery_jobs: Mutex<Vec<DiscoveryJob>>,
    /// Hand-overs so far, a futex word the discoverer sleeps on.
    pub discovery_jobs_posted: AtomicU32,
    /// A producer asked the discoverer for ring memory since it last looked
    /// (`ring_memory`): only then does it read the rings' headers.
    pub ring_memory_asked: AtomicBool,

    // --- retire, lingering, shadow ---
    /// (start, end) of each trampoline of an unwinder hook, for
    /// `retire::in_return_hook_code` (published before `internal_count` covers it).
    pub internal_trampolines: [(AtomicU64, AtomicU64); MAX_INTERNAL],
    pub internal_count: AtomicUsize,
    /// Threads a retire pass's self-checks found inside a hook (`retire`): how many
    /// were noted, and the first of them by tid.
    pub self_check_obstacles: AtomicUsize,
    pub obstacle_tids: [AtomicI32; MAX_OBSTACLES_NOTED],
    /// The background retry of lingering hooks has started.
    pub lingering_started: AtomicBool,
    /// Set when there is (maybe) something to finish; the retry waits on it otherwise.
    pub lingering_work: Mutex<bool>,
    pub lingering_work_arrived: Condvar,
    /// The relocated entry of the real `_Unwind_Backtrace`, set when it is patched; the
    /// hooks layer gets a reference to it (`BacktraceStandIn::body`).
    pub backtrace_body: AtomicU64,
}

/// One discovery handed to the discoverer: the function's id and the return address of
/// the call that entered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiscoveryJob {
    pub id: u32,
    pub entered_from: Option<u64>,
}

/// What discovery needs to know of the recording.
pub struct DiscoveryContext {
    /// The session whose patches these are (restored when it ends).
    pub session: u64,
    /// The controller's function table (bytes of the file).
    pub table: Vec<u8>,
    /// Scheme B: patch callees. Otherwise (Scheme A, gross timing) only mark invoked.
    pub discover_callees: bool,
    /// Functions that could not be patched, with the reason.
    pub refused: Vec<(u64, String)>,
    /// Indirect call sites met in the functions discovered, and those seen entering an
    /// instrumented function for the first time.
    pub indirect_sites: HashSet<u64>,
    pub followed_sites: HashSet<u64>,
    /// Follow calls through pointers from the call graph (`pointer_targets`), and the
    /// targets they reached so far.
    pub follow_pointers: bool,
    pub pointer_targets: HashSet<u64>,
    /// Calls through pointers to code the table does not know (JIT code), as (site,
    /// target), for the controller to name (`pointer_targets`; at most a few thousand).
    pub unknown_targets: Vec<(u64, u64)>,
    /// The libraries' code when the table came, and the loader's count of unloaded
    /// libraries then: once a library has gone, the table's functions are used only
    /// where the same library is still loaded (see `discovery`).
    pub table_code: Vec<crate::sys::loaded_modules::LoadedCode>,
    pub table_unloads: u64,
}

/// The one instance.
pub static STATE: RuntimeState = RuntimeState {
    registered: [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_REGISTERED],
    registered_count: AtomicUsize::new(0),
    registering: AtomicUsize::new(0),
    agent_thread_state: OnceLock::new(),
    pool_base: AtomicU64::new(0),
    pool_regions: AtomicUsize::new(0),
    pool_taken: AtomicUsize::new(0),
    rings: AtomicPtr::new(std::ptr::null_mut()),
    recording_active: AtomicU32::new(0),
    recording_generation: AtomicU64::new(0),
    rings_fd: Mutex::new(None),
    segments: [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_SEGMENTS],
    segment_fds: [const { AtomicI32::new(-1) }; MAX_SEGMENTS],
    segment_count: AtomicUsize::new(0),
    adding_segment: AtomicBool::new(false),
    claim_hint: AtomicUsize::new(0),
    reclaiming: AtomicBool::new(false),
    segment_adds_ended: AtomicU32::new(0),
    discovery: Mutex::new(None),
    discovering: [const { AtomicU8::new(0) }; MAX_FUNCTIONS],
    discoveries_ended: AtomicU32::new(0),
    discovered_ahead: Mutex::new(Vec::new()),
    discoverer_raised: AtomicBool::new(false),
    discoverer_ending: AtomicBool::new(false),
    hand_over_from_threads: AtomicUsize::new(usize::MAX),
    discovery_jobs: Mutex::new(Vec::new()),
    discovery_jobs_posted: AtomicU32::new(0),
    ring_memory_asked: AtomicBool::new(false),
    internal_trampolines: [const { (AtomicU64::new(0), AtomicU64::new(0)) }; MAX_INTERNAL],
    internal_count: AtomicUsize::new(0),
    self_check_obstacles: AtomicUsize::new(0),
    obstacle_tids: [const { AtomicI32::new(0) }; MAX_OBSTACLES_NOTED],
    lingering_started: AtomicBool::new(false),
    lingering_work: Mutex::new(false),
    lingering_work_arrived: Condvar::new(),
    backtrace_body: AtomicU64::new(0),
};
