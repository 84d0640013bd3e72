//! Per-call times after pauses, resets and root changes made while threads are deep
//! inside the roots: within 10% of an uninterrupted recording of the same process.
//!
//! The one idea: the `descend` fixture's requests recurse nine levels on three threads,
//! each level computing a fixed amount, so a request's CPU time is the same whatever the
//! machine is doing, and its few calls leave next to nothing to the hooks' cost
//! correction. The test records the process without interruption, then again while
//! pausing (or resetting, or changing the roots) twenty times with threads in the
//! middle of the recursion, and compares the on-CPU time per call: frames left open
//! across an interruption, or calls nested under frames that ended unseen, would add
//! the time the recording was not watching. Uninterrupted recordings are made before
//! and after, and the check is against the nearer of the two: CPU time per unit of
//! work still moves a little with what else the cores run (caches), and the tests take
//! turns so three of them do not crowd two cores. (`live_tree.rs` checks the tree's
//! shape on the demo, whose calls are too short for a 10% bound.)

mod common;

use common::Target;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tendril::profile::{Node, Profile};
use tendril::recording::{RecordOptions, Recorder, Scheme};

/// How long any one wait may take on a loaded machine before the test gives up.
const WAIT: Duration = Duration::from_secs(120);
const ROUNDS: usize = 20;
/// Root calls recorded for a per-call time, and between two interruptions.
const CALLS: u64 = 300;
const CALLS_BETWEEN: u64 = 20;
const ROOT: &str = "request";
/// A thread this deep is inside `descend`'s recursion (request, descend × 3).
const MID_RECURSION: usize = 4;
const TOLERANCE: f64 = 0.10;

/// The tests take turns (see the module comment); a failed one does not stop the rest.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn start(target: &Target, root: &str) -> Recorder {
    Recorder::start(&RecordOptions {
        pid: target.pid(),
        roots: vec![root.to_string()],
        scheme: Scheme::B,
        gross_only: false,
    })
    .unwrap_or_else(|e| panic!("cannot record the fixture: {e}"))
}

/// Drains the rings until `condition` holds, looking at a snapshot every 20 ms.
fn record_until(recorder: &mut Recorder, what: &str, mut condition: impl FnMut(&Profile) -> bool) {
    let deadline = Instant::now() + WAIT;
    let mut checked = Instant::now();
    loop {
        recorder.poll();
        if checked.elapsed() >= Duration::from_millis(20) {
            checked = Instant::now();
            if condition(&recorder.snapshot()) {
                return;
            }
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn calls_at_top(profile: &Profile, name: &str) -> u64 {
    let tops = profile.merged.roots.iter().filter(|n| n.name == name);
    tops.map(|n| n.calls).sum()
}

fn record_calls(recorder: &mut Recorder, root: &str, calls: u64) {
    let from = calls_at_top(&recorder.snapshot(), root);
    record_until(recorder, "root calls", |p| {
        calls_at_top(p, root) >= from + calls
    });
}

fn until_mid_recursion(recorder: &mut Recorder) {
    let deadline = Instant::now() + WAIT;
    while recorder.threads_at_depth(MID_RECURSION) < 2 {
        assert!(
            Instant::now() < deadline,
            "no two threads inside the recursion"
        );
        recorder.poll();
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// On-CPU nanoseconds per call of the root and of its `descend` child.
fn per_call(profile: &Profile) -> [f64; 2] {
    let root = profile.merged.roots.iter().find(|n| n.name == ROOT);
    let root = root.expect("the root was recorded");
    let descend = root.children.iter().find(|n| n.name == "descend");
    let descend = descend.expect("descend was recorded");
    [root, descend].map(|n: &Node| {
        n.cpu_ns.expect("the recording measures CPU time") as f64 / n.calls.max(1) as f64
    })
}

fn uninterrupted(target: &Target) -> Profile {
    let mut recorder = start(target, ROOT);
    record_calls(&mut recorder, ROOT, CALLS);
    let profile = recorder.finish(false).expect("the recording ends").profile;
    common::check_profile(&profile);
    profile
}

/// The root only at the top of every tree, and the per-call times within
/// [`TOLERANCE`] of the nearer of two uninterrupted recordings' (made before and after).
fn check(profile: &Profile, references: [&Profile; 2], what: &str) {
    common::check_profile(profile);
    let trees =
        std::iter::once(&profile.merged.roots).chain(profile.threads.iter().map(|t| &t.roots));
    for roots in trees {
        let mut pending: Vec<(usize, &Node)> = roots.iter().map(|n| (1, n)).collect();
        while let Some((depth, node)) = pending.pop() {
            assert!(
                (depth == 1) == (node.name == ROOT),
                "after {what}: {} at depth {depth}",
                node.name
            );
            pending.extend(node.children.iter().map(|c| (depth + 1, c)));
        }
    }
    let now = per_call(profile);
    let then = references.map(per_call);
    println!("{what}: on-CPU per call {now:.0?} ns; uninterrupted {then:.0?} ns");
    for (i, name) in [ROOT, "descend"].iter().enumerate() {
        let (low, high) = (then[0][i].min(then[1][i]), then[0][i].max(then[1][i]));
        assert!(
            (low * (1.0 - TOLERANCE)..=high * (1.0 + TOLERANCE)).contains(&now[i]),
            "after {what}: {name} takes {:.0} ns of CPU per call; uninterrupted {:.0} and \
             {:.0} ns",
            now[i],
            then[0][i],
            then[1][i]
        );
    }
}

/// Records the fixture without interruption, then again doing `interrupt` [`ROUNDS`]
/// times with two threads mid-recursion (it is given the round, and answers the root to
/// count calls of until the next), then compares them (`check`).
fn check_interrupted(what: &str, mut interrupt: impl FnMut(&mut Recorder, usize) -> &'static str) {
    let _turn = one_at_a_time();
    let target = Target::spawn("descend", &[]);
    let before = uninterrupted(&target);
    let mut recorder = start(&target, ROOT);
    for round in 0..ROUNDS {
        until_mid_recursion(&mut recorder);
        let root = interrupt(&mut recorder, round);
        record_calls(&mut recorder, root, CALLS_BETWEEN);
    }
    record_calls(&mut recorder, ROOT, CALLS);
    let profile = recorder.finish(false).expect("the recording ends").profile;
    check(&profile, [&before, &uninterrupted(&target)], what);
}

#[test]
fn pauses_mid_recursion_leave_per_call_times_as_uninterrupted() {
    check_interrupted("20 pauses", |recorder, _| {
        recorder.pause().expect("pause");
        // Long enough for every request in progress to finish unwatched.
        std::thread::sleep(Duration::from_millis(20));
        recorder.resume().expect("resume");
        ROOT
    });
}

#[test]
fn resets_mid_recursion_leave_per_call_times_as_uninterrupted() {
    check_interrupted("20 resets", |recorder, _| {
        recorder.reset();
        ROOT
    });
}

#[test]
fn root_changes_mid_recursion_leave_per_call_times_as_uninterrupted() {
    check_interrupted("20 root changes", |recorder, round| {
        // Alternately the recursion itself and the request again; the last change
        // comes back to the request.
        let root = if round % 2 == 0 { "descend" } else { ROOT };
        recorder.set_roots(&[root.to_string()]).expect("new roots");
        root
    });
}
