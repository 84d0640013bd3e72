//! Keeping stderr off the screen while the terminal UI runs.
//!
//! Library code reports warnings with `eprintln!` (a root that could not be instrumented,
//! say). Written into the alternate screen, such a line would tear the UI apart and then
//! vanish with it. The one idea: while the UI runs, file descriptor 2 is a pipe; a thread
//! reads its lines for the UI to show as messages, and when the UI ends (or panics) the
//! real stderr is put back, so the lines can be printed again where they stay readable.
//! tendril's own notes (`say!`) are diverted into the same channel without the pipe, so
//! the loop has each one as soon as it is said.

use crate::terminal_text::printable_bytes;
use nix::unistd::{dup, dup2_stderr, pipe};
use std::io::{BufRead, BufReader, IsTerminal};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Once;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// The saved real stderr while a capture runs (-1 otherwise), for the panic hook.
static SAVED_STDERR: AtomicI32 = AtomicI32::new(-1);
static PANIC_HOOK: Once = Once::new();

/// How long [`StderrCapture::stop`] waits for the reader to pass on the last lines.
const LAST_LINES_WAIT: Duration = Duration::from_millis(200);

/// Captures fd 2 until [`StderrCapture::stop`] or drop.
pub struct StderrCapture {
    saved: Option<OwnedFd>,
    lines: Receiver<String>,
}

impl StderrCapture {
    /// Starts capturing if stderr is a terminal (otherwise it goes wherever it was
    /// redirected, undisturbed, and `None` is returned).
    ///
    /// Call it after the terminal UI has installed its own panic hook: the hook installed
    /// here runs first and gives stderr back, so the panic message is printed on it.
    pub fn start() -> std::io::Result<Option<StderrCapture>> {
        if !std::io::stderr().is_terminal() {
            return Ok(None);
        }
        let saved = dup(std::io::stderr())?;
        let (read_end, write_end) = pipe()?;
        let (sender, lines) = mpsc::channel();
        let notes = sender.clone();
        std::thread::Builder::new()
            .name("stderr-capture".into())
            .spawn(move || {
                let reader = BufReader::new(std::fs::File::from(read_end));
                for line in reader.split(b'\n') {
                    let Ok(line) = line else { break };
                    // A line that is not UTF-8 is kept, its odd bytes spelled out.
                    let line = match String::from_utf8(line) {
                        Ok(line) => line,
                        Err(e) => printable_bytes(e.as_bytes()).into_owned(),
                    };
                    if sender.send(line).is_err() {
                        break;
                    }
                }
            })?;
        install_panic_hook();
        SAVED_STDERR.store(saved.as_raw_fd(), Ordering::SeqCst);
        dup2_stderr(&write_end)?;
        // fd 2 now holds the pipe's write end; `write_end` itself is closed here.
        drop(write_end);
        // tendril's own notes skip the pipe: they arrive at once, in order.
        crate::terminal_text::divert_notes(Some(notes));
        Ok(Some(StderrCapture {
            saved: Some(saved),
            lines,
        }))
    }

    /// Lines written to stderr since the last call.
    pub fn new_lines(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }

    /// Puts the real stderr back and returns the lines not yet taken.
    pub fn stop(mut self) -> Vec<String> {
        self.restore();
        // The pipe's last writer was fd 2: the reader now sees the end and finishes.
        let deadline = Instant::now() + LAST_LINES_WAIT;
        let mut lines = Vec::new();
        while let Ok(line) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            lines.push(line);
        }
        lines
    }

    fn restore(&mut self) {
        if let Some(saved) = self.saved.take() {
            crate::terminal_text::divert_notes(None);
            SAVED_STDERR.store(-1, Ordering::SeqCst);
            let _ = dup2_stderr(&saved);
        }
    }
}

impl Drop for StderrCapture {
    fn drop(&mut self) {
        self.restore();
    }
}

/// Gives stderr back before any other panic hook runs (the UI's hook then restores the
/// terminal, and the default hook prints the message on the real stderr).
fn install_panic_hook() {
    PANIC_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let saved = SAVED_STDERR.swap(-1, Ordering::SeqCst);
            if saved >= 0 {
                // SAFETY: `saved` is the descriptor a live `StderrCapture` owns; the
                // capture resets SAVED_STDERR before it closes it, and the swap above
                // leaves it to this hook alone. It is only borrowed for the dup2 (a
                // capture ending on another thread at this very moment would at worst
                // make dup2 fail).
                let saved = unsafe { BorrowedFd::borrow_raw(saved) };
                let _ = dup2_stderr(saved);
            }
            previous(info);
        }));
    });
}
