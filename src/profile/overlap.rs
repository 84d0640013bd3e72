//! How far two calling context trees agree: the overlap of their call-path weights and
//! the coverage of hot edges (Arnold–Grove, Zhuang et al., used by Gnedt), for
//! `tendril compare` — a sampled tree against an instrumented one, or two of a kind.
//!
//! The one idea: each call path (the function names from a root down to a node) gets a
//! relative weight, its self time over the tree's whole; so the weights of a tree add
//! up to one. *Overlap* is Σ over all paths of min(weight in A, weight in B): 1 for trees that
//! agree exactly, 0 for trees with no common time. *Hot-edge coverage* at threshold T
//! is the share of A's hot call edges (a path whose total time, callees included, is at
//! least T of the tree's) that B has too. With `root`, only the subtrees below the
//! outermost calls of those functions count, each path starting at the root, so a
//! sampled whole-process tree compares with an instrumented tree of one root. A
//! recording compared with samples is read as a sampled stack shows it: a function
//! reached by a tail jump stands in its parent's place, whose frame was gone.

use std::collections::{HashMap, HashSet};

use super::model::{Node, Profile, Timing, Visit, walk};

/// The hotness threshold of [`Agreement::hotcover`].
pub const HOT_THRESHOLD: f64 = 0.1;

/// One call path's relative weights in a tree.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PathWeight {
    /// Self time over the tree's total.
    pub self_share: f64,
    /// Total time (callees included) over the tree's total.
    pub total_share: f64,
}

/// Call path (names joined by `;`) → its weights.
pub type PathWeights = HashMap<String, PathWeight>;

/// The result of comparing two trees.
#[derive(Debug, Clone, PartialEq)]
pub struct Agreement {
    pub overlap: f64,
    pub hotcover: f64,
    /// Hot paths of A, and how many of them B has.
    pub hot_paths: usize,
    pub hot_covered: usize,
    /// Every path of either tree: (path, A's self share, B's self share), the largest
    /// difference first.
    pub differences: Vec<(String, f64, f64)>,
}

/// Puts two profiles on the clock they can be compared on: a profile sampled on the
/// CPU clock counts only time on the CPU, so when the other is a recording with on-CPU
/// times, that one is shown in on-CPU time too (`Profile::show_clock`). Returns whether
/// it was.
pub fn on_common_clock(a: &mut Profile, b: &mut Profile) -> bool {
    let cpu_sampled = is_sampled_on_the_cpu_clock;
    if cpu_sampled(a) && b.has_cpu_time() {
        b.show_clock(super::Clock::Cpu).is_ok()
    } else if cpu_sampled(b) && a.has_cpu_time() {
        a.show_clock(super::Clock::Cpu).is_ok()
    } else {
        false
    }
}

/// Whether `profile` was sampled on the CPU clock (its samples count time on the CPU).
pub fn is_sampled_on_the_cpu_clock(profile: &Profile) -> bool {
    profile.sampling.as_ref().is_some_and(|s| s.clock == "cpu")
}

/// The relative weights of `profile`'s merged tree, or of the subtrees below the
/// outermost calls of any of `roots` (all of the tree when `roots` is empty).
pub fn path_weights(profile: &Profile, roots: &[String]) -> PathWeights {
    weights(profile, roots, false).weights
}

/// [`path_weights`] of a recording as a sampled stack shows it: a function reached by
/// a tail jump (`Node::tail_call`) takes its parent's place in the path, since the
/// parent's frame is gone while it runs (the root a comparison starts at stays).
pub fn path_weights_as_sampled(profile: &Profile, roots: &[String]) -> RecordedWeights {
    weights(profile, roots, true)
}

/// A recording's path weights as a sampled stack shows them.
#[derive(Debug, Clone, Default)]
pub struct RecordedWeights {
    pub weights: PathWeights,
    /// Contexts reached by a tail jump, moved to their caller's place.
    pub moved: usize,
    /// The paths of functions counted but not timed (`Timing::InCaller`): their time
    /// is their timed caller's.
    pub in_caller: HashSet<String>,
}

fn weights(profile: &Profile, roots: &[String], across_tail_calls: bool) -> RecordedWeights {
    let mut in_caller = HashSet::new();
    let mut raw: HashMap<String, (u64, u64)> = HashMap::new();
    let mut path: Vec<&str> = Vec::new();
    // Per node entered inside a root: the parent's name it took the place of.
    let mut replaced: Vec<Option<&str>> = Vec::new();
    let mut moved = 0;
    // Depth of the outermost root the walk is inside, if any.
    let mut inside: Option<usize> = None;
    let _ = walk(&profile.merged.roots, |step| -> Result<(), ()> {
        match step {
            Visit::Enter { node, depth } => {
                if inside.is_none() && (roots.is_empty() || roots.contains(&node.name)) {
                    inside = Some(depth);
                    path.clear();
                    replaced.clear();
                }
                if inside.is_some() {
                    let takes_parents_place = across_tail_calls && node.tail_call && path.len() > 1;
                    replaced.push(takes_parents_place.then(|| path.pop()).flatten());
                    moved += usize::from(takes_parents_place);
                    path.push(&node.name);
                    let joined = path.join(";");
                    if node.timing == Timing::InCaller {
                        in_caller.insert(joined.clone());
                    }
                    let weights = raw.entry(joined).or_default();
                    weights.0 += node.self_ns;
                    weights.1 += node.total_ns;
                }
            }
            Visit::Leave { depth, .. } => {
                if inside.is_some() {
                    path.pop();
                    if let Some(parent) = replaced.pop().flatten() {
                        path.push(parent);
                    }
                }
                if inside == Some(depth) {
                    inside = None;
                }
            }
        }
        Ok(())
    });
    let whole: u64 = raw.values().map(|&(self_ns, _)| self_ns).sum();
    let weights = raw
        .into_iter()
        .map(|(path, (self_ns, total_ns))| {
            let share = |ns: u64| {
                if whole == 0 {
                    0.0
                } else {
                    ns as f64 / whole as f64
                }
            };
            (
                path,
                PathWeight {
                    self_share: share(self_ns),
                    total_share: share(total_ns),
                },
            )
        })
        .collect();
    RecordedWeights {
        weights,
        moved,
        in_caller,
    }
}

/// Sampled path weights as a recording shows them: the time of a path at or below a
/// function the recording counted but did not time (`in_caller`) goes to its timed
/// caller's path, where the recording put it. Also returns how many paths moved.
pub fn at_timed_callers(
    sampled: &PathWeights,
    in_caller: &HashSet<String>,
) -> (PathWeights, usize) {
    let mut folded = PathWeights::new();
    let mut moved = 0;
    for (path, weight) in sampled {
        // The shortest prefix of `path` the recording counted in its caller.
        let untimed = path
            .match_indices(';')
            .map(|(at, _)| &path[..at])
            .chain(std::iter::once(path.as_str()))
            .find(|prefix| in_caller.contains(*prefix));
        let at = match untimed.and_then(|prefix| prefix.rsplit_once(';')) {
            Some((caller, _)) => {
                moved += 1;
                caller
            }
            None => path,
        };
        let entry = folded.entry(at.to_owned()).or_default();
        entry.self_share += weight.self_share;
        if at == path {
            entry.total_share += weight.total_share;
        }
    }
    (folded, moved)
}

/// Compares two trees' path weights (A is the reference for hot edges).
pub fn agreement(a: &PathWeights, b: &PathWeights) -> Agreement {
    let mut overlap = 0.0;
    let mut differences = Vec::with_capacity(a.len().max(b.len()));
    for (path, weight_a) in a {
        let self_b = b.get(path).map_or(0.0, |w| w.self_share);
        overlap += weight_a.self_share.min(self_b);
        differences.push((path.clone(), weight_a.self_share, self_b));
    }
    for (path, weight_b) in b {
        if !a.contains_key(path) {
            differences.push((path.clone(), 0.0, weight_b.self_share));
        }
    }
    differences.sort_by(|x, y| {
        let gap = |d: &(String, f64, f64)| (d.1 - d.2).abs();
        gap(y).total_cmp(&gap(x)).then_with(|| x.0.cmp(&y.0))
    });
    let hot: Vec<&String> = a
        .iter()
        .filter(|(_, w)| w.total_share >= HOT_THRESHOLD)
        .map(|(path, _)| path)
        .collect();
    let covered = hot
        .iter()
        .filter(|path| b.get(**path).is_some_and(|w| w.total_share > 0.0))
        .count();
    Agreement {
        overlap: overlap.min(1.0),
        hotcover: if hot.is_empty() {
            1.0
        } else {
            covered as f64 / hot.len() as f64
        },
        hot_paths: hot.len(),
        hot_covered: covered,
        differences,
    }
}

/// The names of a profile's merged roots (what an instrumented profile was rooted at).
pub fn root_names(profile: &Profile) -> Vec<String> {
    let mut names: Vec<String> = profile
        .merged
        .roots
        .iter()
        .map(|node: &Node| node.name.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::file::tests::small_profile;

    fn tree(leaves: &[(&str, u64)]) -> Profile {
        let mut profile = small_profile();
        let mut root = Node::leaf("main", "app", 0, 0, 0);
        let mut work = Node::leaf("work", "app", 0, 0, 0);
        for &(name, ns) in leaves {
            work.children.push(Node::leaf(name, "app", 0, ns, ns));
            work.total_ns += ns;
        }
        root.total_ns = work.total_ns;
        root.children.push(work);
        profile.merged.roots = vec![root];
        profile
    }

    #[test]
    fn identical_trees_overlap_fully_and_disjoint_ones_not_at_all() {
        let a = path_weights(&tree(&[("x", 25), ("y", 50), ("z", 25)]), &[]);
        let same = agreement(&a, &a);
        assert!((same.overlap - 1.0).abs() < 1e-9);
        assert_eq!(same.hotcover, 1.0);
        let b = path_weights(&tree(&[("q", 100)]), &[]);
        let apart = agreement(&a, &b);
        assert!(apart.overlap.abs() < 1e-9);
        // main and main;work are hot in A and present in B; x, y and z are not.
        assert_eq!((apart.hot_paths, apart.hot_covered), (5, 2));
    }

    #[test]
    fn a_shifted_split_overlaps_by_the_common_part_and_root_cuts_the_tree() {
        let a = path_weights(&tree(&[("x", 25), ("y", 50), ("z", 25)]), &[]);
        let b = path_weights(&tree(&[("x", 30), ("y", 40), ("z", 30)]), &[]);
        let result = agreement(&a, &b);
        assert!((result.overlap - 0.9).abs() < 1e-9, "{}", result.overlap);
        assert_eq!(result.differences[0].0, "main;work;y");
        let below = path_weights(&tree(&[("x", 1)]), &["work".to_string()]);
        assert!(below.contains_key("work;x"));
        assert!(!below.contains_key("main"));
    }

    #[test]
    fn a_tail_called_function_takes_its_parents_place_as_a_sampled_stack_shows_it() {
        // main → work → x, where work reaches x by a tail jump: a sampled stack in x
        // is main;x.
        let mut recorded = tree(&[("x", 60), ("y", 40)]);
        recorded.merged.roots[0].children[0].children[0].tail_call = true;
        let RecordedWeights { weights, moved, .. } = path_weights_as_sampled(&recorded, &[]);
        assert_eq!(moved, 1);
        assert!(weights.contains_key("main;x"), "{weights:?}");
        assert!(weights.contains_key("main;work;y"), "{weights:?}");
        assert!(!weights.contains_key("main;work;x"));
        let sampled = tree(&[("y", 40)]);
        let mut sampled_x = Node::leaf("x", "app", 0, 60, 60);
        sampled_x.samples = Some(6);
        let mut sampled = sampled;
        sampled.merged.roots[0].children.push(sampled_x);
        sampled.merged.roots[0].total_ns += 60;
        let result = agreement(&weights, &path_weights(&sampled, &[]));
        assert!((result.overlap - 1.0).abs() < 1e-9, "{}", result.overlap);
        // As recorded, the paths stay; below a root, the root is never replaced.
        assert!(path_weights(&recorded, &[]).contains_key("main;work;x"));
        let below_work = path_weights_as_sampled(&recorded, &["work".to_string()]).weights;
        assert!(below_work.contains_key("work;x"), "{below_work:?}");
    }

    #[test]
    fn sampled_time_below_a_function_counted_in_its_caller_goes_to_that_caller() {
        // Recorded: main → work (timed) → x (counted in its caller) → z; y timed.
        let mut recorded = tree(&[("x", 0), ("y", 40)]);
        let x = &mut recorded.merged.roots[0].children[0].children[0];
        x.timing = Timing::InCaller;
        x.children.push(Node::leaf("z", "app", 0, 0, 0));
        let in_caller = path_weights_as_sampled(&recorded, &[]).in_caller;
        assert_eq!(in_caller.len(), 1, "{in_caller:?}");
        let sampled = path_weights(&tree(&[("x", 30), ("y", 40)]), &[]);
        let mut sampled = sampled;
        sampled.insert(
            "main;work;x;z".into(),
            PathWeight {
                self_share: 0.3,
                total_share: 0.3,
            },
        );
        let (folded, moved) = at_timed_callers(&sampled, &in_caller);
        assert_eq!(moved, 2);
        assert!(!folded.contains_key("main;work;x") && !folded.contains_key("main;work;x;z"));
        let work = folded["main;work"];
        assert!(
            (work.self_share - (30.0 / 70.0 + 0.3)).abs() < 1e-9,
            "{work:?}"
        );
        assert!(folded.contains_key("main;work;y"));
    }

    #[test]
    fn a_cpu_sampled_profile_is_compared_with_the_others_on_cpu_times() {
        // The recording: x waits most of its wall time (90 wall, 10 on the CPU).
        let mut recorded = tree(&[("x", 90), ("y", 10)]);
        let mut pending: Vec<&mut Node> = recorded.merged.roots.iter_mut().collect();
        while let Some(node) = pending.pop() {
            let (cpu, self_cpu) = match node.name.as_str() {
                "x" => (10, 10),
                "y" => (10, 10),
                _ => (20, 0),
            };
            node.cpu_ns = Some(cpu);
            node.self_cpu_ns = Some(self_cpu);
            pending.extend(node.children.iter_mut());
        }
        let mut sampled = tree(&[("x", 50), ("y", 50)]);
        sampled.sampling = Some(crate::profile::model::SamplingInfo {
            clock: "cpu".into(),
            ..Default::default()
        });
        let before = agreement(&path_weights(&sampled, &[]), &path_weights(&recorded, &[]));
        assert!(on_common_clock(&mut sampled, &mut recorded));
        let after = agreement(&path_weights(&sampled, &[]), &path_weights(&recorded, &[]));
        assert!(before.overlap < 0.7, "{}", before.overlap);
        assert!((after.overlap - 1.0).abs() < 1e-9, "{}", after.overlap);
        // Two recordings stay on wall-clock time.
        let mut other = recorded.clone();
        assert!(!on_common_clock(&mut other, &mut tree(&[("x", 1)])));
    }
}
