//! The control layer's global state: every static of `control` in one struct, [`STATE`],
//! with this module as its one owner (see `sys::state` for the pattern).

use std::os::unix::net::UnixStream;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Instant;

/// The control layer's statics.
pub(super) struct ControlState {
    /// Set once the control thread has been started in this process image.
    pub(super) control_started: AtomicBool,
    /// The sessions the agent serves now.
    pub(super) open_sessions: Mutex<Vec<OpenSession>>,
    /// The session recording now (0: none).
    pub(super) recording_session: AtomicU64,
    /// The id the next session gets (ids are never reused).
    pub(super) next_session: AtomicU64,
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

/// The one instance.
pub(super) static STATE: ControlState = ControlState {
    control_started: AtomicBool::new(false),
    open_sessions: Mutex::new(Vec::new()),
    recording_session: AtomicU64::new(0),
    next_session: AtomicU64::new(1),
};
