//! The live progress line of `record` and `count` on a terminal: elapsed time and what
//! has been collected, rewritten in place a few times a second on stderr.
//!
//! The one idea: only a terminal gets it (a script or a log sees the usual lines and
//! nothing else), and the line is erased before anything else is printed, so the
//! summary lines that follow are never mixed with it.

pub use crate::quantities::{amount, thousands};
use crate::terminal_text::printable;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// How often the line is redrawn.
const REDRAW_INTERVAL: Duration = Duration::from_millis(250);

/// A progress line on stderr, if stderr is a terminal.
pub struct Progress {
    enabled: bool,
    started: Instant,
    next_draw: Instant,
    drawn: bool,
}

impl Progress {
    pub fn new() -> Progress {
        Progress::with_terminal(std::io::stderr().is_terminal())
    }

    fn with_terminal(enabled: bool) -> Progress {
        let now = Instant::now();
        Progress {
            enabled,
            started: now,
            next_draw: now + REDRAW_INTERVAL,
            drawn: false,
        }
    }

    /// Redraws the line if it is time to: `what` says what has been collected (escaped
    /// here: it may name the target's function).
    pub fn update(&mut self, what: impl FnOnce() -> String) {
        if !self.enabled || Instant::now() < self.next_draw {
            return;
        }
        self.next_draw = Instant::now() + REDRAW_INTERVAL;
        let line = format!(
            "tendril: {:.1} s — {} (Ctrl-C ends)",
            self.started.elapsed().as_secs_f64(),
            printable(&what())
        );
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[K{line}");
        let _ = err.flush();
        self.drawn = true;
    }

    /// Erases the line (before the summary is printed).
    pub fn clear(&mut self) {
        if self.drawn {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
            self.drawn = false;
        }
    }
}

impl Default for Progress {
    fn default() -> Progress {
        Progress::new()
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(amount(1, "call", "calls"), "1 call");
        assert_eq!(amount(1500, "call", "calls"), "1,500 calls");
    }

    #[test]
    fn without_a_terminal_nothing_is_drawn() {
        let mut progress = Progress::with_terminal(false);
        progress.next_draw = Instant::now();
        progress.update(|| unreachable!("not asked without a terminal"));
        assert!(!progress.drawn);
    }
}
