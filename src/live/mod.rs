//! The live terminal UI's controller (issue 5): attach, pick a root, watch the calling
//! context tree grow, dig in, detach — and browse saved profiles the same way.
//!
//! The `tendril-tui` crate draws; this module owns the terminal, the event loop
//! ([`controller`]), the target and its recording ([`profiling_state`], carrying out the
//! UI's actions in `actions`), and the conversion of profiles into the UI's view-model
//! ([`convert`]).
//!
//! The one idea: whatever ends the UI — `q`, Ctrl-C, SIGTERM or SIGHUP, an error, a
//! panic — the target is detached first (its code restored, the process left running;
//! an attach in progress is waited for), then the terminal is given back, then one line
//! says what happened. And nothing touches the target before the terminal is the UI's.

mod actions;
mod busy;
mod code_counts;
mod code_view;
pub mod controller;
pub mod convert;
mod input;
pub mod job;
pub mod processes;
pub mod profiling_state;
pub mod roots;
mod sampled;
mod sampler_thread;
pub mod save_path;
mod stage;
pub mod stderr;

use crate::process::TargetProcess;
use crate::profile::Profile;
use crate::recording::TimingOptions;
use anyhow::bail;
use profiling_state::ProfilingState;
use std::io::IsTerminal;
use std::os::fd::AsRawFd;
use std::path::Path;
use stderr::StderrCapture;
use tendril_tui::{App, ProcessEntry, ProfileSnapshot, Screen, Status, TerminalGuard};

/// Where the UI starts.
pub enum Start<'a> {
    /// `tendril` without arguments: choose a process.
    ProcessPicker,
    /// `tendril attach <PID>` (roots empty: choose them in the root picker) and
    /// `tendril demo` (roots given: profile them at once). The target was checked with
    /// [`crate::process::inspect`].
    Attach {
        target: &'a TargetProcess,
        /// Patterns, as for `tendril record --root`.
        roots: Vec<String>,
        /// Adaptive timing's options, as for `tendril record`.
        timing: TimingOptions,
    },
    /// `tendril view <FILE>`: browse a saved profile.
    View {
        profile: &'a Profile,
        path: &'a Path,
    },
}

/// Fails with a one-line message unless stdout is a terminal (the UI needs one) and
/// tendril is in its foreground: a background process that sets the terminal up is
/// stopped by the kernel (SIGTTOU) again and again, whatever signal it is sent.
pub fn require_terminal(instead: &str) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    if !stdout.is_terminal() {
        bail!("the terminal UI needs a terminal, and stdout is not one — {instead}");
    }
    // SAFETY: tcgetpgrp only reads the terminal's foreground group through the
    // descriptor, which stdout keeps open.
    let foreground = unsafe { libc::tcgetpgrp(stdout.as_raw_fd()) };
    // -1: not tendril's controlling terminal, which has no foreground to ask about.
    if foreground > 0 && foreground != nix::unistd::getpgrp().as_raw() {
        bail!(
            "the terminal UI needs the foreground of its terminal, and tendril runs in the \
             background (started with `&`, or by `timeout` without `--foreground`) — \
             run it in the foreground, or {instead}"
        );
    }
    Ok(())
}

/// Runs the UI from `start` until the user quits; detaches from any target first.
/// Returns what to tell the user about the target afterwards (e.g. that it was detached
/// and keeps running), if anything.
pub fn run(start: Start) -> anyhow::Result<Option<String>> {
    crate::interrupt::install();
    let stderr_was_terminal = std::io::stderr().is_terminal();
    // The terminal first: if it cannot be had, no job has touched the target yet.
    let mut guard = TerminalGuard::enter()?;
    // Without a capture, stray stderr lines would land on the UI: not worth failing for.
    let capture = StderrCapture::start().ok().flatten();
    let mut captured = Vec::new();
    let (outcome, detached) = match prepare(start) {
        Ok((mut session, mut app)) => {
            let outcome = controller::event_loop(
                &mut guard,
                &mut app,
                &mut session,
                capture.as_ref(),
                &mut captured,
            );
            // Detach first, whatever happened (a signal, an error), saying so on screen
            // while it takes, then give the terminal back.
            let detached = session.shutdown(&mut |note| {
                app.set_message(note);
                let _ = controller::draw(&mut guard, &mut app);
            });
            (outcome, detached)
        }
        Err(error) => (Err(error), Ok(None)),
    };
    if let Some(capture) = capture {
        captured.extend(capture.stop());
    }
    let restored = guard.restore();
    // A terminal that went away can neither be restored nor printed on (printing to it
    // fails, and Rust's printing macros panic on failure): what would be printed has
    // nowhere to go.
    let terminal_gone = !std::io::stdout().is_terminal();
    if terminal_gone {
        discard_output(stderr_was_terminal);
    }
    drop(guard);
    for line in captured {
        eprintln!("{}", crate::terminal_text::already_printed(&line));
    }
    outcome?;
    if !terminal_gone {
        restored?;
    }
    detached
}

/// Points stdout (and stderr, if it was the terminal) at `/dev/null`, once the terminal
/// they wrote to has gone away.
fn discard_output(stderr_was_terminal: bool) {
    let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") else {
        return;
    };
    let _ = nix::unistd::dup2_stdout(&null);
    if stderr_was_terminal && !std::io::stderr().is_terminal() {
        let _ = nix::unistd::dup2_stderr(&null);
    }
}

/// The session and the UI's first screen for `start`. Slow steps start in the
/// background here (the terminal is the UI's by then); a bad pid has been refused by
/// the command before the UI appeared.
fn prepare(start: Start) -> anyhow::Result<(ProfilingState, App)> {
    match start {
        Start::ProcessPicker => Ok((
            ProfilingState::for_process_picker(),
            App::new(Screen::ProcessPicker(processes::list_processes())),
        )),
        Start::Attach {
            target,
            roots,
            timing,
        } if roots.is_empty() => {
            let mut session = ProfilingState::for_target(target, timing);
            session.load_symbols(profiling_state::WhenLoaded::ShowSampled)?;
            // The process picker, narrowed to this process, says what is happening
            // until the Sampled view (or the root picker) can open (reading the symbols
            // takes a moment).
            let entry =
                processes::process_entry(target.pid as u32).unwrap_or_else(|| ProcessEntry {
                    pid: target.pid as u32,
                    user: String::new(),
                    threads: 0,
                    command_line: target.exe.display().to_string(),
                });
            let mut app = App::new(Screen::ProcessPicker(vec![entry]));
            app.set_message(format!(
                "{}: reading its functions, then sampling it…",
                session.target
            ));
            Ok((session, app))
        }
        Start::Attach {
            target,
            roots,
            timing,
        } => {
            let mut session = ProfilingState::for_target(target, timing);
            let mut app = App::new(Screen::Live(ProfileSnapshot {
                status: Status {
                    target: session.target.clone(),
                    roots: roots.clone(),
                    ..Status::default()
                },
                ..ProfileSnapshot::default()
            }));
            session.start_recording(roots.clone(), roots, &mut app)?;
            Ok((session, app))
        }
        Start::View { profile, path } => Ok((
            ProfilingState::for_saved_profile(),
            App::new(Screen::ReadOnly(convert::saved_snapshot(profile, path))),
        )),
    }
}
