//! Background jobs: slow calls (loading a process's symbols, attaching and starting a
//! recording, writing a profile file) run on a thread of their own while the UI keeps drawing and reading keys.
//!
//! The one idea: a job is a thread plus a one-shot channel; the event loop asks "done
//! yet?" on every turn and never waits, except when the session ends and the result must
//! be cleaned up (a recorder that finished starting must still be detached, a file
//! being written must be complete).

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::time::Duration;

/// A value being computed on another thread.
pub struct Job<T> {
    result: Receiver<T>,
}

/// What a job has to say at the moment.
pub enum JobState<T> {
    Running,
    Done(T),
    /// The thread panicked before it produced a result.
    Died,
}

impl<T: Send + 'static> Job<T> {
    /// Runs `work` on a new thread named `name`.
    pub fn spawn(name: &str, work: impl FnOnce() -> T + Send + 'static) -> std::io::Result<Job<T>> {
        let (sender, result) = mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let _ = sender.send(work());
            })?;
        Ok(Job { result })
    }

    /// The result if it is there, without waiting.
    pub fn poll(&self) -> JobState<T> {
        match self.result.try_recv() {
            Ok(value) => JobState::Done(value),
            Err(TryRecvError::Empty) => JobState::Running,
            Err(TryRecvError::Disconnected) => JobState::Died,
        }
    }

    /// Waits for the result however long it takes (the thread has then done its work);
    /// `None` if the thread died first.
    pub fn wait_done(self) -> Option<T> {
        self.result.recv().ok()
    }

    /// Waits up to `timeout` for the result.
    pub fn wait(&self, timeout: Duration) -> JobState<T> {
        match self.result.recv_timeout(timeout) {
            Ok(value) => JobState::Done(value),
            Err(RecvTimeoutError::Timeout) => JobState::Running,
            Err(RecvTimeoutError::Disconnected) => JobState::Died,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_reports_running_then_its_result() {
        let (go, wait) = mpsc::channel::<()>();
        let job = Job::spawn("test-job", move || {
            let _ = wait.recv();
            42
        })
        .unwrap();
        assert!(matches!(job.poll(), JobState::Running));
        go.send(()).unwrap();
        assert!(matches!(
            job.wait(Duration::from_secs(10)),
            JobState::Done(42)
        ));
    }

    #[test]
    fn waiting_for_a_job_to_be_done_gives_its_result() {
        let (go, wait) = mpsc::channel::<()>();
        let job = Job::spawn("test-job-done", move || {
            let _ = wait.recv();
            "done"
        })
        .unwrap();
        go.send(()).unwrap();
        assert_eq!(job.wait_done(), Some("done"));
        let died = Job::spawn("test-job-dies", || -> u32 { panic!("on purpose") }).unwrap();
        assert_eq!(died.wait_done(), None);
    }

    #[test]
    fn a_panicking_job_is_reported_as_dead() {
        let job = Job::spawn("test-job-panics", || -> u32 { panic!("on purpose") }).unwrap();
        assert!(matches!(job.wait(Duration::from_secs(10)), JobState::Died));
    }
}
