//! Go targets (issue 31, "targets that fight back"): sampling unwinds Go code exactly
//! with `.gopclntab` and names a stripped binary's functions from it; the C code of a
//! cgo program is counted and recorded exactly though Go's runtime leaves no real-time
//! signal free; Go code itself is refused with the reason and left untouched.
//!
//! The one idea: the fixtures are real Go programs built by the tests with `go build`
//! (`go_leaf`, static, and its stripped copy; `go_cgo`, a cgo program). Without a Go
//! toolchain each test says so and passes; `.ci/run` installs golang-go.

use crate::common;

use common::{Counting, Recording, Target, code_bytes_match_file, have_go, node_at, tendril};
use std::time::{Duration, Instant};
use tendril::profile::{Node, Profile, Visit, walk};
use tendril::sampling::{Sampler, SamplerOptions};

/// The longest a test waits for its samples (a loaded machine gives fewer per second).
const SAMPLES_TIMEOUT: Duration = Duration::from_secs(90);
/// The longest go_cgo may take to answer one line of work, however loaded the machine.
const LINE_TIMEOUT: Duration = Duration::from_secs(60);
/// The line tendril gives for Go code.
const GO_REFUSAL: &str =
    "Go code: its runtime walks stacks by return address; tendril cannot hook it";

/// Samples `pid` until `enough` says the profile so far has what the test needs.
fn sample_until(pid: i32, enough: impl Fn(&Profile) -> bool) -> Profile {
    let mut sampler = Sampler::start(pid, SamplerOptions::default()).expect("sampling starts");
    let deadline = Instant::now() + SAMPLES_TIMEOUT;
    let mut last_check = Instant::now();
    loop {
        sampler.poll(Duration::from_millis(50)).expect("poll");
        if last_check.elapsed() >= Duration::from_millis(250) {
            last_check = Instant::now();
            if enough(&sampler.profile()) {
                return sampler.finish();
            }
        }
        assert!(
            Instant::now() < deadline,
            "not enough samples of process {pid} within {SAMPLES_TIMEOUT:?}: {} so far",
            sampler.trees().samples
        );
    }
}

/// Every call path (names from the root, `;`-joined) with its samples at or below.
fn paths(roots: &[Node]) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut path: Vec<&str> = Vec::new();
    let _ = walk(roots, |step| -> Result<(), ()> {
        match step {
            Visit::Enter { node, .. } => {
                path.push(&node.name);
                out.push((path.join(";"), node.samples.unwrap_or(0)));
            }
            Visit::Leave { .. } => {
                path.pop();
            }
        }
        Ok(())
    });
    out
}

/// Samples of paths whose innermost frame is `main.leaf` (it calls nothing, so a path
/// ending there holds only samples in it).
fn leaf_samples(paths: &[(String, u64)]) -> u64 {
    paths
        .iter()
        .filter(|(path, _)| path.ends_with(";main.leaf") || path == "main.leaf")
        .map(|(_, samples)| samples)
        .sum()
}

/// Samples `fixture` until main.leaf has 300 samples, and checks that nearly all of
/// them are on the whole path from the goroutine's start: the frameless leaf keeps its
/// caller, and the walk goes on to `runtime.main` and the outermost frame.
fn check_go_leaf_paths(fixture: &str) {
    let target = Target::spawn(fixture, &[]);
    let profile = sample_until(target.pid(), |p| {
        leaf_samples(&paths(&p.merged.roots)) >= 300
    });
    let all = paths(&profile.merged.roots);
    let in_leaf = leaf_samples(&all);
    let whole: u64 = all
        .iter()
        .filter(|(path, _)| {
            path.starts_with("runtime.goexit")
                && path.ends_with(";runtime.main;main.main;main.top;main.leaf")
        })
        .map(|(_, samples)| samples)
        .sum();
    let shown: Vec<&(String, u64)> = all.iter().filter(|(_, s)| *s >= 3).collect();
    eprintln!("{fixture}: {whole} of {in_leaf} samples in main.leaf on the whole path");
    assert!(
        whole * 100 >= in_leaf * 90,
        "{fixture}: only {whole} of {in_leaf} samples in main.leaf are under \
         runtime.goexit;runtime.main;main.main;main.top: {shown:#?}"
    );
}

#[test]
fn sampling_go_code_keeps_the_caller_of_a_frameless_leaf_and_reaches_runtime_main() {
    if have_go("sampling_go_code_keeps_the_caller_of_a_frameless_leaf") {
        check_go_leaf_paths("go_leaf");
    }
}

#[test]
fn a_stripped_go_binary_is_named_and_unwound_from_gopclntab() {
    if have_go("a_stripped_go_binary_is_named_and_unwound_from_gopclntab") {
        check_go_leaf_paths("go_leaf_stripped");
    }
}

/// Asks go_cgo for `command` (`work N`, `callback N`) and returns its answer line.
fn ask(target: &mut Target, command: &str, answer: &str) -> String {
    target.write_stdin(&format!("{command}\n"));
    target.expect_line(answer, LINE_TIMEOUT)
}

#[test]
fn c_functions_of_a_cgo_program_are_counted_exactly_and_restored() {
    if !have_go("c_functions_of_a_cgo_program_are_counted_exactly_and_restored") {
        return;
    }
    let mut target = Target::spawn("go_cgo", &[]);
    let before = ask(&mut target, "work 5000", "counted ");
    // A goroutine spins in Go code all along: the patch stops its thread with ptrace
    // (Go leaves no real-time signal free).
    let counting = Counting::start(target.pid(), &["c_work", "getppid"]);
    let during = ask(&mut target, "work 5000", "counted ");
    let report = counting.finish();
    assert_eq!(during, before, "what the program computes does not change");
    assert_eq!(report.calls("c_work"), 5000, "{}", report.stdout);
    assert_eq!(report.calls("getppid"), 5000, "{}", report.stdout);
    assert!(report.not_counted.is_empty(), "{}", report.stdout);
    code_bytes_match_file(target.pid()).unwrap();
    assert_eq!(ask(&mut target, "work 5000", "counted "), before);
}

#[test]
fn a_c_root_of_a_cgo_program_is_recorded_and_its_go_callees_listed_not_followed() {
    if !have_go("a_c_root_of_a_cgo_program_is_recorded") {
        return;
    }
    let mut target = Target::spawn("go_cgo", &[]);
    let before = ask(&mut target, "callback 1000", "called ");
    let recording = Recording::start(target.pid(), &["--root", "c_calls_go"]);
    let during = ask(&mut target, "callback 1000", "called ");
    let recorded = recording.finish();
    assert_eq!(during, before, "what the program computes does not change");
    let roots = &recorded.profile.merged.roots;
    let root = node_at(roots, &["c_calls_go"]).expect("the root was recorded");
    assert_eq!(root.calls, 1000);
    let exported = node_at(roots, &["c_calls_go", "goStep"]).expect("its C callee");
    assert_eq!(exported.calls, 1000);
    let discovery = recorded
        .profile
        .discovery
        .as_ref()
        .expect("discovery stats");
    let crosscall = discovery
        .not_followed
        .iter()
        .find(|n| n.target.starts_with("crosscall2 "))
        .unwrap_or_else(|| panic!("crosscall2 is not listed: {:?}", discovery.not_followed));
    assert_eq!(crosscall.reason, GO_REFUSAL);
    code_bytes_match_file(target.pid()).unwrap();
    assert_eq!(ask(&mut target, "callback 1000", "called "), before);
}

#[test]
fn go_code_is_refused_with_the_reason_and_the_target_is_left_alone() {
    if !have_go("go_code_is_refused_with_the_reason_and_the_target_is_left_alone") {
        return;
    }
    let mut target = Target::spawn("go_cgo", &[]);
    let pid = target.pid().to_string();
    let before = ask(&mut target, "work 100", "counted ");
    let commands: [&[&str]; 4] = [
        &["count", &pid, "main.leaf", "--duration", "1"],
        &["record", &pid, "--root", "main.top", "--duration", "1"],
        &["edges", &pid, "main.leaf"],
        &["attach", &pid, "--root", "main.leaf"],
    ];
    for args in commands {
        let output = tendril().args(args).output().expect("tendril runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} succeeded: {stderr}");
        assert!(stderr.contains(GO_REFUSAL), "{args:?}: {stderr}");
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "{args:?}: one line: {stderr}"
        );
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(
        !maps.contains("libtendril_agent"),
        "nothing was loaded into the target"
    );
    code_bytes_match_file(target.pid()).unwrap();
    assert_eq!(ask(&mut target, "work 100", "counted "), before);
}
