//! The controller's side of the control connection to a resident agent.
//!
//! The one idea: the agent answers for a process its user controls, so nothing it says
//! is taken on trust. The socket's listener must be the target process itself
//! (`SO_PEERCRED`, checked before a byte is sent: a user could leave a link to another
//! service's socket at the agent's name); an answer line is at most
//! [`MAX_RESPONSE_BYTES`]; a file descriptor that comes with an answer (the rings, see
//! `tendril_wire`) is handed to the caller to check, never used as it is. Answers are
//! read with `recvmsg`, because a plain read would drop the descriptors.

use nix::sys::socket::{ControlMessageOwned, MsgFlags};
use std::io::{ErrorKind, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
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
/// The longest answer line read from an agent (counters of many threads are the largest).
pub const MAX_RESPONSE_BYTES: usize = 256 << 20;

#[derive(Debug, Error)]
pub enum AgentConnectionError {
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
    #[error(
        "the agent's socket {path} is served by pid {found}, not by process {expected}: it is not this process's agent; remove it and try again"
    )]
    WrongPeer {
        path: String,
        expected: i32,
        found: i32,
    },
}

/// What the agent reported when the connection opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentStatus {
    pub version: String,
    pub threads: usize,
    pub patched: usize,
    /// tendril's own unwinder hooks still waiting to come out after a restore, and why.
    pub pending_restore: usize,
    pub pending_reason: Option<String>,
}

/// An open, greeted control connection.
///
/// A request that fails on the connection (no answer in time, a broken socket) closes
/// it for good: a late answer would otherwise be read as the next request's. The agent
/// takes a closed connection as the controller gone and restores everything it patched.
pub struct AgentConnection {
    stream: UnixStream,
    /// Bytes received after the last answer line (none, from a well-behaved agent).
    pending: Vec<u8>,
    /// Descriptors that came with the last answer.
    received: Vec<OwnedFd>,
    closed: bool,
    /// The failure that closed it was the agent's end going away (a broken pipe, a
    /// reset, the end of the stream): [`AgentConnection::closed_by_agent`] says so.
    peer_went_away: bool,
    pub status: AgentStatus,
    /// What to undo when the connection ends ([`AgentConnection::when_closed`]).
    on_close: Vec<Box<dyn FnOnce() + Send>>,
}

impl Drop for AgentConnection {
    fn drop(&mut self) {
        for action in self.on_close.drain(..) {
            action();
        }
    }
}

impl AgentConnection {
    /// Connects to the socket at `path`, checks that process `pid` (as tendril sees it)
    /// listens on it, and performs the version handshake.
    pub fn open(path: &Path, pid: i32) -> Result<AgentConnection, AgentConnectionError> {
        let stream = UnixStream::connect(path)?;
        let listener =
            nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
                .map_err(std::io::Error::from)?
                .pid();
        if listener != pid {
            return Err(AgentConnectionError::WrongPeer {
                path: path.display().to_string(),
                expected: pid,
                found: listener,
            });
        }
        let mut connection = AgentConnection {
            stream,
            pending: Vec::new(),
            received: Vec::new(),
            closed: false,
            peer_went_away: false,
            on_close: Vec::new(),
            status: AgentStatus {
                version: String::new(),
                threads: 0,
                patched: 0,
                pending_restore: 0,
                pending_reason: None,
            },
        };
        match connection.request(&Request::Hello {
            version: PROTOCOL_VERSION.into(),
        })? {
            Response::Ready {
                version,
                threads,
                patched,
                pending_restore,
                pending_reason,
                ..
            } => {
                connection.status = AgentStatus {
                    version,
                    threads,
                    patched,
                    pending_restore,
                    pending_reason,
                };
                Ok(connection)
            }
            other => Err(AgentConnectionError::Protocol(format!("{other:?}"))),
        }
    }

    /// Sends one request and waits for its response; an agent's refusal is an error.
    pub fn request(&mut self, request: &Request) -> Result<Response, AgentConnectionError> {
        self.request_with_payload(request, &[])
    }

    /// The dynamic loader's counts of libraries added and removed so far in the target.
    pub fn loader_counts(&mut self) -> Result<tendril_wire::LoaderCounts, AgentConnectionError> {
        match self.request(&Request::ReadCounters { ids: Vec::new() })? {
            Response::Counters { loader, .. } => Ok(loader),
            other => Err(AgentConnectionError::Protocol(format!("{other:?}"))),
        }
    }

    /// Sends one request followed by `payload` (the bytes a request says follow it, as
    /// `StartRecording`'s table), and waits for its response.
    pub fn request_with_payload(
        &mut self,
        request: &Request,
        payload: &[u8],
    ) -> Result<Response, AgentConnectionError> {
        if self.closed {
            return Err(AgentConnectionError::Closed);
        }
        self.received.clear();
        let line = self.exchange(request, payload).inspect_err(|error| {
            self.closed = true;
            self.peer_went_away = matches!(
                error,
                AgentConnectionError::Io(io) if matches!(
                    io.kind(),
                    std::io::ErrorKind::BrokenPipe
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::UnexpectedEof
                )
            );
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
        })?;
        match tendril_wire::decode::<Response>(&line) {
            Ok(Response::Error { message }) => Err(AgentConnectionError::Refused(message)),
            Ok(response) => Ok(response),
            Err(e) => Err(AgentConnectionError::Protocol(e.to_string())),
        }
    }

    /// Takes the file descriptor that came with the last answer, if one did.
    pub fn take_received_descriptor(&mut self) -> Option<OwnedFd> {
        self.received.pop()
    }

    /// Runs `action` when the connection ends (it is dropped), after its last request.
    pub fn when_closed(&mut self, action: impl FnOnce() + Send + 'static) {
        self.on_close.push(Box::new(action));
    }

    /// Whether the agent has closed the connection (another tendril's `detach` ended
    /// this session, or the process is gone), without waiting. A connection this side
    /// closed after a failed request is not, unless the failure was the agent's end going away.
    pub fn closed_by_agent(&self) -> bool {
        if self.closed {
            return self.peer_went_away;
        }
        let mut byte = [0u8; 1];
        // An answer never arrives unasked, so anything readable now is the end of the
        // stream, or an error.
        match nix::sys::socket::recv(
            self.stream.as_raw_fd(),
            &mut byte,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(0) => true,
            Ok(_) => false,
            Err(errno) => errno != nix::errno::Errno::EAGAIN,
        }
    }

    /// Writes `request` and its payload and reads one line of answer.
    fn exchange(
        &mut self,
        request: &Request,
        payload: &[u8],
    ) -> Result<Vec<u8>, AgentConnectionError> {
        let timeout = reply_timeout(request);
        self.stream.set_read_timeout(Some(timeout))?;
        let mut message = tendril_wire::encode(request);
        message.extend_from_slice(payload);
        // The agent may have answered and closed before reading the request (it refuses
        // a connection it has no room for): then its answer says why, not the failed write.
        let mut write_error = (&self.stream).write_all(&message).err();
        loop {
            if let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let rest = self.pending.split_off(end + 1);
                return Ok(std::mem::replace(&mut self.pending, rest));
            }
            if self.pending.len() > MAX_RESPONSE_BYTES {
                return Err(AgentConnectionError::Protocol(format!(
                    "an answer longer than {} MiB",
                    MAX_RESPONSE_BYTES >> 20
                )));
            }
            let received = self.receive();
            if let Some(error) = write_error.take() {
                if matches!(received, Ok(n) if n > 0) {
                    write_error = Some(error);
                    continue;
                }
                return Err(error.into());
            }
            match received {
                Ok(0) => return Err(AgentConnectionError::Io(ErrorKind::UnexpectedEof.into())),
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(AgentConnectionError::NoAnswer(timeout));
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Receives what is there (waiting up to the read timeout) into `pending`, and the
    /// descriptors that come with it into `received`; returns the bytes received.
    fn receive(&mut self) -> std::io::Result<usize> {
        let mut chunk = [0u8; 64 * 1024];
        let mut control = nix::cmsg_space!([std::os::fd::RawFd; 4]);
        let mut iov = [std::io::IoSliceMut::new(&mut chunk)];
        let message = nix::sys::socket::recvmsg::<()>(
            self.stream.as_raw_fd(),
            &mut iov,
            Some(&mut control),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        let bytes = message.bytes;
        for cmsg in message.cmsgs()? {
            if let ControlMessageOwned::ScmRights(fds) = cmsg {
                for fd in fds {
                    // SAFETY: the kernel just installed `fd` in this process for this
                    // message; nothing else owns it.
                    self.received.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        self.pending.extend_from_slice(&chunk[..bytes]);
        Ok(bytes)
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
                    module: None,
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
