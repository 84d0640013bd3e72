//! Which addresses a controller may have the agent patch: only code of a program or
//! library file mapped executable in this process.
//!
//! The one idea: a patch target comes over the control socket, so it is checked against
//! the process's own view of its memory (`/proc/self/maps`) before the patcher reads a
//! byte of it. An address on a stack, in the heap, in data, or in anonymous executable
//! memory (JIT code, tendril's own trampolines) is refused with the reason, instead of
//! being decoded and overwritten; so is an address whose library is not the one the
//! controller read (unloaded since, maybe with another loaded in its place). The check
//! runs once per request from a controller; the agent's own patches (discovery,
//! calibration) come from the function table and its own code, and do not pay for it.

use crate::patching::patcher::{self, PatchRequest};
use crate::sys::error::AgentError;
use crate::sys::loaded_modules;
use crate::sys::maps::{self, Mapping};

/// Why `request` may not be patched, if it may not: `module` is the file the
/// controller found it in.
fn refusal(maps: &[Mapping], address: u64, module: Option<&str>) -> Option<AgentError> {
    let Some(mapping) = maps.iter().find(|m| m.contains(address)) else {
        return Some(AgentError::Refused(format!(
            "{address:#x} is not in any mapping of the process; give the address of a function"
        )));
    };
    let place = if mapping.name.is_empty() {
        "anonymous memory".to_string()
    } else {
        mapping.name.clone()
    };
    if !mapping.executable() {
        return Some(AgentError::Refused(format!(
            "{address:#x} is not code: it lies in {place}, which is not executable"
        )));
    }
    if !mapping.is_file() {
        return Some(AgentError::Refused(format!(
            "{address:#x} lies in {place}, executable memory no program or library file backs \
             (JIT code or tendril's own trampolines); tendril patches only functions of mapped files"
        )));
    }
    let mapped = mapping.name.trim_end_matches(" (deleted)");
    if let Some(expected) = module
        && mapped != expected.trim_end_matches(" (deleted)")
    {
        return Some(AgentError::Refused(format!(
            "its library {expected} was unloaded ({mapped} is mapped at {address:#x} now); \
             nothing was written"
        )));
    }
    None
}

/// Patches `requests` for `owner` like [`patcher::patch`], refusing first every target
/// that is not in an executable, file-backed mapping, or not in the file `modules`
/// names for it (the controller's view, which a library unloaded since makes stale).
/// The check and the patch happen with the loader held, so no library comes or goes
/// between them.
pub fn patch_mapped(
    owner: u64,
    requests: &[PatchRequest],
    modules: &[Option<String>],
    code_ranges: &[(u64, u64)],
) -> Vec<Result<u32, AgentError>> {
    loaded_modules::with_modules_held(|_| {
        let maps = match maps::read_own() {
            Ok(mappings) => mappings,
            Err(e) => {
                let reason = AgentError::io("cannot read this process's mappings", e);
                return requests.iter().map(|_| Err(reason.clone())).collect();
            }
        };
        let refusals: Vec<Option<AgentError>> = requests
            .iter()
            .enumerate()
            .map(|(i, request)| {
                let module = modules.get(i).and_then(Option::as_deref);
                refusal(&maps, request.address, module)
            })
            .collect();
        let accepted: Vec<PatchRequest> = requests
            .iter()
            .zip(&refusals)
            .filter(|(_, refused)| refused.is_none())
            .map(|(request, _)| request.clone())
            .collect();
        let mut patched = if accepted.is_empty() {
            Vec::new()
        } else {
            patcher::patch(owner, &accepted, code_ranges)
        }
        .into_iter();
        refusals
            .into_iter()
            .map(|refused| match refused {
                Some(reason) => Err(reason),
                None => patched.next().unwrap_or_else(|| {
                    Err(AgentError::Refused("the patcher gave no answer".into()))
                }),
            })
            .collect()
    })
}
