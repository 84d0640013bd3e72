//! The control socket the agent listens on, kept reachable for the life of the process.
//!
//! The one idea: the socket is a file in `/tmp`, and a file can be deleted (a `/tmp`
//! cleaner, a user tidying up) while the agent runs; a deleted socket still accepts
//! nothing new, so the agent would be out of reach for good. The control thread checks
//! regularly that the socket's path still names the socket it bound (same device and
//! inode) and, if not, binds a new one there — recreating the private runtime directory
//! if it is gone. The agent makes that directory itself, as the target's user.

use crate::sys::error::AgentError;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

/// A bound, listening control socket and the file that names it.
pub struct ControlListener {
    listener: UnixListener,
    path: PathBuf,
    /// (device, inode) of the socket file this listener bound.
    file: (u64, u64),
}

impl ControlListener {
    /// Binds the control socket of this process (uid and pid as the agent sees them),
    /// replacing whatever file has its name: a socket left there by an earlier process
    /// that had this pid is stale, nothing listens on it.
    /// `uid` names the directory (see `connections::name_uid`); the directory must be
    /// this process's own (owned by its uid as it sees it). The runtime directory is
    /// made here if it is missing: the agent runs as the target's user, in the target's
    /// mount namespace, so it can make only what that user can (tendril, often root,
    /// makes nothing there).
    pub fn bind(uid: u32, pid: i32) -> Result<ControlListener, AgentError> {
        let dir = tendril_wire::runtime_dir(uid);
        make_private_dir(&dir);
        let meta = std::fs::symlink_metadata(&dir).map_err(|e| {
            AgentError::io(
                format!("runtime directory {} is unusable", dir.display()),
                e,
            )
        })?;
        // SAFETY: getuid cannot fail and has no preconditions.
        let own = unsafe { libc::getuid() };
        if !meta.is_dir() || meta.uid() != own || meta.permissions().mode() & 0o777 != 0o700 {
            return Err(AgentError::Unusable(format!(
                "runtime directory {} must be a directory of this process's user with mode 0700",
                dir.display()
            )));
        }
        let path = tendril_wire::control_socket_path(uid, pid);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(AgentError::Unusable(format!(
                    "{} is taken by something that cannot be removed ({e})",
                    path.display()
                )));
            }
        }
        let listener = UnixListener::bind(&path)
            .map_err(|e| AgentError::io(format!("cannot listen on {}", path.display()), e))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| AgentError::io(format!("cannot restrict {}", path.display()), e))?;
        // The control thread polls the socket and accepts only what is waiting.
        listener
            .set_nonblocking(true)
            .map_err(|e| AgentError::io(format!("cannot configure {}", path.display()), e))?;
        let meta = std::fs::symlink_metadata(&path)
            .map_err(|e| AgentError::io(format!("cannot inspect {}", path.display()), e))?;
        let _ = std::fs::remove_file(tendril_wire::agent_error_path(uid, pid));
        Ok(ControlListener {
            listener,
            path,
            file: (meta.dev(), meta.ino()),
        })
    }

    /// The listening socket's file descriptor, for `poll`.
    pub fn fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }

    /// The next waiting connection, if any (the socket is non-blocking).
    pub fn accept(&self) -> Option<UnixStream> {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => return Some(stream),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // WouldBlock: nothing is waiting. Any other error (the peer gave up
                // before the accept, no file descriptors left) ends this round too.
                Err(_) => return None,
            }
        }
    }

    /// Whether the socket's path still names the socket this listener bound.
    pub fn is_reachable(&self) -> bool {
        std::fs::symlink_metadata(&self.path)
            .is_ok_and(|meta| meta.file_type().is_socket() && (meta.dev(), meta.ino()) == self.file)
    }

    /// Binds the socket again if its file was deleted or replaced; the old listener is
    /// closed once the new one listens. The runtime directory is recreated (private,
    /// this uid's) if it is gone. An error leaves this listener as it was.
    pub fn rebind_if_unreachable(&mut self, uid: u32, pid: i32) -> Result<(), AgentError> {
        if self.is_reachable() {
            return Ok(());
        }
        *self = ControlListener::bind(uid, pid)?;
        Ok(())
    }
}

/// Makes `dir` (mode 0700) if nothing is there; fails harmlessly if someone made it
/// meanwhile (`bind` checks what is there).
fn make_private_dir(dir: &std::path::Path) {
    if std::fs::symlink_metadata(dir).is_err()
        && std::fs::DirBuilder::new().mode(0o700).create(dir).is_ok()
    {
        // The process's umask may have taken bits off.
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    }
}
