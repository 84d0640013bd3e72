//! Names the target chose to fight back (issue 31): escape sequences, a right-to-left
//! override, an invisible character. Every screen shows them escaped — never dropped,
//! so two names never look the same — while the actions the UI returns carry the exact
//! names the controller needs to find the functions.

mod common;

use common::*;
use tendril_tui::crossterm::event::KeyCode;
use tendril_tui::{
    Action, App, CodeLine, CodeSnapshot, FunctionEntry, ProcessEntry, SamplingStatus, Screen,
};

const EVIL: &str = "evil\x1b[31mname\u{202e}cod";
const EVIL_SHOWN: &str = "evil\\x1b[31mname\\u{202e}cod";
const MODULE: &str = "lib\u{200b}x.so";
const MODULE_SHOWN: &str = "lib\\u{200b}x.so";

/// The fixed profile with one callee renamed, a module with an invisible character, a
/// thread named with an escape, and a target whose name overrides the direction.
fn hostile_snapshot() -> tendril_tui::ProfileSnapshot {
    let mut data = snapshot();
    data.merged[0].children[0].name = EVIL.into();
    data.merged[0].children[0].module = MODULE.into();
    data.threads[0].name = "thr\x07ead".into();
    data.status.target = "pid 4242 calltree\u{202e}gnp.exe".into();
    data.status.roots = vec![EVIL.into()];
    data
}

fn assert_escaped(text: &str, expected: &[&str]) {
    for shown in expected {
        assert!(text.contains(shown), "{shown:?} missing:\n{text}");
    }
}

#[test]
fn the_tree_hot_spots_threads_and_status_show_names_escaped() {
    let mut app = App::new(Screen::Live(hostile_snapshot()));
    let text = screen_text(&mut app, 160, 30);
    assert_escaped(
        &text,
        &[EVIL_SHOWN, MODULE_SHOWN, "calltree\\u{202e}gnp.exe"],
    );
    press_char(&mut app, '2');
    assert_escaped(&screen_text(&mut app, 160, 30), &[EVIL_SHOWN, MODULE_SHOWN]);
    press_char(&mut app, '3');
    assert_escaped(&screen_text(&mut app, 160, 30), &["thr\\x07ead"]);
    app.set_message(format!("cannot instrument {EVIL}"));
    assert_eq!(
        app.message(),
        Some(format!("cannot instrument {EVIL_SHOWN}").as_str())
    );
    assert_escaped(&screen_text(&mut app, 160, 30), &[EVIL_SHOWN]);
}

#[test]
fn enter_on_an_escaped_name_asks_for_the_exact_name() {
    let mut data = hostile_snapshot();
    data.status.sampling = Some(SamplingStatus {
        rate_hz: 499,
        clock: "cpu".into(),
        samples: 100,
        ..SamplingStatus::default()
    });
    data.status.roots.clear();
    let mut app = App::new(Screen::Sampled(data));
    // The hottest path opens by itself, its end (`leaf`) selected; the renamed
    // `compute` is the row above.
    press(&mut app, KeyCode::Up);
    let action = press(&mut app, KeyCode::Enter);
    assert!(
        matches!(&action, Some(Action::RootFromSamples { name, module, .. })
            if name == EVIL && module == MODULE),
        "{action:?}"
    );
}

#[test]
fn the_pickers_show_names_and_command_lines_escaped() {
    let processes = vec![ProcessEntry {
        pid: 7,
        user: "mallory".into(),
        threads: 1,
        command_line: "./server \x1b]0;pwned\x07".into(),
    }];
    let mut app = App::new(Screen::ProcessPicker(processes));
    assert_escaped(
        &screen_text(&mut app, 120, 20),
        &["./server \\x1b]0;pwned\\x07"],
    );

    let functions = vec![FunctionEntry {
        name: EVIL.into(),
        module: MODULE.into(),
        size: 16,
        address: 0x1000,
    }];
    let mut app = App::new(Screen::RootPicker(functions));
    assert_escaped(&screen_text(&mut app, 120, 20), &[EVIL_SHOWN, MODULE_SHOWN]);
    press(&mut app, KeyCode::Tab);
    assert_escaped(&screen_text(&mut app, 120, 20), &["selected: evil\\x1b"]);
    let action = press(&mut app, KeyCode::Enter);
    assert!(
        matches!(&action, Some(Action::SetRoots(roots)) if roots[0].name == EVIL),
        "{action:?}"
    );
}

#[test]
fn a_stderr_line_and_a_code_line_are_escaped_once() {
    let mut app = App::new(Screen::Live(hostile_snapshot()));
    // Written on stderr escaped already: shown as it is, not escaped a second time.
    app.show_stderr_line("tendril: not instrumented: evil\\x1b[31m");
    assert_eq!(
        app.message(),
        Some("tendril: not instrumented: evil\\x1b[31m")
    );
    // Written raw (a library, a panic): escaped now.
    app.show_stderr_line("raw\x1b[2J");
    assert_eq!(app.message(), Some("raw\\x1b[2J"));

    // `e` on the renamed callee: the code screen waits for its lines, then shows them.
    press(&mut app, KeyCode::Down);
    let action = press_char(&mut app, 'e');
    assert!(
        matches!(&action, Some(Action::ShowCode { name, .. }) if name == EVIL),
        "{action:?}"
    );
    assert_escaped(&screen_text(&mut app, 120, 20), &[EVIL_SHOWN]);
    // The listing's lines come escaped by the controller (as `tendril edges` prints
    // them): such a line is not escaped again; a line still holding something raw is
    // escaped whole.
    let line = |text: &str| CodeLine {
        text: text.into(),
        hot: false,
    };
    app.update_code(CodeSnapshot {
        title: format!("{EVIL} (calltree)"),
        lines: vec![line("call evil\\x1b[31m"), line("jmp raw\x1b[0m")],
    });
    let text = screen_text(&mut app, 120, 20);
    assert_escaped(
        &text,
        &[EVIL_SHOWN, " call evil\\x1b[31m\n", "jmp raw\\x1b[0m"],
    );
}
