//! Flame graphs and the other stack exports (folded stacks, SVG, speedscope, pprof,
//! `diff`) of a tree deeper than they can draw: cut at [`MAX_STACK_DEPTH`] levels.
//!
//! The one idea: an export writes one stack per calling context, and a stack repeats
//! every frame above it, so a recursion 100,000 deep makes 100,000 stacks of up to
//! 100,000 frames — gigabytes (inferno's SVG took 6.7 GB). So the exports draw a copy
//! of the tree whose every subtree below level [`MAX_STACK_DEPTH`] − 1 is one frame,
//! `[N levels cut]` (N: how deep that subtree went), which carries the subtree's time:
//! its self time is the sum of the self times below, so the graph's widths and totals
//! stay what they were. A deep chain then costs about `MAX_STACK_DEPTH²/2` frames, not
//! depth². Trees within the bound are not copied. No recursion: the tree may be as deep
//! as the program's.

use super::model::{Node, Profile, Visit, walk};
use std::borrow::Cow;

/// Most levels a stack export draws; the last is the `[N levels cut]` frame when the
/// tree goes deeper.
pub const MAX_STACK_DEPTH: usize = 1024;

/// The level (0 for a root) whose nodes keep no children of their own when the tree
/// goes deeper than [`MAX_STACK_DEPTH`]: their subtree below becomes one frame.
const LAST_KEPT: usize = MAX_STACK_DEPTH - 2;

/// Whether `node`, at level [`LAST_KEPT`], has more below it than one level: what the
/// cut replaces.
fn too_deep_below(node: &Node) -> bool {
    node.children.iter().any(|child| !child.children.is_empty())
}

/// How many subtrees of `roots` [`cut_deep_stacks`] replaces by one frame.
pub fn subtrees_cut(roots: &[Node]) -> u64 {
    let mut cut = 0;
    let _ = walk(roots, |step| -> Result<(), ()> {
        if let Visit::Enter { node, depth } = step
            && depth == LAST_KEPT
            && too_deep_below(node)
        {
            cut += 1;
        }
        Ok(())
    });
    cut
}

/// `profile`, or a copy of it whose merged and thread trees are cut at
/// [`MAX_STACK_DEPTH`] levels (see the module's comment).
pub fn cut_deep_stacks(profile: &Profile) -> Cow<'_, Profile> {
    let deep = |roots: &[Node]| subtrees_cut(roots) > 0;
    if !deep(&profile.merged.roots) && !profile.threads.iter().any(|t| deep(&t.roots)) {
        return Cow::Borrowed(profile);
    }
    let mut cut = profile.clone();
    cut_roots(&mut cut.merged.roots);
    for thread in &mut cut.threads {
        cut_roots(&mut thread.roots);
    }
    Cow::Owned(cut)
}

/// `roots` cut as [`cut_deep_stacks`] cuts a profile's trees.
pub fn cut_roots(roots: &mut [Node]) {
    let mut pending: Vec<(&mut Node, usize)> = roots.iter_mut().map(|n| (n, 0)).collect();
    while let Some((node, depth)) = pending.pop() {
        if depth == LAST_KEPT {
            if too_deep_below(node) {
                let below = std::mem::take(&mut node.children);
                node.children.push(levels_cut(&below));
            }
            continue;
        }
        pending.extend(node.children.iter_mut().map(|child| (child, depth + 1)));
    }
}

/// The one frame that stands for the subtrees `below`: their calls, their time, and as
/// self time every self time in them.
fn levels_cut(below: &[Node]) -> Node {
    let mut levels = 0;
    let mut self_ns = 0u64;
    let mut self_cpu_ns: Option<u64> = None;
    let _ = walk(below, |step| -> Result<(), ()> {
        if let Visit::Enter { node, depth } = step {
            levels = levels.max(depth + 1);
            self_ns += node.self_ns;
            if let Some(cpu) = node.self_cpu_ns {
                *self_cpu_ns.get_or_insert(0) += cpu;
            }
        }
        Ok(())
    });
    let sum = |value: fn(&Node) -> Option<u64>| -> Option<u64> {
        below
            .iter()
            .map(value)
            .try_fold(0u64, |sum, v| Some(sum + v?))
    };
    let mut cut = Node::leaf(
        &format!("[{levels} levels cut]"),
        "",
        below.iter().map(|n| n.calls).sum(),
        below.iter().map(|n| n.total_ns).sum(),
        self_ns,
    );
    cut.cpu_ns = sum(|n| n.cpu_ns);
    cut.self_cpu_ns = self_cpu_ns.filter(|_| cut.cpu_ns.is_some());
    cut.samples = sum(|n| n.samples);
    cut
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::export::self_sum_ns;
    use crate::profile::model::tests::chain;

    fn depth(roots: &[Node]) -> usize {
        let mut deepest = 0;
        let _ = walk(roots, |step| -> Result<(), ()> {
            if let Visit::Enter { depth, .. } = step {
                deepest = deepest.max(depth + 1);
            }
            Ok(())
        });
        deepest
    }

    #[test]
    fn a_deep_chain_keeps_its_first_levels_and_one_frame_for_the_rest() {
        let mut roots = vec![chain("f", 100_000)];
        let before = self_sum_ns(&roots);
        assert_eq!(subtrees_cut(&roots), 1);
        cut_roots(&mut roots);
        assert_eq!(depth(&roots), MAX_STACK_DEPTH);
        assert_eq!(self_sum_ns(&roots), before, "the time is all there");
        let mut node = &roots[0];
        while let Some(child) = node.children.first() {
            node = child;
        }
        let cut = 100_000 - (MAX_STACK_DEPTH - 1);
        assert_eq!(node.name, format!("[{cut} levels cut]"));
        assert_eq!(node.self_ns, cut as u64);
        assert_eq!(subtrees_cut(&roots), 0);
    }

    #[test]
    fn a_tree_within_the_bound_is_not_copied() {
        let mut profile = crate::profile::file::tests::small_profile();
        assert!(matches!(cut_deep_stacks(&profile), Cow::Borrowed(_)));
        profile.threads[1].roots = vec![chain("g", MAX_STACK_DEPTH)];
        assert!(matches!(cut_deep_stacks(&profile), Cow::Borrowed(_)));
        profile.threads[1].roots = vec![chain("g", MAX_STACK_DEPTH + 1)];
        let cut = cut_deep_stacks(&profile);
        assert_eq!(depth(&cut.threads[1].roots), MAX_STACK_DEPTH);
        assert_eq!(cut.merged, profile.merged);
    }
}
