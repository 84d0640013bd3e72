//! Coroutines that switch stacks inside instrumented functions (ucontext): the profile
//! counts every call exactly where it can attribute it, never shows exits it cannot
//! match, and says how many stack switches cut frames short.

use crate::common;

use common::{Recording, Round, Target, all_nodes, node_at};
use std::time::Duration;
use tendril::profile::Node;

const LINE_TIMEOUT: Duration = Duration::from_secs(60);

/// Calls of `name` in every context of the trees.
fn calls_everywhere(roots: &[Node], name: &str) -> u64 {
    all_nodes(roots)
        .iter()
        .filter(|node| node.name == name)
        .map(|node| node.calls)
        .sum()
}

/// Runs `run N` and returns the fixture's round line.
fn run(target: &mut Target, n: u64) -> Round {
    target.write_stdin(&format!("run {n}\n"));
    target.rounds(1, LINE_TIMEOUT).remove(0)
}

#[test]
fn coroutine_switches_are_counted_exactly_and_marked_in_the_profile() {
    let mut target = Target::spawn("coroutines", &[]);
    // The coroutines start before the recording: frames are open on their stacks.
    run(&mut target, 3);
    // co_leaf is a root too: a coroutine resumed inside co_work calls it before
    // Scheme B would have found it (co_work's first entry in the recording).
    let roots = ["--root", "drive", "--root", "co_work", "--root", "co_leaf"];
    let recording = Recording::start(target.pid(), &roots);
    let rounds = [run(&mut target, 100), run(&mut target, 57)];
    let recorded = recording.finish();
    let total = |key: &str| rounds.iter().map(|r| r.get(key).unwrap()).sum::<u64>();
    let profile = &recorded.profile;
    let merged = &profile.merged.roots;
    let stderr = &recorded.stderr;

    assert_eq!(
        node_at(merged, &["drive"]).map(|n| n.calls),
        Some(157),
        "{stderr}"
    );
    assert_eq!(
        node_at(merged, &["drive", "resume"]).map(|n| n.calls),
        Some(total("resume")),
        "{stderr}"
    );
    assert_eq!(
        node_at(merged, &["drive", "resume", "swapcontext"]).map(|n| n.calls),
        Some(total("resume")),
        "{stderr}"
    );
    assert_eq!(calls_everywhere(merged, "co_work"), total("co_work"));
    assert_eq!(calls_everywhere(merged, "co_leaf"), total("co_leaf"));
    assert_eq!(calls_everywhere(merged, "yield"), total("co_leaf"));

    // Nothing it could not match, and the switches said out loud.
    assert_eq!(profile.stats.unmatched_exits, 0, "{stderr}");
    assert!(profile.stats.stack_switches > 0, "{:?}", profile.stats);
    // Each resume() returns into at least the coroutine's swapcontext and yield frames.
    assert!(
        profile.stats.dropped_frames >= 2 * profile.stats.stack_switches,
        "{:?}",
        profile.stats
    );
    assert_eq!(profile.threads.len(), 1);
    assert_eq!(
        profile.threads[0].stack_switches,
        profile.stats.stack_switches
    );
    assert_eq!(
        profile.threads[0].dropped_frames,
        profile.stats.dropped_frames
    );
    assert!(
        stderr.contains("warning: threads switched stacks"),
        "no warning in the summary: {stderr}"
    );

    // The report prints it too, and the coroutines carry on.
    let file = std::env::temp_dir().join(format!("tendril-coroutines-{}.json", target.pid()));
    profile.save(&file).unwrap();
    let report = common::tendril().arg("report").arg(&file).output().unwrap();
    let _ = std::fs::remove_file(&file);
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(text.contains("warning: threads switched stacks"), "{text}");
    assert_eq!(run(&mut target, 4).get("co_leaf"), Some(8));
}
