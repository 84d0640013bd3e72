//! CPU time per node: a recording takes the time each thread spent off the CPU (from the
//! kernel's context switches) out of the frames it fell in.
//!
//! The one idea: the `off_cpu` fixture's requests compute a fixed amount (`crunch`) and
//! then sleep 2 ms (`nap`), and the fixture measures `crunch`'s CPU time itself with
//! its thread CPU clock. Load cannot move what is asserted: the work's CPU time is the
//! same however long the thread waits for a core, a sleep keeps a thread off the CPU
//! at least as long as it asked, and sleeping takes next to no CPU.

mod common;

use common::{Recording, Target, node_at, number_after};
use std::time::Duration;
use tendril::profile::{Clock, Node};

const LINE_TIMEOUT: Duration = Duration::from_secs(300);
const REQUESTS: u64 = 200;

fn per_call(node: &Node, time: u64) -> f64 {
    time as f64 / node.calls.max(1) as f64
}

#[test]
fn cpu_time_is_wall_time_less_the_time_off_the_cpu() {
    let mut target = Target::spawn("off_cpu", &[]);
    let recording = Recording::start(target.pid(), &["--root", "request"]);
    target.write_stdin(&format!("run {REQUESTS}\n"));
    let line = target.expect_line("run ", LINE_TIMEOUT);
    let crunch_cpu_truth: f64 = number_after(&line, "crunch_cpu");
    let nap_ns: f64 = number_after(&line, "nap_ns");
    let recorded = recording.finish();
    let profile = recorded.profile;
    assert_eq!(profile.stats.cpu_unmeasured, None);
    let roots = &profile.merged.roots;
    let request = node_at(roots, &["request"]).expect("request was recorded");
    let crunch = node_at(roots, &["request", "crunch"]).expect("crunch was recorded");
    let nap = node_at(roots, &["request", "nap"]).expect("nap was recorded");
    for node in [request, crunch, nap] {
        assert_eq!(node.calls, REQUESTS, "{} calls", node.name);
    }
    let cpu = |node: &Node| node.cpu_ns.expect("a CPU time");

    // The work's CPU time, as the fixture's own thread clock saw it.
    let crunch_cpu = per_call(crunch, cpu(crunch));
    assert!(
        (crunch_cpu / crunch_cpu_truth - 1.0).abs() <= 0.10,
        "crunch: {crunch_cpu:.0} ns of CPU per call; the fixture measured {crunch_cpu_truth:.0}"
    );
    // Each request sleeps at least nap_ns: at least that much of its wall time is off
    // the CPU, and all of it inside nap.
    let off = |node: &Node| per_call(node, node.total_ns - cpu(node));
    assert!(
        off(request) >= 0.95 * nap_ns && off(nap) >= 0.95 * nap_ns,
        "off the CPU per call: request {:.0} ns, nap {:.0} ns; each sleeps {nap_ns} ns",
        off(request),
        off(nap)
    );
    // Sleeping takes next to no CPU.
    let nap_cpu = per_call(nap, cpu(nap));
    assert!(
        nap_cpu < 0.15 * nap_ns,
        "nap: {nap_cpu:.0} ns of CPU per call for a {nap_ns} ns sleep"
    );

    // The report shows either clock.
    let mut shown = profile.clone();
    shown.show_clock(Clock::Cpu).unwrap();
    let request_shown = node_at(&shown.merged.roots, &["request"]).unwrap();
    assert_eq!(request_shown.total_ns, cpu(request));
    assert_eq!(request_shown.cpu_ns, Some(request.total_ns));
}

#[test]
fn gross_only_recordings_say_cpu_time_is_not_measured() {
    let mut target = Target::spawn("off_cpu", &[]);
    let recording = Recording::start(target.pid(), &["--root", "request", "--gross-only"]);
    target.write_stdin("run 5\n");
    target.expect_line("run ", LINE_TIMEOUT);
    let profile = recording.finish().profile;
    let why = profile.stats.cpu_unmeasured.clone().expect("a reason");
    assert!(why.contains("--gross-only"), "{why}");
    let mut shown = profile;
    let refused = shown
        .show_clock(Clock::Cpu)
        .expect_err("no CPU times to show");
    assert!(refused.to_string().contains("--gross-only"), "{refused}");
}
