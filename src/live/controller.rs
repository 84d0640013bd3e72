//! The live UI's event loop: keys in, actions to the session, the recorder drained every
//! few milliseconds, snapshots to the UI ten times a second, frames drawn.
//!
//! The one idea: the loop never waits on the target. It waits only for terminal input,
//! and at most a couple of milliseconds while a recording runs (a full event ring makes
//! the target wait for us), so the screen stays responsive and the rings stay drained
//! whether or not anybody presses a key.

use super::input::Input;
use super::profiling_state::{Flow, ProfilingState};
use super::stderr::StderrCapture;
use crate::interrupt;
use std::time::{Duration, Instant};
use tendril_tui::crossterm::event::{Event, KeyCode, KeyEvent};
use tendril_tui::{Action, App, ScreenKind, TerminalGuard};

/// How long the loop waits for input while events are flowing (the rings' drain rate).
const POLL_INTERVAL: Duration = Duration::from_millis(2);
/// How long it waits for input otherwise.
const IDLE_WAIT: Duration = Duration::from_millis(25);
/// Frames are drawn at least this often (10 Hz), and after every input.
const FRAME_INTERVAL: Duration = Duration::from_millis(100);
/// Snapshots of a live recording are taken this often, or less often if one takes long.
const SNAPSHOT_INTERVAL: Duration = Duration::from_millis(100);

/// Runs the UI until the user quits, a signal asks to, or a fatal error happens. The
/// caller shuts the session down afterwards, whatever the outcome.
pub fn event_loop(
    guard: &mut TerminalGuard,
    app: &mut App,
    session: &mut ProfilingState,
    capture: Option<&StderrCapture>,
    captured: &mut Vec<String>,
) -> anyhow::Result<()> {
    let input = Input::start()?;
    let mut next_draw = Instant::now();
    let mut next_snapshot = Instant::now();
    // Once data first arrives after roots are chosen, the hottest path is expanded — as
    // if the user had pressed `h` — unless the user pressed a key first.
    let mut expand_hottest_path = true;
    loop {
        // A terminal that hung up (its window closed, the tmux server killed) does not
        // always send SIGHUP: quit as if asked to.
        if interrupt::requested() || input.terminal_gone() {
            return Ok(());
        }
        let now = Instant::now();
        let wait = if session.is_collecting() {
            POLL_INTERVAL
        } else {
            IDLE_WAIT
        };
        let mut dirty = false;
        let mut next_event = input.next(wait.min(next_draw.saturating_duration_since(now)));
        while let Some(event) = next_event {
            let event = event?;
            dirty = true;
            if matches!(event, Event::Key(_)) {
                expand_hottest_path = false;
            }
            if let Some(action) = app.handle_event(event) {
                if matches!(action, Action::SetRoots(_) | Action::RootFromSamples { .. }) {
                    expand_hottest_path = true;
                }
                let serial = app.message_serial();
                if let Some(note) = session.progress_note(&action) {
                    app.set_message(note);
                    draw(guard, app)?;
                }
                if session.handle(action, app) == Flow::Quit {
                    return Ok(());
                }
                // What the action said answers the key: a note drained next waits.
                app.hold_answer_since(serial);
            }
            next_event = input.try_next();
        }
        session.poll();
        // Notes said while draining come before what the tick finds (the target's exit).
        dirty |= show_new_lines(capture, app, captured);
        session.tick(app, Instant::now())?;
        dirty |= show_new_lines(capture, app, captured);
        if session.is_collecting() && Instant::now() >= next_snapshot {
            let began = Instant::now();
            session.refresh(app);
            // A large profile is converted less often, so draining keeps up.
            let interval = SNAPSHOT_INTERVAL.max(began.elapsed() * 4);
            next_snapshot = Instant::now() + interval;
            dirty = true;
        }
        if expand_hottest_path
            && app.screen() == ScreenKind::Live
            && !app.snapshot().merged.is_empty()
        {
            app.handle_key(KeyEvent::from(KeyCode::Char('h')));
            expand_hottest_path = false;
        }
        if dirty || Instant::now() >= next_draw {
            draw(guard, app)?;
            next_draw = Instant::now() + FRAME_INTERVAL;
        }
    }
}

/// Shows the lines written to stderr (and the notes said) since the last call, keeping
/// them for the real stderr; whether there were any.
fn show_new_lines(
    capture: Option<&StderrCapture>,
    app: &mut App,
    captured: &mut Vec<String>,
) -> bool {
    let lines = capture.map(StderrCapture::new_lines).unwrap_or_default();
    for line in &lines {
        app.show_stderr_line(line);
    }
    let any = !lines.is_empty();
    captured.extend(lines);
    any
}

/// Draws one frame of `app`.
pub fn draw(guard: &mut TerminalGuard, app: &mut App) -> std::io::Result<()> {
    guard.terminal().draw(|frame| app.draw(frame))?;
    Ok(())
}
