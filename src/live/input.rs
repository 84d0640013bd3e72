//! The terminal's input, read on a thread of its own.
//!
//! The one idea: the event loop must never be stuck in a read of the terminal. When the
//! terminal goes away (its window closed, the tmux server killed) without a SIGHUP
//! reaching tendril, crossterm's reader spins on end-of-file and never returns. Read
//! on a thread of its own, that costs at most a spinning thread: the loop only waits on
//! a channel with a timeout, notices the terminal is gone ([`terminal_hung_up`]) and
//! ends the session as if the user quit — detaching from the target.

use std::io::IsTerminal;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::time::Duration;
use tendril_tui::crossterm::event::{self, Event};

/// Terminal events as they come.
pub struct Input {
    events: Receiver<std::io::Result<Event>>,
}

impl Input {
    /// Starts reading the terminal (which must be set up for the UI already).
    pub fn start() -> std::io::Result<Input> {
        let (sender, events) = mpsc::channel();
        std::thread::Builder::new()
            .name("tendril-input".into())
            .spawn(move || {
                loop {
                    let event = event::read();
                    let failed = event.is_err();
                    if sender.send(event).is_err() || failed {
                        return;
                    }
                }
            })?;
        Ok(Input { events })
    }

    /// The next event, waiting up to `timeout`; `None` if none came.
    pub fn next(&self, timeout: Duration) -> Option<std::io::Result<Event>> {
        match self.events.recv_timeout(timeout) {
            Ok(event) => Some(event),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Err(reader_gone())),
        }
    }

    /// The next event if one is waiting.
    pub fn try_next(&self) -> Option<std::io::Result<Event>> {
        match self.events.try_recv() {
            Ok(event) => Some(event),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some(Err(reader_gone())),
        }
    }
}

fn reader_gone() -> std::io::Error {
    std::io::Error::other("the terminal reader stopped")
}

/// Whether the terminal is gone: a hung-up terminal stops being one to `isatty`.
pub fn terminal_hung_up() -> bool {
    !std::io::stdin().is_terminal() || !std::io::stdout().is_terminal()
}
