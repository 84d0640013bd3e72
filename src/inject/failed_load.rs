//! What a failed remote `dlopen` of the agent leaves mapped, and removing it.
//!
//! glibc's loader first maps the library's whole address range read-only, then maps
//! each segment over it. When one of those fails — a seccomp filter that refuses an
//! executable mapping with EPERM, say — `dlopen` returns an error and forgets the
//! library without unmapping anything (glibc: "mappings can be in an inconsistent
//! state"). A 4 MB read-only mapping of the agent's file stays, which nothing refers
//! to. So after a failed `dlopen`, while tendril still holds the thread, every mapping
//! of an agent file is unmapped with a remote `munmap` — unless one of them is
//! executable: then a library is loaded after all, and nothing is touched.
//!
//! A loaded agent always has an executable mapping; [`is_resident`] says so, so that a
//! read-only leftover (from a tendril without this cleanup) is never taken for an agent
//! whose start function can be called.

use super::loader::LoaderEntryPoints;
use super::remote_call::RemoteFrame;
use crate::agent_bundle;
use crate::symbols::maps::{self, Mapping};
use std::time::Duration;

/// How long a remote `munmap` may take.
const MUNMAP_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether `mapping` maps a tendril agent's file (of any build).
pub fn is_agent_mapping(mapping: &Mapping) -> bool {
    mapping
        .file_name()
        .is_some_and(agent_bundle::is_agent_module)
}

/// Whether the agent mappings `agent` are those of a loaded library: one is executable.
pub fn is_resident(agent: &[&Mapping]) -> bool {
    agent.iter().any(|mapping| mapping.executable)
}

/// Unmaps, on the thread `frame` borrows, what a failed `dlopen` left of the agent in
/// process `pid`. Returns what to add to the failure's message: that nothing stays
/// mapped, or what does and why.
pub fn unmap_leftovers(
    frame: &mut RemoteFrame,
    entry_points: &LoaderEntryPoints,
    pid: i32,
) -> String {
    let leftovers = match maps::read_maps(pid) {
        Ok(maps) => maps,
        Err(e) => return format!("; tendril could not check what stays mapped ({e})"),
    };
    let leftovers: Vec<&Mapping> = leftovers.iter().filter(|m| is_agent_mapping(m)).collect();
    if is_resident(&leftovers) {
        return String::new();
    }
    if leftovers.is_empty() {
        return "; nothing of it stays mapped".into();
    }
    let Some(munmap) = entry_points.munmap else {
        return stays_mapped(&leftovers, "the target's libc has no munmap");
    };
    for mapping in &leftovers {
        let length = mapping.end - mapping.start;
        match frame.call(munmap, &[mapping.start, length], MUNMAP_TIMEOUT) {
            Ok(0) => {}
            Ok(_) => return stays_mapped(&leftovers, "munmap failed"),
            Err(e) => return stays_mapped(&leftovers, &e.to_string()),
        }
    }
    "; nothing of it stays mapped".into()
}

fn stays_mapped(leftovers: &[&Mapping], why: &str) -> String {
    let bytes: u64 = leftovers.iter().map(|m| m.end - m.start).sum();
    format!(
        "; {} KiB of it stay mapped at {:#x}, unused ({why})",
        bytes / 1024,
        leftovers[0].start
    )
}
