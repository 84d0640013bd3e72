//! The agent library embedded in this binary, and how a resident agent is recognised.
//!
//! The agent never goes into a file: `inject::agent_memfd` writes these bytes into a
//! memfd the target itself creates, and the target loads it from there. So tendril,
//! often root, writes nothing where the target's user could redirect it (a mount
//! namespace of theirs can put any directory at `/tmp`). In `/proc/PID/maps` the agent
//! shows as `/memfd:libtendril_agent-DIGEST.so (deleted)`; the digest tells two tendril
//! builds' agents apart, since a resident agent cannot be replaced.

include!(concat!(env!("OUT_DIR"), "/agent_bundle.rs"));

/// The name every build of the agent library starts with.
pub const AGENT_LIBRARY_PREFIX: &str = "libtendril_agent";

/// The prefix of a memfd's name in `/proc/PID/maps`.
const MEMFD_PREFIX: &str = "memfd:";

/// Whether a module (by file name) is a tendril agent, of this build or another: its
/// code is tendril's own, and is never instrumented. An agent loaded from a memfd is
/// named `memfd:libtendril_agent-…` (earlier builds loaded it from a file).
pub fn is_agent_module(file_name: &str) -> bool {
    file_name
        .strip_prefix(MEMFD_PREFIX)
        .unwrap_or(file_name)
        .starts_with(AGENT_LIBRARY_PREFIX)
}

/// Whether a module (by file name) is this build's agent.
pub fn is_this_agent(file_name: &str) -> bool {
    file_name.strip_prefix(MEMFD_PREFIX) == Some(agent_file_name().as_str())
}

/// File name of the agent library built into this tendril (the memfd's name).
pub fn agent_file_name() -> String {
    format!("{AGENT_LIBRARY_PREFIX}-{AGENT_DIGEST}.so")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_are_recognised_by_name_whether_from_a_memfd_or_a_file() {
        let this = format!("memfd:{}", agent_file_name());
        assert!(is_agent_module(&this) && is_this_agent(&this));
        assert!(is_agent_module("libtendril_agent-0123.so"));
        assert!(is_agent_module("memfd:libtendril_agent-0123.so"));
        assert!(!is_this_agent("memfd:libtendril_agent-0123.so"));
        assert!(!is_agent_module("memfd:wayland-shm"));
        assert!(!is_agent_module("libc.so.6"));
    }
}
