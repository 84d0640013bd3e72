//! The patch engine's bookkeeping: which functions are patched, by whom, with which
//! trampoline, and with what id.
//!
//! Patching a batch of functions first *prepares* each one — reads its code, plans
//! what its entry jump overwrites (`relocate`), refusing what cannot be proven safe,
//! and builds its trampoline within ±2 GiB (`code_memory`, `stubs`) — and then writes
//! all their jumps in one go (`patch_protocol`). An entry takes a 5-byte `jmp rel32`
//! when it can; otherwise a 2-byte `jmp rel8` to a `jmp rel32` placed in dead padding
//! nearby (`padding`). Function ids are never reused and trampolines never freed, so a
//! counter keeps its meaning and a thread still inside a trampoline after a restore
//! finishes correctly.

use crate::code::branch_index::BranchIndex;
use crate::code::entry_plan::{self, EntryPlan, PatchStyle, SHORT_PATCH_LEN};
use crate::code::padding::{self, KnownRanges, PAD_LEN};
use crate::code::relocate;
use crate::hooks::stubs::{self, TrampolineCode};
use crate::hooks::{slow_call, thread_layout};
use crate::patching::patch_protocol::{self, Pad, Site, Trampoline};
use crate::patching::sites::Engine;
pub use crate::patching::sites::RuntimeHooks;
use crate::patching::state::STATE;
use crate::patching::stop_world;
use crate::sys::code_memory::{self};
use crate::sys::error::AgentError;
use std::collections::HashMap;
use std::sync::MutexGuard;
use tendril_wire::Hook;
use tendril_wire::events::HookShape;

/// Longest function body read for planning; longer bodies are scanned up to this much.
const MAX_BODY_SCAN: u64 = 1 << 20;

/// One function to patch.
#[derive(Debug, Clone)]
pub struct PatchRequest {
    pub address: u64,
    /// The function's size (symbol or FDE); its whole body is scanned for branches
    /// back into the bytes the patch overwrites.
    pub size: u64,
    pub kind: Hook,
}

pub(super) fn engine() -> MutexGuard<'static, Option<Engine>> {
    STATE
        .engine
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Installs the runtime's hooks; the first installation stays.
pub fn install_runtime(hooks: RuntimeHooks) {
    let _ = STATE.runtime.set(hooks);
}

pub(super) fn runtime() -> Result<&'static RuntimeHooks, AgentError> {
    STATE.runtime.get().ok_or(AgentError::RuntimeNotInstalled)
}

/// The owner of the agent's self-test patches (calibration): the only owner that may
/// hook a function of the agent itself, the one made to be hooked.
pub const SELF_TEST_OWNER: u64 = u64::MAX;

/// Everything the stubs and the protocol rely on, set up before the first patch.
pub(super) fn prepare() -> Result<(), AgentError> {
    (runtime()?.prepare)()?;
    // Computed now, so signal handlers can ask without allocating.
    crate::sys::own_code::is_agent_code(0);
    slow_call::prepare();
    code_memory::prepare()?;
    stop_world::install()?;
    crate::sys::thread_tracer::prepare()?;
    Ok(())
}

/// Whether session `owner` has patched the function at `address`.
pub fn is_patched_by(owner: u64, address: u64) -> bool {
    engine()
        .as_ref()
        .and_then(|e| e.sites.get(&address))
        .is_some_and(|site| site.owner == owner)
}

/// Calls `visit(id, key)` for every id ever given: a function's, keyed by its address,
/// or an edge counter's, keyed by a value with bit 63 set (`function_copies`), which no
/// code address has. Every id is visited, so a registry filled from it has no gaps.
pub fn for_each_id(mut visit: impl FnMut(u32, u64)) {
    if let Some(engine) = engine().as_ref() {
        for (&key, &id) in engine.ids.iter() {
            visit(id, key);
        }
    }
}

/// Reads the code at `address` as it was before tendril patched it: the live bytes with
/// the original bytes of every entry jump and pad in the range put back (a patched
/// entry decodes as a jump to its trampoline, and the bytes after it decode out of
/// step with the function's instructions).
pub fn read_original_code(address: u64, buffer: &mut [u8]) -> std::io::Result<()> {
    code_memory::read_code(address, buffer)?;
    if let Some(engine) = engine().as_ref() {
        engine.put_back_originals(address, buffer);
    }
    Ok(())
}

/// Number of functions patched now, not counting the unwinder's hooks that wait to
/// come out (see [`pending_restore`]).
pub fn patched_count() -> usize {
    engine().as_ref().map_or(0, |e| {
        e.sites.values().filter(|s| s.owner != LINGERING).count()
    })
}

/// The unwinder's hooks that a restore had to leave in, and why (see `retire`): they
/// come out by themselves once nothing holds them (`lingering`).
pub fn pending_restore() -> (usize, Option<AgentError>) {
    let guard = engine();
    let pending = guard.as_ref().map_or(0, |e| {
        e.sites.values().filter(|s| s.owner == LINGERING).count()
    });
    let obstacle = STATE
        .lingering_because
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    (pending, obstacle.filter(|_| pending > 0))
}

/// Tries once more to take out the hooks a restore had to leave in; returns how many
/// are still in.
pub fn retry_pending_restore(attempts: usize) -> usize {
    let mut guard = engine();
    let Some(engine) = guard.as_mut() else {
        return 0;
    };
    if engine.sites.values().any(|s| s.owner == LINGERING) {
        restore_addresses(engine, &[], attempts);
    }
    engine
        .sites
        .values()
        .filter(|s| s.owner == LINGERING)
        .count()
}

/// Patches a batch of functions for session `owner`, all in one stop of the process.
/// `code_ranges` are the known functions around them (themselves included), whose code
/// might branch into a patched entry. Returns, per request, the function's id or why
/// it was not patched.
pub fn patch(
    owner: u64,
    requests: &[PatchRequest],
    code_ranges: &[(u64, u64)],
) -> Vec<Result<u32, AgentError>> {
    let mut guard = engine();
    let engine = guard.get_or_insert_with(Engine::default);
    if let Err(reason) = prepare() {
        return requests.iter().map(|_| Err(reason.clone())).collect();
    }
    let nearby = Nearby {
        branches: BranchIndex::new(code_ranges),
        known: KnownRanges::new(code_ranges),
    };
    let mut results: Vec<Result<u32, AgentError>> = Vec::with_capacity(requests.len());
    let mut batch: Vec<Site> = Vec::new();
    // The batch's functions (address → id), and the pads taken so far, kept as the
    // batch grows: looking them up by going over the batch made thousands of functions
    // cost quadratic time.
    let mut batch_ids: HashMap<u64, u32> = HashMap::new();
    let mut pads_taken: Vec<u64> = engine
        .sites
        .values()
        .filter_map(|site| site.pad.as_ref().map(|pad| pad.address))
        .collect();
    for request in requests {
        let result = match engine.sites.get(&request.address) {
            Some(site) if site.owner == owner => Ok(site.id),
            Some(site) if site.owner == LINGERING && is_internal(request.kind) => {
                let id = site.id;
                if let Some(site) = engine.sites.get_mut(&request.address) {
                    site.owner = owner;
                }
                Ok(id)
            }
            Some(_) => Err(AgentError::OwnedByAnotherSession),
            None => match batch_ids.get(&request.address) {
                Some(&id) => Ok(id),
                None => engine
                    .prepare_site(owner, request, &nearby, &pads_taken)
                    .map(|site| {
                        let id = site.id;
                        batch_ids.insert(request.address, id);
                        pads_taken.extend(site.pad.as_ref().map(|pad| pad.address));
                        batch.push(site);
                        id
                    }),
            },
        };
        results.push(result);
    }
    // The unwinder's hooks go in first, completely: a return hook that runs before them
    // leaves a trampoline address in a return slot that an unwinder starting in the
    // meantime cannot step through (a Rust panic aborts with "failed to initiate
    // panic, error 5"; a C++ exception terminates).
    // Counters start from zero when the hooks go in (they may hold an earlier
    // session's counts), so a count includes the calls made while they went in.
    for site in &batch {
        if let Ok(runtime) = runtime() {
            (runtime.before_patching)(site.id);
        }
    }
    let (mut internal, mut others): (Vec<Site>, Vec<Site>) =
        batch.into_iter().partition(|site| site.internal);
    let batch_ids: Vec<u32> = batch_ids.into_values().collect();
    let mut installed: Vec<Site> = Vec::new();
    for part in [&mut internal, &mut others] {
        if part.is_empty() {
            continue;
        }
        if let Err(reason) = patch_protocol::install(part) {
            // Nothing after a failed part goes in either.
            let done: Vec<u32> = installed.iter().map(|s| s.id).collect();
            for result in results.iter_mut() {
                if matches!(result, Ok(id) if batch_ids.contains(id) && !done.contains(id)) {
                    *result = Err(reason.clone());
                }
            }
            break;
        }
        installed.append(part);
    }
    engine.register_installed(installed);
    results
}

impl Engine {
    /// Records installed sites, and the bytes they replaced.
    pub(super) fn register_installed(&mut self, installed: Vec<Site>) {
        for site in installed {
            self.originals.insert(
                site.patch_at,
                site.original[..site.trampoline.plan.jump_len].to_vec(),
            );
            if let Some(pad) = &site.pad {
                self.originals.insert(pad.address, pad.original.to_vec());
            }
            self.sites.insert(site.function(), site);
        }
    }
}

/// What is known of the code around a batch.
pub(super) struct Nearby {
    pub(super) branches: BranchIndex,
    /// The known functions' ranges, for pads in the padding between them.
    pub(super) known: KnownRanges,
}

impl Nearby {
    /// The neighbours' direct branches into `low..high`, read from their original code.
    fn branches_into(&self, engine: &Engine, low: u64, high: u64) -> Vec<(u64, u64)> {
        self.branches.landing_in(low, high, |at, buffer| {
            let read = code_memory::read_code(at, buffer).is_ok();
            engine.put_back_originals(at, buffer);
            read
        })
    }
}

impl Engine {
    /// Overwrites, in `buffer` (the code read at `address`), the bytes of the patches
    /// that fall in it with the bytes they replaced.
    pub(super) fn put_back_originals(&self, address: u64, buffer: &mut [u8]) {
        let end = address + buffer.len() as u64;
        // A patch is at most a few bytes long, so one starting shortly before `address`
        // may reach into the range.
        let from = address.saturating_sub(PAD_LEN.max(patch_protocol::MAX_ENTRY_PATCH as u64));
        for (&at, original) in self.originals.range(from..end) {
            for (offset, &byte) in original.iter().enumerate() {
                let byte_at = at + offset as u64;
                if (address..end).contains(&byte_at) {
                    buffer[(byte_at - address) as usize] = byte;
                }
            }
        }
    }

    /// Plans the patch of one function and builds (or reuses) its trampoline, with a pad
    /// (if it needs one) clear of the `pads_taken`.
    fn prepare_site(
        &mut self,
        owner: u64,
        request: &PatchRequest,
        nearby: &Nearby,
        pads_taken: &[u64],
    ) -> Result<Site, AgentError> {
        let address = request.address;
        if let Some(reason) = own_code(owner, address, request.size) {
            return Err(AgentError::Refused(reason.into()));
        }
        if request.size == 0 {
            return Err(AgentError::Refused(
                "its size is unknown (no symbol size and no unwind information)".into(),
            ));
        }
        let mut code = vec![0u8; request.size.min(MAX_BODY_SCAN) as usize];
        code_memory::read_code(address, &mut code).map_err(unreadable)?;
        self.put_back_originals(address, &mut code);
        let thunk_allowed = matches!(
            request.kind,
            Hook::Count | Hook::CountReturns | Hook::Record | Hook::RecordRoot
        );
        let (plan, pad_address) =
            self.choose_plan(request, &code, nearby, pads_taken, thunk_allowed)?;
        let id = self.id_for(address)?;
        let key = (address, request.kind);
        let entry_len = plan.patch_offset + plan.overwritten_len;
        let reusable = self
            .trampolines
            .get(&key)
            .filter(|t| t.entry_bytes == code[..entry_len] && t.plan == plan)
            .cloned();
        let trampoline = match reusable {
            Some(trampoline) => trampoline,
            None => {
                let trampoline = self.build_trampoline(address, &code, plan, id, request.kind)?;
                self.trampolines.insert(key, trampoline.clone());
                trampoline
            }
        };
        let patch_at = address + trampoline.plan.patch_offset as u64;
        let (original, pad) = replaced_bytes(&code, &trampoline.plan, pad_address)?;
        Ok(Site {
            patch_at,
            original,
            pad,
            trampoline,
            owner,
            id,
            kind: request.kind,
            internal: is_internal(request.kind),
            recorded: [None, None],
        })
    }

    /// Chooses how to patch the entry, in order of preference:
    /// 1. a `jmp` over one instruction (no thread can be in the middle of it, so the
    ///    patch needs no stop of the process);
    /// 2. a call thunk, for an entry that is a call (one instruction too);
    /// 3. a short `jmp` to a pad over one instruction;
    /// 4. a `jmp`, then a short `jmp`, over several instructions (a stop is needed);
    /// 5. the same with a copied call emulated (correct, but each return of the callee
    ///    then misses the cpu's return prediction).
    pub(super) fn choose_plan(
        &self,
        request: &PatchRequest,
        code: &[u8],
        nearby: &Nearby,
        pads_taken: &[u64],
        thunk_allowed: bool,
    ) -> Result<(EntryPlan, Option<u64>), AgentError> {
        let address = request.address;
        let long = plan_for(request, code, Style::Long);
        let emulates = |plan: &EntryPlan| entry_plan::emulates_a_call(address, code, plan);
        let single = |plan: &EntryPlan| plan.instruction_offsets.len() == 1;
        if let Ok(plan) = &long
            && single(plan)
            && !emulates(plan)
        {
            return Ok((plan.clone(), None));
        }
        if thunk_allowed && let Ok(plan) = plan_for(request, code, Style::CallThunk) {
            return Ok((plan, None));
        }
        let short = plan_for(request, code, Style::Short).and_then(|plan| {
            let jump_end = address + (plan.patch_offset + plan.jump_len) as u64;
            let read = |at: u64, buffer: &mut [u8]| code_memory::read_code(at, buffer).is_ok();
            let function = (address, request.size);
            padding::find_pad(jump_end, &nearby.known, function, pads_taken, read)
                .map(|pad| (plan, pad))
                .ok_or_else(|| {
                    AgentError::Refused("there is no padding nearby for a short jump".into())
                })
        });
        if let Ok((plan, pad)) = &short
            && single(plan)
            && !emulates(plan)
        {
            return Ok((plan.clone(), Some(*pad)));
        }
        // Several instructions overwritten: the neighbours must not branch into them
        // (checked only now, as reading the neighbours costs more than the rest).
        let mut reasons = Vec::new();
        let long = long.map(|plan| (plan, None));
        let short = short.map(|(plan, pad)| (plan, Some(pad)));
        let candidates = [&long, &short]
            .into_iter()
            .filter_map(|c| c.as_ref().ok())
            .filter(|(plan, _)| !emulates(plan))
            .chain(
                [&long, &short]
                    .into_iter()
                    .filter_map(|c| c.as_ref().ok())
                    .filter(|(plan, _)| emulates(plan)),
            );
        for (plan, pad) in candidates {
            match check_neighbours(self, request, plan, nearby) {
                Ok(()) => return Ok((plan.clone(), *pad)),
                Err(reason) => reasons.push(reason.to_string()),
            }
        }
        for reason in [long, short].into_iter().filter_map(Result::err) {
            // The same reason for both plans (a guard across a cache line) says it once.
            let reason = reason.to_string();
            if !reasons.contains(&reason) {
                reasons.push(reason);
            }
        }
        Err(AgentError::Refused(reasons.join("; ")))
    }

    pub(super) fn id_for(&mut self, address: u64) -> Result<u32, AgentError> {
        let (id, new) = self.id_under(address)?;
        if new {
            (runtime()?.function_registered)(id, address);
        }
        Ok(id)
    }

    /// The id kept under `key` in the id table (a function's address, or an edge
    /// counter's key, see `function_copies`), and whether it was made now. Ids are
    /// never reused, so a counter keeps its meaning.
    pub(super) fn id_under(&mut self, key: u64) -> Result<(u32, bool), AgentError> {
        if let Some(&id) = self.ids.get(&key) {
            return Ok((id, false));
        }
        let id = self.ids.len() as u32;
        if id as usize >= thread_layout::MAX_FUNCTION_IDS {
            return Err(AgentError::TooManyFunctions {
                max: thread_layout::MAX_FUNCTION_IDS,
            });
        }
        self.ids.insert(key, id);
        Ok((id, true))
    }

    fn build_trampoline(
        &mut self,
        address: u64,
        code: &[u8],
        plan: EntryPlan,
        id: u32,
        kind: Hook,
    ) -> Result<Trampoline, AgentError> {
        let memory = self.arena.allocate_near(address, stubs::TRAMPOLINE_BYTES)?;
        let mut instruction_map = Vec::new();
        let thunk_returns_to = (plan.style == PatchStyle::CallThunk)
            .then(|| address + (plan.patch_offset + plan.overwritten_len) as u64);
        let shape = match plan.style {
            PatchStyle::CallThunk => HookShape::CallThunk,
            PatchStyle::Jump if plan.jump_len == SHORT_PATCH_LEN => HookShape::PadJump,
            PatchStyle::Jump => HookShape::Jump,
        };
        let TrampolineCode {
            mut bytes,
            mut hook,
            body,
            body_sink,
        } = stubs::build(memory, id, kind, thunk_returns_to, shape, |body| {
            let relocated = relocate::relocate(address, code, &plan, body)?;
            instruction_map = relocated.instruction_map;
            Ok(relocated.bytes)
        })?;
        if plan.lead_pushes > 0 {
            let adapter = memory + bytes.len() as u64;
            bytes.extend_from_slice(&pop_lead_pushes(plan.lead_pushes, adapter, hook));
            if bytes.len() as u64 > stubs::TRAMPOLINE_BYTES {
                return Err(AgentError::NoRoomForEntryAdapter);
            }
            hook = adapter;
        }
        if is_internal(kind) {
            (runtime()?.internal_trampoline_built)(memory, memory + stubs::TRAMPOLINE_BYTES);
        }
        code_memory::write_code(memory, &bytes)
            .map_err(|e| AgentError::io("cannot write a trampoline", e))?;
        if let Some(sink) = body_sink {
            sink.store(body, std::sync::atomic::Ordering::Release);
        }
        Ok(Trampoline {
            body,
            hook,
            entry_bytes: code[..plan.patch_offset + plan.overwritten_len].to_vec(),
            plan,
            instruction_map,
        })
    }
}

/// Why a function at `address` (`size` bytes) is tendril's own code, which `owner` may
/// not patch, if it is: the agent's library (its Rust code and everything linked into
/// it) runs the patching and the hooks, and a hook in it would re-enter itself or patch
/// the code doing the patching; trampolines and stubs are tendril's by construction.
/// The calibration's own target, made to be hooked, is the one exception.
pub(super) fn own_code(owner: u64, address: u64, size: u64) -> Option<&'static str> {
    let last = address + size.saturating_sub(1);
    if owner == SELF_TEST_OWNER {
        None
    } else if crate::sys::own_code::is_agent_code(address)
        || crate::sys::own_code::is_agent_code(last)
    {
        Some("part of tendril's agent, which never instruments itself")
    } else if code_memory::is_trampoline_code(address) {
        Some("part of tendril's trampolines, which are never instrumented")
    } else {
        None
    }
}

/// Whether a hook is one of the unwinder's (see `shadow`), which must be in whenever a
/// return hook is or a frame still holds one's exit.
/// Where the patch of an entry with lead pushes jumps: `lea rsp,[rsp+8n]` takes the
/// `n` pushes the thread just made off the stack again (the registers still hold what
/// was pushed, and `lea` leaves the flags alone), then `jmp hook` — the hook sees the
/// stack as at the function's entry, and the body makes the pushes again.
/// The bytes the entry jump `plan` describes replaces in `code` (the function's bytes),
/// and the pad at `pad_address`, if the plan needs one, with the bytes it replaces.
pub(super) fn replaced_bytes(
    code: &[u8],
    plan: &EntryPlan,
    pad_address: Option<u64>,
) -> Result<([u8; patch_protocol::MAX_ENTRY_PATCH], Option<Pad>), AgentError> {
    let mut original = [0u8; patch_protocol::MAX_ENTRY_PATCH];
    original[..plan.jump_len].copy_from_slice(&code[plan.patch_offset..][..plan.jump_len]);
    let pad = match pad_address {
        Some(address) => {
            let mut pad_original = [0u8; PAD_LEN as usize];
            code_memory::read_code(address, &mut pad_original).map_err(unreadable)?;
            Some(Pad {
                address,
                original: pad_original,
            })
        }
        None => None,
    };
    Ok((original, pad))
}

pub(super) fn pop_lead_pushes(pushes: usize, at: u64, hook: u64) -> [u8; 10] {
    let mut code = [0x48, 0x8d, 0x64, 0x24, (8 * pushes) as u8, 0xe9, 0, 0, 0, 0];
    let displacement = hook.wrapping_sub(at + code.len() as u64) as i32;
    code[6..].copy_from_slice(&displacement.to_le_bytes());
    code
}

/// A function whose code cannot be read is refused with what the read said.
pub(super) fn unreadable(error: std::io::Error) -> AgentError {
    AgentError::Refused(error.to_string())
}

fn is_internal(kind: Hook) -> bool {
    kind.is_agents_own()
}

/// Which plan [`plan_checked`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    Long,
    Short,
    CallThunk,
}

/// Plans an entry patch of the given style.
fn plan_for(request: &PatchRequest, code: &[u8], style: Style) -> Result<EntryPlan, AgentError> {
    let address = request.address;
    match style {
        Style::Long => entry_plan::plan_entry_patch(address, code),
        Style::Short => entry_plan::plan_short_entry_patch(address, code),
        Style::CallThunk => entry_plan::plan_call_thunk(address, code),
    }
    .map_err(AgentError::from)
}

/// Checks that no nearby code branches into what `plan` overwrites beyond its first
/// instruction (nothing branches into the middle of one, so a plan that overwrites
/// one instruction needs no check).
fn check_neighbours(
    engine: &Engine,
    request: &PatchRequest,
    plan: &EntryPlan,
    nearby: &Nearby,
) -> Result<(), AgentError> {
    if plan.instruction_offsets.len() == 1 {
        return Ok(());
    }
    let address = request.address;
    let patch_start = address + plan.patch_offset as u64;
    let body = address..address + request.size;
    let into = nearby.branches_into(
        engine,
        patch_start + 1,
        patch_start + plan.overwritten_len as u64,
    );
    // Branches inside the body were checked by the plan, which knows which are its own.
    match into.iter().find(|(from, to)| {
        !body.contains(from) && entry_plan::lands_inside_patch(plan, address, *to)
    }) {
        Some(&(from, to)) => Err(entry_plan::Refusal::BranchIntoPatch { from, to }.into()),
        None => Ok(()),
    }
}

/// Restores the functions patched by `owner` (every function for `None`); returns how
/// many were restored.
pub fn restore(owner: Option<u64>) -> usize {
    let mut guard = engine();
    let Some(engine) = guard.as_mut() else {
        return 0;
    };
    let chosen: Vec<u64> = engine
        .sites
        .iter()
        .filter(|(_, site)| owner.is_none_or(|o| site.owner == o))
        .map(|(&address, _)| address)
        .collect();
    restore_addresses(engine, &chosen, RETIRE_ATTEMPTS)
}

/// Restores the given functions of `owner`; returns how many were restored.
pub fn restore_functions(owner: u64, addresses: &[u64]) -> usize {
    let mut guard = engine();
    let Some(engine) = guard.as_mut() else {
        return 0;
    };
    let owned: Vec<u64> = addresses
        .iter()
        .copied()
        .filter(|address| engine.sites.get(address).is_some_and(|s| s.owner == owner))
        .collect();
    restore_addresses(engine, &owned, RETIRE_ATTEMPTS)
}

/// Owner of the unwinder's hooks while they cannot come out yet (some thread stayed
/// inside tendril's code, see `retire`): every later restore tries again, and the next
/// session that hooks returns takes them over.
const LINGERING: u64 = u64::MAX - 1;

/// Passes a restore tries before leaving the unwinder's hooks in for the background.
const RETIRE_ATTEMPTS: usize = 40;

/// Restores `addresses` and any lingering hooks; returns how many functions got their
/// bytes back (lingering ones included).
fn restore_addresses(engine: &mut Engine, addresses: &[u64], attempts: usize) -> usize {
    let lingering: Vec<u64> = engine
        .sites
        .iter()
        .filter(|(_, site)| site.owner == LINGERING)
        .map(|(&address, _)| address)
        .collect();
    let sites: Vec<Site> = addresses
        .iter()
        .chain(&lingering)
        .filter_map(|address| engine.sites.remove(address))
        .collect();
    for site in &sites {
        engine.originals.remove(&site.patch_at);
        if let Some(pad) = &site.pad {
            engine.originals.remove(&pad.address);
        }
    }
    // The reverse of `patch`: the unwinder's hooks come out last, once no frame holds
    // a return hook's exit any more.
    let (mut internal, others): (Vec<Site>, Vec<Site>) =
        sites.into_iter().partition(|site| site.internal);
    if !others.is_empty() {
        patch_protocol::restore(&others);
    }
    let mut restored = others.len();
    if !internal.is_empty() {
        let retired = runtime().and_then(|runtime| (runtime.retire_exits)(attempts));
        *STATE
            .lingering_because
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = retired.clone().err();
        if retired.is_ok() {
            patch_protocol::restore(&internal);
            restored += internal.len();
        } else {
            for site in &mut internal {
                site.owner = LINGERING;
            }
            engine.register_installed(internal);
        }
    }
    restored
}
