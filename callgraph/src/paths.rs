//! Ball–Larus path numbering over a function's control-flow graph.
//!
//! The one idea (Ball & Larus, *Efficient Path Profiling*, 1996): take the back edges
//! out of the graph and it is acyclic; give each edge a value so that the sums of the
//! values along the paths from entry to exit are exactly 0, 1, …, N − 1. Then one
//! register, set to 0 at the entry and increased on the edges whose value is not zero,
//! holds the number of the path taken, and one counter per path number counts it.
//!
//! Loops: a back edge `v → w` is replaced by two edges, `v → EXIT` (the path ends at the
//! back edge) and `ENTRY → w` (a new path starts at the loop's head). When the back edge
//! runs, the path so far is counted with `v → EXIT`'s value added, and the register is
//! set to `ENTRY → w`'s value. Returns, tail calls and any other way out of the function
//! are edges to EXIT.
//!
//! Landing pads: a block only the unwinder enters (a C++ catch block or cleanup) gets an
//! edge `ENTRY → pad` too, so a path starts there; the code at the pad sets the
//! register to that edge's value. The path the exception cut short is not counted.
//!
//! Blocks are the graph's blocks; ENTRY and EXIT are virtual nodes. The graph comes as
//! successor lists (block 0 is the entry), so the agent, numbering the function it
//! copies, and the controller, decoding the counted numbers from the copy's layout
//! (`tendril_wire::edges::EdgeLayout::path_successors`), run this same code on the same
//! lists.

use std::fmt;

/// One edge of the function's graph and what the instrumentation does on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathEdge {
    /// The block the edge leaves.
    pub from: usize,
    /// The block it enters; `None` for an edge out of the function (return, tail call).
    pub to: Option<usize>,
    /// What to do on the edge.
    pub action: EdgeAction,
}

/// The path register's update on one edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeAction {
    /// `r += increment` (nothing when it is 0), and go on.
    Add { increment: u64 },
    /// Leaves the function: count path `r + increment`.
    Exit { increment: u64 },
    /// A back edge: count path `r + end`, then `r = restart`.
    Back { end: u64, restart: u64 },
}

/// A function's path numbering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathNumbering {
    /// Number of distinct acyclic paths: path numbers are `0..paths`.
    pub paths: u64,
    /// Every edge of the graph, in block order, then successor order.
    pub edges: Vec<PathEdge>,
    /// The acyclic graph's edges out of each node, with their values, by increasing
    /// value: nodes `0..blocks` are the blocks, then ENTRY, then EXIT.
    dag: Vec<Vec<(usize, u64)>>,
    /// Block → index of its first edge in `edges`.
    first_edge: Vec<usize>,
    /// ENTRY's edges after the one to block 0: to the loop heads, then to the landing
    /// pads that are not loop heads: how many go to loop heads.
    heads: usize,
    /// Each landing pad's block and the value a path starting there begins with.
    pub landing_pads: Vec<(usize, u64)>,
}

/// A path, decoded from its number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path {
    /// Whether it starts at a loop's head after a back edge, rather than at the entry.
    pub from_back_edge: bool,
    /// Whether it starts at a landing pad, where an exception landed.
    pub from_landing_pad: bool,
    /// The blocks it runs through, in order.
    pub blocks: Vec<usize>,
    /// The edges it takes (indices into [`PathNumbering::edges`]), in order; the last
    /// one leaves the function or is a back edge.
    pub edges: Vec<usize>,
    /// Whether it ends by taking a back edge, rather than by leaving the function.
    pub to_back_edge: bool,
}

/// The graph has more acyclic paths than a 64-bit number can count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooManyPaths;

impl fmt::Display for TooManyPaths {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "more than 2^64 acyclic paths")
    }
}

impl PathNumbering {
    /// Numbers the paths of the graph whose block `b` has the edges `successors[b]`, in
    /// order: `Some(block)` inside the function, `None` out of it. A block with no edge
    /// (a return, a jump through a pointer) has one, out of the function.
    pub fn new(successors: &[Vec<Option<usize>>]) -> Result<PathNumbering, TooManyPaths> {
        Self::with_landing_pads(successors, &[])
    }

    /// [`PathNumbering::new`] for a graph whose blocks `pads` are entered by the
    /// unwinder (landing pads): a path starts at each.
    pub fn with_landing_pads(
        successors: &[Vec<Option<usize>>],
        pads: &[usize],
    ) -> Result<PathNumbering, TooManyPaths> {
        let blocks = successors.len();
        if blocks == 0 {
            return Ok(PathNumbering::without_code());
        }
        let pads: Vec<usize> = pads.iter().copied().filter(|&pad| pad < blocks).collect();
        let entry = blocks;
        let successors = with_exits(successors);
        let back = back_edges(&successors, &pads);
        let acyclic = AcyclicGraph::new(&successors, &back, &pads);
        let (count, values) = path_counts(&acyclic.edges, entry)?;
        let edges = edge_actions(&successors, &back, &acyclic.heads, &values);
        let dag: Vec<Vec<(usize, u64)>> = acyclic
            .edges
            .into_iter()
            .zip(values)
            .map(|(targets, values)| targets.into_iter().zip(values).collect())
            .collect();
        let first_edge = first_edges(&edges, blocks);
        let landing_pads = landing_pad_values(&dag[entry], &pads);
        Ok(PathNumbering {
            paths: count[entry],
            edges,
            dag,
            first_edge,
            heads: acyclic.heads.len(),
            landing_pads,
        })
    }

    /// The numbering of a function with no code: no path (and nothing for the walks of
    /// [`PathNumbering::with_landing_pads`] to start from).
    fn without_code() -> PathNumbering {
        PathNumbering {
            paths: 0,
            edges: Vec::new(),
            dag: vec![Vec::new(), Vec::new()],
            first_edge: Vec::new(),
            heads: 0,
            landing_pads: Vec::new(),
        }
    }

    /// The blocks path `number` runs through; `None` if there is no such path.
    pub fn path(&self, number: u64) -> Option<Path> {
        if number >= self.paths {
            return None;
        }
        let blocks = self.dag.len() - 2;
        let (entry, exit) = (blocks, blocks + 1);
        let mut remaining = number;
        let mut node = entry;
        let mut path = Path {
            from_back_edge: false,
            from_landing_pad: false,
            blocks: Vec::new(),
            edges: Vec::new(),
            to_back_edge: false,
        };
        let mut first = true;
        while node != exit {
            // The edge with the largest value not above what remains.
            let at = self.dag[node].partition_point(|&(_, value)| value <= remaining) - 1;
            let (to, value) = self.dag[node][at];
            if first {
                path.from_back_edge = at > 0 && at <= self.heads;
                path.from_landing_pad = at > self.heads;
                first = false;
            }
            remaining -= value;
            if node != entry {
                // A block's acyclic edges are its real edges, in the same order.
                let edge = self.first_edge[node] + at;
                path.edges.push(edge);
                path.to_back_edge = matches!(self.edges[edge].action, EdgeAction::Back { .. });
            }
            if to != exit {
                path.blocks.push(to);
            }
            node = to;
        }
        Some(path)
    }
}

/// The successor lists with every block that has no edge (a return, a jump through a
/// pointer) given one, out of the function.
fn with_exits(successors: &[Vec<Option<usize>>]) -> Vec<Vec<Option<usize>>> {
    successors
        .iter()
        .map(|edges| {
            if edges.is_empty() {
                vec![None]
            } else {
                edges.clone()
            }
        })
        .collect()
}

/// The acyclic graph the paths are numbered on: forward edges, block → EXIT for each
/// exit and back edge, ENTRY → block 0, ENTRY → each loop head (once, however many back
/// edges lead to it), then ENTRY → each landing pad that is neither block 0 nor a loop
/// head. Nodes `0..blocks` are the blocks, then ENTRY, then EXIT.
struct AcyclicGraph {
    /// Each node's edges out, by the node they enter, in the order they are numbered.
    edges: Vec<Vec<usize>>,
    /// The loop heads, in the order of ENTRY's edges to them (after the one to block 0).
    heads: Vec<usize>,
}

impl AcyclicGraph {
    fn new(successors: &[Vec<Option<usize>>], back: &[Vec<bool>], pads: &[usize]) -> Self {
        let blocks = successors.len();
        let (entry, exit) = (blocks, blocks + 1);
        let mut edges: Vec<Vec<usize>> = vec![Vec::new(); blocks + 2];
        let mut heads = Vec::new();
        for (from, targets) in successors.iter().enumerate() {
            for (position, target) in targets.iter().enumerate() {
                let to = match target {
                    Some(to) if back[from][position] => {
                        if !heads.contains(to) {
                            heads.push(*to);
                        }
                        exit
                    }
                    Some(to) => *to,
                    None => exit,
                };
                edges[from].push(to);
            }
        }
        edges[entry].push(0);
        edges[entry].extend(&heads);
        let mut pad_edges: Vec<usize> = Vec::new();
        for &pad in pads {
            if pad != 0 && !heads.contains(&pad) && !pad_edges.contains(&pad) {
                pad_edges.push(pad);
            }
        }
        edges[entry].extend(&pad_edges);
        AcyclicGraph { edges, heads }
    }
}

/// The number of paths from each node of the acyclic graph `edges` (EXIT last) to EXIT,
/// and each edge's value: the paths counted by the node's edges before it. Computed in
/// reverse topological order from `entry`.
fn path_counts(
    edges: &[Vec<usize>],
    entry: usize,
) -> Result<(Vec<u64>, Vec<Vec<u64>>), TooManyPaths> {
    let exit = edges.len() - 1;
    let mut count = vec![0u64; edges.len()];
    count[exit] = 1;
    let mut values: Vec<Vec<u64>> = vec![Vec::new(); edges.len()];
    for node in topological_order(edges, entry).into_iter().rev() {
        if node == exit {
            continue;
        }
        let mut total = 0u64;
        for &to in &edges[node] {
            values[node].push(total);
            total = total.checked_add(count[to]).ok_or(TooManyPaths)?;
        }
        count[node] = total;
    }
    Ok((count, values))
}

/// The instrumentation per real edge, in block order, then successor order, from the
/// acyclic graph's edge `values`. ENTRY's values (node `successors.len()`): block 0
/// first (0), then one per loop head, in `heads` order.
fn edge_actions(
    successors: &[Vec<Option<usize>>],
    back: &[Vec<bool>],
    heads: &[usize],
    values: &[Vec<u64>],
) -> Vec<PathEdge> {
    let entry = successors.len();
    let mut edges = Vec::new();
    for (from, targets) in successors.iter().enumerate() {
        for (position, &to) in targets.iter().enumerate() {
            // A block no path reaches (never, in a graph built from its entry)
            // keeps 0 on its edges: they never run.
            let value = values[from].get(position).copied().unwrap_or(0);
            let action = if back[from][position] {
                let head = heads.iter().position(|&head| Some(head) == to);
                let restart = values[entry][1 + head.expect("a back edge's head is listed")];
                EdgeAction::Back {
                    end: value,
                    restart,
                }
            } else if to.is_none() {
                EdgeAction::Exit { increment: value }
            } else {
                EdgeAction::Add { increment: value }
            };
            edges.push(PathEdge { from, to, action });
        }
    }
    edges
}

/// Block → index of its first edge in `edges` (which are in block order).
fn first_edges(edges: &[PathEdge], blocks: usize) -> Vec<usize> {
    let mut first_edge = vec![0; blocks];
    for (index, edge) in edges.iter().enumerate().rev() {
        first_edge[edge.from] = index;
    }
    first_edge
}

/// Each landing pad's block and the value of ENTRY's edge to it (`entry_edges`, with
/// their values): the pad's own edge, or the loop head's it is.
fn landing_pad_values(entry_edges: &[(usize, u64)], pads: &[usize]) -> Vec<(usize, u64)> {
    pads.iter()
        .map(|&pad| {
            let at = entry_edges
                .iter()
                .position(|&(to, _)| to == pad)
                .expect("every landing pad has an edge from ENTRY");
            (pad, entry_edges[at].1)
        })
        .collect()
}

/// Which edges (by block, then position) are back edges of a depth-first search from
/// block 0, then from each of `pads` not reached yet: edges to a block still on the
/// search's stack.
fn back_edges(successors: &[Vec<Option<usize>>], pads: &[usize]) -> Vec<Vec<bool>> {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        New,
        OnStack,
        Done,
    }
    let mut back: Vec<Vec<bool>> = successors.iter().map(|s| vec![false; s.len()]).collect();
    let mut state = vec![State::New; successors.len()];
    for &root in std::iter::once(&0).chain(pads) {
        if state[root] != State::New {
            continue;
        }
        // (block, next successor position to look at)
        let mut stack = vec![(root, 0usize)];
        state[root] = State::OnStack;
        while let Some(&mut (block, ref mut position)) = stack.last_mut() {
            match successors[block].get(*position) {
                Some(&target) => {
                    let at = *position;
                    *position += 1;
                    if let Some(target) = target {
                        match state[target] {
                            State::New => {
                                state[target] = State::OnStack;
                                stack.push((target, 0));
                            }
                            State::OnStack => back[block][at] = true,
                            State::Done => {}
                        }
                    }
                }
                None => {
                    state[block] = State::Done;
                    stack.pop();
                }
            }
        }
    }
    back
}

/// The nodes reachable from `entry` in topological order (Kahn's algorithm, over the
/// edges of reachable nodes only: a block no path reaches holds nothing up).
fn topological_order(edges: &[Vec<usize>], entry: usize) -> Vec<usize> {
    let mut reachable = vec![false; edges.len()];
    let mut pending = vec![entry];
    while let Some(node) = pending.pop() {
        if !std::mem::replace(&mut reachable[node], true) {
            pending.extend(&edges[node]);
        }
    }
    let mut incoming = vec![0usize; edges.len()];
    for (from, targets) in edges.iter().enumerate() {
        for &to in targets.iter().filter(|_| reachable[from]) {
            incoming[to] += 1;
        }
    }
    let mut ready = vec![entry];
    let mut order = Vec::with_capacity(edges.len());
    while let Some(node) = ready.pop() {
        order.push(node);
        for &to in &edges[node] {
            incoming[to] -= 1;
            if incoming[to] == 0 {
                ready.push(to);
            }
        }
    }
    order
}

#[cfg(test)]
mod tests;
