//! The live view as a user sees it: call tree browsing, hot spots, threads, the status
//! bar, the help overlay and the actions its keys return, read back from a `TestBackend`.

mod common;
#[path = "live_view/times_and_code.rs"]
mod times_and_code;

use common::*;
use tendril_tui::crossterm::event::KeyCode;
use tendril_tui::{Action, App, ProfileSnapshot, Screen, ScreenKind};

fn live_app() -> App {
    App::new(Screen::Live(snapshot()))
}

#[test]
fn roots_start_expanded_and_children_are_sorted_by_total() {
    let mut app = live_app();
    assert_eq!(
        tree_names(&mut app),
        [
            "main",
            " compute",
            " io_wait",
            " parse",
            "worker_loop",
            " crunch"
        ]
    );
}

#[test]
fn right_expands_left_collapses_and_enter_toggles() {
    let mut app = live_app();
    press(&mut app, KeyCode::Down); // compute
    press(&mut app, KeyCode::Right);
    assert_eq!(
        &tree_names(&mut app)[..5],
        ["main", " compute", "  leaf", "  helper", " io_wait"]
    );
    press(&mut app, KeyCode::Right); // already open: steps into the first child
    press(&mut app, KeyCode::Left); // a leaf: steps out to its parent
    press(&mut app, KeyCode::Left); // collapses compute
    assert_eq!(&tree_names(&mut app)[..3], ["main", " compute", " io_wait"]);
    press(&mut app, KeyCode::Enter);
    assert_eq!(&tree_names(&mut app)[..3], ["main", " compute", "  leaf"]);
    press(&mut app, KeyCode::Enter);
    assert_eq!(&tree_names(&mut app)[..3], ["main", " compute", " io_wait"]);
    press(&mut app, KeyCode::Up); // main
    press(&mut app, KeyCode::Left);
    assert_eq!(tree_names(&mut app), ["main", "worker_loop", " crunch"]);
}

#[test]
fn rows_show_calls_times_share_and_expanders() {
    let mut app = live_app();
    let rows = screen(&mut app, 120, 30);
    let compute = rows_with(&rows, "compute")[0];
    assert!(compute.contains("▸ compute"), "{compute}");
    for cell in ["calltree", " 5 ", "50.00", "10.00", "41.7%", "█"] {
        assert!(compute.contains(cell), "{cell:?} missing from {compute:?}");
    }
    assert!(rows_with(&rows, "main")[0].contains("▾ main"));
    assert!(
        rows[1].contains("TOTAL ms▾"),
        "the sort column is marked: {}",
        rows[1]
    );
}

#[test]
fn s_cycles_the_sort_through_total_self_and_calls() {
    let mut app = live_app();
    let children = |app: &mut App| {
        tree_names(app)[1..4]
            .iter()
            .map(|name| name.trim().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(children(&mut app), ["compute", "io_wait", "parse"]);
    press_char(&mut app, 's');
    assert_eq!(children(&mut app), ["io_wait", "compute", "parse"]);
    assert!(screen_text(&mut app, 120, 30).contains("SELF ms▾"));
    press_char(&mut app, 's');
    assert_eq!(children(&mut app), ["parse", "compute", "io_wait"]);
    assert!(screen_text(&mut app, 120, 30).contains("CALLS▾"));
    press_char(&mut app, 's');
    assert_eq!(children(&mut app), ["compute", "io_wait", "parse"]);
}

#[test]
fn h_expands_the_hottest_path_and_selects_its_end() {
    let mut app = live_app();
    press_char(&mut app, 'h'); // from main: compute (50) then leaf (30)
    assert_eq!(
        &tree_names(&mut app)[..5],
        ["main", " compute", "  leaf", "  helper", " io_wait"]
    );
    let selected = selected_row(&mut app, 120, 30).expect("a selected row");
    assert!(
        selected.contains("leaf") && selected.contains("30.00"),
        "{selected}"
    );
    press(&mut app, KeyCode::Left); // leaf has no children: steps to its parent
    assert!(selected_row(&mut app, 120, 30).is_some_and(|row| row.contains("compute")));
    press(&mut app, KeyCode::Left); // collapses compute
    assert_eq!(&tree_names(&mut app)[..3], ["main", " compute", " io_wait"]);
}

#[test]
fn expansion_and_selection_survive_a_snapshot_update() {
    let mut app = live_app();
    press(&mut app, KeyCode::Down);
    press(&mut app, KeyCode::Right); // compute open
    let before = tree_names(&mut app);
    for round in 1..=10 {
        let mut next = snapshot();
        // Times grow and the order of the roots' children changes with them.
        next.merged[0].children[1].total_ns = (60.0 + round as f64) * MS;
        next.merged[0].children[0].calls += round;
        app.update_snapshot(next);
        let rows = tree_names(&mut app);
        assert!(
            rows.contains(&"  leaf".to_string()),
            "compute collapsed after update {round}: {rows:?}"
        );
    }
    let after = tree_names(&mut app);
    assert_eq!(before.len(), after.len());
    assert_eq!(
        after[1], " io_wait",
        "io_wait now has the larger total and comes first"
    );
    let selected = selected_row(&mut app, 120, 30).expect("a selected row");
    assert!(
        selected.contains("compute"),
        "the selection followed compute: {selected}"
    );
    press(&mut app, KeyCode::Left);
    assert!(!tree_names(&mut app).contains(&"  leaf".to_string()));
}

#[test]
fn hot_spots_sum_self_time_over_contexts() {
    let mut app = live_app();
    press_char(&mut app, '2');
    let rows = screen(&mut app, 120, 30);
    assert!(rows[1].contains("SELF ms▾"), "{}", rows[1]);
    let leaf = rows_with(&rows, "leaf");
    assert_eq!(leaf.len(), 1, "one row per function: {rows:#?}");
    // leaf: 30 ms under compute + 10 ms under parse, 20 + 4 calls.
    assert!(
        leaf[0].contains("40.00") && leaf[0].contains(" 24 "),
        "{}",
        leaf[0]
    );
    let order: Vec<&str> = rows[2..6]
        .iter()
        .map(|row| row.split_whitespace().next().unwrap_or(""))
        .collect();
    assert_eq!(order, ["leaf", "io_wait", "crunch", "compute"]);
}

#[test]
fn enter_on_a_thread_filters_the_tree_and_m_returns_to_merged() {
    let mut app = live_app();
    press_char(&mut app, '3');
    let rows = screen(&mut app, 120, 30);
    assert!(
        !rows_with(&rows, "worker").is_empty() && rows_with(&rows, "102").len() == 1,
        "{rows:#?}"
    );
    press(&mut app, KeyCode::Down);
    press(&mut app, KeyCode::Enter);
    let rows = screen(&mut app, 120, 30);
    assert!(rows[0].contains("thread 102 worker"), "{}", rows[0]);
    assert_eq!(tree_names(&mut app), ["worker_loop", " crunch"]);
    press_char(&mut app, '3');
    assert!(
        screen_text(&mut app, 120, 30).contains("● worker"),
        "the filtered thread is marked"
    );
    press_char(&mut app, 'm');
    press_char(&mut app, '1');
    assert!(screen(&mut app, 120, 30)[0].contains("all threads"));
    assert_eq!(tree_names(&mut app)[0], "main");
}

#[test]
fn status_bar_shows_the_session_and_counters() {
    let mut app = live_app();
    let text = screen_text(&mut app, 120, 30);
    for expected in [
        "RUNNING",
        "pid 4242 calltree",
        "root: main, worker_loop",
        "00:01:23",
        "1.2M ev/s",
        "12 instr / 8 invoked",
        "3 indirect: 2 followed, 5 targets",
        "0 lost",
        "~2.5% overhead",
    ] {
        assert!(
            text.contains(expected),
            "{expected:?} missing from the status bar:\n{text}"
        );
    }
    let mut paused = snapshot();
    paused.status.paused = true;
    paused.status.message = Some("saved profile to x.json".into());
    app.update_snapshot(paused);
    let text = screen_text(&mut app, 120, 30);
    assert!(
        text.contains("PAUSED") && text.contains("saved profile to x.json"),
        "{text}"
    );
}

#[test]
fn question_mark_toggles_a_help_overlay_listing_every_key() {
    let mut app = live_app();
    assert_eq!(press_char(&mut app, '?'), None);
    assert!(app.is_help_visible());
    let text = screen_text(&mut app, 100, 30);
    for key in [
        "pause or resume",
        "reset",
        "add or change the root",
        "save",
        "detach",
        "quit",
        "hottest path",
        "sort",
    ] {
        assert!(text.contains(key), "{key:?} missing from help:\n{text}");
    }
    assert_eq!(
        press_char(&mut app, 'q'),
        None,
        "a key while help is open only closes it"
    );
    assert!(!app.is_help_visible());
    assert!(!screen_text(&mut app, 100, 30).contains("hottest path"));
}

#[test]
fn a_view_key_closes_the_help_and_switches_the_view_in_one_press() {
    let mut app = live_app();
    press_char(&mut app, '?');
    assert!(app.is_help_visible());
    assert_eq!(press_char(&mut app, '2'), None);
    assert!(!app.is_help_visible());
    let rows = screen(&mut app, 120, 30);
    assert!(rows[1].contains("SELF ms▾"), "the hot spots: {rows:#?}");
}

#[test]
fn the_threads_tab_shows_its_sort_marker() {
    let mut app = live_app();
    press_char(&mut app, '3');
    let rows = screen(&mut app, 120, 30);
    assert!(rows[1].contains("TID▴"), "{rows:#?}");
}

#[test]
fn the_key_hints_fit_at_120_columns_and_keep_the_important_ones_at_80() {
    let mut app = live_app();
    let all = [
        "1-3 views",
        "s sort",
        "h hottest",
        "p pause",
        "X reset",
        "r roots",
        "w save",
        "d detach",
        "q quit",
        "? help",
    ];
    let footer = screen(&mut app, 120, 30).last().cloned().unwrap();
    for hint in all {
        assert!(
            footer.contains(hint),
            "{hint:?} missing at 120 columns: {footer:?}"
        );
    }
    let footer = screen(&mut app, 80, 24).last().cloned().unwrap();
    for hint in [
        "? help", "q quit", "p pause", "r roots", "w save", "d detach",
    ] {
        assert!(
            footer.contains(hint),
            "{hint:?} missing at 80 columns: {footer:?}"
        );
    }
    // With a message, the hints that still fit are whole ones.
    app.set_message("saved profile to /tmp/tendril-4242-20261123-224500.json");
    let footer = screen(&mut app, 80, 24).last().cloned().unwrap();
    assert!(
        footer.contains("? help") && footer.trim_end().ends_with("help"),
        "{footer:?}"
    );
}

#[test]
fn a_notice_too_long_for_one_line_is_shown_whole_at_80_columns() {
    let mut app = live_app();
    let notice = "tendril: calls through pointers: 3967 address-taken functions in 12 modules \
                  instrumented (found in 404 ms); 33 not followed (the profile lists them with \
                  the reason)";
    app.show_stderr_line(notice);
    for (width, height) in [(80, 24), (120, 35)] {
        let rows = screen(&mut app, width, height);
        let text: String = rows
            .iter()
            .map(|row| row.trim())
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            text.contains(notice),
            "the notice cut at {width}×{height}:\n{}",
            rows.join("\n")
        );
        assert!(
            text.contains("lost") && text.contains("overhead"),
            "the status bar is still there at {width}×{height}:\n{}",
            rows.join("\n")
        );
    }
    // A screen too short to give it rows keeps one line, cut.
    let rows = screen(&mut app, 80, 8);
    assert_eq!(rows.len(), 8);
}

#[test]
fn live_keys_return_actions() {
    let mut app = live_app();
    assert_eq!(press_char(&mut app, 'p'), Some(Action::Pause));
    let mut paused = snapshot();
    paused.status.paused = true;
    app.update_snapshot(paused);
    assert_eq!(press_char(&mut app, 'p'), Some(Action::Resume));
    assert_eq!(press_char(&mut app, 'X'), Some(Action::Reset));
    assert_eq!(press_char(&mut app, 'w'), Some(Action::Save));
    assert_eq!(press_char(&mut app, 't'), Some(Action::Trace));
    assert_eq!(press_char(&mut app, 'd'), Some(Action::Detach));
    assert_eq!(press_char(&mut app, 'q'), Some(Action::Quit));
    assert_eq!(ctrl(&mut app, 'c'), Some(Action::Quit));
    assert_eq!(
        press_char(&mut app, 'x'),
        None,
        "lower-case x does not reset"
    );
}

#[test]
fn r_opens_the_root_picker_and_asks_for_functions_when_it_has_none() {
    let mut app = live_app();
    assert_eq!(press_char(&mut app, 'r'), Some(Action::LoadFunctions));
    assert_eq!(app.screen(), ScreenKind::RootPicker);
    assert!(screen_text(&mut app, 80, 24).contains("loading"));
    press(&mut app, KeyCode::Esc);
    assert_eq!(
        app.screen(),
        ScreenKind::Live,
        "Esc goes back: roots are already set"
    );
}

#[test]
fn after_detach_the_data_stays_browsable_and_target_keys_are_refused() {
    let mut app = live_app();
    let mut detached = snapshot();
    detached.status.detached = true;
    app.update_snapshot(detached);
    for key in ['p', 'X', 'd', 'r'] {
        assert_eq!(press_char(&mut app, key), None, "{key} needs a target");
    }
    assert_eq!(
        press_char(&mut app, 'w'),
        Some(Action::Save),
        "saving needs no target"
    );
    let text = screen_text(&mut app, 100, 24);
    assert!(
        text.contains("DETACHED") && text.contains("detached"),
        "{text}"
    );
    press_char(&mut app, 'h');
    assert_eq!(&tree_names(&mut app)[..3], ["main", " compute", "  leaf"]);
}

#[test]
fn read_only_mode_hides_and_refuses_target_actions() {
    let mut app = App::new(Screen::ReadOnly(snapshot()));
    assert!(app.is_read_only());
    for key in ['p', 'X', 'd', 'r', 'w'] {
        assert_eq!(
            press_char(&mut app, key),
            None,
            "{key} is not available read-only"
        );
    }
    assert!(
        app.message()
            .is_some_and(|message| message.contains("read-only"))
    );
    press_char(&mut app, '?');
    let text = screen_text(&mut app, 100, 30);
    assert!(text.contains("READ-ONLY"));
    assert!(
        !text.contains("pause or resume") && !text.contains("detach:"),
        "{text}"
    );
    assert!(text.contains("hottest path"), "browsing keys stay");
    press(&mut app, KeyCode::Esc);
    assert_eq!(press_char(&mut app, 'q'), Some(Action::Quit));
}

#[test]
fn an_80_by_24_screen_keeps_the_important_columns() {
    let mut app = live_app();
    let rows = screen(&mut app, 80, 24);
    let header = &rows[1];
    for title in ["FUNCTION", "CALLS", "TOTAL ms", "SELF ms", "%"] {
        assert!(
            header.contains(title),
            "{title:?} missing at 80 columns: {header}"
        );
    }
    assert!(
        !header.contains("MODULE"),
        "the module goes before the numbers: {header}"
    );
    assert!(rows.iter().all(|row| row.chars().count() <= 80));
    let compute = rows_with(&rows, "compute")[0];
    assert!(
        compute.contains("50.00") && compute.contains("41.7%"),
        "{compute}"
    );
    assert!(
        rows.iter().any(|row| row.contains("RUNNING")),
        "status bar visible"
    );
}

#[test]
fn long_names_are_cut_with_an_ellipsis() {
    let long =
        "std::collections::hash::map::HashMap<alloc::string::String, alloc::vec::Vec<u8>>::insert";
    let mut data = snapshot();
    data.merged[0].children[0].name = long.into();
    let mut app = App::new(Screen::Live(data));
    let rows = screen(&mut app, 80, 24);
    let row = rows_with(&rows, "std::collections")[0];
    assert!(row.contains('…') && row.contains("50.00"), "{row}");
}

#[test]
fn stripped_names_name_their_module_once_and_three_never_look_the_same() {
    let module = "libpython3.12.so.1.0";
    let mut data = snapshot();
    let compute = &mut data.merged[0].children[0];
    compute.children.clear();
    compute.below_resolution = true;
    for (offset, ms) in [("1a2b30", 3.0), ("1a2b90", 2.0), ("1a2c10", 1.0)] {
        let name = format!("{module}+0x{offset}");
        compute.children.push(node(&name, module, 1, ms, ms));
    }
    let mut app = App::new(Screen::Live(data));
    press(&mut app, KeyCode::Down); // compute
    press(&mut app, KeyCode::Right);
    for width in [80, 160] {
        let rows = screen(&mut app, width, 24);
        let stripped = rows_with(&rows, "+0x1a2");
        assert_eq!(stripped.len(), 3, "{rows:#?}");
        for (row, offset) in stripped.iter().zip(["1a2b30", "1a2b90", "1a2c10"]) {
            assert!(row.contains(&format!("+0x{offset} ")), "{row}");
            assert_eq!(row.matches("libpy").count(), 1, "the module once: {row}");
        }
        let compute = rows_with(&rows, "compute")[0];
        assert!(
            compute.contains("<res"),
            "below resolution, not 0: {compute}"
        );
    }
    // The hot spots too.
    press_char(&mut app, '2');
    let rows = screen(&mut app, 160, 24);
    let stripped = rows_with(&rows, "+0x1a2");
    assert_eq!(stripped.len(), 3, "{rows:#?}");
    assert!(stripped.iter().all(|row| row.matches("libpy").count() == 1));
}

#[test]
fn a_call_into_jit_code_shows_jit_in_the_calls_column_and_its_module() {
    let mut data = snapshot();
    let compute = &mut data.merged[0].children[0];
    compute.children.clear();
    let mut leaf = node("JS:*leafy app.js:1", "[jit]", 0, 0.0, 0.0);
    leaf.jit = true;
    compute.children.push(leaf);
    let mut app = App::new(Screen::Live(data));
    press(&mut app, KeyCode::Down); // compute
    press(&mut app, KeyCode::Right);
    let rows = screen(&mut app, 120, 24);
    let row = rows_with(&rows, "JS:*leafy")[0];
    assert!(row.contains("[jit]") && row.contains(" jit "), "{row}");
}

#[test]
fn tiny_and_empty_screens_do_not_panic() {
    let sizes = [
        (0, 0),
        (1, 1),
        (10, 3),
        (3, 10),
        (20, 5),
        (80, 2),
        (200, 60),
    ];
    let mut apps = vec![
        live_app(),
        App::new(Screen::Live(ProfileSnapshot::default())),
        App::new(Screen::ReadOnly(snapshot())),
    ];
    for app in &mut apps {
        for tab in ['1', '2', '3'] {
            press_char(app, tab);
            for (width, height) in sizes {
                screen(app, width, height);
            }
        }
        press_char(app, '?');
        for (width, height) in sizes {
            screen(app, width, height);
        }
    }
}

#[test]
fn empty_data_says_so() {
    let mut app = App::new(Screen::Live(ProfileSnapshot::default()));
    assert!(screen_text(&mut app, 80, 24).contains("waiting for a root function"));
    for key in [
        KeyCode::Down,
        KeyCode::Enter,
        KeyCode::Left,
        KeyCode::Right,
        KeyCode::End,
        KeyCode::PageUp,
    ] {
        press(&mut app, key);
    }
    press_char(&mut app, 'h');
    press_char(&mut app, '3');
    assert!(screen_text(&mut app, 80, 24).contains("no thread"));
}

#[test]
fn a_keys_answer_is_not_replaced_by_a_note_that_arrives_just_after() {
    let mut app = live_app();
    press_char(&mut app, 'S');
    let answer = app.message().unwrap_or_default().to_owned();
    assert!(answer.contains("no sampled tree"), "{answer}");
    app.show_stderr_line("tendril: counting, not timing, 1 function too short to time");
    let text = screen_text(&mut app, 120, 30);
    assert!(text.contains("no sampled tree"), "{text}");
    // A note with no answer on the line is shown at once.
    press(&mut app, KeyCode::Esc);
    app.show_stderr_line("tendril: a later note");
    assert!(screen_text(&mut app, 120, 30).contains("a later note"));
}
