//! The patch engine's data: a patched function's site, its trampoline and pad, the
//! engine's tables, the runtime's callbacks, and a request to patch. Data only (the
//! code that acts on it is `patcher`, `site_plan` and `patch_protocol`), so the layer's
//! state can hold it without importing that code.

use crate::code::entry_plan::EntryPlan;
use crate::code::padding::PAD_LEN;
use crate::sys::code_memory::CodeArena;
use crate::sys::error::AgentError;
use std::collections::{BTreeMap, HashMap, HashSet};
use tendril_wire::Hook;

/// Most bytes an entry patch writes (a 6-byte `call [rip+x]` replaced by a thunk call).
pub const MAX_ENTRY_PATCH: usize = 6;

/// A built trampoline, reusable while the function's bytes are unchanged.
#[derive(Clone)]
pub struct Trampoline {
    /// Where the relocated first instructions start.
    pub body: u64,
    pub hook: u64,
    /// Bytes at the function entry the trampoline was built from.
    pub entry_bytes: Vec<u8>,
    pub plan: EntryPlan,
    /// (offset of an overwritten instruction in the function, offset of its copy).
    pub instruction_map: Vec<(usize, usize)>,
}

/// A `jmp rel32` placed in padding for a short entry jump, and the bytes it replaced.
pub struct Pad {
    pub address: u64,
    pub original: [u8; PAD_LEN as usize],
}

/// A patched (or about to be patched) function.
pub struct Site {
    /// Where the entry jump is written (the entry, or just after its `endbr64`).
    pub patch_at: u64,
    /// The bytes the entry patch replaced (the first `jump_len` are meaningful).
    pub original: [u8; MAX_ENTRY_PATCH],
    pub pad: Option<Pad>,
    pub trampoline: Trampoline,
    pub owner: u64,
    pub id: u32,
    /// The hook its trampoline runs.
    pub kind: Hook,
    /// An internal hook on the unwinder (see `shadow`): it goes in before, and comes
    /// out after, every return hook.
    pub internal: bool,
    /// Where the lock-free record keeps the entry's and the pad's original bytes.
    pub recorded: [Option<usize>; 2],
}

/// A pad to restore: its bytes, the hook it leads to, and its record slot.
pub struct PendingPad {
    pub(in crate::patching) pad: Pad,
    pub(in crate::patching) hook: u64,
    pub(in crate::patching) recorded: Option<usize>,
}

/// The patch engine's tables, behind one lock (`state::STATE.engine`).
#[derive(Default)]
pub struct Engine {
    pub(in crate::patching) arena: CodeArena,
    /// Function address → id. Ids are never reused, so counters stay meaningful.
    pub(in crate::patching) ids: HashMap<u64, u32>,
    /// Ids of functions whose library was unloaded while they were patched, with their
    /// address then (a function loaded at that address later gets a new id).
    pub(in crate::patching) retired_ids: Vec<(u64, u32)>,
    /// The loader's count of unloaded libraries when the sites were last checked.
    pub(in crate::patching) unloads_seen: u64,
    /// (owner, function) of the patches forgotten because their library was unloaded,
    /// not yet told to their session (`patcher::take_unloaded`).
    pub(in crate::patching) unloaded: Vec<(u64, u64)>,
    /// Function address → its patch.
    pub(in crate::patching) sites: HashMap<u64, Site>,
    pub(in crate::patching) trampolines: HashMap<(u64, Hook), Trampoline>,
    /// Function address → (where in it each trampoline ever built for it goes back to
    /// after its copy of the entry's instructions, that trampoline's hook). Trampolines
    /// are never freed: a thread on a pad not yet restored goes through one, back into
    /// the function, even after its site was restored and a new one installed.
    pub(in crate::patching) resume_offsets: HashMap<u64, Vec<(usize, u64)>>,
    /// Address of every entry jump and pad written → the bytes it replaced.
    pub(in crate::patching) originals: BTreeMap<u64, Vec<u8>>,
    /// Function address → the counting copy put behind its recording hook, while the
    /// site still leads there (`function_copies::install_behind_hook`).
    pub(in crate::patching) copies_behind: HashMap<u64, CopyBehind>,
    /// Sessions whose recording hooks go on copies that check calls through pointers
    /// (`patcher::follow_pointers`).
    pub(in crate::patching) follows_pointers: HashSet<u64>,
    /// Function address → its copy with pointer checks, or `None` when it has none
    /// (no call through a pointer, or a copy refused), for every function a session
    /// that follows pointers has patched (`function_copies::pointer_checked_trampoline`).
    pub(in crate::patching) pointer_checked: HashMap<u64, Option<PointerChecked>>,
    /// Function address → the recording hooks built in front of its untouched entry
    /// (`entry_stubs`: a target of calls through pointers whose entry was refused).
    pub(in crate::patching) in_front: HashMap<u64, InFront>,
}

/// The hooks in front of a function's untouched entry: the function's id when they
/// were built, the kind the checks send its calls to now, each kind's hook, and the
/// function's first bytes then (another library loaded at its address has others).
#[derive(Debug, Clone)]
pub struct InFront {
    pub id: u32,
    pub kind: Hook,
    pub timed: u64,
    pub untimed: Option<u64>,
    pub entry: Vec<u8>,
}

impl InFront {
    /// The hook of the kind in use.
    pub fn hook(&self) -> u64 {
        match self.kind {
            Hook::Untimed => self.untimed.unwrap_or(self.timed),
            _ => self.timed,
        }
    }
}

/// A function's copy with pointer checks: its size (to copy it again behind another
/// hook) and the copy's address.
#[derive(Debug, Clone)]
pub struct PointerChecked {
    pub size: u64,
    pub body: u64,
}

/// A counting copy behind a recording hook: the hook that leads to it, what the
/// controller was told of it, and the function's original bytes.
pub struct CopyBehind {
    pub hook: u64,
    pub layout: tendril_wire::edges::EdgeLayout,
    pub code: Vec<u8>,
}

/// What the runtime above does at the patch engine's moments. The runtime installs it
/// once, before the first patch (`patcher::install_runtime`); the engine never imports it.
#[derive(Clone, Copy)]
pub struct RuntimeHooks {
    /// Sets up what the stubs rely on (the agent threads' shared state).
    pub prepare: fn() -> Result<(), AgentError>,
    /// Function `id` is about to get its hooks: its counters start from zero.
    pub before_patching: fn(id: u32),
    /// Function `id` got its id; it lives at `address`.
    pub function_registered: fn(id: u32, address: u64),
    /// A trampoline of tendril's own unwinder hooks lies in `start..end`.
    pub internal_trampoline_built: fn(start: u64, end: u64),
    /// Puts the real return address back in every frame that holds a return hook's
    /// exit, trying up to `attempts` passes; an error says what keeps them (the
    /// unwinder's hooks must then stay in).
    pub retire_exits: fn(attempts: usize) -> Result<(), AgentError>,
}

/// One function to patch.
#[derive(Debug, Clone)]
pub struct PatchRequest {
    pub address: u64,
    /// The function's size (symbol or FDE); its whole body is scanned for branches
    /// back into the bytes the patch overwrites.
    pub size: u64,
    pub kind: Hook,
}

/// The owner of the agent's self-test patches (calibration): the only owner that may
/// hook a function of the agent itself, the one made to be hooked.
pub const SELF_TEST_OWNER: u64 = u64::MAX;
