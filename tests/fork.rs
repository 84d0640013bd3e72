//! `fork()` inside a recorded call graph: the child's events never reach the parent's
//! profile, the parent's calls are counted exactly, and the child runs correctly.

use crate::common;

use common::{Recording, Round, Target, all_nodes, node_at};
use std::time::{Duration, Instant};
use tendril::profile::Node;

const LINE_TIMEOUT: Duration = Duration::from_secs(60);

fn run(target: &mut Target, n: u64) -> Round {
    target.write_stdin(&format!("run {n}\n"));
    target.rounds(1, LINE_TIMEOUT).remove(0)
}

/// Every (parent, child) pair of the trees whose child took longer than its parent.
fn children_longer_than_parents(roots: &[Node]) -> Vec<String> {
    all_nodes(roots)
        .iter()
        .flat_map(|parent| {
            parent
                .children
                .iter()
                .filter(|child| child.total_ns > parent.total_ns + 1_000)
                .map(|child| {
                    format!(
                        "{} ({} ns) in {} ({} ns)",
                        child.name, child.total_ns, parent.name, parent.total_ns
                    )
                })
        })
        .collect()
}

#[test]
fn a_child_forked_inside_the_graph_adds_nothing_to_the_parents_profile() {
    let mut target = Target::spawn("forking", &[]);
    let started = Instant::now();
    let recording = Recording::start(target.pid(), &["--root", "fork_round"]);
    let rounds = [run(&mut target, 20), run(&mut target, 15)];
    let recorded = recording.finish();
    let wall_ns = started.elapsed().as_nanos() as u64;
    let profile = &recorded.profile;
    let stderr = &recorded.stderr;
    for round in &rounds {
        assert_eq!(round.get("children_ok"), round.get("spawn"), "{round:?}");
    }
    let merged = &profile.merged.roots;
    let calls = |path: &[&str]| node_at(merged, path).map(|n| n.calls);
    assert_eq!(profile.threads.len(), 1, "{stderr}");
    assert_eq!(calls(&["fork_round"]), Some(35), "{stderr}");
    assert_eq!(calls(&["fork_round", "parent_leaf"]), Some(350));
    assert_eq!(calls(&["fork_round", "spawn"]), Some(35));
    // Every call below spawn is one the parent made once per spawn (fork, waitpid)
    // or inside those: no child's function, nothing counted twice.
    let spawn = node_at(merged, &["fork_round", "spawn"]).unwrap();
    for child in &spawn.children {
        assert_eq!(
            child.calls, 35,
            "{} under spawn: {:#?}",
            child.name, spawn.children
        );
    }
    assert!(all_nodes(merged).iter().all(|n| !n.name.contains("child_")));
    assert_eq!(profile.stats.unmatched_exits, 0, "{stderr}");
    assert_eq!(children_longer_than_parents(merged), Vec::<String>::new());
    let root = node_at(merged, &["fork_round"]).unwrap();
    assert!(
        root.total_ns <= wall_ns,
        "{} ns of {wall_ns}",
        root.total_ns
    );

    // The parent goes on forking correctly after the recording.
    let after = run(&mut target, 5);
    assert_eq!(after.get("children_ok"), Some(5));
}
