//! The calling context tree as an arena of nodes addressed by `u32` index.
//!
//! The one idea: a node is found from its parent and a function id, and the same child is
//! asked for again and again (a loop calls the same callee), so each node remembers the
//! child it last returned; only on a miss does it scan its children (a short vector), or
//! ask a hash map once it has more than [`WIDE_NODE_CHILDREN`]. A child is always created
//! after its parent, so increasing index order visits parents before children: every
//! whole-tree pass here is a plain loop, safe for any depth.
//!
//! Totals are corrected per node (see `calibration`), so a node's corrected total can
//! come out below the sum of its children's: where its own time is smaller than the
//! error of the hook cost removed for its calls (a recursion of a few nanoseconds per
//! level). [`CallArena::settle`] makes every tree consistent before it is shown: such a
//! node's total becomes its children's sum — what was measured inside it — and it is
//! marked below resolution instead of showing a self time of 0 as if measured.

use super::calibration::Correction;
use super::model::{Node, Timing};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The index of the invisible node whose children are the roots.
pub const TOP: u32 = 0;

/// Above this many children a node's children are also indexed by a hash map.
pub const WIDE_NODE_CHILDREN: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq)]
struct ChildRef {
    function: u32,
    node: u32,
}

/// No child remembered: `node` is never [`TOP`] for a real child.
const NO_CHILD: ChildRef = ChildRef {
    function: 0,
    node: TOP,
};

#[derive(Debug, Clone)]
pub struct ArenaNode {
    pub function: u32,
    pub parent: u32,
    pub calls: u64,
    /// Corrected ticks of the completed invocations in this context.
    pub total_ticks: f64,
    /// The on-CPU part of `total_ticks`, when the recording measures it.
    pub cpu_ticks: f64,
    last_child: ChildRef,
    children: Vec<ChildRef>,
}

impl ArenaNode {
    fn new(function: u32, parent: u32) -> ArenaNode {
        ArenaNode {
            function,
            parent,
            calls: 0,
            total_ticks: 0.0,
            cpu_ticks: 0.0,
            last_child: NO_CHILD,
            children: Vec::new(),
        }
    }

    /// The children's indices, in the order they were first called.
    pub fn children(&self) -> impl Iterator<Item = u32> + '_ {
        self.children.iter().map(|child| child.node)
    }
}

/// A multiplicative hash for `(parent, function)` keys: two `u32`s need no SipHash.
#[derive(Default)]
struct PairHasher(u64);

impl Hasher for PairHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u32(u32::from(byte));
        }
    }

    fn write_u32(&mut self, value: u32) {
        self.0 = (self.0.rotate_left(26) ^ u64::from(value)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[derive(Debug, Clone)]
pub struct CallArena {
    nodes: Vec<ArenaNode>,
    /// `(parent, function) → child` for the children of wide nodes only.
    wide: HashMap<(u32, u32), u32, BuildHasherDefault<PairHasher>>,
}

impl Default for CallArena {
    fn default() -> CallArena {
        CallArena {
            nodes: vec![ArenaNode::new(u32::MAX, TOP)],
            wide: HashMap::default(),
        }
    }
}

impl CallArena {
    /// Nodes, [`TOP`] included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    #[cfg(test)]
    pub fn node(&self, index: u32) -> &ArenaNode {
        &self.nodes[index as usize]
    }

    pub fn node_mut(&mut self, index: u32) -> &mut ArenaNode {
        &mut self.nodes[index as usize]
    }

    /// All nodes; index 0 is [`TOP`].
    pub fn nodes(&self) -> &[ArenaNode] {
        &self.nodes
    }

    /// The child of `parent` for `function`, created if needed.
    #[inline]
    pub fn child(&mut self, parent: u32, function: u32) -> u32 {
        let last = self.nodes[parent as usize].last_child;
        if last.function == function && last.node != TOP {
            return last.node;
        }
        self.child_on_miss(parent, function)
    }

    #[cold]
    #[inline(never)]
    fn child_on_miss(&mut self, parent: u32, function: u32) -> u32 {
        let siblings = &self.nodes[parent as usize].children;
        let found = if siblings.len() > WIDE_NODE_CHILDREN {
            self.wide.get(&(parent, function)).copied()
        } else {
            siblings
                .iter()
                .find(|child| child.function == function)
                .map(|child| child.node)
        };
        let node = found.unwrap_or_else(|| self.add_child(parent, function));
        self.nodes[parent as usize].last_child = ChildRef { function, node };
        node
    }

    fn add_child(&mut self, parent: u32, function: u32) -> u32 {
        let node = u32::try_from(self.nodes.len()).expect("fewer than 2^32 calling contexts");
        self.nodes.push(ArenaNode::new(function, parent));
        let siblings = &mut self.nodes[parent as usize].children;
        siblings.push(ChildRef { function, node });
        if siblings.len() == WIDE_NODE_CHILDREN + 1 {
            for child in siblings.iter() {
                self.wide.insert((parent, child.function), child.node);
            }
        } else if siblings.len() > WIDE_NODE_CHILDREN + 1 {
            self.wide.insert((parent, function), node);
        }
        node
    }

    /// Node totals (ticks) made consistent, children first: a node whose total is
    /// below its children's sum gets that sum, and is marked in `below` (its self time
    /// is below the measurement's resolution). `raw[i]` is node `i`'s corrected total.
    pub fn settle(&self, raw: &[f64]) -> Settled {
        let mut totals = raw.to_vec();
        let mut below = vec![false; self.nodes.len()];
        let mut children_sum = vec![0.0f64; self.nodes.len()];
        for index in (1..self.nodes.len()).rev() {
            let inside = children_sum[index];
            // Summing in floating point is not exact: a hair's difference is none.
            if totals[index] < inside - inside * 1e-12 {
                below[index] = true;
                totals[index] = inside;
            }
            totals[index] = totals[index].max(inside);
            let parent = self.nodes[index].parent as usize;
            children_sum[parent] += totals[index];
        }
        Settled { totals, below }
    }

    /// Adds `other`'s contexts into this tree by call path: calls are summed, and
    /// `other_totals[i]` (ticks) is added to the total of the node matching `other`'s
    /// node `i`. Returns, for each of `other`'s nodes, the index of its match here.
    pub fn merge(&mut self, other: &CallArena, other_totals: &[f64]) -> Vec<u32> {
        let mut matching: Vec<u32> = Vec::with_capacity(other.len());
        matching.push(TOP);
        for (node, &total) in other.nodes.iter().zip(other_totals).skip(1) {
            let parent = matching[node.parent as usize];
            let mine = self.child(parent, node.function);
            let merged = &mut self.nodes[mine as usize];
            merged.calls += node.calls;
            merged.total_ticks += total;
            matching.push(mine);
        }
        matching
    }

    /// Adds `other_cpu` (on-CPU ticks of another arena's nodes) to the nodes `matching`
    /// says they were merged into (what [`CallArena::merge`] returned).
    pub fn add_cpu(&mut self, matching: &[u32], other_cpu: &[f64]) {
        for (&mine, &cpu) in matching.iter().zip(other_cpu).skip(1) {
            self.nodes[mine as usize].cpu_ticks += cpu;
        }
    }

    /// Which nodes were counted, not timed: those of a function `untimed` says is, except
    /// at the top (a root's context has no caller to hold its time), and every node
    /// below one of them.
    pub fn in_caller(&self, untimed: impl Fn(u32) -> bool) -> Vec<bool> {
        let mut marks = vec![false; self.nodes.len()];
        for index in 1..self.nodes.len() {
            let node = &self.nodes[index];
            marks[index] =
                marks[node.parent as usize] || (node.parent != TOP && untimed(node.function));
        }
        marks
    }

    /// The roots as profile nodes: `totals[i]` (ticks, [settled](CallArena::settle)) is
    /// node `i`'s total time, `self` time is the total minus the children's totals, and
    /// `describe` gives a function's (name, module, entry address). A node marked in
    /// `below` whose self time is under half a nanosecond is below resolution: its total
    /// is exactly its children's. Totals are rounded to whole nanoseconds and never below
    /// the sum of the children's rounded totals.
    #[cfg(test)]
    pub fn to_nodes(
        &self,
        totals: &[f64],
        below: &[bool],
        correction: &Correction,
        describe: impl FnMut(u32) -> (String, String, Option<u64>),
    ) -> Vec<Node> {
        let in_caller = vec![false; self.nodes.len()];
        self.to_nodes_with_cpu(totals, below, &in_caller, None, correction, describe)
    }

    /// [`CallArena::to_nodes`], with each node's on-CPU time from `cpu` (settled totals
    /// in ticks, indexed like `totals`) when given. Nodes marked in `in_caller` were
    /// counted, not timed (their totals are 0 already): they carry
    /// [`Timing::InCaller`], no error and no CPU time.
    pub fn to_nodes_with_cpu(
        &self,
        totals: &[f64],
        below: &[bool],
        in_caller: &[bool],
        cpu: Option<&[f64]>,
        correction: &Correction,
        mut describe: impl FnMut(u32) -> (String, String, Option<u64>),
    ) -> Vec<Node> {
        // Children have higher indices than parents: build from the last node back, so a
        // node's children are complete when the node is built.
        let mut built: Vec<Option<Node>> = Vec::with_capacity(self.nodes.len());
        built.resize_with(self.nodes.len(), || None);
        let take_children = |built: &mut Vec<Option<Node>>, index: usize| -> Vec<Node> {
            self.nodes[index]
                .children()
                .map(|child| {
                    built[child as usize]
                        .take()
                        .expect("built before its parent")
                })
                .collect()
        };
        // Timed and untimed calls at or below each node, for its error estimate.
        let mut subtree_calls = vec![[0u64; 2]; self.nodes.len()];
        for index in (1..self.nodes.len()).rev() {
            let node = &self.nodes[index];
            let children = take_children(&mut built, index);
            let counted_only = in_caller[index];
            subtree_calls[index][usize::from(counted_only)] += node.calls;
            let [timed, untimed] = subtree_calls[index];
            subtree_calls[node.parent as usize][0] += timed;
            subtree_calls[node.parent as usize][1] += untimed;
            let (name, module, address) = describe(node.function);
            if counted_only {
                let mut counted = Node::leaf(&name, &module, node.calls, 0, 0);
                counted.address = address;
                counted.timing = Timing::InCaller;
                // Its CPU time, like its wall time, is its caller's.
                counted.cpu_ns = cpu.map(|_| 0);
                counted.self_cpu_ns = counted.cpu_ns;
                counted.children = children;
                built[index] = Some(counted);
                continue;
            }
            let children_ns: u64 = children.iter().map(|child| child.total_ns).sum();
            let children_ticks: f64 = node.children().map(|c| totals[c as usize]).sum();
            let below_resolution = below[index]
                && correction.ticks_to_ns((totals[index] - children_ticks).max(0.0)) == 0;
            let total_ns = if below_resolution {
                children_ns
            } else {
                correction.ticks_to_ns(totals[index]).max(children_ns)
            };
            let cpu_ns = cpu.map(|cpu| {
                let children_cpu_ns: u64 = children.iter().filter_map(|c| c.cpu_ns).sum();
                correction
                    .ticks_to_ns(cpu[index])
                    .max(children_cpu_ns)
                    .min(total_ns.max(children_cpu_ns))
            });
            let self_cpu_ns =
                cpu_ns.map(|cpu_ns| cpu_ns - children.iter().filter_map(|c| c.cpu_ns).sum::<u64>());
            built[index] = Some(Node {
                name,
                module,
                calls: node.calls,
                total_ns,
                self_ns: total_ns - children_ns,
                below_resolution,
                cpu_ns,
                self_cpu_ns,
                error_ns: correction.error_ns(node.calls, timed - node.calls, untimed),
                address,
                samples: None,
                jit: false,
                tail_call: false,
                timing: Timing::Timed,
                children,
            });
        }
        take_children(&mut built, TOP as usize)
    }
}

/// Consistent totals, and which nodes were raised to their children's sum.
#[derive(Debug, Clone, PartialEq)]
pub struct Settled {
    pub totals: Vec<f64>,
    pub below: Vec<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::model::Calibration;

    fn one_ns_ticks() -> Correction {
        Correction::new(&Calibration {
            tsc_hz: 1_000_000_000,
            inner_ns: 0.0,
            outer_ns: 0.0,
            inner_spread_ns: 0.0,
            outer_spread_ns: 0.0,
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn the_same_child_is_found_again_and_new_ones_are_added() {
        let mut arena = CallArena::default();
        let a = arena.child(TOP, 7);
        assert_eq!(arena.child(TOP, 7), a);
        let b = arena.child(TOP, 8);
        assert_ne!(a, b);
        assert_eq!(arena.child(TOP, 7), a, "after a miss on another child");
        let a_child = arena.child(a, 7);
        assert_eq!(arena.node(a_child).parent, a);
        assert_eq!(arena.len(), 4);
        assert_eq!(arena.node(TOP).children().collect::<Vec<_>>(), [a, b]);
    }

    #[test]
    fn wide_nodes_find_every_child() {
        let mut arena = CallArena::default();
        let first: Vec<u32> = (0..100).map(|f| arena.child(TOP, f)).collect();
        let again: Vec<u32> = (0..100).rev().map(|f| arena.child(TOP, f)).collect();
        assert_eq!(again.into_iter().rev().collect::<Vec<_>>(), first);
        assert_eq!(arena.len(), 101);
        // Function 0 is an ordinary id, not "no child".
        assert_eq!(arena.child(TOP, 0), first[0]);
    }

    #[test]
    fn merge_sums_by_path_and_to_nodes_computes_self_time() {
        let mut one = CallArena::default();
        let root = one.child(TOP, 0);
        let leaf = one.child(root, 1);
        one.node_mut(root).calls = 1;
        one.node_mut(leaf).calls = 2;
        let one_totals = [0.0, 50.0, 20.0];
        let mut two = CallArena::default();
        let root2 = two.child(TOP, 0);
        let other = two.child(root2, 2);
        let leaf2 = two.child(root2, 1);
        for index in [root2, other, leaf2] {
            two.node_mut(index).calls = 1;
        }
        let two_totals = [0.0, 30.0, 5.0, 10.0];

        let mut merged = CallArena::default();
        merged.merge(&one, &one_totals);
        merged.merge(&two, &two_totals);
        let totals: Vec<f64> = merged.nodes().iter().map(|n| n.total_ticks).collect();
        let names = ["root", "leaf", "other"];
        let below = vec![false; totals.len()];
        let roots = merged.to_nodes(&totals, &below, &one_ns_ticks(), |f| {
            (names[f as usize].to_owned(), "m".to_owned(), None)
        });
        let mut expected = Node::leaf("root", "m", 2, 80, 45);
        expected.children.push(Node::leaf("leaf", "m", 3, 30, 30));
        expected.children.push(Node::leaf("other", "m", 1, 5, 5));
        assert_eq!(roots, vec![expected]);
    }

    #[test]
    fn a_100_000_deep_chain_converts_without_recursion() {
        let mut arena = CallArena::default();
        let mut parent = TOP;
        for _ in 0..100_000 {
            parent = arena.child(parent, 3);
        }
        let totals: Vec<f64> = (0..arena.len()).map(|i| (100_001 - i) as f64).collect();
        let below = vec![false; totals.len()];
        let roots = arena.to_nodes(&totals, &below, &one_ns_ticks(), |_| {
            ("f".into(), "m".into(), None)
        });
        assert_eq!(roots.len(), 1);
        assert_eq!((roots[0].total_ns, roots[0].self_ns), (100_000, 1));
    }

    #[test]
    fn a_total_below_its_childrens_becomes_their_sum_and_says_so() {
        // root 100 → mid 40 (its children: 30 + 25 = 55) → leaves; other 10.
        let mut arena = CallArena::default();
        let root = arena.child(TOP, 0);
        let mid = arena.child(root, 1);
        let leaf_a = arena.child(mid, 2);
        let leaf_b = arena.child(mid, 3);
        let other = arena.child(root, 4);
        for index in [root, mid, leaf_a, leaf_b, other] {
            arena.node_mut(index).calls = 1;
        }
        let raw = [0.0, 100.0, 40.0, 30.0, 25.0, 10.0];
        let settled = arena.settle(&raw);
        assert_eq!(settled.totals, [0.0, 100.0, 55.0, 30.0, 25.0, 10.0]);
        assert_eq!(settled.below, [false, false, true, false, false, false]);
        // Raised, mid pushes root below its children too: 55 + 10 > 60.
        let raw = [0.0, 60.0, 40.0, 30.0, 25.0, 10.0];
        let settled = arena.settle(&raw);
        assert_eq!(settled.totals, [0.0, 65.0, 55.0, 30.0, 25.0, 10.0]);
        assert_eq!(settled.below, [false, true, true, false, false, false]);
        let names = ["root", "mid", "a", "b", "other"];
        let roots = arena.to_nodes(&settled.totals, &settled.below, &one_ns_ticks(), |f| {
            (names[f as usize].to_owned(), "m".to_owned(), None)
        });
        let (root, mid) = (&roots[0], &roots[0].children[0]);
        assert_eq!(
            (root.total_ns, root.self_ns, root.below_resolution),
            (65, 0, true)
        );
        assert_eq!(
            (mid.total_ns, mid.self_ns, mid.below_resolution),
            (55, 0, true)
        );
        assert!(!mid.children[0].below_resolution);
    }

    #[test]
    fn rounding_never_puts_the_children_above_their_parent() {
        // Three children of 1.4 ns round down to 1 each; a parent of 3.6 ns rounds up
        // to 4: self 1. With the children at 1.6 (2 each), the parent's 4.9 rounds to 5,
        // still below their 6: its total becomes 6 without a below-resolution mark
        // (its self time in ticks, 0.1, is real).
        let mut arena = CallArena::default();
        let root = arena.child(TOP, 0);
        for function in 1..=3 {
            arena.child(root, function);
        }
        let roots = arena.to_nodes(
            &[0.0, 4.9, 1.6, 1.6, 1.6],
            &[false; 5],
            &one_ns_ticks(),
            |_| ("f".into(), "m".into(), None),
        );
        assert_eq!((roots[0].total_ns, roots[0].self_ns), (6, 0));
        assert!(!roots[0].below_resolution);
    }
}
