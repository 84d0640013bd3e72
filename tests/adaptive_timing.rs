//! Adaptive timing (issue 32): functions too short to time are switched, live, to the
//! untimed hook; their calls stay counted exactly, in their contexts, and are marked
//! `"timing": "in_caller"`; `--time-all`, `--time PATTERN` and a reset behave as
//! documented. Figures (the roots' times against bare runs) are benchmarks
//! (`benches/accuracy.rs`, BENCHMARKS.md), not asserted here.

use crate::common;

use common::{Recording, Target, all_nodes, node_at};
use std::time::{Duration, Instant};
use tendril::profile::{Node, Profile, Timing};

/// Far beyond what a run of the fixture takes, on any machine.
const TIMEOUT: Duration = Duration::from_secs(300);

/// The threshold the tests give (`--min-time`, ns): far above what a call of the
/// fixture's tiny functions averages even on a machine so busy that the calibration's
/// own threshold is missed (a preempted call inflates the mean), and far below what its
/// roots take.
const JUDGED_SHORT: &str = "100000";

/// What the live view shows in both time cells of a function counted, not timed.
const IN_CALLER_CELL: &str = "in caller";

/// What tendril says when it switches functions to the untimed hook.
const SWITCHED: &str = "tendril: counting, not timing, ";

fn timing_of<'a>(profile: &'a Profile, path: &[&str]) -> &'a Node {
    node_at(&profile.merged.roots, path)
        .unwrap_or_else(|| panic!("no {path:?} in {:#?}", profile.merged.roots))
}

/// The checksum a `run` line of the fixture ends with.
fn checksum(line: &str) -> String {
    line.split_whitespace().last().unwrap().to_string()
}

/// `tightcall` recorded from `root`, after a first run of 2,000 mid calls has had `mid`
/// and `leaf` switched to the untimed hook.
fn recording_with_mid_and_leaf_untimed() -> (Target, Recording) {
    let mut target = Target::spawn("tightcall", &[]);
    let mut recording = Recording::start(
        target.pid(),
        &["--root", "root", "--min-time", JUDGED_SHORT],
    );
    target.write_stdin("run 2000\n");
    target.expect_line("run calls 6001 ", TIMEOUT);
    recording.wait_for_line(SWITCHED, TIMEOUT);
    (target, recording)
}

#[test]
fn threads_that_exit_after_root_calls_have_every_untimed_call_counted() {
    let (mut target, recording) = recording_with_mid_and_leaf_untimed();
    // 200 threads one after another, each making 5 root calls of 100 mid calls and
    // exiting: more threads than the first 128 rings, so later threads take over the
    // rings of threads gone.
    target.write_stdin("serial 200 5 100\n");
    target.expect_line("serial calls 301000 ", TIMEOUT);
    let recorded = recording.finish();
    let profile = &recorded.profile;
    assert_eq!(profile.stats.lost_events, 0, "{}", recorded.stderr);
    let root = timing_of(profile, &["root"]);
    let mid = timing_of(profile, &["root", "mid"]);
    let leaf = timing_of(profile, &["root", "mid", "leaf"]);
    assert_eq!(
        (root.calls, mid.calls, leaf.calls),
        (1 + 1000, 2000 + 100_000, 4000 + 200_000)
    );
    let serial: Vec<_> = profile
        .threads
        .iter()
        .filter(|thread| thread.tid != target.pid() as u32)
        .collect();
    assert_eq!(serial.len(), 200);
    for thread in serial {
        let calls = |path: &[&str]| node_at(&thread.roots, path).map(|node| node.calls);
        assert_eq!(
            (
                calls(&["root"]),
                calls(&["root", "mid"]),
                calls(&["root", "mid", "leaf"])
            ),
            (Some(5), Some(500), Some(1000)),
            "thread {}",
            thread.tid
        );
    }
}

#[test]
fn tiny_callees_are_counted_exactly_in_context_and_the_root_stays_timed() {
    let mut target = Target::spawn("tightcall", &[]);
    target.write_stdin("run 300000\n");
    let bare = target.expect_line("run calls 900001 ", TIMEOUT);
    let mut recording = Recording::start(
        target.pid(),
        &["--root", "root", "--min-time", JUDGED_SHORT],
    );
    // 2,000 calls of mid and 4,000 of leaf are enough to judge them.
    target.write_stdin("run 2000\n");
    target.expect_line("run calls 6001 ", TIMEOUT);
    // Callees first: leaf is switched with mid, or before it when the judge looked
    // while mid's first 1,000 calls were not all read yet (both are untimed by the end,
    // as the profile says below).
    let switched = recording.wait_for_line(SWITCHED, TIMEOUT);
    assert!(
        switched.contains("leaf, mid") || switched.ends_with(": leaf"),
        "{switched}"
    );
    recording.wait_for_line_where(
        SWITCHED,
        |line| line.contains("leaf, mid") || line.ends_with(": mid"),
        TIMEOUT,
    );
    // Every call is counted, before and after the switch.
    target.write_stdin("run 300000\n");
    let recorded_line = target.expect_line("run calls 900001 ", TIMEOUT);
    assert_eq!(
        checksum(&recorded_line),
        checksum(&bare),
        "the target computes the same"
    );
    let recorded = recording.finish();
    let profile = &recorded.profile;

    let root = timing_of(profile, &["root"]);
    let mid = timing_of(profile, &["root", "mid"]);
    let leaf = timing_of(profile, &["root", "mid", "leaf"]);
    assert_eq!((root.calls, mid.calls, leaf.calls), (2, 302_000, 604_000));
    assert_eq!(root.timing, Timing::Timed);
    // Its time is what load moves (the hooks' cost removed can exceed it): only that
    // it carries an error estimate is asserted.
    assert!(root.error_ns.is_some());
    for node in [mid, leaf] {
        assert_eq!(node.timing, Timing::InCaller, "{}", node.name);
        assert_eq!((node.total_ns, node.self_ns, node.error_ns), (0, 0, None));
    }
    assert_eq!(
        all_nodes(&profile.merged.roots).len(),
        3,
        "no call out of its context: {:#?}",
        profile.merged.roots
    );
    let policy = profile
        .stats
        .timing
        .as_ref()
        .expect("the policy is in the profile");
    assert_eq!(policy.untimed_functions, 2);
    assert!(policy.threshold_ns > 0.0);
    assert!(
        policy.untimed_calls >= 900_000 && policy.untimed_calls <= 906_000,
        "the calls made after the switch: {policy:?}"
    );
}

#[test]
fn a_recursive_root_stays_timed_at_its_outermost_calls_only() {
    let mut target = Target::spawn("tightcall", &[]);
    target.write_stdin("fib 20\n");
    let bare = target.expect_line("fib calls ", TIMEOUT);
    let mut recording =
        Recording::start(target.pid(), &["--root", "fib", "--min-time", JUDGED_SHORT]);
    target.write_stdin("fib 20\n");
    target.expect_line("fib calls ", TIMEOUT);
    let switched = recording.wait_for_line(SWITCHED, TIMEOUT);
    assert!(
        switched.contains("1 function ") && switched.ends_with("fib"),
        "{switched}"
    );
    target.write_stdin("fib 20\n");
    let recorded_line = target.expect_line("fib calls ", TIMEOUT);
    assert_eq!(
        recorded_line.split(" value ").nth(1),
        bare.split(" value ").nth(1)
    );
    let recorded = recording.finish();
    let roots = &recorded.profile.merged.roots;
    let outermost = timing_of(&recorded.profile, &["fib"]);
    assert_eq!(outermost.calls, 2, "one per run");
    assert_eq!(outermost.timing, Timing::Timed);
    // Its time is what load moves (the cost removed for the counted calls can exceed
    // it): only that it carries an error estimate is asserted.
    assert!(outermost.error_ns.is_some());
    // The second run's recursion is one node below the outermost call: its calls are
    // folded (a recursion of untimed calls cannot be told from a loop of them).
    let inner = timing_of(&recorded.profile, &["fib", "fib"]);
    assert_eq!(inner.timing, Timing::InCaller);
    assert!(
        all_nodes(roots)
            .iter()
            .filter(|node| !std::ptr::eq(**node, outermost))
            .all(|node| node.timing == Timing::InCaller)
    );
}

#[test]
fn time_all_and_time_pattern_keep_functions_timed() {
    let mut target = Target::spawn("tightcall", &[]);
    // --time mid: only leaf may go, and mid, which calls it, stays timed.
    let mut recording = Recording::start(
        target.pid(),
        &[
            "--root",
            "root",
            "--time",
            "mid",
            "--min-time",
            JUDGED_SHORT,
        ],
    );
    target.write_stdin("run 2000\n");
    target.expect_line("run calls 6001 ", TIMEOUT);
    let switched = recording.wait_for_line(SWITCHED, TIMEOUT);
    assert!(
        switched.contains("1 function ") && switched.ends_with(": leaf"),
        "{switched}"
    );
    let recorded = recording.finish();
    assert_eq!(
        timing_of(&recorded.profile, &["root", "mid"]).timing,
        Timing::Timed
    );
    assert_eq!(
        timing_of(&recorded.profile, &["root", "mid", "leaf"]).timing,
        Timing::InCaller
    );

    // --time-all: the same work leaves every node timed, and the profile no policy.
    let recording = Recording::start(target.pid(), &["--root", "root", "--time-all"]);
    target.write_stdin("run 2000\n");
    target.expect_line("run calls 6001 ", TIMEOUT);
    target.write_stdin("run 2000\n");
    target.expect_line("run calls 6001 ", TIMEOUT);
    let recorded = recording.finish();
    assert!(!recorded.stderr.contains(SWITCHED), "{}", recorded.stderr);
    assert_eq!(recorded.profile.stats.timing, None);
    assert!(
        all_nodes(&recorded.profile.merged.roots)
            .iter()
            .all(|node| node.timing == Timing::Timed)
    );
    assert_eq!(
        timing_of(&recorded.profile, &["root", "mid", "leaf"]).calls,
        8000
    );
}

#[test]
fn a_reset_times_everything_again_until_it_is_judged_anew() {
    let mut target = Target::spawn("tightcall", &[]);
    let mut recorder = tendril::recording::Recorder::start(&tendril::recording::RecordOptions {
        pid: target.pid(),
        roots: vec!["root".into()],
        scheme: tendril::recording::Scheme::B,
        gross_only: false,
        timing: tendril::recording::TimingOptions {
            min_time_ns: Some(JUDGED_SHORT.parse().unwrap()),
            ..Default::default()
        },
        pointer_candidates: false,
    })
    .unwrap();
    let untimed_after_runs = |recorder: &mut tendril::recording::Recorder, target: &mut Target| {
        // Runs of the root until the judge has switched mid and leaf: it looks at the
        // trees as they are polled.
        let deadline = Instant::now() + TIMEOUT;
        loop {
            target.write_stdin("run 2000\n");
            target.expect_line("run calls 6001 ", TIMEOUT);
            recorder.poll();
            let profile = recorder.snapshot();
            let untimed = profile.stats.timing.as_ref().unwrap().untimed_functions;
            if untimed == 2 {
                return profile;
            }
            assert!(
                Instant::now() < deadline,
                "never switched: {:?}",
                profile.stats
            );
        }
    };
    let profile = untimed_after_runs(&mut recorder, &mut target);
    assert_eq!(
        timing_of(&profile, &["root", "mid"]).timing,
        Timing::InCaller
    );

    recorder.reset();
    let fresh = recorder.snapshot();
    assert_eq!(fresh.stats.timing.as_ref().unwrap().untimed_functions, 0);
    // Timed again: a run's calls come as entries and exits, with times.
    target.write_stdin("run 100\n");
    target.expect_line("run calls 301 ", TIMEOUT);
    let deadline = Instant::now() + TIMEOUT;
    let timed = loop {
        recorder.poll();
        let profile = recorder.snapshot();
        if node_at(&profile.merged.roots, &["root"]).is_some_and(|root| root.calls == 1) {
            break profile;
        }
        assert!(Instant::now() < deadline, "the run never arrived");
    };
    let mid = timing_of(&timed, &["root", "mid"]);
    assert_eq!((mid.calls, mid.timing), (100, Timing::Timed));
    // And judged anew.
    let profile = untimed_after_runs(&mut recorder, &mut target);
    assert_eq!(
        timing_of(&profile, &["root", "mid", "leaf"]).timing,
        Timing::InCaller
    );
    recorder.finish(false).unwrap();
}

#[test]
fn untimed_nodes_keep_their_mark_through_json_and_pprof() {
    let (_target, recording) = recording_with_mid_and_leaf_untimed();
    let recorded = recording.finish();
    let text = serde_json::to_string(&recorded.profile).unwrap();
    assert!(text.contains(r#""timing":"in_caller""#), "{text}");
    let again: Profile = serde_json::from_str(&text).unwrap();
    assert_eq!(
        timing_of(&again, &["root", "mid"]).timing,
        Timing::InCaller,
        "read back"
    );
    let pprof = tendril::profile::export::pprof::to_pprof(&recorded.profile);
    let label = |text: &str| pprof.string_table.iter().position(|s| s == text).unwrap() as i64;
    let marked = pprof
        .sample
        .iter()
        .filter(|sample| {
            sample
                .label
                .iter()
                .any(|l| l.key == label("timing") && l.str == label("in_caller"))
        })
        .count();
    assert_eq!(marked, 2, "mid and leaf carry the label");
    let mut report = Vec::new();
    tendril::profile::write_report(
        &recorded.profile,
        tendril::profile::ReportFormat::Tree,
        &mut report,
    )
    .unwrap();
    let report = String::from_utf8(report).unwrap();
    assert!(
        report.contains("adaptive timing: 2 functions counted"),
        "{report}"
    );
    assert!(
        report
            .lines()
            .any(|line| line.contains("in caller   in caller") && line.ends_with("mid (tightcall)")),
        "{report}"
    );
}

#[test]
fn the_live_view_marks_untimed_functions_and_says_how_many() {
    let _turn = common::live_target_turn();
    let mut target = Target::spawn("tightcall", &[]);
    let pid = target.pid().to_string();
    let ui = common::Tmux::tendril(
        "adaptive-live",
        &["attach", &pid, "--root", "root", "--min-time", JUDGED_SHORT],
    );
    // Rounds of calls until both tiny functions are judged: a row's two time cells then
    // say where their time went.
    let marked_row = |screen: &str, name: &str| {
        screen.lines().any(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            words.contains(&name) && line.matches(IN_CALLER_CELL).count() == 2
        })
    };
    let screen = ui.wait_for(
        "mid and leaf marked, the policy in the status bar",
        |screen| {
            target.write_stdin("run 2000\n");
            (marked_row(screen, "mid")
                && marked_row(screen, "leaf")
                && screen.contains("2 untimed (<100000 ns)"))
            .then(|| screen.to_string())
        },
    );
    assert!(
        common::calls_of(&screen, "mid").is_some_and(|calls| calls >= 2000.0),
        "{screen}"
    );
    ui.press("q");
    assert_eq!(ui.wait_exit(), 0, "the screen:\n{}", ui.screen());
    target.drain();
    target.write_stdin("run 10\n");
    target.expect_line("run calls 31 ", TIMEOUT);
    common::code_bytes_match_file(target.pid()).expect("the code equals its files");
}
