//! The terminal guard: raw mode, alternate screen and hidden cursor for as long as it
//! lives, and the terminal given back on every way out.
//!
//! The one idea: restoring is idempotent and guarded by one process-wide flag, so Drop,
//! an explicit [`TerminalGuard::restore`] and the panic hook can all call it in any order
//! and the terminal is restored exactly once — before a panic message is printed, so the
//! message lands on the normal screen where it can be read.
//!
//! Nothing here reads from the terminal: queries that wait for the terminal's answer
//! (the cursor's position) are never made, so a terminal that does not answer, or that
//! goes away, cannot hold the UI up.
//!
//! Each frame reaches the terminal in one write: ratatui flushes its backend once a frame
//! is drawn, and the backend writes into a buffer large enough for any screen. (Through
//! `Stdout`'s own 1 KiB line buffer a frame went out in pieces, and a terminal could show
//! one half drawn.)

use std::io::{self, BufWriter, Stdout, Write};
use std::panic;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::cursor::{Hide, Show};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{
    Clear, ClearType, EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};

/// The terminal type the controller draws on.
pub type CrosstermTerminal = Terminal<CrosstermBackend<BufWriter<Stdout>>>;

/// The frame buffer's size: a whole screen of 400 × 120 cells, each with its colours,
/// fits (a frame larger still is written in more than one piece, nothing worse).
const FRAME_BUFFER_BYTES: usize = 1 << 20;

/// Whether the terminal is currently in the UI's mode (raw + alternate screen).
static UI_ACTIVE: AtomicBool = AtomicBool::new(false);
static PANIC_HOOK: Once = Once::new();

/// Owns the terminal while the UI runs; dropping it restores the terminal.
pub struct TerminalGuard {
    terminal: CrosstermTerminal,
}

impl TerminalGuard {
    /// Enters raw mode and the alternate screen, hides the cursor, and installs (once per
    /// process) a panic hook that restores the terminal before the previous hook runs.
    pub fn enter() -> io::Result<Self> {
        install_panic_hook();
        enable_raw_mode()?;
        UI_ACTIVE.store(true, Ordering::SeqCst);
        let mut stdout = io::stdout();
        // The screen is cleared directly: ratatui's `Terminal::clear` asks the terminal
        // where its cursor is and waits for the answer, which a terminal that never
        // answers (or goes away meanwhile) turns into a hang nothing can interrupt.
        if let Err(error) = execute!(stdout, EnterAlternateScreen, Hide, Clear(ClearType::All)) {
            restore_terminal();
            return Err(error);
        }
        let frames = BufWriter::with_capacity(FRAME_BUFFER_BYTES, stdout);
        match Terminal::new(CrosstermBackend::new(frames)) {
            Ok(terminal) => Ok(TerminalGuard { terminal }),
            Err(error) => {
                restore_terminal();
                Err(error)
            }
        }
    }

    /// The terminal to draw on: `guard.terminal().draw(|frame| app.draw(frame))`.
    pub fn terminal(&mut self) -> &mut CrosstermTerminal {
        &mut self.terminal
    }

    /// Gives the terminal back now (e.g. before printing a final message). Safe to call
    /// more than once; Drop does nothing afterwards.
    pub fn restore(&mut self) -> io::Result<()> {
        if UI_ACTIVE.swap(false, Ordering::SeqCst) {
            let left = execute!(self.terminal.backend_mut(), LeaveAlternateScreen);
            // Through ratatui, so that its own Drop knows the cursor is back.
            let shown = self.terminal.show_cursor();
            let raw = disable_raw_mode();
            left?;
            shown?;
            raw?;
        }
        Ok(())
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        // Errors cannot be reported from Drop; the best effort is all there is.
        let _ = self.restore();
    }
}

/// Leaves the alternate screen, shows the cursor and disables raw mode, if the UI had
/// them on. Best effort: used where errors cannot be reported (panic hook, failed enter).
fn restore_terminal() {
    if UI_ACTIVE.swap(false, Ordering::SeqCst) {
        let mut stdout = io::stdout();
        let _ = execute!(stdout, LeaveAlternateScreen, Show);
        let _ = disable_raw_mode();
        let _ = stdout.flush();
    }
}

fn install_panic_hook() {
    PANIC_HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            restore_terminal();
            previous(info);
        }));
    });
}
