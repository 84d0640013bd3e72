//! The Sampled view: the sampled tree and hot spots before any root is instrumented,
//! Enter to instrument a function, `S` between the two trees, `r` for the root picker,
//! and the overlap on the live view's status bar.

mod common;

use common::*;
use std::time::Duration;
use tendril_tui::crossterm::event::KeyCode;
use tendril_tui::{
    Action, App, FunctionEntry, ProfileSnapshot, SamplingStatus, Screen, ScreenKind, Status,
    ThreadSummary, TreeNode,
};

/// A whole-process sampled tree: the worker thread's stack down to a hot leaf, one
/// truncated stack, samples as the count.
///
/// ```text
/// clone3            100 samples
///   worker_main     96
///     work_round    96
///       compute     70   (self 30)
///         leaf_add  40
///       mix         26
/// [truncated stack] 4
/// ```
fn sampled_tree() -> Vec<TreeNode> {
    let ms = |samples: u64| samples as f64 * 2.0 * MS;
    let node = |name: &str, module: &str, samples: u64, self_samples: u64| {
        TreeNode::new(name, module, samples, ms(samples), ms(self_samples))
    };
    vec![
        node("clone3", "libc.so.6", 96, 0).with_children([node("worker_main", "calltree", 96, 0)
            .with_children([node("work_round", "calltree", 96, 0).with_children([
                node("compute", "calltree", 70, 30)
                    .with_children([node("leaf_add", "calltree", 40, 40)]),
                node("mix", "calltree", 26, 26),
            ])])]),
        node("[truncated stack]", "", 4, 4),
    ]
}

fn sampled(stopped: bool) -> ProfileSnapshot {
    ProfileSnapshot {
        merged: sampled_tree(),
        threads: vec![ThreadSummary {
            tid: 7,
            name: "worker".into(),
            calls: 100,
            total_ns: 200.0 * MS,
            roots: sampled_tree(),
        }],
        status: Status {
            target: "pid 4242 calltree".into(),
            elapsed: Duration::from_secs(3),
            sampling: Some(SamplingStatus {
                rate_hz: 499,
                clock: "cpu".into(),
                samples: 100,
                lost_samples: 0,
                truncated_stacks: 4,
                threads: 3,
                stopped,
            }),
            ..Status::default()
        },
    }
}

fn sampled_app() -> App {
    App::new(Screen::Sampled(sampled(false)))
}

#[test]
fn the_sampled_view_says_it_is_sampled_and_opens_the_hottest_path() {
    let mut app = sampled_app();
    assert_eq!(app.screen(), ScreenKind::Sampled);
    let text = screen_text(&mut app, 100, 30);
    for expected in [
        "SAMPLED · all threads",
        "SAMPLES",
        "SAMPLING",
        "499 Hz cpu clock: 100 samples",
        "nothing loaded into the target",
        "Enter instrument",
    ] {
        assert!(text.contains(expected), "{expected:?} missing:\n{text}");
    }
    assert_eq!(
        tree_names(&mut app),
        [
            "clone3",
            " worker_main",
            "  work_round",
            "   compute",
            "    leaf_add",
            "   mix",
            "[truncated",
        ]
    );
    let selected = selected_row(&mut app, 100, 30).expect("a selected row");
    assert!(selected.contains("leaf_add"), "{selected}");
    // Stopped, it says so.
    app.update_sampled(sampled(true));
    let text = screen_text(&mut app, 100, 30);
    assert!(text.contains("SAMPLED │ pid 4242"), "{text}");
    assert!(text.contains("sampling stopped"), "{text}");
}

#[test]
fn enter_instruments_the_selected_function_and_goes_live() {
    let mut app = sampled_app();
    press(&mut app, KeyCode::Up); // compute
    assert_eq!(
        press(&mut app, KeyCode::Enter),
        Some(Action::RootFromSamples {
            name: "compute".into(),
            module: "calltree".into(),
            address: None,
        })
    );
    assert_eq!(app.screen(), ScreenKind::Live);
}

#[test]
fn enter_on_a_hot_spot_instruments_it_and_samples_count_once_per_path() {
    let mut app = sampled_app();
    press_char(&mut app, '2');
    let text = screen_text(&mut app, 100, 30);
    let first = text
        .lines()
        .skip_while(|line| !line.contains("SELF ms▾"))
        .nth(1)
        .unwrap_or_default()
        .to_string();
    assert!(first.starts_with("leaf_add"), "{text}");
    assert!(text.contains("SAMPLES"), "{text}");
    assert_eq!(
        press(&mut app, KeyCode::Enter),
        Some(Action::RootFromSamples {
            name: "leaf_add".into(),
            module: "calltree".into(),
            address: None,
        })
    );
}

#[test]
fn a_truncated_stack_is_not_a_function() {
    let mut app = sampled_app();
    press(&mut app, KeyCode::End);
    assert_eq!(press(&mut app, KeyCode::Enter), None);
    assert_eq!(app.screen(), ScreenKind::Sampled);
    assert!(
        app.message().is_some_and(|m| m.contains("not a function")),
        "{:?}",
        app.message()
    );
}

#[test]
fn s_switches_between_the_sampled_and_the_instrumented_tree() {
    let mut app = sampled_app();
    // Nothing instrumented yet.
    assert_eq!(press_char(&mut app, 'S'), None);
    assert_eq!(app.screen(), ScreenKind::Sampled);
    assert!(
        app.message()
            .is_some_and(|m| m.contains("nothing is instrumented"))
    );
    press(&mut app, KeyCode::Enter);
    let mut live = snapshot();
    live.status.roots = vec!["leaf_add".into()];
    live.status.overlap = Some(0.8766);
    app.update_snapshot(live);
    let text = screen_text(&mut app, 100, 30);
    assert!(text.contains("overlap 0.877 with sampled"), "{text}");
    assert!(text.contains("S sampled"), "{text}");
    press_char(&mut app, 'S');
    assert_eq!(app.screen(), ScreenKind::Sampled);
    // The sampled tree kept its selection.
    let selected = selected_row(&mut app, 100, 30).expect("a selected row");
    assert!(selected.contains("leaf_add"), "{selected}");
    press_char(&mut app, 'S');
    assert_eq!(app.screen(), ScreenKind::Live);
    press_char(&mut app, '?');
    let text = screen_text(&mut app, 100, 40);
    assert!(text.contains("the sampled tree"), "{text}");
}

#[test]
fn without_samples_s_says_why_and_the_help_leaves_it_out() {
    let mut app = App::new(Screen::Live(snapshot()));
    assert_eq!(press_char(&mut app, 'S'), None);
    assert_eq!(app.screen(), ScreenKind::Live);
    assert!(app.message().is_some_and(|m| m.contains("no sampled tree")));
    press_char(&mut app, '?');
    let text = screen_text(&mut app, 100, 40);
    assert!(!text.contains("the sampled tree"), "{text}");
}

#[test]
fn r_opens_the_root_picker_and_esc_comes_back_to_the_samples() {
    let mut app = sampled_app();
    app.set_functions(vec![FunctionEntry {
        name: "work_round".into(),
        module: "calltree".into(),
        size: 64,
        address: 0x1000,
    }]);
    assert_eq!(press_char(&mut app, 'r'), None);
    assert_eq!(app.screen(), ScreenKind::RootPicker);
    press(&mut app, KeyCode::Esc);
    assert_eq!(app.screen(), ScreenKind::Sampled);
    // Without a function list yet, the controller is asked for one.
    let mut app = sampled_app();
    assert_eq!(press_char(&mut app, 'r'), Some(Action::LoadFunctions));
    assert_eq!(app.screen(), ScreenKind::RootPicker);
}

#[test]
fn once_detached_enter_explains_instead_of_instrumenting() {
    let mut app = sampled_app();
    let mut ended = snapshot();
    ended.status.detached = true;
    app.update_snapshot(ended);
    app.show_sampled();
    assert_eq!(press(&mut app, KeyCode::Enter), None);
    assert_eq!(app.screen(), ScreenKind::Sampled);
    assert!(app.message().is_some_and(|m| m.contains("detached")));
}

#[test]
fn the_sampled_views_keys_are_listed() {
    let mut app = sampled_app();
    assert_eq!(press_char(&mut app, 'w'), Some(Action::SaveSampled));
    press_char(&mut app, '?');
    let text = screen_text(&mut app, 110, 30);
    for expected in [
        "instrument this function",
        "root picker",
        "the instrumented tree",
    ] {
        assert!(text.contains(expected), "{expected:?} missing:\n{text}");
    }
}
