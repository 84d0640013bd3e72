//! Ctrl-C (and SIGTERM, SIGHUP) as a request to finish early, not to die.
//!
//! The one idea: a command that has patched a target must always get to restore it, so
//! these signals only set a flag that the command's waiting loop polls; the command
//! then restores the target and reports what it measured.

use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Makes Ctrl-C, SIGTERM and SIGHUP set the flag instead of ending the process.
pub fn install() {
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        let _ = unsafe { sigaction(signal, &action) };
    }
}

/// Whether one of those signals arrived.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// Sleeps until `deadline` (forever for `None`) or an interruption, waking every
/// `tick` to run `on_tick`; stops early when `on_tick` returns false.
pub fn wait(deadline: Option<Instant>, tick: Duration, mut on_tick: impl FnMut() -> bool) {
    loop {
        if requested() || deadline.is_some_and(|d| Instant::now() >= d) {
            return;
        }
        let nap = deadline.map_or(tick, |d| {
            tick.min(d.saturating_duration_since(Instant::now()))
        });
        std::thread::sleep(nap);
        if !on_tick() {
            return;
        }
    }
}
