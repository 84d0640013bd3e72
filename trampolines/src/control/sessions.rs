//! The sessions the agent serves now: who is connected, since when, whether they said
//! hello, and whether they are ending.

use std::os::unix::net::UnixStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Identity of this process as the agent sees it.
pub(super) fn identity() -> (u32, i32) {
    // SAFETY: getuid and getpid cannot fail and have no preconditions.
    unsafe { (libc::getuid(), libc::getpid()) }
}

/// A session the agent serves, with a handle on its connection (to end it).
pub(super) struct OpenSession {
    pub(super) id: u64,
    pub(super) stream: UnixStream,
    /// The connected process, as `SO_PEERCRED` gave it (0 if not visible from here).
    pub(super) peer_pid: i32,
    pub(super) opened: Instant,
    /// The hello handshake completed.
    pub(super) greeted: bool,
    /// Its connection is closed or closing; it is restoring what it patched.
    pub(super) ending: bool,
}

/// The open sessions.
static OPEN_SESSIONS: Mutex<Vec<OpenSession>> = Mutex::new(Vec::new());

/// How long a detach waits for the sessions it ended to restore their code themselves.
pub(super) const SESSION_END_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) fn open_sessions() -> std::sync::MutexGuard<'static, Vec<OpenSession>> {
    OPEN_SESSIONS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(super) fn mark_greeted(session: u64) {
    if let Some(open) = open_sessions().iter_mut().find(|open| open.id == session) {
        open.greeted = true;
    }
}

pub(super) fn mark_ending(session: u64) {
    if let Some(open) = open_sessions().iter_mut().find(|open| open.id == session) {
        open.ending = true;
    }
}

/// A forked child inherits its parent's session list but none of its threads; the
/// connections are its parent's, so it closes its copies without shutting them down.
/// (A list locked at the fork by a thread the child does not have is left alone.)
pub(super) fn forget_inherited_sessions() {
    match OPEN_SESSIONS.try_lock() {
        Ok(mut open) => open.clear(),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner().clear(),
        Err(std::sync::TryLockError::WouldBlock) => {}
    }
}
