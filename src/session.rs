//! The controller's side of the control connection to a resident agent.

use nix::sys::socket::MsgFlags;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;
use tendril_wire::{PROTOCOL_VERSION, Request, Response};
use thiserror::Error;

/// How long the agent may take to answer one request, plus [`PER_FUNCTION`] for each
/// function a request patches or restores.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// The time one function of a patch or restore request may add to [`REPLY_TIMEOUT`]:
/// planning, building and writing a patch takes microseconds, but on a machine loaded
/// by others the agent's thread may get a small share of a core, and a legitimate
/// batch of thousands of functions (`libc.so.6:*`) must not be cut off.
const PER_FUNCTION: Duration = Duration::from_millis(5);

#[derive(Debug, Error)]
pub enum SessionError {
    #[error("lost the connection to the agent: {0}")]
    Io(#[from] std::io::Error),
    #[error("the agent sent a message this tendril does not understand: {0}")]
    Protocol(String),
    #[error(
        "the agent did not answer within {} s (is the target stopped?); the connection is closed, and the agent restores the target's code when it runs again",
        .0.as_secs()
    )]
    NoAnswer(Duration),
    #[error("the connection to the agent was closed after an earlier failure")]
    Closed,
    #[error("{0}")]
    Refused(String),
}

/// What the agent reported when the session opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentStatus {
    pub version: String,
    pub threads: usize,
    pub patched: usize,
}

/// An open, greeted control connection.
///
/// A request that fails on the connection (no answer in time, a broken socket) closes
/// it for good: a late answer would otherwise be read as the next request's. The agent
/// takes a closed connection as the controller gone and restores everything it patched.
pub struct AgentSession {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    closed: bool,
    pub status: AgentStatus,
}

impl AgentSession {
    /// Connects to the socket at `path` and performs the version handshake.
    pub fn open(path: &Path) -> Result<AgentSession, SessionError> {
        let stream = UnixStream::connect(path)?;
        let writer = stream.try_clone()?;
        let mut session = AgentSession {
            reader: BufReader::new(stream),
            writer,
            closed: false,
            status: AgentStatus {
                version: String::new(),
                threads: 0,
                patched: 0,
            },
        };
        match session.request(&Request::Hello {
            version: PROTOCOL_VERSION.into(),
        })? {
            Response::Ready {
                version,
                threads,
                patched,
                ..
            } => {
                session.status = AgentStatus {
                    version,
                    threads,
                    patched,
                };
                Ok(session)
            }
            other => Err(SessionError::Protocol(format!("{other:?}"))),
        }
    }

    /// Sends one request and waits for its response; an agent's refusal is an error.
    pub fn request(&mut self, request: &Request) -> Result<Response, SessionError> {
        if self.closed {
            return Err(SessionError::Closed);
        }
        let line = self.exchange(request).inspect_err(|_| {
            self.closed = true;
            let _ = self.writer.shutdown(std::net::Shutdown::Both);
        })?;
        match tendril_wire::decode::<Response>(&line) {
            Ok(Response::Error { message }) => Err(SessionError::Refused(message)),
            Ok(response) => Ok(response),
            Err(e) => Err(SessionError::Protocol(e.to_string())),
        }
    }

    /// Whether the agent has closed the connection (another tendril's `detach` ended
    /// this session, or the process is gone), without waiting. A connection this side
    /// closed after a failed request is not: that failure was reported already.
    pub fn closed_by_agent(&self) -> bool {
        if self.closed {
            return false;
        }
        let mut byte = [0u8; 1];
        // An answer never arrives unasked, so anything readable now is the end of the
        // stream, or an error.
        match nix::sys::socket::recv(
            self.writer.as_raw_fd(),
            &mut byte,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(0) => true,
            Ok(_) => false,
            Err(errno) => errno != nix::errno::Errno::EAGAIN,
        }
    }

    /// Writes `request` and reads one line of answer.
    fn exchange(&mut self, request: &Request) -> Result<Vec<u8>, SessionError> {
        let timeout = reply_timeout(request);
        self.reader.get_ref().set_read_timeout(Some(timeout))?;
        let mut line = Vec::new();
        if let Err(error) = self.writer.write_all(&tendril_wire::encode(request)) {
            // The agent may have answered and closed before reading the request (it
            // refuses a connection it has no room for): that answer says why.
            return match self.reader.read_until(b'\n', &mut line) {
                Ok(_) if line.ends_with(b"\n") => Ok(line),
                _ => Err(error.into()),
            };
        }
        match self.reader.read_until(b'\n', &mut line) {
            Ok(0) => Err(SessionError::Io(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(_) => Ok(line),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                Err(SessionError::NoAnswer(timeout))
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// How long the agent may take to answer `request`: longer for a request that patches
/// or restores many functions.
fn reply_timeout(request: &Request) -> Duration {
    let functions = match request {
        Request::Patch { targets, .. } => targets.len(),
        Request::Unpatch { addresses } => addresses.len(),
        _ => 0,
    };
    REPLY_TIMEOUT + PER_FUNCTION * u32::try_from(functions).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tendril_wire::{Hook, PatchTarget};

    #[test]
    fn big_batches_get_more_time() {
        let patch = |n: u64| Request::Patch {
            targets: (0..n)
                .map(|address| PatchTarget {
                    address,
                    size: 16,
                    hook: Hook::Count,
                })
                .collect(),
            code_ranges: Vec::new(),
        };
        assert_eq!(reply_timeout(&Request::StopRecording), REPLY_TIMEOUT);
        assert_eq!(reply_timeout(&patch(1)), REPLY_TIMEOUT + PER_FUNCTION);
        assert_eq!(
            reply_timeout(&patch(4000)),
            REPLY_TIMEOUT + Duration::from_secs(20)
        );
        let unpatch = Request::Unpatch {
            addresses: vec![0; 4000],
        };
        assert_eq!(reply_timeout(&unpatch), reply_timeout(&patch(4000)));
    }
}
