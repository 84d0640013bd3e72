//! A target that leaves in the middle of a recording or a count is named for what it
//! did: exec'd another program (the agent went with the old image), or exited and is
//! a zombie its parent has not reaped (killed by which signal, or with which status)
//! — not "detached by another tendril" (issues #17, #31).
//!
//! The one idea: the `departing` fixture does each for real — its root function calls
//! execve after some recorded work, or its forked worker is killed while its parent
//! never reaps it — and the test checks the line tendril prints, that the profile holds
//! the work done before, and that the process is left untraced.

use crate::common;

use common::{RunningTendril, Target, node_at, tendril};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tendril::process::{StatLine, status_field};
use tendril::profile::Profile;

/// How long tendril may take to attach, calibrate and patch.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long tendril may take to end once the target left.
const END_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the fixture may take to print a line.
const LINE_TIMEOUT: Duration = Duration::from_secs(10);

/// A profile file of this test process's own.
fn profile_path(test: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "tendril-departures-{}-{test}.json",
        std::process::id()
    ))
}

/// `tendril record PID --root depart_round -o FILE`, recording.
fn record(pid: i32, output: &PathBuf) -> RunningTendril {
    let mut command = tendril();
    command
        .args(["record", &pid.to_string(), "--root", "depart_round", "-o"])
        .arg(output)
        .stdout(Stdio::null());
    RunningTendril::start(command, "tendril: recording ", START_TIMEOUT)
}

/// Waits for `running` to exit on its own (killing it after `END_TIMEOUT`); returns
/// whether it succeeded, and its stderr.
fn wait_end(running: RunningTendril) -> (bool, String) {
    let pid = running.pid();
    let deadline = Instant::now() + END_TIMEOUT;
    loop {
        // Gone, or a zombie waiting for this test to reap it.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let exited = StatLine::parse(&stat).is_none_or(|line| line.has_exited());
        if exited {
            let (status, _, stderr) = running.wait();
            return (status.success(), stderr);
        }
        if Instant::now() >= deadline {
            running.kill();
            panic!("tendril went on for {END_TIMEOUT:?} after the target left");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `n` whole rounds have run since now: `n` + 1 more "round" lines, as the
/// first may end a round that began before the hooks went in (not recorded).
fn rounds(target: &mut Target, n: usize) {
    target.drain();
    for _ in 0..=n {
        target.expect_line("round ", LINE_TIMEOUT);
    }
}

fn tracer_of(pid: i32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status_field(&status, "TracerPid").unwrap().to_string()
}

/// The profile holds whole rounds: depart_round → depart_work → 1000 × depart_leaf.
fn assert_rounds_recorded(profile: &Profile, at_least: u64) {
    let round = node_at(&profile.merged.roots, &["depart_round"]).expect("depart_round");
    assert!(round.calls >= at_least, "{} rounds", round.calls);
    let work = node_at(&round.children, &["depart_work"]).expect("depart_work");
    let leaf = node_at(&work.children, &["depart_leaf"]).expect("depart_leaf");
    assert!(work.calls >= at_least, "{} depart_work calls", work.calls);
    assert!(
        leaf.calls >= 1000 * (work.calls - 1),
        "{} depart_leaf calls under {} depart_work calls",
        leaf.calls,
        work.calls
    );
}

#[test]
fn record_says_the_target_execd_and_writes_the_profile_up_to_the_exec() {
    let mut target = Target::spawn("departing", &["exec"]);
    let pid = target.pid();
    let output = profile_path("exec");
    let recording = record(pid, &output);
    rounds(&mut target, 3);
    target.signal(libc::SIGUSR1);
    target.expect_line("exec", LINE_TIMEOUT);
    let (succeeded, stderr) = wait_end(recording);
    assert!(succeeded, "tendril record failed:\n{stderr}");
    let sleep = std::fs::canonicalize("/bin/sleep").unwrap();
    let expected = format!(
        "tendril: process {pid} exec'd {}: the agent is gone with the old program image; \
         profile written up to the exec",
        sleep.display()
    );
    assert!(
        stderr.lines().any(|line| line == expected),
        "expected {expected:?} in:\n{stderr}"
    );
    assert!(!stderr.contains("another tendril"), "{stderr}");
    let profile = Profile::load(&output).expect("the profile was written");
    common::check_profile(&profile);
    assert_rounds_recorded(&profile, 3);
    // The process runs the new program, untouched.
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/exe")).unwrap(),
        sleep
    );
    assert_eq!(tracer_of(pid), "0");
    assert!(target.is_running());
    let _ = std::fs::remove_file(output);
}

#[test]
fn count_says_the_target_execd() {
    let mut target = Target::spawn("departing", &["exec"]);
    let pid = target.pid();
    let mut command = tendril();
    command
        .args(["count", &pid.to_string(), "depart_leaf"])
        .stdout(Stdio::piped());
    let counting = RunningTendril::start(command, "tendril: counting ", START_TIMEOUT);
    rounds(&mut target, 3);
    target.signal(libc::SIGUSR1);
    target.expect_line("exec", LINE_TIMEOUT);
    let (succeeded, stderr) = wait_end(counting);
    assert!(succeeded, "tendril count failed:\n{stderr}");
    assert!(
        stderr.contains(&format!(
            "tendril: process {pid} exec'd {}: the agent is gone with the old program image; \
             counts are from the last reading before the exec",
            std::fs::canonicalize("/bin/sleep").unwrap().display()
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("another tendril"), "{stderr}");
    assert_eq!(tracer_of(pid), "0");
}

#[test]
fn record_says_how_a_zombie_its_parent_has_not_reaped_ended() {
    let mut parent = Target::spawn("departing", &["fork"]);
    let worker: i32 = parent
        .ready_line()
        .and_then(|line| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix("worker="))
        })
        .and_then(|pid| pid.parse().ok())
        .expect("the ready line names the worker");
    let output = profile_path("zombie");
    let recording = record(worker, &output);
    rounds(&mut parent, 3);
    // SAFETY: kill has no memory-safety preconditions; the worker is the fixture's
    // child, which its parent (alive) never reaps, so the pid names it.
    assert_eq!(unsafe { libc::kill(worker, libc::SIGKILL) }, 0);
    let (succeeded, stderr) = wait_end(recording);
    assert!(succeeded, "tendril record failed:\n{stderr}");
    // Its wait status is still in /proc/PID/stat: killed by SIGKILL, not "exited".
    let expected = format!(
        "tendril: process {worker} was killed by signal 9 (SIGKILL) (a zombie its parent \
         has not reaped yet); the profile covers it up to its end"
    );
    assert!(
        stderr.lines().any(|line| line == expected),
        "expected {expected:?} in:\n{stderr}"
    );
    let stat = std::fs::read_to_string(format!("/proc/{worker}/stat")).unwrap();
    let state = StatLine::parse(&stat).map(|line| line.state);
    assert_eq!(state, Some('Z'), "the worker is a zombie: {stat}");
    let profile = Profile::load(&output).expect("the profile was written");
    common::check_profile(&profile);
    assert_rounds_recorded(&profile, 3);
    let _ = std::fs::remove_file(output);
}
