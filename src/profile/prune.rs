//! `report`'s `--thread`, `--depth` and `--threshold`: a profile cut down to what the
//! reader asked for, before any format prints it.
//!
//! The one idea: cutting is done on the profile itself, so every format (tree, hot
//! spots, folded stacks, JSON) shows the same cut. A node below the threshold or the
//! depth goes with its whole subtree; the nodes kept keep their own totals, so a total
//! can exceed the sum of the children shown. Trees may be as deep as a recursion: no
//! recursion here.

use super::model::{Node, Profile};

/// What to keep.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Prune {
    /// Only this thread's tree (as the merged tree too).
    pub thread: Option<u32>,
    /// Only the nodes this many levels deep at most (1: the roots).
    pub depth: Option<usize>,
    /// Only the nodes whose total is at least this percentage of all roots' total.
    pub threshold_percent: Option<f64>,
}

/// Why a profile cannot be cut as asked.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PruneError {
    #[error("the profile has no thread {tid} — its threads are: {known}")]
    NoSuchThread { tid: u32, known: String },
}

impl Prune {
    /// Cuts `profile` down as asked.
    pub fn apply(&self, profile: &mut Profile) -> Result<(), PruneError> {
        if let Some(tid) = self.thread {
            let Some(index) = profile.threads.iter().position(|t| t.tid == tid) else {
                let known: Vec<String> = profile
                    .threads
                    .iter()
                    .map(|t| format!("{} ({})", t.tid, t.name))
                    .collect();
                return Err(PruneError::NoSuchThread {
                    tid,
                    known: known.join(", "),
                });
            };
            let thread = profile.threads.swap_remove(index);
            profile.threads = vec![thread];
            profile.merged.roots = profile.threads[0].roots.clone();
        }
        let whole = profile.merged_total_ns() as f64;
        let minimum = self
            .threshold_percent
            .map_or(0, |percent| (whole * percent / 100.0).ceil() as u64);
        cut(&mut profile.merged.roots, minimum, self.depth);
        for thread in &mut profile.threads {
            cut(&mut thread.roots, minimum, self.depth);
        }
        Ok(())
    }
}

/// Removes the nodes under `minimum` total, and those deeper than `depth`.
fn cut(roots: &mut Vec<Node>, minimum: u64, depth: Option<usize>) {
    roots.retain(|node| node.total_ns >= minimum);
    let mut pending: Vec<(&mut Node, usize)> = roots.iter_mut().map(|n| (n, 1)).collect();
    while let Some((node, level)) = pending.pop() {
        if depth.is_some_and(|max| level >= max) {
            node.children.clear();
            continue;
        }
        node.children.retain(|child| child.total_ns >= minimum);
        pending.extend(node.children.iter_mut().map(|child| (child, level + 1)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::model::ThreadProfile;

    fn n(name: &str, total: u64, children: Vec<Node>) -> Node {
        let mut node = Node::leaf(name, "app", 1, total, 0);
        node.children = children;
        node
    }

    fn profile() -> Profile {
        let tree = || {
            vec![n(
                "main",
                1000,
                vec![
                    n("big", 900, vec![n("deep", 800, vec![])]),
                    n("small", 5, vec![]),
                ],
            )]
        };
        let builder = crate::profile::CctBuilder::new(crate::profile::Calibration {
            tsc_hz: 1_000_000_000,
            inner_ns: 0.0,
            outer_ns: 0.0,
            inner_spread_ns: 0.0,
            outer_spread_ns: 0.0,
            ..Default::default()
        })
        .unwrap();
        let names: Vec<crate::profile::FunctionName> = Vec::new();
        let mut profile = builder.snapshot(&Default::default(), &names);
        profile.merged.roots = tree();
        profile.threads = vec![
            ThreadProfile {
                tid: 7,
                name: "worker".into(),
                roots: vec![n("other", 50, vec![])],
                ..Default::default()
            },
            ThreadProfile {
                tid: 8,
                name: "main".into(),
                roots: tree(),
                ..Default::default()
            },
        ];
        profile
    }

    /// Names in preorder.
    fn names(roots: &[Node]) -> Vec<String> {
        let mut out = Vec::new();
        let mut pending: Vec<&Node> = roots.iter().rev().collect();
        while let Some(node) = pending.pop() {
            out.push(node.name.clone());
            pending.extend(node.children.iter().rev());
        }
        out
    }

    #[test]
    fn threshold_depth_and_thread_cut_the_trees() {
        let mut cut = profile();
        let prune = Prune {
            threshold_percent: Some(1.0),
            ..Default::default()
        };
        prune.apply(&mut cut).unwrap();
        assert_eq!(names(&cut.merged.roots), ["main", "big", "deep"]);

        let mut cut = profile();
        let prune = Prune {
            depth: Some(2),
            ..Default::default()
        };
        prune.apply(&mut cut).unwrap();
        assert_eq!(names(&cut.merged.roots), ["main", "big", "small"]);

        let mut cut = profile();
        let prune = Prune {
            thread: Some(7),
            ..Default::default()
        };
        prune.apply(&mut cut).unwrap();
        assert_eq!(names(&cut.merged.roots), ["other"]);
        assert_eq!(cut.threads.len(), 1);

        let error = Prune {
            thread: Some(9),
            ..Default::default()
        }
        .apply(&mut profile())
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "the profile has no thread 9 — its threads are: 7 (worker), 8 (main)"
        );
    }
}
