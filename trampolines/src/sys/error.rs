//! The agent's one error type: what went wrong, in the one line the controller shows.
//!
//! Every layer returns [`AgentError`]; it lives at the bottom so that each can. Its
//! variants need nothing above `sys`: a patch refusal planned by `code` arrives here as
//! its reason (`code` converts its `Refusal`), and limits known higher up (the most
//! function ids, the trampoline size) are carried as numbers. The wire protocol carries
//! reasons as text: the control layer turns an error into its message with
//! `to_string()` at that boundary, and the messages are the ones users and tests know.
//!
//! Errors are `Clone`, as one reason may answer several requests of a batch (an I/O
//! error is shared behind an `Arc` for that). Building one may allocate, so code that
//! runs while guards are in place only builds the ones it built before (see
//! `patching::stop_world`).

use std::sync::Arc;

/// Why the agent could not do what it was asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AgentError {
    /// A system call or file operation failed while the agent was `doing` something
    /// ("cannot write code", "cannot share the rings").
    #[error("{doing}: {source}")]
    Io {
        doing: String,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A function the agent will not patch, with the reason (a refusal of the entry
    /// planner, a target outside mapped code, tendril's own code, …).
    #[error("{0}")]
    Refused(String),
    /// The function is patched by another session.
    #[error("already instrumented by another tendril session")]
    OwnedByAnotherSession,
    /// The runtime has not handed the patch engine its callbacks (`runtime::install`).
    #[error("the agent's runtime is not installed")]
    RuntimeNotInstalled,
    /// The runtime has not handed the stubs their slow-path handlers.
    #[error("the runtime's hook handlers are not installed")]
    HandlersNotInstalled,
    /// The process's threads could not be stopped (or held with ptrace), so nothing was
    /// written; the text says which and why.
    #[error("{0}")]
    NotStopped(String),
    /// The unwinder's hooks cannot come out yet; the text says what holds them (a
    /// thread inside a hook, one that cannot be stopped).
    #[error("{0}")]
    HooksStillNeeded(String),
    /// A trampoline's code is larger than the room reserved for one.
    #[error("a trampoline needs {needed} bytes, more than the {reserved} reserved")]
    TrampolineTooLarge { needed: usize, reserved: u64 },
    /// A trampoline has no room left for the adapter of an entry with lead pushes.
    #[error("the trampoline has no room for its entry adapter")]
    NoRoomForEntryAdapter,
    /// The address space within a rel32 jump of a function is full.
    #[error("no free address space within ±2 GiB of {near:#x} for a trampoline")]
    NoAddressSpace { near: u64 },
    /// Every function id is taken.
    #[error("more than {max} different functions instrumented in this process")]
    TooManyFunctions { max: usize },
    /// A hook's machine code could not be assembled.
    #[error("cannot assemble a hook: {0}")]
    Assembly(iced_x86::IcedError),
    /// Something the agent needs is missing or unusable (its runtime directory, its
    /// socket's path, memory for its state); the text says what.
    #[error("{0}")]
    Unusable(String),
    /// The controller asked for something the agent does not do now (a second
    /// recording, a table too large); the text says what to do.
    #[error("{0}")]
    Request(String),
}

impl AgentError {
    /// `error` from the system, met while `doing` something.
    pub fn io(doing: impl Into<String>, error: std::io::Error) -> AgentError {
        AgentError::Io {
            doing: doing.into(),
            source: Arc::new(error),
        }
    }

    /// The last system error (`errno`), met while `doing` something.
    pub fn last_os(doing: impl Into<String>) -> AgentError {
        AgentError::io(doing, std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_as_one_line_with_the_cause() {
        let io = AgentError::io(
            "cannot write code",
            std::io::Error::from_raw_os_error(libc::EFAULT),
        );
        assert_eq!(
            io.to_string(),
            "cannot write code: Bad address (os error 14)"
        );
        assert!(std::error::Error::source(&io).is_some());
        assert_eq!(
            AgentError::NoAddressSpace { near: 0x1000 }.to_string(),
            "no free address space within ±2 GiB of 0x1000 for a trampoline"
        );
        assert_eq!(
            AgentError::TooManyFunctions { max: 8 }.to_string(),
            "more than 8 different functions instrumented in this process"
        );
        let refused = AgentError::Refused("its size is unknown".into());
        assert_eq!(refused.clone().to_string(), "its size is unknown");
    }
}
