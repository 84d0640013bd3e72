//! Which addresses a controller may have the agent patch: only code of a program or
//! library file mapped executable in this process.
//!
//! The one idea: a patch target comes over the control socket, so it is checked against
//! the process's own view of its memory (`/proc/self/maps`) before the patcher reads a
//! byte of it. An address on a stack, in the heap, in data, or in anonymous executable
//! memory (JIT code, tendril's own trampolines) is refused with the reason, instead of
//! being decoded and overwritten. The check runs once per request from a controller;
//! the agent's own patches (discovery, calibration) come from the function table and
//! its own code, and do not pay for it.

use crate::patching::patcher::{self, PatchRequest};
use crate::sys::error::AgentError;
use crate::sys::maps::{self, Mapping};

/// Why `address` may not be patched, if it may not.
fn refusal(maps: &[Mapping], address: u64) -> Option<AgentError> {
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
    None
}

/// Patches `requests` for `owner` like [`patcher::patch`], refusing first every target
/// that is not in an executable, file-backed mapping.
pub fn patch_mapped(
    owner: u64,
    requests: &[PatchRequest],
    code_ranges: &[(u64, u64)],
) -> Vec<Result<u32, AgentError>> {
    let maps = match maps::read_own() {
        Ok(mappings) => mappings,
        Err(e) => {
            let reason = AgentError::io("cannot read this process's mappings", e);
            return requests.iter().map(|_| Err(reason.clone())).collect();
        }
    };
    let refusals: Vec<Option<AgentError>> = requests
        .iter()
        .map(|request| refusal(&maps, request.address))
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
            None => patched
                .next()
                .unwrap_or_else(|| Err(AgentError::Refused("the patcher gave no answer".into()))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 1234 /usr/bin/my program
55d0c0a01000-55d0c0a02000 r-xp 00001000 08:01 1234 /usr/bin/my program
7f0000000000-7f0000001000 rwxp 00000000 00:00 0
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0 [stack]
";

    #[test]
    fn only_code_of_mapped_files_may_be_patched() {
        let maps = maps::parse(MAPS);
        assert_eq!(maps.len(), 4);
        assert_eq!(maps[1].name, "/usr/bin/my program");
        let refused = |address| refusal(&maps, address).map(|reason| reason.to_string());
        assert_eq!(refused(0x55d0c0a01010), None);
        let stack = refused(0x7ffc00000100).unwrap();
        assert!(
            stack.contains("[stack], which is not executable"),
            "{stack}"
        );
        let data = refused(0x55d0c0a00010).unwrap();
        assert!(data.contains("/usr/bin/my program, which is not executable"));
        let jit = refused(0x7f0000000010).unwrap();
        assert!(jit.contains("anonymous memory"), "{jit}");
        let nowhere = refused(0x10).unwrap();
        assert!(nowhere.contains("not in any mapping"));
    }
}
