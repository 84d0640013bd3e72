//! The progress line shown while symbols load slowly (a cold cache on a big program).
//!
//! The one idea: a line on stderr appears only when loading has taken longer than half
//! a second, only when stderr is a terminal, and only on a thread that asked for it
//! ([`show_progress_on_this_thread`], called by the command-line front end) — so the
//! live view's background loads never write over its screen. A watcher thread sleeps on
//! a condition variable and is woken at once when loading ends, so a fast load pays
//! nothing but the thread's start.

use std::cell::Cell;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// How long loading runs before the line appears.
const DELAY: Duration = Duration::from_millis(500);
/// How often the line is redrawn.
const TICK: Duration = Duration::from_millis(200);

thread_local! {
    static ENABLED: Cell<bool> = const { Cell::new(false) };
}

/// Shows a progress line for symbol loads made on the calling thread when they take
/// longer than half a second, if stderr is a terminal.
pub fn show_progress_on_this_thread() {
    ENABLED.with(|e| e.set(std::io::stderr().is_terminal()));
}

/// Counts loaded modules for the line.
pub(super) struct Progress {
    done: AtomicUsize,
    total: usize,
    finished: Mutex<bool>,
    wake: Condvar,
}

impl Progress {
    /// One more module loaded.
    pub(super) fn tick(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs `load` (loading `total` modules, calling [`Progress::tick`] for each), with the
/// progress line if this thread asked for it.
pub(super) fn with_progress<R>(total: usize, load: impl FnOnce(&Progress) -> R) -> R {
    let progress = Progress {
        done: AtomicUsize::new(0),
        total,
        finished: Mutex::new(false),
        wake: Condvar::new(),
    };
    if !ENABLED.with(Cell::get) {
        return load(&progress);
    }
    std::thread::scope(|scope| {
        scope.spawn(|| watch(&progress));
        let result = load(&progress);
        *progress.finished.lock().unwrap_or_else(|e| e.into_inner()) = true;
        progress.wake.notify_all();
        result
    })
}

/// Waits [`DELAY`], then redraws the line every [`TICK`] until loading ends, then
/// erases it.
fn watch(progress: &Progress) {
    let mut finished = progress.finished.lock().unwrap_or_else(|e| e.into_inner());
    let mut wait = DELAY;
    let mut shown = false;
    loop {
        let (guard, _) = progress
            .wake
            .wait_timeout_while(finished, wait, |done| !*done)
            .unwrap_or_else(|e| e.into_inner());
        finished = guard;
        let mut err = std::io::stderr().lock();
        if *finished {
            if shown {
                let _ = write!(err, "\r\x1b[K");
            }
            return;
        }
        let done = progress.done.load(Ordering::Relaxed);
        let _ = write!(
            err,
            "\r\x1b[Ktendril: reading symbols: {done} of {} modules (cached for next time)…",
            progress.total
        );
        let _ = err.flush();
        shown = true;
        wait = TICK;
    }
}
