//! Preparing one function's patch, before any byte of the process changes: reading its
//! code (with tendril's own patches taken out), choosing how its entry jumps to the
//! hook (`choose_plan`), checking that no neighbour branches into the bytes the jump
//! overwrites, and building (or reusing) its trampoline. `patcher` installs the sites
//! prepared here in one go; `function_copies` prepares its entries the same way.

use crate::code::branch_index::BranchIndex;
use crate::code::entry_plan::{self, EntryPlan, PatchStyle, SHORT_PATCH_LEN};
use crate::code::padding::{self, KnownRanges, PAD_LEN};
use crate::code::relocate;
use crate::hooks::stubs::{self, TrampolineCode};
use crate::hooks::thread_layout;
use crate::patching::patch_protocol::{self, Pad, Site, Trampoline};
use crate::patching::sites::{Engine, PatchRequest, SELF_TEST_OWNER};
use crate::patching::state::runtime;
use crate::sys::code_memory;
use crate::sys::error::AgentError;
use tendril_wire::Hook;
use tendril_wire::events::HookShape;

/// Longest function body read for planning; longer bodies are scanned up to this much.
const MAX_BODY_SCAN: u64 = 1 << 20;

/// What is known of the code around a batch.
pub(super) struct Nearby {
    pub(super) branches: BranchIndex,
    /// The known functions' ranges, for pads in the padding between them.
    pub(super) known: KnownRanges,
}

impl Nearby {
    /// What is known of the code of the functions at `code_ranges` (start, size).
    pub(super) fn new(code_ranges: &[(u64, u64)]) -> Self {
        Nearby {
            branches: BranchIndex::new(code_ranges),
            known: KnownRanges::new(code_ranges),
        }
    }

    /// The neighbours' direct branches into `low..high`, read from their original code.
    fn branches_into(&self, engine: &Engine, low: u64, high: u64) -> Vec<(u64, u64)> {
        self.branches.landing_in(low, high, |at, buffer| {
            let read = code_memory::read_code(at, buffer).is_ok();
            engine.put_back_originals(at, buffer);
            read
        })
    }
}

/// Builds the trampoline of a recording hook whose body is a copy of the function
/// that checks its calls through pointers (`function_copies`), given the engine, the
/// function's address, size and id, the hook, the entry's plan and whether it has a
/// pad; `None` when there is no such copy to make.
pub(super) type PointerCheckedBuilder =
    fn(&mut Engine, u64, u64, u32, Hook, &EntryPlan, bool) -> Option<Trampoline>;

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

    /// Keeps `trampoline`, built for `key`, for reuse, and notes where it goes back to.
    pub(super) fn note_trampoline(&mut self, key: (u64, Hook), trampoline: &Trampoline) {
        let (address, _) = key;
        let resume = (
            trampoline.plan.patch_offset + trampoline.plan.overwritten_len,
            trampoline.hook,
        );
        let offsets = self.resume_offsets.entry(address).or_default();
        if !offsets.contains(&resume) {
            offsets.push(resume);
        }
        self.trampolines.insert(key, trampoline.clone());
    }

    /// Refuses a patch of the function at `address` that would overwrite its bytes
    /// `start..end` when a trampoline built for it before goes back strictly inside them
    /// (an earlier patch made with a pad overwrote fewer instructions) and that earlier
    /// patch's pad is not restored yet (`still_led_to`: its restoring peek did not
    /// complete, as among a thousand busy threads): a thread on the pad, or preempted
    /// in the trampoline, would resume in the middle of the new jump.
    fn check_no_return_inside(
        &self,
        address: u64,
        (start, end): (usize, usize),
        still_led_to: impl Fn(u64) -> bool,
    ) -> Result<(), AgentError> {
        let Some(&(inside, _)) = self.resume_offsets.get(&address).and_then(|offsets| {
            offsets
                .iter()
                .find(|&&(resume, hook)| resume > start && resume < end && still_led_to(hook))
        }) else {
            return Ok(());
        };
        Err(AgentError::Refused(format!(
            "an earlier patch's copy of its entry goes back to its byte {inside}, which this \
             patch would overwrite, and that patch's pad is not restored yet; try again later"
        )))
    }

    /// Plans the patch of one function and builds (or reuses) its trampoline, with a pad
    /// (if it needs one) clear of the `pads_taken`.
    pub(super) fn prepare_site(
        &mut self,
        owner: u64,
        request: &PatchRequest,
        nearby: &Nearby,
        pads_taken: &[u64],
        pointer_checked: PointerCheckedBuilder,
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
        self.check_no_return_inside(
            address,
            (plan.patch_offset, entry_len),
            patch_protocol::pad_pending_for,
        )?;
        // A session that follows calls through pointers wants its recording hooks in
        // front of copies that check them, once for each function.
        let checks_pointers = self.follows_pointers.contains(&owner)
            && matches!(request.kind, Hook::Record | Hook::RecordRoot);
        let checked = self.pointer_checked.get(&address).cloned();
        let reusable = self
            .trampolines
            .get(&key)
            .filter(|t| t.entry_bytes == code[..entry_len] && t.plan == plan)
            .filter(|t| match &checked {
                Some(Some(copy)) => !checks_pointers || copy.body == t.body,
                Some(None) => true,
                None => !checks_pointers,
            })
            .cloned();
        let trampoline = match reusable {
            Some(trampoline) => trampoline,
            None => {
                let has_pad = pad_address.is_some();
                let copy = checks_pointers
                    .then(|| {
                        pointer_checked(
                            self,
                            address,
                            request.size,
                            id,
                            request.kind,
                            &plan,
                            has_pad,
                        )
                    })
                    .flatten();
                let trampoline = match copy {
                    Some(trampoline) => trampoline,
                    None => self.build_trampoline(address, &code, plan, id, request.kind)?,
                };
                self.note_trampoline(key, &trampoline);
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
        let id = (self.ids.len() + self.retired_ids.len()) as u32;
        if id as usize >= thread_layout::MAX_FUNCTION_IDS {
            return Err(AgentError::TooManyFunctions {
                max: thread_layout::MAX_FUNCTION_IDS,
            });
        }
        self.ids.insert(key, id);
        Ok((id, true))
    }

    pub(super) fn build_trampoline(
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

/// Where the patch of an entry with lead pushes jumps: `lea rsp,[rsp+8n]` takes the
/// `n` pushes the thread just made off the stack again (the registers still hold what
/// was pushed, and `lea` leaves the flags alone), then `jmp hook` — the hook sees the
/// stack as at the function's entry, and the body makes the pushes again.
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

/// Whether a hook is one of the unwinder's (see `shadow`), which must be in whenever a
/// return hook is or a frame still holds one's exit.
pub(super) fn is_internal(kind: Hook) -> bool {
    kind.is_agents_own()
}

/// Which plan [`plan_for`] makes.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_over_the_place_an_earlier_trampoline_goes_back_to_is_refused_while_its_pad_is_pending()
     {
        let mut engine = Engine::default();
        // An earlier patch with a pad overwrote the 3-byte first instruction only; its
        // trampoline's hook is at 0x9000.
        engine.resume_offsets.insert(0x1000, vec![(3, 0x9000)]);
        let pending = |hook: u64| hook == 0x9000;
        let longer = engine.check_no_return_inside(0x1000, (0, 7), pending);
        assert!(
            matches!(&longer, Err(AgentError::Refused(reason)) if reason.contains("byte 3")),
            "{longer:?}"
        );
        // Its pad restored: nothing leads there any more.
        assert!(
            engine
                .check_no_return_inside(0x1000, (0, 7), |_| false)
                .is_ok()
        );
        // The same plan again, a shorter one, or another function: nothing in between.
        assert!(
            engine
                .check_no_return_inside(0x1000, (0, 3), pending)
                .is_ok()
        );
        assert!(
            engine
                .check_no_return_inside(0x1000, (0, 2), pending)
                .is_ok()
        );
        assert!(
            engine
                .check_no_return_inside(0x2000, (0, 7), pending)
                .is_ok()
        );
    }
}
