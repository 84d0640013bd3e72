//! The system layer's global state: every static of `sys` in one struct, [`STATE`],
//! with this module as its one owner.
//!
//! The one idea: the agent lives in somebody else's process, so what it must remember
//! between calls — descriptors, the arena's chunks, the ptrace helper's mailbox — is a
//! static; keeping all of a layer's statics in one place shows at a glance what the
//! layer remembers and who may touch it. Fields are atomics or locks; each says who
//! writes it and who reads it. The layers above own their state the same way
//! (`hooks::state`, `patching::state`, `runtime::state`, `control::state`); the allocator
//! and the loader constructor stay in `lib.rs`, where Rust and ELF want them.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Condvar, Mutex, OnceLock};

/// Most threads one ptrace helper stops.
pub const MAX_TRACED: usize = 512;
/// Most arena chunks the lock-free "is this trampoline code?" test knows.
pub const MAX_CHUNKS: usize = 4096;
/// Most function copies the lock-free "is this a hook's code?" test tells apart.
pub const MAX_COPY_BODIES: usize = 8192;

/// The system layer's statics.
pub struct SysState {
    /// `/proc/self/mem`, opened by the process whose pid is in `mem_owner`: a forked
    /// child inherits the descriptor, which still names its parent's memory, and must
    /// reopen. Read while guards are in place, so atomics.
    pub mem_fd: AtomicI32,
    pub mem_owner: AtomicI32,
    /// The trampoline arena's chunks mapped so far, readable without a lock (from
    /// signal handlers): a start is published before the count that covers it.
    pub chunk_starts: [AtomicU64; MAX_CHUNKS],
    pub chunk_count: AtomicUsize,
    /// (start, end) of the function copies in the arena (issue 18): the target's own
    /// code, not a hook's. A range is published before the count that covers it.
    pub copy_bodies: [(AtomicU64, AtomicU64); MAX_COPY_BODIES],
    pub copy_body_count: AtomicUsize,
    /// (start, end, protection) of the executable mappings seen in `/proc/self/maps`
    /// (`code_pages`).
    pub protections: Mutex<Vec<(u64, u64, i32)>>,
    /// Code pages tendril has written to (`page_copies`): the file's bytes of each that
    /// was the file's page then, `None` for one that was a private copy already.
    pub page_origins: Mutex<BTreeMap<u64, Option<Box<[u8; 4096]>>>>,
    /// (start, end, protection) of the code mappings tendril splits, as they were whole,
    /// to be joined again once restored (`whole_mappings`).
    pub whole_mappings: Mutex<Vec<(u64, u64, i32)>>,
    /// The agent's threads that are running, by thread id (`agent_threads`).
    pub agent_threads: Mutex<Vec<i32>>,
    /// Held while code changes and while an agent thread starts or ends
    /// (`agent_threads::code_change`).
    pub code_change: Mutex<()>,
    /// What the patcher and the ptrace helper share (`thread_tracer`).
    pub tracer: TracerShared,
    /// The ptrace helper's stack, mapped once.
    pub tracer_stack_top: OnceLock<u64>,
    /// Whether the helper needs `PR_SET_PTRACER` to trace us (read once, by `prepare`).
    pub yama_needs_ptracer: AtomicBool,
    /// The agent library's own mappings (`own_code`), computed once.
    pub own_code_ranges: OnceLock<Vec<(u64, u64)>>,
    /// The unwind registrar's queue (`frame_registrar`): created by its first thread and
    /// never freed; null before, and in a forked child (whose copy's lock may have been
    /// held at the fork by a thread the child lacks) until a registrar runs there.
    pub frame_registrar: AtomicPtr<Registrar>,
}

/// What the patcher and the ptrace helper share; the helper reads and writes nothing
/// else (it shares this thread's TLS, so it must not touch anything that uses it).
pub struct TracerShared {
    /// The helper's progress (`thread_tracer`'s `PHASE_*`).
    pub phase: AtomicU32,
    pub count: AtomicU32,
    pub tids: [AtomicI32; MAX_TRACED],
    /// Set by the helper: 1 stopped, 2 gone (exited, or never seen).
    pub states: [AtomicU32; MAX_TRACED],
    pub pcs: [AtomicU64; MAX_TRACED],
    pub sps: [AtomicU64; MAX_TRACED],
    /// Set by the patcher: where a thread resumes (0: where it was).
    pub new_pcs: [AtomicU64; MAX_TRACED],
    /// A signal a thread was stopped with, handed back at the detach.
    pub signals: [AtomicU32; MAX_TRACED],
    /// The first failure: a negative errno, and the thread it concerned.
    pub error: AtomicI32,
    pub error_tid: AtomicI32,
}

/// The unwind registrar's queue, with its wake-ups (`frame_registrar`).
#[derive(Default)]
pub struct Registrar {
    pub queue: Mutex<RegistrarQueue>,
    /// A section was queued, or the registrar asked to end.
    pub asked: Condvar,
    /// A section was registered.
    pub done: Condvar,
}

/// The sections asked for, and how far the registrar has got.
#[derive(Default)]
pub struct RegistrarQueue {
    pub sections: VecDeque<Vec<u8>>,
    pub asked: u64,
    pub done: u64,
    pub serving: bool,
    pub ending: bool,
    /// A registration outlived its wait, and the registrar has not caught up since.
    pub stuck: bool,
}

/// The one instance.
pub static STATE: SysState = SysState {
    mem_fd: AtomicI32::new(-1),
    mem_owner: AtomicI32::new(0),
    chunk_starts: [const { AtomicU64::new(0) }; MAX_CHUNKS],
    chunk_count: AtomicUsize::new(0),
    copy_bodies: [const { (AtomicU64::new(0), AtomicU64::new(0)) }; MAX_COPY_BODIES],
    copy_body_count: AtomicUsize::new(0),
    protections: Mutex::new(Vec::new()),
    page_origins: Mutex::new(BTreeMap::new()),
    whole_mappings: Mutex::new(Vec::new()),
    agent_threads: Mutex::new(Vec::new()),
    code_change: Mutex::new(()),
    tracer: TracerShared {
        phase: AtomicU32::new(0),
        count: AtomicU32::new(0),
        tids: [const { AtomicI32::new(0) }; MAX_TRACED],
        states: [const { AtomicU32::new(0) }; MAX_TRACED],
        pcs: [const { AtomicU64::new(0) }; MAX_TRACED],
        sps: [const { AtomicU64::new(0) }; MAX_TRACED],
        new_pcs: [const { AtomicU64::new(0) }; MAX_TRACED],
        signals: [const { AtomicU32::new(0) }; MAX_TRACED],
        error: AtomicI32::new(0),
        error_tid: AtomicI32::new(0),
    },
    tracer_stack_top: OnceLock::new(),
    yama_needs_ptracer: AtomicBool::new(false),
    own_code_ranges: OnceLock::new(),
    frame_registrar: AtomicPtr::new(std::ptr::null_mut()),
};
