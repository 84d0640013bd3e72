//! How a profiling state ends: an attach in progress waited for, the target detached
//! (its code restored), a profile being saved finished; and the same when it is
//! dropped, a panic unwinding included.

use super::*;

impl ProfilingState {
    /// Ends the session: waits for an attach in progress, however long it takes, and
    /// detaches from the target (restoring its code); then waits for a profile being
    /// saved. `progress` is told what is being waited for (the UI draws it as a note).
    /// Returns a line for the user, if there is something to say.
    pub fn shutdown(&mut self, progress: &mut dyn FnMut(&str)) -> anyhow::Result<Option<String>> {
        let detached = self.detach_for_good(progress);
        let saved = self.saving.take().map(|job| {
            progress("finishing the profile being saved…");
            match job.wait_done() {
                Some(saved) => save_message(saved),
                None => "saving the profile crashed".to_string(),
            }
        });
        let detached = detached?;
        Ok(match (detached, saved) {
            (Some(detached), Some(saved)) => Some(format!("{detached}; {saved}")),
            (detached, saved) => detached.or(saved),
        })
    }

    fn detach_for_good(
        &mut self,
        progress: &mut dyn FnMut(&str),
    ) -> anyhow::Result<Option<String>> {
        let recorder = match std::mem::replace(&mut self.recording, Recording::NotStarted) {
            Recording::Live(recorder) => *recorder,
            Recording::Starting(job) => match self.wait_for_attach(job, progress) {
                Ok(recorder) => recorder,
                Err(note) => return Ok(Some(note)),
            },
            Recording::Busy(busy) => match ProfilingState::wait_for_recorder(busy, progress) {
                Some(recorder) => *recorder,
                None => return Ok(None),
            },
            Recording::Detaching(job) => {
                progress(DETACHING_NOTE);
                return match job.wait_done() {
                    Some((Ok(_), _)) => Ok(Some(self.detached_note())),
                    // A target that exited meanwhile has nothing left to restore.
                    Some((Err(_), _)) if self.pid.is_some_and(process::is_gone_or_exiting) => {
                        Ok(None)
                    }
                    Some((Err(error), _)) => Err(error.into()),
                    None => Ok(None),
                };
            }
            other => {
                self.recording = other;
                return Ok(None);
            }
        };
        progress(DETACHING_NOTE);
        let target_gone = self.target_gone || self.pid.is_some_and(process::is_gone_or_exiting);
        recorder.finish(target_gone)?;
        Ok((!target_gone).then(|| self.detached_note()))
    }

    fn detached_note(&self) -> String {
        format!(
            "detached from {}: its code is restored and it keeps running",
            self.target
        )
    }

    /// Waits until the attach job is done: an attach is ptrace calls and a remote
    /// `dlopen` on one of the target's threads, and ending tendril in the middle would
    /// leave that thread with borrowed registers. The attach has time limits of its own.
    /// A failed attach gives the line to tell the user instead.
    fn wait_for_attach(
        &self,
        job: Job<Result<Recorder, RecordError>>,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Recorder, String> {
        let began = Instant::now();
        loop {
            progress(&format!(
                "waiting for the attach to {} to finish, to detach from it ({} s)…",
                self.target,
                began.elapsed().as_secs()
            ));
            match job.wait(ATTACH_NOTE_INTERVAL) {
                JobState::Running => {}
                JobState::Done(Ok(recorder)) => return Ok(recorder),
                // A failed attach leaves the target as it was.
                JobState::Done(Err(error)) => {
                    return Err(format!("{} was not profiled: {error}", self.target));
                }
                JobState::Died => return Err(format!("attaching to {} crashed", self.target)),
            }
        }
    }
}

impl Drop for ProfilingState {
    /// The last resort (a panic unwinding through the UI, or an early return): wait for
    /// an attach in progress and detach all the same. The terminal is given back by
    /// then, so the first note goes to stderr.
    fn drop(&mut self) {
        if matches!(
            self.recording,
            Recording::Live(_)
                | Recording::Starting(_)
                | Recording::Busy(_)
                | Recording::Detaching(_)
        ) || self.saving.is_some()
        {
            let mut told = false;
            let _ = self.shutdown(&mut |note| {
                if !std::mem::replace(&mut told, true) {
                    say!("{note}");
                }
            });
        }
    }
}
