//! The live terminal UI end to end, in a real pseudo-terminal: tmux runs `tendril` in a
//! detached 100×30 session, the test types keys into it and reads the screen back.
//!
//! The one idea: the test does what a user does — attach, type a root's name, press
//! Enter, watch the tree, quit — and then checks what the user relies on: the numbers
//! on screen are plausible, tendril exits cleanly, and the target still computes the
//! same checksums with exactly the code of its files. Every wait polls the screen with
//! a timeout and prints the screen when it fails.

use crate::common;
#[path = "live_ui/without_terminal.rs"]
mod without_terminal;

use common::{
    EXIT_TIMEOUT, Target, Tmux, calls_of, code_bytes_match_file, tendril,
    wait_until_no_hook_is_left_in,
};
use std::path::Path;
use std::time::{Duration, Instant};
use tendril::process::StatLine;

/// How long a fixture may take to print its checksum lines.
const LINES_TIMEOUT: Duration = Duration::from_secs(10);

/// Checks that process `pid` is exactly as before tendril looked at it: not traced, no
/// agent loaded (so nothing can have been patched either).
fn assert_untouched(pid: i32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status.lines().any(|line| line == "TracerPid:\t0"),
        "process {pid} is traced:\n{status}"
    );
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(
        !maps.contains("libtendril_agent"),
        "the agent was loaded into process {pid}:\n{maps}"
    );
}

/// Waits for the live view to show `root` with calls, and `child` below it with calls.
///
/// Home is pressed first: a hottest path expanded when the data came (a recursive one can
/// be deeper than the window) selects its leaf, and may scroll the root out of sight.
fn wait_for_rows(ui: &Tmux, root: &str, child: &str) -> String {
    ui.press("Home");
    ui.wait_for(&format!("{root} and {child} rows with calls"), |screen| {
        let root_calls = calls_of(screen, root)?;
        let child_calls = calls_of(screen, child)?;
        (root_calls > 0.0 && child_calls > 0.0).then(|| screen.to_string())
    })
}

/// The root picker's highlighted (first) row: whether it is selected, and its name.
fn first_picker_row(screen: &str) -> Option<(bool, String)> {
    let mut lines = screen.lines();
    lines.find(|line| line.contains("FUNCTION") && line.contains("MODULE"))?;
    let mut words = lines.next()?.split_whitespace();
    let first = words.next()?;
    Some(match first {
        "✓" => (true, words.next()?.to_string()),
        name => (false, name.to_string()),
    })
}

/// The calltree fixture's steady checksum (read twice, and checked equal).
fn steady_checksum(target: &mut Target) -> u64 {
    let expected = target.checksum_lines(2, LINES_TIMEOUT);
    assert_eq!(
        expected[0], expected[1],
        "the fixture's checksum is not stable"
    );
    expected[0]
}

/// The target computes `expected` on its next three rounds, and runs its files' code.
fn assert_target_intact(target: &mut Target, expected: u64) {
    target.drain();
    let after = target.checksum_lines(3, LINES_TIMEOUT);
    assert!(
        after.iter().all(|&c| c == expected),
        "checksums changed: {expected} then {after:?}"
    );
    // The unwinder's hooks come out by themselves once no thread is inside one (the
    // agent's restorer; `status` says `pending_restore` until then).
    wait_until_no_hook_is_left_in(target.pid(), LINES_TIMEOUT);
    code_bytes_match_file(target.pid()).expect("the target's code equals its files");
    let status = std::fs::read_to_string(format!("/proc/{}/status", target.pid())).unwrap();
    assert!(
        status.lines().any(|line| line == "TracerPid:\t0"),
        "the target is still traced:\n{status}"
    );
}

/// The calltree fixture with two workers, its steady checksum, and `tendril attach` on
/// it with `work_round` as the root, in a session named `session`.
fn attach_to_calltree(session: &str) -> (Target, u64, Tmux) {
    let mut target = Target::spawn("calltree", &["2"]);
    let expected = steady_checksum(&mut target);
    let ui = Tmux::tendril(
        session,
        &["attach", &target.pid().to_string(), "--root", "work_round"],
    );
    (target, expected, ui)
}

/// tendril exits with status 0, its last screen saying it detached from the calltree
/// `target`, which computes `expected` and runs its files' code.
fn assert_detached_and_intact(ui: &Tmux, target: &mut Target, expected: u64) {
    assert_eq!(ui.wait_exit(), 0, "the screen:\n{}", ui.screen());
    let screen = ui.screen();
    assert!(
        screen.contains(&format!("detached from pid {} calltree", target.pid())),
        "{screen}"
    );
    assert_target_intact(target, expected);
}

/// The pid in the status bar's "pid N name".
fn target_pid(screen: &str) -> Option<i32> {
    let words: Vec<&str> = screen.split_whitespace().collect();
    words
        .windows(2)
        .find(|pair| pair[0] == "pid")
        .and_then(|pair| pair[1].parse().ok())
}

fn assert_ratio(
    what: &str,
    numerator: f64,
    denominator: f64,
    range: std::ops::RangeInclusive<f64>,
    screen: &str,
) {
    let ratio = numerator / denominator;
    assert!(
        range.contains(&ratio),
        "{what}: {numerator} / {denominator} = {ratio:.1}, expected within {range:?}; the screen:\n{screen}"
    );
}

#[test]
fn attach_pick_a_root_watch_the_tree_and_quit() {
    let _turn = common::live_target_turn();
    let mut target = Target::spawn("calltree", &["4"]);
    let pid = target.pid();
    let expected = target.checksum_lines(2, LINES_TIMEOUT);
    assert_eq!(
        expected[0], expected[1],
        "the fixture's checksum is not stable"
    );

    let ui = Tmux::tendril("attach", &["attach", &pid.to_string()]);
    // The Sampled view comes first (where perf events are allowed); r opens the root
    // picker from there.
    let sampled = ui.wait_for("the Sampled view or the root picker", |screen| {
        if screen.contains("SAMPLED") {
            Some(true)
        } else {
            screen.contains("SIZE").then_some(false)
        }
    });
    if sampled {
        ui.press("r");
        ui.wait_for_text("SIZE");
    }
    ui.type_text("work_round");
    ui.wait_for("work_round among the matches", |screen| {
        let mut lines = screen.lines();
        let title = lines.next()?;
        // The best match is the first row under the header.
        let first = lines.nth(1)?;
        (title.contains("root: work_round")
            && first.split_whitespace().next() == Some("work_round"))
        .then_some(())
    });
    ui.press("Enter");

    // The tree grows: wait for enough whole rounds that the ratios are meaningful (the
    // rounds in progress are counted at entry, their blocks only as they run).
    let (screen, rounds, blocks, adds) =
        ui.wait_for("compute_block and leaf_add rows with calls", |screen| {
            let rounds = calls_of(screen, "work_round")?;
            let blocks = calls_of(screen, "compute_block")?;
            let adds = calls_of(screen, "leaf_add")?;
            (rounds >= 20.0 && blocks > 0.0 && adds > 0.0)
                .then(|| (screen.to_string(), rounds, blocks, adds))
        });
    // 128 blocks per round, 1,024 leaf_add calls per block (counts shown with up to
    // three significant digits, hence the slack).
    assert_ratio(
        "compute_block per work_round",
        blocks,
        rounds,
        96.0..=129.0,
        &screen,
    );
    assert_ratio(
        "leaf_add per compute_block",
        adds,
        blocks,
        950.0..=1080.0,
        &screen,
    );
    assert!(
        screen.contains("RUNNING"),
        "the status bar says RUNNING:\n{screen}"
    );
    assert!(
        screen.contains(&format!("pid {pid} calltree")),
        "the status bar names the target:\n{screen}"
    );

    // Save a snapshot: the profile JSON, in the current directory, named by its full
    // path.
    ui.press("w");
    let saved = ui.wait_for("the saved file's name", |screen| {
        let at = screen.find("saved the profile to ")?;
        let name = screen[at..].split_whitespace().nth(4)?;
        Some(name.to_string())
    });
    assert_eq!(
        std::path::Path::new(&saved).parent(),
        Some(ui.dir.as_path()),
        "the full path of the saved file"
    );
    let profile =
        tendril::profile::Profile::load(&ui.dir.join(&saved)).expect("the saved profile loads");
    assert_eq!(profile.pid, pid as u32);
    assert_eq!(profile.roots, ["work_round"]);
    assert!(
        profile
            .merged
            .roots
            .iter()
            .any(|root| root.name == "work_round" && root.calls > 0)
    );

    ui.press("q");
    assert_eq!(
        ui.wait_exit(),
        0,
        "tendril's exit status; the screen:\n{}",
        ui.screen()
    );

    // The target runs on, computing exactly what it computed before, with its own code.
    target.drain();
    let after = target.checksum_lines(3, LINES_TIMEOUT);
    assert!(
        after.iter().all(|&c| c == expected[0]),
        "checksums changed: {expected:?} then {after:?}"
    );
    code_bytes_match_file(pid).expect("the target's code equals its files after quitting");
}

#[test]
fn view_shows_a_saved_profile() {
    let _turn = common::live_target_turn();
    let target = Target::spawn("calltree", &["2"]);
    let dir = std::env::temp_dir().join(format!("tendril-live-ui-view-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("calltree.json");
    let recorded = tendril()
        .args([
            "record",
            &target.pid().to_string(),
            "--root",
            "work_round",
            "--duration",
            "1",
            "-o",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        recorded.status.success(),
        "tendril record: {}",
        String::from_utf8_lossy(&recorded.stderr)
    );
    drop(target);
    let profile = tendril::profile::Profile::load(&file).unwrap();
    let root = &profile.merged.roots[0];
    assert_eq!(root.name, "work_round");

    let ui = Tmux::tendril("view", &["view", &file.display().to_string()]);
    // The status bar names the file.
    ui.wait_for_all(&["READ-ONLY", "calltree.json"]);
    // The hottest path opens by itself: work_round, compute_block, its hottest leaf.
    let screen = ui.wait_for("the call tree's rows", |screen| {
        calls_of(screen, "compute_block").map(|_| screen.to_string())
    });
    assert_eq!(
        calls_of(&screen, "work_round"),
        Some(root.calls as f64),
        "{screen}"
    );
    // Hot spots: every function once, leaf_add among them.
    ui.press("2");
    ui.wait_for("leaf_add among the hot spots", |screen| {
        (screen.contains("SELF ms▾") && calls_of(screen, "leaf_add").is_some()).then_some(())
    });
    // Threads: one row per thread of the file.
    ui.press("3");
    let tids: Vec<String> = profile.threads.iter().map(|t| t.tid.to_string()).collect();
    let mut expected: Vec<&str> = tids.iter().map(String::as_str).collect();
    expected.push("TID");
    ui.wait_for_all(&expected);
    // Keys that need a target explain why they do nothing.
    ui.press("d");
    ui.wait_for_text("read-only");
    ui.press("q");
    assert_eq!(ui.wait_exit(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn demo_shows_its_functions_detaches_and_quits() {
    let _turn = common::live_target_turn();
    let ui = Tmux::tendril("demo", &["demo"]);
    let (screen, child) = ui.wait_for("demo rows with calls", |screen| {
        let calls = calls_of(screen, "demo_handle_request")?;
        (calls > 0.0 && screen.contains("demo_")).then(|| (screen.to_string(), target_pid(screen)))
    });
    let child = child.unwrap_or_else(|| panic!("no pid in the status bar:\n{screen}"));
    assert!(screen.contains("root: demo_handle_request"), "{screen}");

    // Detach: the demo keeps running its own code, and the data stays on screen. (The
    // hottest path was expanded when the data came, and its leaf selected: as the tree
    // grew above it, the view may have scrolled the root out of sight. Home shows it.)
    ui.press("d");
    ui.press("Home");
    ui.wait_for("DETACHED, with the data", |screen| {
        (screen.contains("DETACHED")
            && calls_of(screen, "demo_handle_request").is_some_and(|c| c > 0.0))
        .then_some(())
    });
    assert!(
        Path::new(&format!("/proc/{child}")).exists(),
        "the demo still runs after detaching"
    );
    code_bytes_match_file(child).expect("the demo's code equals its files after detaching");

    ui.press("q");
    assert_eq!(ui.wait_exit(), 0, "the screen:\n{}", ui.screen());
    // tendril stops its demo child on the way out.
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{child}")).exists() {
        assert!(
            Instant::now() < deadline,
            "the demo process {child} outlived tendril demo"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_first_key_after_a_resize_to_80_by_24_is_obeyed() {
    let _turn = common::live_target_turn();
    let (mut target, expected, ui) = attach_to_calltree("resize");
    wait_for_rows(&ui, "work_round", "compute_block");
    // A key before the resize too: crossterm's default input source then took the
    // resize and dropped the terminal's readiness, and q waited for the next key.
    ui.press("Down");
    ui.resize(80, 24);
    ui.press("q");
    assert_eq!(
        ui.wait_exit(),
        0,
        "one q quits; the screen:\n{}",
        ui.screen()
    );
    assert_target_intact(&mut target, expected);
}

#[test]
fn ctrl_c_after_pausing_and_changing_roots_detaches_and_quits() {
    let _turn = common::live_target_turn();
    let (mut target, expected, ui) = attach_to_calltree("ctrl-c");
    wait_for_rows(&ui, "work_round", "compute_block");

    // Paused, the roots change at once on the status bar, and the data is reset.
    ui.press("p");
    ui.wait_for_text("PAUSED");
    ui.press("r");
    ui.type_text("work_round");
    ui.wait_for("work_round selected in the root picker", |screen| {
        (first_picker_row(screen)? == (true, "work_round".to_string())).then_some(())
    });
    ui.press("Tab"); // off
    ui.press("Escape"); // clears the query
    // Typed at once, the next letter would make an Alt key of the Escape.
    ui.wait_for_text("root: ▏");
    ui.type_text("compute_block");
    ui.wait_for("compute_block first in the root picker", |screen| {
        (first_picker_row(screen)? == (false, "compute_block".to_string())).then_some(())
    });
    ui.press("Tab"); // on
    ui.press("Enter");
    // The footer says what p does (it is drawn last: waited for with the status bar).
    let screen = ui.wait_for("the paused status bar naming the new root", |screen| {
        (screen
            .lines()
            .any(|line| line.contains("PAUSED") && line.contains("root: compute_block"))
            && screen.contains("p starts profiling compute_block"))
        .then(|| screen.to_string())
    });
    assert_eq!(calls_of(&screen, "work_round"), None, "{screen}");

    // Resumed: compute_block is the root now.
    ui.press("p");
    let screen = wait_for_rows(&ui, "compute_block", "leaf_add");
    assert!(screen.contains("RUNNING"), "{screen}");
    assert_eq!(calls_of(&screen, "work_round"), None, "{screen}");

    // Ctrl-C is a key in raw mode: it quits like q, detaching first.
    ui.press("C-c");
    assert_detached_and_intact(&ui, &mut target, expected);
    // The pointer calls' notice, the same after the resume, is said once.
    let screen = ui.screen();
    assert!(
        screen.matches("calls through pointers").count() <= 1,
        "{screen}"
    );
}

#[test]
fn a_stopped_target_does_not_freeze_the_ui() {
    let _turn = common::live_target_turn();
    let (mut target, expected, ui) = attach_to_calltree("stopped-target");
    wait_for_rows(&ui, "work_round", "compute_block");

    // Stopped, the target's agent cannot answer: pausing waits for it in the
    // background while the UI goes on reading keys and drawing. (The pause gives up
    // after the agent's reply timeout, 10 s: nothing but the second `p` comes before
    // the target goes on, so that a loaded machine's slow screens cannot outlast it.)
    target.signal(libc::SIGSTOP);
    ui.press("p");
    ui.wait_for_text("pausing: restoring the target's code");
    ui.press("p");
    let screen = ui.wait_for_text("still pausing; try again in a moment");
    assert!(!screen.contains("PAUSED"), "{screen}");

    // Continued, the agent answers and the pause completes.
    target.signal(libc::SIGCONT);
    ui.wait_for_text("PAUSED");
    ui.press("?");
    ui.wait_for_text("keys · Esc closes");
    ui.press("Escape");
    // Typed at once, the next letter would make an Alt key of the Escape.
    ui.wait_for("the keys closed", |screen| {
        (!screen.contains("keys · Esc closes")).then_some(())
    });
    ui.press("q");
    assert_detached_and_intact(&ui, &mut target, expected);
}

#[test]
fn a_terminal_that_goes_away_detaches_and_quits() {
    let _turn = common::live_target_turn();
    let (mut target, expected, ui) = attach_to_calltree("terminal-gone");
    wait_for_rows(&ui, "work_round", "compute_block");
    let tendril_pid = ui.tendril_pid();
    // Pausing a stopped target keeps a request waiting when the terminal goes.
    target.signal(libc::SIGSTOP);
    ui.press("p");
    ui.wait_for_text("pausing: restoring the target's code");
    ui.run(&["kill-server"]);
    std::thread::sleep(Duration::from_millis(300));
    target.signal(libc::SIGCONT);

    let deadline = Instant::now() + EXIT_TIMEOUT;
    let exited = || {
        std::fs::read_to_string(format!("/proc/{tendril_pid}/stat")).map_or(true, |stat| {
            StatLine::parse(&stat).is_some_and(|s| s.has_exited())
        })
    };
    while !exited() {
        assert!(
            Instant::now() < deadline,
            "tendril went on without its terminal"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_target_intact(&mut target, expected);
}

#[test]
fn sigterm_detaches_and_quits() {
    let _turn = common::live_target_turn();
    let (mut target, expected, ui) = attach_to_calltree("sigterm");
    wait_for_rows(&ui, "work_round", "compute_block");
    // SAFETY: kill has no memory-safety preconditions; tendril_pid is a live child of
    // the pane's shell, which has not reaped it.
    assert_eq!(unsafe { libc::kill(ui.tendril_pid(), libc::SIGTERM) }, 0);
    assert_detached_and_intact(&ui, &mut target, expected);
}

#[test]
fn sigterm_while_attaching_waits_for_the_attach_then_detaches() {
    let _turn = common::live_target_turn();
    let (mut target, expected, ui) = attach_to_calltree("sigterm-attaching");
    // The attach runs in the background from the moment the UI is up; whether it is
    // still running when the signal arrives or has just finished, tendril must finish
    // it and detach before it exits.
    ui.wait_for_text("attaching to");
    // SAFETY: as in `sigterm_detaches_and_quits`.
    assert_eq!(unsafe { libc::kill(ui.tendril_pid(), libc::SIGTERM) }, 0);
    assert_detached_and_intact(&ui, &mut target, expected);
}

#[test]
fn a_target_that_exits_leaves_its_data_to_browse_and_save() {
    let _turn = common::live_target_turn();
    let (mut target, expected, ui) = attach_to_calltree("target-exits");
    let pid = target.pid();
    wait_for_rows(&ui, "work_round", "compute_block");
    // Rounds computed while profiled are right.
    target.drain();
    let profiled = target.checksum_lines(2, LINES_TIMEOUT);
    assert!(
        profiled.iter().all(|&c| c == expected),
        "checksums changed while profiled: {expected} then {profiled:?}"
    );

    target.signal(libc::SIGTERM);
    assert!(
        target.wait_exit(EXIT_TIMEOUT).is_some(),
        "the target did not exit"
    );
    // The root's row, however far the tree has grown below it.
    ui.press("Home");
    ui.wait_for("the exit said, the data kept", |screen| {
        (screen.contains("exited; the data stays")
            && screen.contains("DETACHED")
            && calls_of(screen, "work_round").is_some_and(|calls| calls > 0.0))
        .then_some(())
    });

    ui.press("w");
    let saved = ui.wait_for("the saved file's name", |screen| {
        let at = screen.find("saved the profile to ")?;
        let name = screen[at..].split_whitespace().nth(4)?;
        Some(name.to_string())
    });
    let profile =
        tendril::profile::Profile::load(&ui.dir.join(&saved)).expect("the saved profile loads");
    assert_eq!(profile.pid, pid as u32);
    assert!(
        profile
            .merged
            .roots
            .iter()
            .any(|root| root.name == "work_round" && root.calls > 0),
        "{:?}",
        profile.merged.roots
    );

    ui.press("q");
    assert_eq!(ui.wait_exit(), 0, "the screen:\n{}", ui.screen());
}

#[test]
fn record_and_count_show_a_live_progress_line_on_a_terminal() {
    let _turn = common::live_target_turn();
    let target = Target::spawn("calltree", &["2"]);
    let pid = target.pid().to_string();
    let record = Tmux::tendril(
        "progress-record",
        &["record", &pid, "--root", "work_round", "--duration", "600"],
    );
    let screen = record.wait_for("the progress line", |screen| {
        screen
            .lines()
            .find(|line| line.contains(" functions instrumented (Ctrl-C ends)"))
            .map(str::to_string)
    });
    assert!(
        screen.starts_with("tendril: ") && screen.contains(" events, "),
        "{screen}"
    );
    // Ctrl-C as the shell would deliver it to tendril alone (the pane's shell must live
    // on to keep the last screen).
    // SAFETY: kill only sends a signal.
    unsafe { libc::kill(record.tendril_pid(), libc::SIGINT) };
    assert_eq!(record.wait_exit(), 0, "{}", record.screen());
    let screen = record.screen();
    // The line is gone once the summary is printed, and the profile is in a file.
    assert!(!screen.contains("(Ctrl-C ends)\n"), "{screen}");
    assert!(screen.contains("profile written to "), "{screen}");

    let count = Tmux::tendril("progress-count", &["count", &pid, "leaf_*"]);
    count.wait_for("the progress line", |screen| {
        screen
            .lines()
            .find(|line| line.contains(" calls of ") && line.contains("(Ctrl-C ends)"))
            .map(str::to_string)
    });
    // SAFETY: kill only sends a signal.
    unsafe { libc::kill(count.tendril_pid(), libc::SIGINT) };
    assert_eq!(count.wait_exit(), 0, "{}", count.screen());
    assert!(count.screen().contains(" total ("), "{}", count.screen());
}
