//! The threads that serve control sessions: one per session, ended when it ends.
//!
//! The one idea: glibc ends a thread with every signal blocked while it runs libc
//! functions (`madvise`, `free`...), and the patcher, which leaves the agent's own
//! threads out when it stops the target's, must never change code an agent thread is
//! running. So a session thread whose work is done
//! does not simply return: it says so (through an eventfd the control thread polls) and
//! waits. The control thread, which never ends, takes `agent_threads::code_change()` — no
//! patch goes in or out meanwhile — lets the thread go, joins it (the kernel has then
//! ended it), and only then lets code change again. Starting a thread waits for code
//! changes to finish too (`threads::spawn_agent_thread`).

use crate::runtime::threads;
use crate::sys::agent_threads;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The live session threads, owned by the control thread.
pub struct SessionThreads {
    live: Vec<SessionThread>,
    finished: Arc<FinishedSignal>,
}

/// One session's thread, from its start until it is joined.
struct SessionThread {
    session: u64,
    /// Set by the thread when its work is done; it then waits for `release`.
    done: Arc<AtomicBool>,
    release: Sender<()>,
    handle: JoinHandle<()>,
}

/// An eventfd that session threads signal when their work is done.
struct FinishedSignal(OwnedFd);

impl FinishedSignal {
    fn new() -> io::Result<FinishedSignal> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new fd we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        Ok(FinishedSignal(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn notify(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd this struct owns.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Resets the count, so the next poll waits for a new signal.
    fn clear(&self) {
        let mut count = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from a non-blocking eventfd we own.
        unsafe { libc::read(self.0.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
    }
}

impl SessionThreads {
    pub fn new() -> io::Result<SessionThreads> {
        Ok(SessionThreads {
            live: Vec::new(),
            finished: Arc::new(FinishedSignal::new()?),
        })
    }

    /// A file descriptor that becomes readable when a session thread's work is done
    /// (then call [`SessionThreads::reap`]).
    pub fn finished_fd(&self) -> RawFd {
        self.finished.0.as_raw_fd()
    }

    /// The number of session threads that have not been joined yet.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// The sessions whose threads have not been joined yet.
    pub fn sessions(&self) -> impl Iterator<Item = u64> + '_ {
        self.live.iter().map(|thread| thread.session)
    }

    /// Runs `job` for `session` on a new agent thread, started between code changes.
    pub fn start(&mut self, session: u64, job: impl FnOnce() + Send + 'static) -> io::Result<()> {
        self.start_named("session", session, job)
    }

    /// [`SessionThreads::start`], the thread named `name` (after the agent's prefix).
    pub fn start_named(
        &mut self,
        name: &str,
        session: u64,
        job: impl FnOnce() + Send + 'static,
    ) -> io::Result<()> {
        let done = Arc::new(AtomicBool::new(false));
        let (release, released) = mpsc::channel::<()>();
        let finished = Arc::clone(&self.finished);
        let done_in_thread = Arc::clone(&done);
        let handle =
            threads::spawn_agent_thread(name, threads::Start::BetweenCodeChanges, move || {
                // A job that panics must not skip the safe end below.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                done_in_thread.store(true, Ordering::Release);
                finished.notify();
                // The control thread sends this while it holds `code_change()`; an error
                // means it is gone, and waiting longer would change nothing.
                let _ = released.recv();
            })?;
        self.live.push(SessionThread {
            session,
            done,
            release,
            handle,
        });
        Ok(())
    }

    /// Ends and joins the threads whose work is done, while no code can change; returns
    /// how many it joined.
    pub fn reap(&mut self) -> usize {
        self.finished.clear();
        let (done, running): (Vec<SessionThread>, Vec<SessionThread>) =
            std::mem::take(&mut self.live)
                .into_iter()
                .partition(|thread| thread.done.load(Ordering::Acquire));
        self.live = running;
        if done.is_empty() {
            return 0;
        }
        let joined = done.len();
        let _no_code_change = agent_threads::code_change();
        for thread in done {
            let _ = thread.release.send(());
            // Returns once the kernel has ended the thread: it runs no more code.
            let _ = thread.handle.join();
        }
        joined
    }

    /// Waits up to `timeout` for some session thread to finish its work, and joins the
    /// finished ones; returns how many it joined.
    pub fn wait_for_one_to_end(&mut self, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            let joined = self.reap();
            let left = deadline.saturating_duration_since(Instant::now());
            if joined > 0 || left.is_zero() || self.live.is_empty() {
                return joined;
            }
            let mut finished = libc::pollfd {
                fd: self.finished_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: polls one valid pollfd for at most `left` milliseconds.
            unsafe { libc::poll(&mut finished, 1, left.as_millis().max(1) as libc::c_int) };
        }
    }
}
