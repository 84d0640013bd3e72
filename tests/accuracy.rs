//! Times are corrected for tendril's own cost: on a fixture whose leaves busy-wait
//! known durations (measured by the fixture itself on bare twins of the same code, run
//! between the recorded calls), each leaf's self time per call is within 10% of its
//! truth, and the parent's total per call within 5% of its bare time — although every
//! call goes through two hooks. A root whose time is mostly short calls two levels down
//! is within 15% of its time measured before the recording (the hooks of every call
//! below a frame ran inside its time, not only those of its direct calls).
//!
//! This binary holds one test, so nothing else runs beside it, and the fixture runs at
//! a real-time priority, so other work on a busy machine cannot stretch its calls. A
//! run out of tolerance is still repeated (up to three times: an interrupt storm or the
//! real-time throttle can hit one), and every attempt is shown if all fail.

use crate::common;

use common::{Recording, Target, node_at, number_after};
use std::time::Duration;

const LINE_TIMEOUT: Duration = Duration::from_secs(60);
const CALLS: u32 = 300;

/// The fixture's own mean nanoseconds per call of each leaf and of `parent`, from the
/// bare twins timed between the recorded calls, and of `layered`, measured before.
struct Truth {
    short: f64,
    medium: f64,
    long: f64,
    parent: f64,
    layered: f64,
}

fn attempt() -> Result<String, String> {
    // The fixture runs at a real-time priority: other work on a busy machine cannot
    // take the CPU from it, so neither its own measurement nor the recorded run is
    // stretched by waits that have nothing to do with tendril.
    let mut target = Target::spawn_realtime("timed", &[]);
    target.write_stdin(&format!("measure {CALLS}\n"));
    let layered_truth = number_after(&target.expect_line("measure ", LINE_TIMEOUT), "layered");
    let recording = Recording::start(target.pid(), &["--root", "parent", "--root", "layered"]);
    // Each recorded parent() is followed by its bare twin: the truth of the same moment.
    target.write_stdin(&format!("pairs {CALLS}\n"));
    let pairs = target.expect_line("pairs ", LINE_TIMEOUT);
    target.write_stdin(&format!("layers {CALLS}\n"));
    target.expect_line("layers ", LINE_TIMEOUT);
    let recorded = recording.finish();
    let twins = &pairs[pairs.find(" bare ").ok_or("no twins' times")?..];
    let truth = Truth {
        short: number_after(twins, "short"),
        medium: number_after(twins, "medium"),
        long: number_after(twins, "long"),
        parent: number_after(twins, "parent"),
        layered: layered_truth,
    };
    let roots = &recorded.profile.merged.roots;
    let parent = node_at(roots, &["parent"]).ok_or("no parent node")?;
    let layered = node_at(roots, &["layered"]).ok_or("no layered node")?;
    let per_call = |total: u64, calls: u64| total as f64 / calls as f64;
    let mut report = format!(
        "truth: short {:.0} medium {:.0} long {:.0} parent {:.0} layered {:.0} ns\n",
        truth.short, truth.medium, truth.long, truth.parent, truth.layered
    );
    let mut ok = true;
    let mut check = |what: &str, measured: f64, truth: f64, tolerance: f64| {
        let error = (measured - truth).abs() / truth;
        report.push_str(&format!(
            "{what}: {measured:.0} ns per call against {truth:.0} ({:+.1}%, tolerance {:.0}%)\n",
            100.0 * (measured - truth) / truth,
            tolerance * 100.0
        ));
        ok &= error <= tolerance;
    };
    check(
        "parent total",
        per_call(parent.total_ns, parent.calls),
        truth.parent,
        0.05,
    );
    // A thousand calls of 200 ns below it: each carries the hooks' cost in its real
    // surroundings, which is some 10–15 ns more than the calibration loop measures (its
    // minimum over batches, as JFluid takes it). Charging only the direct calls' hooks
    // (the error this guards against) leaves about 18% in.
    check(
        "layered total",
        per_call(layered.total_ns, layered.calls),
        truth.layered,
        0.15,
    );
    for (name, truth) in [
        ("leaf_short", truth.short),
        ("leaf_medium", truth.medium),
        ("leaf_long", truth.long),
    ] {
        let leaf = node_at(roots, &["parent", name]).ok_or(format!("no {name} node"))?;
        check(
            &format!("{name} self"),
            per_call(leaf.self_ns, leaf.calls),
            truth,
            0.10,
        );
    }
    report.push_str(&format!(
        "calibration: {:?}\n",
        recorded.profile.calibration
    ));
    if ok { Ok(report) } else { Err(report) }
}

#[test]
fn times_are_corrected_for_tendrils_own_cost() {
    let mut failures = Vec::new();
    for number in 1..=3 {
        match attempt() {
            Ok(report) => {
                eprintln!("attempt {number} within tolerance:\n{report}");
                return;
            }
            Err(report) => failures.push(format!("attempt {number}:\n{report}")),
        }
    }
    panic!("every attempt out of tolerance:\n{}", failures.join("\n"));
}
