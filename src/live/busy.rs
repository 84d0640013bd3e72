//! Operations on a live recorder that wait for the agent — pause, resume, new roots,
//! detach — run on a background thread, so the UI keeps drawing and reading keys while
//! the agent patches or restores code (and if the target is stopped, the agent cannot
//! answer at all until its reply times out).
//!
//! The one idea: the recorder is *moved* into the job and comes back with the line to
//! show; until then the session is [`Recording::Busy`] (or [`Recording::Detaching`]) and
//! says so to any key that needs the recorder. A job that dies takes the recorder with
//! it: its connection closes, and the agent restores the code by itself.

use super::job::{Job, JobState};
use super::profiling_state::ProfilingState;
use super::stage::{BusyJob, Recording};
use crate::recording::Recorder;
use tendril_tui::App;

impl ProfilingState {
    /// Runs `operation` on the live recorder in the background, showing `note`
    /// meanwhile; `operation` returns the line to show when it is done. Without a live
    /// recorder, says why nothing happens.
    pub(super) fn run_on_recorder(
        &mut self,
        doing: &'static str,
        note: String,
        operation: impl FnOnce(&mut Recorder) -> String + Send + 'static,
        app: &mut App,
    ) {
        // The snapshot on screen stays until the recorder comes back: the newest one.
        self.refresh(app);
        let Some(recorder) = self.take_live_recorder(app) else {
            return;
        };
        let job = Job::spawn("tendril-recorder", move || {
            let mut recorder = recorder;
            let message = operation(&mut recorder);
            (recorder, message)
        });
        match job {
            Ok(job) => {
                self.recording = Recording::Busy(BusyJob { job, doing });
                app.set_message(note);
            }
            // No thread to be had (the recorder went with the closure): the agent
            // restores the code by itself when the connection closes.
            Err(error) => self.lost_recorder(format!("cannot go on: {error}"), app),
        }
    }

    /// Detaches in the background: restores the target's code, then shows the final
    /// profile with `message`.
    pub(super) fn detach_in_background(&mut self, note: &str, message: String, app: &mut App) {
        let Some(recorder) = self.take_live_recorder(app) else {
            return;
        };
        let job = Job::spawn("tendril-detach", move || (recorder.finish(false), message));
        match job {
            Ok(job) => {
                self.recording = Recording::Detaching(job);
                app.set_message(note);
            }
            Err(error) => self.lost_recorder(format!("cannot detach cleanly: {error}"), app),
        }
    }

    /// Takes the live recorder out of the session, to hand to a job; without one, says
    /// why nothing happens.
    fn take_live_recorder(&mut self, app: &mut App) -> Option<Box<Recorder>> {
        match std::mem::replace(&mut self.recording, Recording::NotStarted) {
            Recording::Live(recorder) => Some(recorder),
            other => {
                app.set_message(other.not_live_note());
                self.recording = other;
                None
            }
        }
    }

    /// Picks up a finished background operation on the recorder.
    pub(super) fn check_busy(&mut self, app: &mut App) {
        match &self.recording {
            Recording::Busy(busy) => match busy.job.poll() {
                JobState::Running => {}
                JobState::Done((recorder, message)) => {
                    self.recording = Recording::Live(recorder);
                    self.rate.clear();
                    app.set_message(message);
                    self.refresh(app);
                }
                JobState::Died => {
                    let doing = busy.doing;
                    self.lost_recorder(format!("{doing} crashed"), app);
                }
            },
            Recording::Detaching(job) => match job.poll() {
                JobState::Running => {}
                JobState::Done((finished, message)) => self.end_with(finished, message, app),
                JobState::Died => self.lost_recorder("detaching crashed".into(), app),
            },
            _ => {}
        }
    }

    /// The recorder is gone with a job that died: its connection closed, so the agent
    /// restores the code by itself. The last snapshot stays on screen.
    fn lost_recorder(&mut self, what: String, app: &mut App) {
        let mut snapshot = app.snapshot().clone();
        snapshot.status.detached = true;
        app.update_snapshot(snapshot);
        app.set_message(format!(
            "{what}; the agent restores the target's code by itself"
        ));
        self.recording = Recording::NotStarted;
        self.target_gone = true;
    }

    /// Waits for a background operation on the recorder, however long it takes (the
    /// agent's replies have time limits), and gives the recorder back; `None` if the
    /// job died with it (the agent then restores the code by itself).
    pub(super) fn wait_for_recorder(
        busy: BusyJob,
        progress: &mut dyn FnMut(&str),
    ) -> Option<Box<Recorder>> {
        progress(&format!("waiting for {} to finish…", busy.doing));
        busy.job.wait_done().map(|(recorder, _)| recorder)
    }
}
