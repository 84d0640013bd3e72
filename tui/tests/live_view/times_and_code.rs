//! The live view's other measures and its code screen: `C` between wall-clock and
//! on-CPU times, `E` for a node's estimated error, and `e` for a function's annotated
//! code, with what each says when it has nothing to show, and for which of two functions
//! that share a name.

use super::live_app;
use crate::common::*;
use tendril_tui::crossterm::event::KeyCode;
use tendril_tui::{Action, App, CodeLine, CodeSnapshot, Screen, ScreenKind, TreeNode};
#[test]
fn capital_c_switches_between_wall_and_on_cpu_times_and_back() {
    let mut snapshot = snapshot();
    for root in &mut snapshot.merged {
        let mut pending = vec![root];
        while let Some(node) = pending.pop() {
            // On-CPU: a tenth of the wall-clock times.
            node.other_clock = Some((node.total_ns / 10.0, node.self_ns / 10.0));
            pending.extend(node.children.iter_mut());
        }
    }
    let wall_root = snapshot.merged[0].total_ns;
    let mut app = App::new(Screen::Live(snapshot.clone()));
    press_char(&mut app, 'C');
    assert!(app.shows_cpu_time());
    assert_eq!(app.snapshot().merged[0].total_ns, wall_root / 10.0);
    assert!(screen_text(&mut app, 120, 30).contains("on-CPU times"));
    // A new snapshot (wall-clock, as the controller sends them) is shown on-CPU too.
    app.update_snapshot(snapshot.clone());
    assert_eq!(app.snapshot().merged[0].total_ns, wall_root / 10.0);
    press_char(&mut app, 'C');
    assert!(!app.shows_cpu_time());
    assert_eq!(app.snapshot().merged[0].total_ns, wall_root);
}

#[test]
fn capital_c_without_on_cpu_times_says_why() {
    let mut snapshot = snapshot();
    snapshot.status.cpu_unmeasured = Some("CPU time is not measured: refused".into());
    let mut app = App::new(Screen::Live(snapshot));
    press_char(&mut app, 'C');
    assert!(!app.shows_cpu_time());
    assert_eq!(app.message(), Some("CPU time is not measured: refused"));
}

#[test]
fn capital_e_gives_the_selected_nodes_estimated_error() {
    let mut snapshot = snapshot();
    snapshot.merged[0].error_ns = Some(250_000.0);
    let mut app = App::new(Screen::Live(snapshot));
    press_char(&mut app, 'E');
    let message = app.message().unwrap_or_default().to_owned();
    assert!(
        message.starts_with("main:") && message.contains("± 0.250 ms estimated error"),
        "{message}"
    );
    press(&mut app, KeyCode::Down);
    press_char(&mut app, 'E');
    assert!(
        app.message()
            .unwrap_or_default()
            .contains("no error estimate"),
        "{:?}",
        app.message()
    );
}

#[test]
fn e_opens_the_selected_functions_code_and_esc_goes_back() {
    let mut app = live_app();
    press(&mut app, KeyCode::Down); // compute
    assert_eq!(
        press_char(&mut app, 'e'),
        Some(Action::ShowCode {
            name: "compute".into(),
            module: "calltree".into(),
            address: None,
        })
    );
    assert_eq!(app.screen(), ScreenKind::Code);
    assert!(screen_text(&mut app, 100, 20).contains("copying compute"));
    app.update_code(CodeSnapshot {
        title: "compute (calltree): 5 calls inside the call graph".into(),
        lines: vec![CodeLine {
            text: "▶ 5  100.0%  +0x0    push rbp".into(),
            hot: true,
        }],
    });
    let text = screen_text(&mut app, 100, 20);
    assert!(text.contains("5 calls inside the call graph"), "{text}");
    assert!(text.contains("push rbp"), "{text}");
    assert!(text.contains("Esc back"), "the footer names Esc: {text}");
    // The live view's keys do nothing here: p does not pause.
    assert_eq!(press_char(&mut app, 'p'), None);
    assert_eq!(press(&mut app, KeyCode::Esc), Some(Action::CloseCode));
    assert_eq!(app.screen(), ScreenKind::Live);
    // Counts arriving late are dropped; a refusal comes back to the live view.
    app.update_code(CodeSnapshot::default());
    assert_eq!(app.code(), None);
    press_char(&mut app, 'e');
    app.close_code("cannot count compute's edges: its size is unknown");
    assert_eq!(app.screen(), ScreenKind::Live);
    assert_eq!(
        app.message(),
        Some("cannot count compute's edges: its size is unknown")
    );
}

#[test]
fn e_needs_a_target_and_a_function() {
    let mut app = App::new(Screen::ReadOnly(snapshot()));
    assert_eq!(press_char(&mut app, 'e'), None);
    assert_eq!(app.screen(), ScreenKind::Live);
    assert!(app.message().unwrap_or_default().contains("read-only"));
    let mut app = live_app();
    press_char(&mut app, '3'); // the threads tab: no function selected
    assert_eq!(press_char(&mut app, 'e'), None);
    assert!(
        app.message()
            .unwrap_or_default()
            .contains("select a function"),
        "{:?}",
        app.message()
    );
}

#[test]
fn twins_of_one_name_are_two_rows_and_e_names_each_by_its_address() {
    // Two `static` functions `step` of one module, told apart only by their addresses.
    let step = |address: u64, total_ms: f64| {
        let mut node = TreeNode::new("step", "app", 10, total_ms * MS, total_ms * MS);
        node.address = Some(address);
        node
    };
    let root = TreeNode::new("main", "app", 1, 10.0 * MS, 4.0 * MS)
        .with_children([step(0x5624_0bff_e210, 5.0), step(0x5624_0bff_e260, 1.0)]);
    let mut snapshot = snapshot();
    snapshot.merged = vec![root];
    let mut app = App::new(Screen::Live(snapshot));
    let show_code = |address| {
        Some(Action::ShowCode {
            name: "step".into(),
            module: "app".into(),
            address: Some(address),
        })
    };
    press(&mut app, KeyCode::Down);
    assert_eq!(press_char(&mut app, 'e'), show_code(0x5624_0bff_e210));
    press(&mut app, KeyCode::Esc);
    press(&mut app, KeyCode::Down);
    assert_eq!(press_char(&mut app, 'e'), show_code(0x5624_0bff_e260));
    press(&mut app, KeyCode::Esc);
    // The hot spots do not add them up: two rows, by self time (step 5 ms, main 4 ms,
    // step 1 ms), which show the addresses.
    press_char(&mut app, '2');
    let text = screen_text(&mut app, 80, 20);
    for twin in ["step at 0x56240bffe210", "step at 0x56240bffe260"] {
        assert!(text.contains(twin), "{text}");
    }
    assert_eq!(press_char(&mut app, 'e'), show_code(0x5624_0bff_e210));
    press(&mut app, KeyCode::Esc);
    press(&mut app, KeyCode::Down);
    press(&mut app, KeyCode::Down);
    assert_eq!(press_char(&mut app, 'e'), show_code(0x5624_0bff_e260));
}
