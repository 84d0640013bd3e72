//! The terminal's input, read on a thread of its own, which never spins.
//!
//! The one idea: crossterm is only asked to read when the terminal has something to
//! read, or for the events it has read already. crossterm's reader loops forever, at full speed, on a terminal that went away
//! (its reads return end-of-file or EIO, and it retries them), and it holds its lock
//! while it does. So the input thread first waits with `poll(2)` for the terminal to be
//! readable; when poll reports a hang-up (the window closed, the tmux server killed, the
//! pty's other end closed — with or without a SIGHUP reaching tendril), the thread
//! notes it and ends instead of calling crossterm. The event loop only waits on a
//! channel with a timeout, sees [`Input::terminal_gone`], and ends the session as if the
//! user quit — detaching from the target. crossterm is built with its `use-dev-tty`
//! source, which polls level-triggered: its default (mio, edge-triggered) returned a
//! resize and dropped the terminal's readiness reported with it, so a key typed after
//! a resize waited for the next key. (What remains: a hang-up in the microseconds
//! between poll's answer and crossterm's read still sets crossterm spinning, on this
//! thread only; the event loop notices the terminal is gone all the same.)

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use std::fs::File;
use std::io::IsTerminal;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::time::Duration;
use tendril_tui::crossterm::event::{self, Event};

/// How often (in milliseconds) the input thread wakes while nothing is typed, to see
/// whether it is still wanted.
const IDLE_POLL_MS: u16 = 250;

/// How long crossterm is given to hand out the events it holds already.
const BUFFERED_LOOK: Duration = Duration::from_millis(1);

/// Terminal events as they come.
pub struct Input {
    events: Receiver<std::io::Result<Event>>,
    /// Set by the input thread when the terminal hung up.
    hung_up: Arc<AtomicBool>,
    /// Set when the event loop no longer wants input: the thread ends.
    stop: Arc<AtomicBool>,
    /// Where the input is read from.
    terminal: Arc<InputTerminal>,
}

impl Input {
    /// Starts reading the terminal (which must be set up for the UI already).
    pub fn start() -> std::io::Result<Input> {
        let terminal = Arc::new(InputTerminal::open()?);
        let thread_terminal = terminal.clone();
        let (sender, events) = mpsc::channel();
        let hung_up = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (thread_hung_up, thread_stop) = (hung_up.clone(), stop.clone());
        std::thread::Builder::new()
            .name("tendril-input".into())
            .spawn(move || {
                // crossterm reads all the bytes there are and hands out one event at a
                // time: after a read, more events may wait in crossterm, not in the fd.
                let mut maybe_buffered = false;
                while !thread_stop.load(Ordering::SeqCst) {
                    let wait = if maybe_buffered { 0 } else { IDLE_POLL_MS };
                    let event = match wait_readable(thread_terminal.fd(), wait) {
                        Readiness::HungUp => {
                            thread_hung_up.store(true, Ordering::SeqCst);
                            return;
                        }
                        Readiness::Readable => event::read(),
                        // Nothing in the fd (and no hang-up): crossterm only looks at
                        // what it holds already. (Its poll with a zero timeout does not
                        // look even there: it is given the shortest one that does.)
                        Readiness::Idle if maybe_buffered => match event::poll(BUFFERED_LOOK) {
                            Ok(true) => event::read(),
                            Ok(false) => {
                                maybe_buffered = false;
                                continue;
                            }
                            Err(error) => Err(error),
                        },
                        Readiness::Idle => continue,
                    };
                    maybe_buffered = true;
                    let failed = event.is_err();
                    if sender.send(event).is_err() || failed {
                        return;
                    }
                }
            })?;
        Ok(Input {
            events,
            hung_up,
            stop,
            terminal,
        })
    }

    /// The next event, waiting up to `timeout`; `None` if none came (or the terminal
    /// is gone: see [`Input::terminal_gone`]).
    pub fn next(&self, timeout: Duration) -> Option<std::io::Result<Event>> {
        match self.events.recv_timeout(timeout) {
            Ok(event) => Some(event),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => self.reader_gone(),
        }
    }

    /// The next event if one is waiting.
    pub fn try_next(&self) -> Option<std::io::Result<Event>> {
        match self.events.try_recv() {
            Ok(event) => Some(event),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => self.reader_gone(),
        }
    }

    fn reader_gone(&self) -> Option<std::io::Result<Event>> {
        if self.terminal_gone() {
            None
        } else {
            Some(Err(std::io::Error::other("the terminal reader stopped")))
        }
    }

    /// Whether the terminal is gone: it hung up, or stopped being a terminal to
    /// `isatty` (which a hung-up terminal does).
    pub fn terminal_gone(&self) -> bool {
        self.hung_up.load(Ordering::SeqCst)
            || !nix::unistd::isatty(self.terminal.fd()).unwrap_or(false)
            || !std::io::stdout().is_terminal()
    }
}

impl Drop for Input {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Where crossterm reads the keys from (its own choice: stdin if it is a terminal,
/// else `/dev/tty`).
enum InputTerminal {
    Stdin(std::io::Stdin),
    /// `/dev/tty`, when stdin is not a terminal.
    Controlling(File),
}

impl InputTerminal {
    fn open() -> std::io::Result<InputTerminal> {
        let stdin = std::io::stdin();
        if stdin.is_terminal() {
            Ok(InputTerminal::Stdin(stdin))
        } else {
            Ok(InputTerminal::Controlling(
                File::options().read(true).write(true).open("/dev/tty")?,
            ))
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            InputTerminal::Stdin(stdin) => stdin.as_fd(),
            InputTerminal::Controlling(file) => file.as_fd(),
        }
    }
}

enum Readiness {
    Readable,
    HungUp,
    Idle,
}

/// Waits up to `milliseconds` for `fd` to have input.
fn wait_readable(fd: BorrowedFd, milliseconds: u16) -> Readiness {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::from(milliseconds)) {
        Ok(0) | Err(nix::errno::Errno::EINTR) => Readiness::Idle,
        Ok(_) => {
            let revents = fds[0].revents().unwrap_or(PollFlags::empty());
            let gone = PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL;
            // A hung-up terminal also stops being one (its file operations are
            // replaced by the kernel's hung-up ones).
            if revents.intersects(gone) || !nix::unistd::isatty(fd).unwrap_or(false) {
                Readiness::HungUp
            } else {
                Readiness::Readable
            }
        }
        Err(_) => Readiness::HungUp,
    }
}
