//! Switching a recorded function between its timed hook (`Hook::Record`) and its untimed
//! one (`Hook::Untimed`) while the process runs (adaptive timing, issue 32); a root
//! between `Hook::RecordRoot` and `Hook::RecordRootOutermost` (timed at its outermost
//! call, untimed inside its own graph: recursion).
//!
//! The one idea: the site stays installed, and only where its entry jump (or its pad's
//! jump) leads changes (`patch_protocol::retarget`, one instruction before and after).
//! Each function's trampoline of each kind is built once and kept, like every
//! trampoline: a thread inside the timed one when the switch happens returns through
//! its exit as usual, and a switch back reuses the first one. The site's original bytes
//! do not change, so a restore puts back exactly what it would have before.

use super::entry_stubs;
use super::function_copies;
use super::patch_protocol;
use super::readiness::prepare;
use super::sites::Engine;
use super::state::engine;
use crate::code::entry_plan::PatchStyle;
use crate::hooks::stubs;
use crate::sys::code_memory;
use crate::sys::error::AgentError;
use crate::sys::loaded_modules;
use tendril_wire::Hook;

/// Longest part of a function read to rebuild its trampoline: the relocation needs the
/// instructions the entry jump overwrote, a few bytes.
const ENTRY_READ: u64 = 64;

/// Points each function at `addresses` that session `owner` records at its timed
/// (`timed`) or untimed hook. Per address: `None` if it now runs that hook, or why not.
pub fn set_timing(owner: u64, addresses: &[u64], timed: bool) -> Vec<Option<String>> {
    loaded_modules::with_modules_held(|modules| {
        let mut guard = engine();
        let engine = guard.get_or_insert_with(Engine::default);
        engine.forget_unloaded(modules);
        if let Err(reason) = prepare() {
            return addresses.iter().map(|_| Some(reason.to_string())).collect();
        }
        addresses
            .iter()
            .map(|&address| engine.switch_timing(owner, address, timed).err())
            .map(|refused| refused.map(|reason| reason.to_string()))
            .collect()
    })
}

/// The hook a recorded function's site of hook `now` runs when (un)`timed`; `None` if
/// the site is not a recorded one.
fn timing_hook(now: Hook, timed: bool) -> Option<Hook> {
    match (now, timed) {
        (Hook::Record | Hook::Untimed, true) => Some(Hook::Record),
        (Hook::Record | Hook::Untimed, false) => Some(Hook::Untimed),
        (Hook::RecordRoot | Hook::RecordRootOutermost, true) => Some(Hook::RecordRoot),
        (Hook::RecordRoot | Hook::RecordRootOutermost, false) => Some(Hook::RecordRootOutermost),
        _ => None,
    }
}

impl Engine {
    /// Points the site of `owner` at `address` at the trampoline of its timed or untimed
    /// hook.
    fn switch_timing(&mut self, owner: u64, address: u64, timed: bool) -> Result<(), AgentError> {
        let Some(site) = self.sites.get(&address) else {
            // Reached through pointers only, by a hook in front of its entry.
            return entry_stubs::switch_timing(self, address, timed);
        };
        let kind = match timing_hook(site.kind, timed) {
            Some(kind) if site.owner == owner => kind,
            _ => {
                return Err(AgentError::Refused(
                    "it is not a function this recording records".into(),
                ));
            }
        };
        if site.kind == kind {
            return Ok(());
        }
        if kind == Hook::RecordRootOutermost && site.trampoline.plan.lead_pushes > 0 {
            return Err(AgentError::Refused(
                "its entry pushes before the patch: as a root it stays timed".into(),
            ));
        }
        // The hook being left stays built, for a switch back (and a root's outermost
        // calls go on through its timed one).
        self.trampolines
            .entry((address, site.kind))
            .or_insert_with(|| site.trampoline.clone());
        let timed_root_hook = self
            .trampolines
            .get(&(address, Hook::RecordRoot))
            .map(|root| root.hook);
        if self.copies_behind.contains_key(&address) {
            return Err(AgentError::Refused(
                "its code is shown with counts, behind its timed hook: it stays timed".into(),
            ));
        }
        let plan_style = site.trampoline.plan.style;
        let (plan, id, entry_bytes, has_pad) = (
            site.trampoline.plan.clone(),
            site.id,
            site.trampoline.entry_bytes.clone(),
            site.pad.is_some(),
        );
        let key = (address, kind);
        let trampoline = match self.trampolines.get(&key) {
            Some(built) if built.plan == plan && built.entry_bytes == entry_bytes => built.clone(),
            _ => {
                let mut code = vec![0u8; ENTRY_READ.max(entry_bytes.len() as u64) as usize];
                code_memory::read_code(address, &mut code)
                    .map_err(|e| AgentError::io("cannot read its code", e))?;
                self.put_back_originals(address, &mut code);
                if code[..entry_bytes.len()] != entry_bytes[..] {
                    return Err(AgentError::Refused(
                        "its code changed since it was patched".into(),
                    ));
                }
                let built = match self.pointer_checked.get(&address) {
                    // Its calls through pointers stay checked behind the new hook.
                    Some(Some(copy)) => {
                        let size = copy.size;
                        function_copies::pointer_checked_trampoline(
                            self, address, size, id, kind, &plan, has_pad,
                        )
                        .ok_or_else(|| {
                            AgentError::Refused(
                                "its copy that checks calls through pointers cannot go \
                                 behind the other hook"
                                    .into(),
                            )
                        })?
                    }
                    _ => self.build_trampoline(address, &code, plan, id, kind)?,
                };
                if kind == Hook::RecordRootOutermost {
                    let Some(root_hook) = timed_root_hook else {
                        return Err(AgentError::Refused("its timed hook is gone".into()));
                    };
                    let after_call = plan_style == PatchStyle::CallThunk;
                    let word = stubs::outermost_word(built.body, after_call)?;
                    code_memory::write_code(word, &root_hook.to_le_bytes())
                        .map_err(|e| AgentError::io("cannot write a trampoline", e))?;
                }
                self.note_trampoline(key, &built);
                built
            }
        };
        let site = self
            .sites
            .get_mut(&address)
            .expect("the site was found above, under the same lock");
        patch_protocol::retarget(site, trampoline.hook)?;
        site.trampoline = trampoline;
        site.kind = kind;
        Ok(())
    }
}
