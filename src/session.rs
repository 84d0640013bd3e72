//! The controller's side of the control connection to a resident agent.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;
use tendril_wire::{PROTOCOL_VERSION, Request, Response};
use thiserror::Error;

/// How long the agent may take to answer one request.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Error)]
pub enum SessionError {
    #[error("lost the connection to the agent: {0}")]
    Io(#[from] std::io::Error),
    #[error("the agent sent a message this tendril does not understand: {0}")]
    Protocol(String),
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
pub struct AgentSession {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    pub status: AgentStatus,
}

impl AgentSession {
    /// Connects to the socket at `path` and performs the version handshake.
    pub fn open(path: &Path) -> Result<AgentSession, SessionError> {
        let stream = UnixStream::connect(path)?;
        stream.set_read_timeout(Some(REPLY_TIMEOUT))?;
        let writer = stream.try_clone()?;
        let mut session = AgentSession {
            reader: BufReader::new(stream),
            writer,
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
        self.writer.write_all(&tendril_wire::encode(request))?;
        let mut line = Vec::new();
        if self.reader.read_until(b'\n', &mut line)? == 0 {
            return Err(SessionError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        match tendril_wire::decode::<Response>(&line) {
            Ok(Response::Error { message }) => Err(SessionError::Refused(message)),
            Ok(response) => Ok(response),
            Err(e) => Err(SessionError::Protocol(e.to_string())),
        }
    }
}
