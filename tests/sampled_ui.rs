//! The terminal UI's Sampled view end to end, in tmux: `tendril attach PID` without a
//! root samples the target first; Enter on a hot function instruments it and the live
//! view shows it with the overlap against the samples; `S` goes back and forth; `q`
//! leaves the target running its own code. And where perf events are refused, the root
//! picker opens as before, saying why.
//!
//! The one idea: what the user relies on is checked, not what machine load can move —
//! which function is hottest is read off the screen, the overlap is only checked to be
//! a share, and every wait polls the screen with a timeout.

use crate::common;

use common::{EXIT_TIMEOUT, Target, Tmux, calls_of, code_bytes_match_file};
use std::time::Duration;

/// How long a fixture may take to print its checksum lines.
const LINES_TIMEOUT: Duration = Duration::from_secs(10);

/// The first row of the hot spots table, once it is a function of `module`: its name.
/// (A stripped function's row shows no module: its name, `module+0xOFFSET`, says it.)
fn hottest_spot(ui: &Tmux, module: &str) -> String {
    ui.wait_for(
        &format!("a function of {module} first in the hot spots"),
        |screen| {
            let mut lines = screen.lines();
            lines.find(|line| line.contains("SELF ms▾") && line.contains("SAMPLES"))?;
            let words: Vec<&str> = lines.next()?.split_whitespace().collect();
            let name = *words.first()?;
            let in_module =
                words.get(1) == Some(&module) || name.starts_with(&format!("{module}+0x"));
            (in_module && screen.contains("SAMPLING")).then(|| name.to_string())
        },
    )
}

/// Waits for the live view to show `root` as the root, with calls.
///
/// Home is pressed once the view is live: a hottest path expanded when the data came (a
/// recursive one can be deeper than the window) selects its leaf, and may scroll the root
/// out of sight.
fn wait_for_instrumented(ui: &Tmux, root: &str) -> String {
    ui.wait_for(&format!("{root} instrumented"), |screen| {
        (screen.contains("RUNNING") && screen.contains(&format!("root: {root}"))).then_some(())
    });
    ui.press("Home");
    ui.wait_for(&format!("{root} instrumented, with calls"), |screen| {
        (screen.contains("RUNNING")
            && screen.contains(&format!("root: {root}"))
            && calls_of(screen, root)? > 0.0)
            .then(|| screen.to_string())
    })
}

/// The overlap figure on the live view's status bar.
fn overlap_of(screen: &str) -> Option<f64> {
    let at = screen.find("overlap ")?;
    screen[at + "overlap ".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[test]
fn sampled_first_then_enter_instruments_the_hot_function() {
    let _turn = common::live_target_turn();
    let mut target = Target::spawn("calltree", &["2"]);
    let pid = target.pid();
    let expected = target.steady_checksum(2, LINES_TIMEOUT);

    // `tendril PID`: `tendril attach PID` without a root.
    let ui = Tmux::tendril("sampled", &[&pid.to_string()]);
    ui.wait_for_all(&[
        "SAMPLING",
        "SAMPLED · all threads",
        "nothing loaded into the target",
    ]);
    // Sampling loads nothing: no agent yet.
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(!maps.contains("libtendril_agent"), "{maps}");

    // The hottest function by its own samples, instrumented with Enter.
    ui.press("2");
    let hottest = hottest_spot(&ui, "calltree");
    ui.press("Home");
    ui.press("Enter");
    wait_for_instrumented(&ui, &hottest);
    let (screen, overlap) = ui.wait_for("the overlap with the sampled tree", |screen| {
        let overlap = overlap_of(screen)?;
        screen
            .contains("with sampled")
            .then(|| (screen.to_string(), overlap))
    });
    assert!((0.0..=1.0).contains(&overlap), "{screen}");

    // S: the sampled tree, kept as it was when the hooks went in; S again: live.
    ui.press("S");
    ui.wait_for("the sampled tree, with the hottest function", |screen| {
        (screen.contains("SAMPLED │")
            && screen.contains("sampling stopped")
            && calls_of(screen, &hottest).is_some())
        .then_some(())
    });
    // w there saves the sampled profile.
    ui.press("w");
    let saved = ui.wait_for("the saved file's name", |screen| {
        let at = screen.find("saved the profile to ")?;
        Some(screen[at..].split_whitespace().nth(4)?.to_string())
    });
    let profile =
        tendril::profile::Profile::load(&ui.dir.join(&saved)).expect("the saved profile loads");
    assert_eq!(profile.scheme, "sampled");
    assert!(profile.sampling.is_some_and(|s| s.samples > 0));
    ui.press("S");
    wait_for_instrumented(&ui, &hottest);

    ui.press("q");
    assert_eq!(ui.wait_exit(), 0, "the screen:\n{}", ui.screen());
    let screen = ui.screen();
    assert!(
        screen.contains(&format!("detached from pid {pid} calltree")),
        "{screen}"
    );
    target.drain();
    let after = target.checksum_lines(3, LINES_TIMEOUT);
    assert!(
        after.iter().all(|&c| c == expected),
        "checksums changed: {expected} then {after:?}"
    );
    code_bytes_match_file(pid).expect("the target's code equals its files after quitting");
}

#[test]
fn a_stripped_function_is_instrumented_by_its_sampled_name() {
    let _turn = common::live_target_turn();
    let target = Target::spawn("sampled_stripped", &["split"]);
    let pid = target.pid();
    let ui = Tmux::tendril("sampled-stripped", &["attach", &pid.to_string()]);
    ui.wait_for_text("SAMPLING");
    ui.press("2");
    let hottest = hottest_spot(&ui, "sampled_stripped");
    assert!(
        hottest.starts_with("sampled_stripped+0x"),
        "a stripped function is named module+0xOFFSET: {hottest}"
    );
    ui.press("Home");
    ui.press("Enter");
    wait_for_instrumented(&ui, &hottest);
    ui.press("q");
    assert_eq!(ui.wait_exit(), 0, "the screen:\n{}", ui.screen());
    code_bytes_match_file(pid).expect("the target's code equals its files after quitting");
}

#[test]
fn refused_perf_events_open_the_root_picker_with_the_reason() {
    let _turn = common::live_target_turn();
    let target = Target::spawn("calltree", &["2"]);
    let pid = target.pid();
    let ui = Tmux::tendril_without_perf_events("no-perf", &["attach", &pid.to_string()]);
    // The root picker, with the reason in one line.
    let screen = ui.wait_for_all(&["SIZE", "perf_event_open is refused"]);
    assert!(!screen.contains("SAMPLING"), "{screen}");
    // The root picker works as without sampling.
    ui.type_text("work_round");
    ui.wait_for("work_round first among the matches", |screen| {
        let mut lines = screen.lines();
        lines.find(|line| line.contains("FUNCTION") && line.contains("SIZE"))?;
        (lines.next()?.split_whitespace().next() == Some("work_round")).then_some(())
    });
    ui.press("Enter");
    wait_for_instrumented(&ui, "work_round");
    // No sampled tree to switch to: S says so.
    ui.press("S");
    ui.wait_for_text("no sampled tree in this session");
    ui.press("q");
    assert_eq!(ui.wait_exit(), 0, "the screen:\n{}", ui.screen());
    code_bytes_match_file(pid).expect("the target's code equals its files after quitting");
}

#[test]
fn a_picked_process_is_sampled_and_its_exit_brings_the_list_back() {
    let _turn = common::live_target_turn();
    let mut target = Target::spawn("calltree", &["2"]);
    let pid = target.pid();
    let ui = Tmux::tendril("picker", &[]);
    ui.wait_for_text("processes");
    ui.type_text(&format!("{pid} calltree"));
    ui.wait_for("just the target listed", |screen| {
        (screen.contains(" 1 of ") && screen.contains(&pid.to_string())).then_some(())
    });
    ui.press("Enter");
    ui.wait_for_text("SAMPLING");
    target.signal(libc::SIGTERM);
    assert!(
        target.wait_exit(EXIT_TIMEOUT).is_some(),
        "the target did not exit"
    );
    ui.wait_for_text("exited; choose another process");
    ui.press("q");
    assert_eq!(ui.wait_exit(), 0, "the screen:\n{}", ui.screen());
}
