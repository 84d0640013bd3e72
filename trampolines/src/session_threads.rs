//! The threads that serve control sessions: started when needed, never ended.
//!
//! The one idea: glibc ends a thread with every signal blocked while it runs libc
//! functions (`madvise`, `free`...), and a thread that meets a patch's transient `int3`
//! with SIGTRAP blocked ends the whole process. The agent cannot hold off a thread's
//! end while another session patches, so its threads do not end: a thread whose
//! session is over waits for the next one. Starting a thread waits for code changes
//! to finish (`threads::spawn_agent_thread`).

use crate::threads;
use std::sync::Mutex;
use std::sync::mpsc::{self, Receiver, Sender};

/// A unit of work for a session thread.
type Job = Box<dyn FnOnce() + Send>;

/// The idle threads, each waiting on its own channel.
static IDLE: Mutex<Vec<Sender<Job>>> = Mutex::new(Vec::new());

/// Runs `job` on an idle session thread, or on a new one if none is idle.
pub fn run(job: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    let mut job: Job = Box::new(job);
    loop {
        let idle = IDLE
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop();
        let Some(thread) = idle else { break };
        match thread.send(job) {
            Ok(()) => return Ok(()),
            // Cannot happen (the thread keeps its own sender), but the job is not lost.
            Err(mpsc::SendError(returned)) => job = returned,
        }
    }
    let (sender, receiver) = mpsc::channel();
    let own = sender.clone();
    let _ = sender.send(job);
    threads::spawn_agent_thread("session", threads::Start::BetweenCodeChanges, move || {
        serve(own, receiver)
    })
}

/// Runs jobs as they come, saying it is idle after each.
fn serve(own: Sender<Job>, jobs: Receiver<Job>) {
    // `own` keeps the channel open, so this waits for good between jobs.
    while let Ok(job) = jobs.recv() {
        // A job that panics must not end the thread either.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        IDLE.lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(own.clone());
    }
}
