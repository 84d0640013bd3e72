//! The contract between the tendril controller and the agent it injects.
//!
//! Both sides link this crate, so the control protocol, the version check and the
//! runtime-directory conventions are written exactly once. The control channel is a Unix
//! stream socket carrying one JSON message per line: the controller sends a [`Request`],
//! the agent answers with exactly one [`Response`]. Control traffic is rare and small;
//! the hot event path (later) goes through shared-memory rings, not through here.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Version of the wire protocol and agent. A controller only talks to an agent of the
/// same version: a resident agent cannot be replaced inside a running process.
pub const PROTOCOL_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "+wire1");

/// A message from the controller to the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum Request {
    /// First message of every connection: says which protocol the controller speaks.
    Hello { version: String },
    /// Restore every byte the agent has patched, in every session.
    Detach,
}

/// A message from the agent to the controller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "response", rename_all = "snake_case")]
pub enum Response {
    /// Answer to [`Request::Hello`] when the versions match.
    Ready {
        version: String,
        /// The target's pid as the agent sees it (its own pid namespace).
        pid: i32,
        /// Threads of the target, not counting the agent's own threads.
        threads: usize,
        /// Functions currently patched.
        patched: usize,
    },
    /// Answer to [`Request::Detach`]: how many functions were restored.
    Detached { restored: usize },
    /// The request was refused; the message says why and what to do.
    Error { message: String },
}

/// The per-user private runtime directory, as a path inside the target's mount
/// namespace. The directory is created with mode 0700 and owned by `uid`; the agent
/// refuses to listen in it otherwise.
pub fn runtime_dir(uid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/tendril-{uid}"))
}

/// The agent's control socket for the process whose pid (in its own pid namespace) is
/// `pid`, as a path inside the target's mount namespace.
pub fn control_socket_path(uid: u32, pid: i32) -> PathBuf {
    runtime_dir(uid).join(format!("agent-{pid}.sock"))
}

/// Where the agent writes the reason it could not start, so the controller can report it.
pub fn agent_error_path(uid: u32, pid: i32) -> PathBuf {
    runtime_dir(uid).join(format!("agent-{pid}.err"))
}

/// Encode one message as a single JSON line (with the trailing newline).
pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    let mut line = serde_json::to_vec(message).expect("wire messages always serialise");
    line.push(b'\n');
    line
}

/// Decode one JSON line (with or without its trailing newline).
pub fn decode<'a, T: Deserialize<'a>>(line: &'a [u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(line.trim_ascii_end())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_as_single_lines() {
        let request = Request::Hello {
            version: PROTOCOL_VERSION.into(),
        };
        let line = encode(&request);
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(decode::<Request>(&line).unwrap(), request);

        let response = Response::Ready {
            version: "v".into(),
            pid: 7,
            threads: 3,
            patched: 0,
        };
        assert_eq!(decode::<Response>(&encode(&response)).unwrap(), response);
    }

    #[test]
    fn paths_are_per_user_and_per_pid() {
        assert_eq!(
            control_socket_path(1000, 42),
            PathBuf::from("/tmp/tendril-1000/agent-42.sock")
        );
        assert_ne!(runtime_dir(0), runtime_dir(1000));
    }
}
