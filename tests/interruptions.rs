//! Per-call times after pauses, resets and root changes made while threads are deep
//! inside the roots: within 10% of the time on a CPU the fixture measured for the same
//! requests.
//!
//! The one idea: the `descend` fixture's requests recurse nine levels on three threads,
//! each level computing a fixed amount, and its few calls leave next to nothing to the
//! hooks' cost correction. The test records the process while pausing (or resetting,
//! or changing the roots) twenty times with threads in the middle of the recursion, and
//! compares the on-CPU time per call with the fixture's: each request's wall time less
//! its thread's waits for a core (schedstat; not its CPU clock, which leaves out what a
//! hypervisor takes), over the same stretches of time, weighted by the calls the
//! recording saw in each. Frames left open across an
//! interruption, or calls nested under frames that ended unseen, would add the time
//! the recording was not watching. The truth is taken at the same moment because a
//! request's CPU time moves with what else the cores run: beside two busy loops, the
//! same requests took 250 µs in one recording and 296 µs in the one before it. The
//! tests take turns so three of them do not crowd two cores. (`live_tree.rs` checks
//! the tree's shape on the demo, whose calls are too short for a 10% bound.)

use crate::common;

use common::{Target, number_after, start_recorder};
use std::time::{Duration, Instant};
use tendril::profile::{Node, Profile};
use tendril::recording::Recorder;

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

/// The requests the fixture finished since it was last asked, and their CPU
/// nanoseconds on a CPU in all; asking starts the sums again.
fn fixture_cpu(target: &mut Target) -> (u64, u64) {
    target.write_stdin("cpu\n");
    let line = target.expect_line("cpu requests ", WAIT);
    (number_after(&line, "requests"), number_after(&line, "ns"))
}

/// The root only at the top of every tree, and the per-call times within
/// [`TOLERANCE`] of the fixture's own CPU time per request (`Truth`).
fn check(profile: &Profile, truth: f64, what: &str) {
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
    println!("{what}: on-CPU per call {now:.0?} ns; the fixture measured {truth:.0} ns on a CPU");
    // What a failure needs to tell a cause: lost switch records count as on-CPU time,
    // and the pauses removed.
    let stats = &profile.stats;
    println!(
        "{what}: {} context-switch records lost; pauses {} ns ({} ns waiting for a core, \
         {} ns for ring room, {} ns faulting rings); {} events lost",
        stats.off_cpu_lost,
        stats.pause_ns,
        stats.core_wait_ns,
        stats.ring_wait_ns,
        stats.ring_fault_ns,
        stats.lost_events
    );
    // A request is descend(8) and nothing else: both carry its time.
    for (i, name) in [ROOT, "descend"].iter().enumerate() {
        assert!(
            (truth * (1.0 - TOLERANCE)..=truth * (1.0 + TOLERANCE)).contains(&now[i]),
            "after {what}: {name} takes {:.0} ns of CPU per call; the fixture measured \
             {truth:.0} ns on a CPU",
            now[i],
        );
    }
}

/// The fixture's CPU time per request over the stretches a recording watched, each
/// weighted by the root calls it recorded in it. A request's CPU time moves with
/// what else the cores run; over the whole recording, stretches it did not watch (a
/// pause, the other root) and stretches it did can differ by more than the bound.
#[derive(Default)]
struct Truth {
    /// Per stretch: the root calls in the recording at its end, and the fixture's CPU
    /// nanoseconds per request in it.
    stretches: Vec<(u64, f64)>,
}

impl Truth {
    /// Ends a stretch: asks the fixture for its requests since the last stretch.
    fn end_stretch(&mut self, target: &mut Target, recorder: &mut Recorder) {
        let recorded = calls_at_top(&recorder.snapshot(), ROOT);
        let (requests, ns) = fixture_cpu(target);
        if self
            .stretches
            .last()
            .is_some_and(|&(before, _)| recorded < before)
        {
            // A reset: the recording holds only what came after it.
            self.stretches.clear();
        }
        if requests > 0 {
            self.stretches.push((recorded, ns as f64 / requests as f64));
        }
    }

    /// The weighted mean, in nanoseconds.
    fn per_request(&self) -> f64 {
        let (mut before, mut calls, mut sum) = (0, 0, 0.0);
        for &(recorded, ns) in &self.stretches {
            let weight = recorded.saturating_sub(before);
            before = recorded;
            calls += weight;
            sum += weight as f64 * ns;
        }
        assert!(calls > 0, "the fixture finished no request while recorded");
        sum / calls as f64
    }
}

/// Records the fixture doing `interrupt` [`ROUNDS`] times with two threads
/// mid-recursion (it is given the round, and answers the root to count calls of until
/// the next), then compares the per-call times with the fixture's own (`check`).
fn check_interrupted(what: &str, mut interrupt: impl FnMut(&mut Recorder, usize) -> &'static str) {
    let _turn = common::live_target_turn();
    let mut target = Target::spawn("descend", &[]);
    // From here on the fixture sums its requests' CPU time for the truth.
    fixture_cpu(&mut target);
    let mut recorder = start_recorder(target.pid(), ROOT);
    let mut truth = Truth::default();
    for round in 0..ROUNDS {
        until_mid_recursion(&mut recorder);
        let root = interrupt(&mut recorder, round);
        record_calls(&mut recorder, root, CALLS_BETWEEN);
        truth.end_stretch(&mut target, &mut recorder);
    }
    record_calls(&mut recorder, ROOT, CALLS);
    truth.end_stretch(&mut target, &mut recorder);
    let profile = recorder.finish(false).expect("the recording ends").profile;
    check(&profile, truth.per_request(), what);
}

#[test]
fn pauses_mid_recursion_leave_per_call_times_as_the_fixture_measures_them() {
    check_interrupted("20 pauses", |recorder, _| {
        recorder.pause().expect("pause");
        // Long enough for every request in progress to finish unwatched.
        std::thread::sleep(Duration::from_millis(20));
        recorder.resume().expect("resume");
        ROOT
    });
}

#[test]
fn resets_mid_recursion_leave_per_call_times_as_the_fixture_measures_them() {
    check_interrupted("20 resets", |recorder, _| {
        recorder.reset();
        ROOT
    });
}

#[test]
fn root_changes_mid_recursion_leave_per_call_times_as_the_fixture_measures_them() {
    check_interrupted("20 root changes", |recorder, round| {
        // Alternately the recursion itself and the request again; the last change
        // comes back to the request.
        let root = if round % 2 == 0 { "descend" } else { ROOT };
        recorder.set_roots(&[root.to_string()]).expect("new roots");
        root
    });
}
