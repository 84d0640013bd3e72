//! The process picker and the root picker: filtering, moving, choosing, and the actions
//! they return.

mod common;

use common::*;
use tendril_tui::crossterm::event::KeyCode;
use tendril_tui::{Action, App, FunctionEntry, ProcessEntry, Screen, ScreenKind};

fn process(pid: u32, user: &str, threads: u32, command_line: &str) -> ProcessEntry {
    ProcessEntry {
        pid,
        user: user.into(),
        threads,
        command_line: command_line.into(),
    }
}

fn processes() -> Vec<ProcessEntry> {
    vec![
        process(1, "root", 1, "/sbin/init"),
        process(812, "www", 9, "/usr/sbin/nginx -g daemon off;"),
        process(4242, "dev", 9, "./target/release/calltree --threads 8"),
        process(5150, "dev", 2, "/usr/bin/python3 server.py"),
    ]
}

fn function(name: &str, module: &str, size: u64) -> FunctionEntry {
    FunctionEntry {
        name: name.into(),
        module: module.into(),
        size,
        address: 0x1000 + size,
    }
}

fn functions() -> Vec<FunctionEntry> {
    vec![
        function("main", "calltree", 120),
        function("compute_block", "calltree", 312),
        function("copy_bytes", "calltree", 48),
        function("malloc", "libc.so.6", 410),
        function("std::vector<int>::push_back", "calltree", 96),
    ]
}

#[test]
fn process_picker_lists_filters_and_attaches() {
    let mut app = App::new(Screen::ProcessPicker(processes()));
    let text = screen_text(&mut app, 80, 24);
    for expected in [
        "PID",
        "USER",
        "THR",
        "COMMAND",
        "/sbin/init",
        "nginx",
        "4 of 4 processes",
    ] {
        assert!(text.contains(expected), "{expected:?} missing:\n{text}");
    }
    type_text(&mut app, "calltree");
    let rows = screen(&mut app, 80, 24);
    assert!(
        rows[0].contains("calltree") && rows[0].contains("1 of 4"),
        "{}",
        rows[0]
    );
    assert!(rows_with(&rows, "nginx").is_empty());
    assert_eq!(press(&mut app, KeyCode::Enter), Some(Action::Attach(4242)));
    assert_eq!(
        app.screen(),
        ScreenKind::ProcessPicker,
        "the controller moves on once attached"
    );
}

#[test]
fn process_filter_matches_pid_user_and_every_word() {
    let mut app = App::new(Screen::ProcessPicker(processes()));
    type_text(&mut app, "dev py");
    assert_eq!(press(&mut app, KeyCode::Enter), Some(Action::Attach(5150)));
    press(&mut app, KeyCode::Esc); // clears the filter
    type_text(&mut app, "812");
    assert_eq!(press(&mut app, KeyCode::Enter), Some(Action::Attach(812)));
    type_text(&mut app, "zzz");
    assert!(screen_text(&mut app, 80, 24).contains("no process matches"));
    assert_eq!(press(&mut app, KeyCode::Enter), None);
}

#[test]
fn process_picker_moves_with_the_arrows_and_follows_the_pid_on_refresh() {
    let mut app = App::new(Screen::ProcessPicker(processes()));
    press(&mut app, KeyCode::End);
    assert_eq!(press(&mut app, KeyCode::Enter), Some(Action::Attach(5150)));
    press(&mut app, KeyCode::Up);
    assert_eq!(press(&mut app, KeyCode::Enter), Some(Action::Attach(4242)));
    assert_eq!(ctrl(&mut app, 'r'), Some(Action::RefreshProcesses));
    let mut refreshed = processes();
    refreshed.insert(0, process(2, "root", 1, "[kthreadd]"));
    app.set_processes(refreshed);
    assert_eq!(
        press(&mut app, KeyCode::Enter),
        Some(Action::Attach(4242)),
        "the selection follows the pid"
    );
    press(&mut app, KeyCode::Home);
    assert_eq!(press(&mut app, KeyCode::Enter), Some(Action::Attach(2)));
}

#[test]
fn process_picker_quits_with_q_esc_or_ctrl_c() {
    let mut app = App::new(Screen::ProcessPicker(processes()));
    assert_eq!(press_char(&mut app, 'q'), Some(Action::Quit));
    assert_eq!(press(&mut app, KeyCode::Esc), Some(Action::Quit));
    type_text(&mut app, "nq"); // q is typed into a filter that is not empty
    assert!(screen_text(&mut app, 80, 24).contains("filter: nq"));
    assert_eq!(ctrl(&mut app, 'c'), Some(Action::Quit));
    assert_eq!(
        press(&mut app, KeyCode::Esc),
        None,
        "Esc first clears the filter"
    );
    assert_eq!(press(&mut app, KeyCode::Esc), Some(Action::Quit));
}

#[test]
fn root_picker_filters_fuzzily_and_shows_the_match_count() {
    let mut app = App::new(Screen::RootPicker(functions()));
    let text = screen_text(&mut app, 80, 24);
    assert!(text.contains("5 of 5 functions"), "{text}");
    for column in ["FUNCTION", "MODULE", "SIZE", "libc.so.6", "410"] {
        assert!(text.contains(column), "{column:?} missing:\n{text}");
    }
    type_text(&mut app, "cblk");
    let rows = screen(&mut app, 80, 24);
    assert!(
        rows[0].contains("cblk") && rows[0].contains("1 of 5 functions"),
        "{}",
        rows[0]
    );
    assert_eq!(rows_with(&rows, "compute_block").len(), 1);
    assert!(rows_with(&rows, "copy_bytes").is_empty());
    press(&mut app, KeyCode::Backspace);
    press(&mut app, KeyCode::Backspace);
    let text = screen_text(&mut app, 80, 24);
    assert!(
        text.contains("3 of 5 functions"),
        "cb: compute_block, copy_bytes, push_back:\n{text}"
    );
    assert_eq!(press(&mut app, KeyCode::Esc), None, "Esc clears the query");
    assert!(screen_text(&mut app, 80, 24).contains("5 of 5 functions"));
}

#[test]
fn enter_profiles_the_highlighted_function() {
    let mut app = App::new(Screen::RootPicker(functions()));
    type_text(&mut app, "malloc");
    let action = press(&mut app, KeyCode::Enter);
    assert_eq!(
        action,
        Some(Action::SetRoots(vec![function("malloc", "libc.so.6", 410)]))
    );
    assert_eq!(
        app.screen(),
        ScreenKind::Live,
        "the live view waits for the first snapshot"
    );
    assert!(screen_text(&mut app, 80, 24).contains("waiting for a root function"));
}

#[test]
fn tab_selects_several_roots() {
    let mut app = App::new(Screen::RootPicker(functions()));
    type_text(&mut app, "compute");
    press(&mut app, KeyCode::Tab);
    press(&mut app, KeyCode::Esc); // clear the query: the selection stays
    type_text(&mut app, "push back");
    press(&mut app, KeyCode::Tab);
    let text = screen_text(&mut app, 80, 24);
    assert!(
        text.contains("2 selected")
            && text.contains("selected: compute_block, std::vector<int>::push_back"),
        "{text}"
    );
    assert!(text.contains("✓"));
    let Some(Action::SetRoots(roots)) = press(&mut app, KeyCode::Enter) else {
        panic!("Enter must set the roots")
    };
    let names: Vec<&str> = roots.iter().map(|root| root.name.as_str()).collect();
    assert_eq!(names, ["compute_block", "std::vector<int>::push_back"]);
}

#[test]
fn tab_again_removes_a_function_from_the_selection() {
    let mut app = App::new(Screen::RootPicker(functions()));
    type_text(&mut app, "main");
    press(&mut app, KeyCode::Tab);
    press(&mut app, KeyCode::Up); // Tab moved down; go back to main
    press(&mut app, KeyCode::Tab);
    assert!(!screen_text(&mut app, 80, 24).contains("selected"));
    assert_eq!(
        press(&mut app, KeyCode::Enter),
        Some(Action::SetRoots(vec![function("main", "calltree", 120)]))
    );
}

#[test]
fn esc_on_a_first_root_picker_stays_and_explains() {
    let mut app = App::new(Screen::RootPicker(functions()));
    assert_eq!(press(&mut app, KeyCode::Esc), None);
    assert_eq!(app.screen(), ScreenKind::RootPicker);
    assert!(
        app.message()
            .is_some_and(|message| message.contains("choose a root"))
    );
    assert_eq!(ctrl(&mut app, 'c'), Some(Action::Quit));
}

#[test]
fn changing_roots_from_the_live_view_starts_from_the_current_ones() {
    let mut app = App::new(Screen::Live(snapshot())); // roots: main, worker_loop
    assert_eq!(press_char(&mut app, 'r'), Some(Action::LoadFunctions));
    app.set_functions(functions());
    let text = screen_text(&mut app, 80, 24);
    assert!(
        text.contains("1 selected") && text.contains("selected: main"),
        "current roots known to the list are preselected:\n{text}"
    );
    assert!(
        text.contains("RUNNING"),
        "the status bar stays visible while changing roots"
    );
    type_text(&mut app, "compute");
    press(&mut app, KeyCode::Tab);
    let Some(Action::SetRoots(roots)) = press(&mut app, KeyCode::Enter) else {
        panic!("Enter must set the roots")
    };
    let names: Vec<&str> = roots.iter().map(|root| root.name.as_str()).collect();
    assert_eq!(names, ["main", "compute_block"]);
    // Enter without Tab adds the highlighted function to the current roots.
    app.update_snapshot(snapshot()); // the controller still reports main, worker_loop
    press_char(&mut app, 'r');
    type_text(&mut app, "malloc");
    let Some(Action::SetRoots(roots)) = press(&mut app, KeyCode::Enter) else {
        panic!("Enter must set the roots")
    };
    let names: Vec<&str> = roots.iter().map(|root| root.name.as_str()).collect();
    assert_eq!(names, ["main", "malloc"]);
    // Replacing: Tab the old root off, Tab the new one on, Enter.
    press_char(&mut app, 'r');
    type_text(&mut app, "main");
    press(&mut app, KeyCode::Tab);
    press(&mut app, KeyCode::Esc);
    type_text(&mut app, "copy");
    press(&mut app, KeyCode::Tab);
    assert_eq!(
        press(&mut app, KeyCode::Enter),
        Some(Action::SetRoots(vec![function(
            "copy_bytes",
            "calltree",
            48
        )]))
    );
    // A second visit needs no new list.
    assert_eq!(press_char(&mut app, 'r'), None);
    assert_eq!(app.screen(), ScreenKind::RootPicker);
    press(&mut app, KeyCode::Esc);
    assert_eq!(app.screen(), ScreenKind::Live);
}

#[test]
fn attach_then_root_picker_then_live_is_the_whole_flow() {
    let mut app = App::new(Screen::ProcessPicker(processes()));
    type_text(&mut app, "4242");
    assert_eq!(press(&mut app, KeyCode::Enter), Some(Action::Attach(4242)));
    app.show_root_picker(functions());
    assert_eq!(app.screen(), ScreenKind::RootPicker);
    type_text(&mut app, "compute");
    assert!(matches!(
        press(&mut app, KeyCode::Enter),
        Some(Action::SetRoots(_))
    ));
    app.update_snapshot(snapshot());
    assert_eq!(tree_names(&mut app)[0], "main");
}

#[test]
fn a_process_gone_at_the_root_picker_leads_back_to_the_process_list() {
    let mut app = App::new(Screen::ProcessPicker(processes()));
    type_text(&mut app, "4242");
    assert_eq!(press(&mut app, KeyCode::Enter), Some(Action::Attach(4242)));
    app.show_root_picker(functions());
    // The controller notices that 4242 exited and starts over.
    let mut remaining = processes();
    remaining.retain(|process| process.pid != 4242);
    app.show_process_picker(remaining);
    app.set_message("pid 4242 calltree exited; choose another process");
    assert_eq!(app.screen(), ScreenKind::ProcessPicker);
    let text = screen_text(&mut app, 80, 24);
    assert!(
        text.contains("choose another process") && text.contains("3 of 3 processes"),
        "{text}"
    );
    type_text(&mut app, "python");
    assert_eq!(press(&mut app, KeyCode::Enter), Some(Action::Attach(5150)));
    // The next process's root picker starts afresh: Esc does not lead to a live view.
    app.show_root_picker(functions());
    assert_eq!(press(&mut app, KeyCode::Esc), None);
    assert_eq!(app.screen(), ScreenKind::RootPicker);
}

#[test]
fn f1_shows_picker_help_and_pickers_survive_tiny_screens() {
    let mut app = App::new(Screen::RootPicker(functions()));
    press(&mut app, KeyCode::F(1));
    assert!(screen_text(&mut app, 80, 24).contains("select or unselect the function"));
    press(&mut app, KeyCode::Esc);
    let mut picker = App::new(Screen::ProcessPicker(processes()));
    let mut empty = App::new(Screen::ProcessPicker(Vec::new()));
    for app in [&mut app, &mut picker, &mut empty] {
        for (width, height) in [(0, 0), (1, 1), (10, 3), (5, 30), (80, 2)] {
            screen(app, width, height);
        }
    }
}
