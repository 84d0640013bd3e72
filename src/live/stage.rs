//! The recording's stage in a live session, from "nothing chosen yet" to "detached,
//! data kept", and the background jobs that hold the recorder meanwhile.
//!
//! The one idea: the recorder lives in exactly one place — the session's stage, or a
//! job it was moved into (`busy`) — so this state sits below both the session that
//! holds it and the background operations that take the recorder out and put it back.

use super::job::Job;
use crate::profile::Profile;
use crate::recording::{Finished, RecordError, Recorder};

/// The recording's stage.
pub(super) enum Recording {
    /// No recording yet: a process or a root is being chosen.
    NotStarted,
    /// Attaching and instrumenting the roots, on a background thread.
    Starting(Job<Result<Recorder, RecordError>>),
    Live(Box<Recorder>),
    /// Pausing, resuming or changing the roots, on a background thread.
    Busy(BusyJob),
    /// Detaching (the code being restored), on a background thread.
    Detaching(DetachJob),
    /// Detached, or the target exited: the final profile stays browsable and saveable.
    Ended(Box<Profile>),
    /// A saved profile (`tendril view`).
    Saved,
}

/// An operation on the recorder in the background: the recorder comes back with the
/// line to show.
pub(super) struct BusyJob {
    pub(super) job: Job<(Box<Recorder>, String)>,
    /// What is being done ("pausing"), for keys pressed meanwhile.
    pub(super) doing: &'static str,
}

/// A detach in the background: the final profile (or why there is none), and the
/// line to show.
pub(super) type DetachJob = Job<(Result<Finished, RecordError>, String)>;

impl Recording {
    /// Why an action that needs the live recorder cannot run now.
    pub(super) fn not_live_note(&self) -> String {
        match self {
            Recording::Busy(busy) => format!("still {}; try again in a moment", busy.doing),
            Recording::Detaching(_) => "still detaching; the data stays once it is done".into(),
            Recording::Starting(_) => "still attaching; try again in a moment".into(),
            Recording::Ended(_) | Recording::Saved => {
                "the target is detached: there is nothing to change".into()
            }
            Recording::NotStarted | Recording::Live(_) => "nothing is being recorded yet".into(),
        }
    }
}
