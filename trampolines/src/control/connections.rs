//! The connections the agent serves now, one session each: who is connected, since when,
//! whether they said hello, and whether they are ending; and who this process is (its
//! uid and pid, and the uid that names its runtime directory).

pub(super) use super::state::OpenSession;
use super::state::STATE;
use std::time::Duration;

/// Identity of this process as the agent sees it.
pub(super) fn identity() -> (u32, i32) {
    // SAFETY: getuid and getpid cannot fail and have no preconditions.
    unsafe { (libc::getuid(), libc::getpid()) }
}

/// The uid that names this process's runtime directory and socket: its uid as the
/// user namespace above sees it (the uid itself outside user namespaces). A process
/// that is root inside a user namespace of user 1001's (a rootless container, `unshare
/// -Ur`) then keeps to `/tmp/tendril-1001`, the name the controller looks for, and
/// never takes root's own `/tmp/tendril-0`.
pub(super) fn name_uid() -> u32 {
    let (uid, _) = identity();
    let map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    map.lines()
        .find_map(|line| {
            let mut fields = line.split_whitespace().map(|f| f.parse::<u64>().ok());
            let (inside, outside, count) = (fields.next()??, fields.next()??, fields.next()??);
            let uid = u64::from(uid);
            (inside..inside.saturating_add(count))
                .contains(&uid)
                .then(|| (outside + (uid - inside)) as u32)
        })
        .unwrap_or(uid)
}

/// How long a detach waits for the sessions it ended to restore their code themselves.
pub(super) const SESSION_END_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) fn open_sessions() -> std::sync::MutexGuard<'static, Vec<OpenSession>> {
    STATE
        .open_sessions
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
    match STATE.open_sessions.try_lock() {
        Ok(mut open) => open.clear(),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner().clear(),
        Err(std::sync::TryLockError::WouldBlock) => {}
    }
}
