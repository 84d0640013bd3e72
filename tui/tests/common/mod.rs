//! Shared test helpers: a fixed profile, key presses, and rendering an [`App`] into a
//! `TestBackend` to read the screen back as text.

#![allow(dead_code)] // each test file uses a different subset

use std::time::Duration;

use tendril_tui::crossterm::event::{Event, KeyCode, KeyEvent, KeyModifiers};
use tendril_tui::ratatui::Terminal;
use tendril_tui::ratatui::backend::TestBackend;
use tendril_tui::ratatui::style::Modifier;
use tendril_tui::{Action, App, ProfileSnapshot, Status, ThreadSummary, TreeNode};

pub const MS: f64 = 1e6;

pub fn node(name: &str, module: &str, calls: u64, total_ms: f64, self_ms: f64) -> TreeNode {
    TreeNode::new(name, module, calls, total_ms * MS, self_ms * MS)
}

/// `main` with three callees whose order differs by every sort key, and `leaf` called in
/// two contexts; plus a worker thread with its own root.
///
/// ```text
/// main            1 call   100 ms total   5 self
///   compute       5        50             10
///     leaf        20       30             30
///     helper      5        10             10   (libx.so)
///   io_wait       2        30             30
///   parse         100      15             5
///     leaf        4        10             10
/// worker_loop     1        20             5
///   crunch        7        15             15
/// ```
pub fn main_tree() -> TreeNode {
    node("main", "calltree", 1, 100.0, 5.0).with_children([
        node("compute", "calltree", 5, 50.0, 10.0).with_children([
            node("leaf", "calltree", 20, 30.0, 30.0),
            node("helper", "libx.so", 5, 10.0, 10.0),
        ]),
        node("io_wait", "libc.so.6", 2, 30.0, 30.0),
        node("parse", "calltree", 100, 15.0, 5.0)
            .with_children([node("leaf", "calltree", 4, 10.0, 10.0)]),
    ])
}

pub fn worker_tree() -> TreeNode {
    node("worker_loop", "calltree", 1, 20.0, 5.0)
        .with_children([node("crunch", "calltree", 7, 15.0, 15.0)])
}

pub fn status() -> Status {
    Status {
        target: "pid 4242 calltree".into(),
        roots: vec!["main".into(), "worker_loop".into()],
        elapsed: Duration::from_secs(83),
        events_per_second: 1_234_567.0,
        instrumented_functions: 12,
        invoked_functions: 8,
        indirect_call_sites: 3,
        indirect_sites_followed: 2,
        indirect_targets: 5,
        lost_events: 0,
        estimated_overhead_percent: 2.5,
        paused: false,
        message: None,
        detached: false,
        sampling: None,
        overlap: None,
        cpu_unmeasured: None,
        shows_cpu_time: false,
        untimed: None,
    }
}

pub fn snapshot() -> ProfileSnapshot {
    ProfileSnapshot {
        merged: vec![main_tree(), worker_tree()],
        threads: vec![
            ThreadSummary {
                tid: 101,
                name: "main".into(),
                calls: 137,
                total_ns: 100.0 * MS,
                roots: vec![main_tree()],
            },
            ThreadSummary {
                tid: 102,
                name: "worker".into(),
                calls: 8,
                total_ns: 20.0 * MS,
                roots: vec![worker_tree()],
            },
        ],
        status: status(),
    }
}

/// The screen after drawing `app` at `width` × `height`, one string per row, right-trimmed.
pub fn screen(app: &mut App, width: u16, height: u16) -> Vec<String> {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test backend");
    terminal.draw(|frame| app.draw(frame)).expect("draw");
    let buffer = terminal.backend().buffer();
    (0..height)
        .map(|y| {
            let row: String = (0..width)
                .map(|x| buffer[(x, y)].symbol().to_string())
                .collect();
            row.trim_end().to_string()
        })
        .collect()
}

/// The text of the highlighted (reversed) table row below the first two screen rows (the
/// tab line, where the active tab is reversed too, and the header).
pub fn selected_row(app: &mut App, width: u16, height: u16) -> Option<String> {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test backend");
    terminal.draw(|frame| app.draw(frame)).expect("draw");
    let buffer = terminal.backend().buffer();
    (2..height)
        .find(|&y| buffer[(0, y)].modifier.contains(Modifier::REVERSED))
        .map(|y| {
            (0..width)
                .map(|x| buffer[(x, y)].symbol().to_string())
                .collect()
        })
}

/// The screen as one string (rows joined by newlines), for `contains` checks.
pub fn screen_text(app: &mut App, width: u16, height: u16) -> String {
    screen(app, width, height).join("\n")
}

/// The rows of the screen that contain `needle`.
pub fn rows_with<'a>(rows: &'a [String], needle: &str) -> Vec<&'a str> {
    rows.iter()
        .filter(|row| row.contains(needle))
        .map(String::as_str)
        .collect()
}

/// The call tree as drawn: one entry per row, the name prefixed by one space per level
/// (read back from the indentation and the expander on screen).
pub fn tree_names(app: &mut App) -> Vec<String> {
    screen(app, 120, 30)
        .iter()
        .skip(2) // tab line and header
        .take_while(|row| !row.is_empty())
        .map(|row| {
            let cell: String = row.chars().take(60).collect();
            let leading = cell.chars().take_while(|c| *c == ' ').count();
            let rest = &cell.trim_start();
            let (depth, name) = match rest.strip_prefix(['▸', '▾']) {
                Some(name) => (leading / 2, name.trim()),
                None => (leading.saturating_sub(2) / 2, rest.trim()),
            };
            let name = name.split_whitespace().next().unwrap_or("");
            format!("{}{}", " ".repeat(depth), name)
        })
        .collect()
}

pub fn press(app: &mut App, code: KeyCode) -> Option<Action> {
    app.handle_event(Event::Key(KeyEvent::new(code, KeyModifiers::NONE)))
}

pub fn press_char(app: &mut App, ch: char) -> Option<Action> {
    press(app, KeyCode::Char(ch))
}

pub fn ctrl(app: &mut App, ch: char) -> Option<Action> {
    app.handle_event(Event::Key(KeyEvent::new(
        KeyCode::Char(ch),
        KeyModifiers::CONTROL,
    )))
}

pub fn type_text(app: &mut App, text: &str) {
    for ch in text.chars() {
        assert_eq!(
            press_char(app, ch),
            None,
            "typing {ch:?} returned an action"
        );
    }
}
