//! `check_profile`: the consistency every profile a test produces must have (issue 15),
//! and that the agent's own in-situ calibration appears in none of its trees.
//!
//! The one idea: check what holds by construction whatever the load — within each
//! tree, no child's total exceeds its parent's and a node's self time is its total
//! minus its children's exactly (a self time the correction took below zero is marked
//! `below_resolution` and is 0, never silently clamped); the merged tree is the sum of
//! the thread trees, path by path, with the same calls; and the hot spots count each
//! function's calls exactly as the tree does.

use std::collections::{BTreeMap, HashMap};
use tendril::profile::hot::hot_spots;
use tendril::profile::{Node, Profile, Visit, walk};

/// Panics with the first inconsistency of `profile`.
pub fn check_profile(profile: &Profile) {
    check_tree("the merged tree", &profile.merged.roots);
    for thread in &profile.threads {
        check_tree(&format!("thread {}'s tree", thread.tid), &thread.roots);
    }
    if !profile.threads.is_empty() {
        check_merged_is_the_threads_sum(profile);
    }
    check_hot_spots(&profile.merged.roots);
}

fn check_tree(which: &str, roots: &[Node]) {
    let _ = walk::<()>(roots, |step| {
        let Visit::Enter { node, depth } = step else {
            return Ok(());
        };
        // The agent's in-situ calibration runs inside the target's calls; its events
        // never belong in a tree, however often the recording restarted.
        assert!(
            !node.name.starts_with("tendril_in_situ"),
            "{which}: the agent's {} at depth {depth}",
            node.name
        );
        let children: u64 = node.children.iter().map(|c| c.total_ns).sum();
        for child in &node.children {
            assert!(
                child.total_ns <= node.total_ns,
                "{which}: {} (depth {depth}) has a total of {} ns, its child {} {} ns",
                node.name,
                node.total_ns,
                child.name,
                child.total_ns
            );
        }
        assert_eq!(
            node.self_ns + children,
            node.total_ns,
            "{which}: {} (depth {depth}): self {} ns + children {children} ns is not its \
             total {} ns",
            node.name,
            node.self_ns,
            node.total_ns
        );
        if node.below_resolution {
            assert_eq!(node.self_ns, 0, "{which}: {} below resolution", node.name);
        }
        check_cpu_times(which, node, depth);
        Ok(())
    });
}

/// CPU times, where a node has them: no more than its wall time, no less than its
/// children's, and its self CPU time the difference; all or none of a tree has them.
fn check_cpu_times(which: &str, node: &Node, depth: usize) {
    let Some(cpu) = node.cpu_ns else {
        assert!(
            node.self_cpu_ns.is_none() && node.children.iter().all(|c| c.cpu_ns.is_none()),
            "{which}: {} (depth {depth}) has no CPU time, but a self CPU time or a child's",
            node.name
        );
        return;
    };
    let children: Option<u64> = node.children.iter().map(|c| c.cpu_ns).sum();
    let children = children.unwrap_or_else(|| {
        panic!(
            "{which}: {} (depth {depth}) has a CPU time and a child without",
            node.name
        )
    });
    assert!(
        children <= cpu && cpu <= node.total_ns,
        "{which}: {} (depth {depth}): CPU {cpu} ns, children's {children} ns, wall {} ns",
        node.name,
        node.total_ns
    );
    assert_eq!(
        node.self_cpu_ns,
        Some(cpu - children),
        "{which}: {} (depth {depth}): self CPU is not CPU less the children's",
        node.name
    );
}

/// Nodes of the same function (name, module, address: two `static` functions may share
/// a name and module) under one parent, by that key.
type Siblings<'a> = BTreeMap<(&'a str, &'a str, Option<u64>), Vec<&'a Node>>;

fn by_function<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Siblings<'a> {
    let mut grouped: Siblings = BTreeMap::new();
    for node in nodes {
        grouped
            .entry((node.name.as_str(), node.module.as_str(), node.address))
            .or_default()
            .push(node);
    }
    grouped
}

/// Every merged path's calls are the threads' sum at that path, and so is its total
/// (within a nanosecond per thread and per node below it, for rounding).
fn check_merged_is_the_threads_sum(profile: &Profile) {
    let sizes = subtree_sizes(&profile.merged.roots);
    let threads = profile.threads.len() as u64;
    let mut pending: Vec<(Vec<&Node>, Vec<&Node>, String)> = vec![(
        profile.merged.roots.iter().collect(),
        profile.threads.iter().flat_map(|t| &t.roots).collect(),
        String::new(),
    )];
    while let Some((merged, parts, path)) = pending.pop() {
        let merged = by_function(merged);
        let mut parts = by_function(parts);
        for (key, nodes) in &merged {
            let here = format!("{path}/{}", key.0);
            assert_eq!(nodes.len(), 1, "the merged tree has {here} twice");
            let node = nodes[0];
            let same = parts.remove(key).unwrap_or_default();
            let calls: u64 = same.iter().map(|n| n.calls).sum();
            assert_eq!(
                node.calls, calls,
                "{here}: merged calls against the threads'"
            );
            let total: u64 = same.iter().map(|n| n.total_ns).sum();
            let slack = threads + sizes[&(node as *const Node)];
            assert!(
                node.total_ns.abs_diff(total) <= slack,
                "{here}: merged total {} ns against the threads' {total} ns",
                node.total_ns
            );
            pending.push((
                node.children.iter().collect(),
                same.iter().flat_map(|n| &n.children).collect(),
                here,
            ));
        }
        assert!(
            parts.is_empty(),
            "thread trees have paths the merged tree lacks under {path}/: {:?}",
            parts.keys().collect::<Vec<_>>()
        );
    }
}

/// Nodes in each subtree, by node address.
fn subtree_sizes(roots: &[Node]) -> HashMap<*const Node, u64> {
    let mut sizes = HashMap::new();
    let _ = walk::<()>(roots, |step| {
        if let Visit::Leave { node, .. } = step {
            let below: u64 = node
                .children
                .iter()
                .map(|c| sizes[&(c as *const Node)])
                .sum();
            sizes.insert(node as *const Node, 1 + below);
        }
        Ok(())
    });
    sizes
}

fn check_hot_spots(roots: &[Node]) {
    let mut calls: HashMap<(&str, &str, Option<u64>), (u64, u64)> = HashMap::new();
    let _ = walk::<()>(roots, |step| {
        if let Visit::Enter { node, .. } = step {
            let entry = (calls.entry((&node.name, &node.module, node.address))).or_default();
            entry.0 += node.calls;
            entry.1 += node.self_ns;
        }
        Ok(())
    });
    let spots = hot_spots(roots);
    assert_eq!(
        spots.len(),
        calls.len(),
        "one hot spot per function of the tree"
    );
    for spot in spots {
        assert_eq!(
            calls.get(&(spot.name, spot.module, spot.address)).copied(),
            Some((spot.calls, spot.self_ns)),
            "hot spot {} ({}): calls and self time against the tree's",
            spot.name,
            spot.module
        );
    }
}
