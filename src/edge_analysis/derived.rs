//! `tendril edges`' numbers, derived from the copy's layout and its counters' counts:
//! per block, per conditional branch, per jump-table entry, per loop.
//!
//! The one idea: the agent counts as little as it can — each block's starts, each
//! branch's taken edge, each table entry — and everything else follows exactly. A
//! branch's not-taken count is its block's count minus the taken count; an edge's count
//! is its source block's (a fall-through or a jump), the taken or not-taken count, or the
//! table entry's. Loops come from the graph: a depth-first walk from the entry finds the
//! back edges (edges to a block still on the walk's stack); a block they lead to is a
//! loop head, entered `count − back edges` times, and runs `count / entries` times per
//! entry. Paths come from their own counters (`path_counts`).

use super::path_counts::PathCounts;
use serde::Serialize;
use std::collections::HashMap;
use std::time::Duration;
use tendril_wire::edges::{EdgeExit, EdgeLayout};

/// Counts of one function's copy, all derived from its layout and counters.
#[derive(Debug, Clone, PartialEq)]
pub struct EdgeProfile {
    /// The function's entry.
    pub address: u64,
    /// Calls that entered the copy.
    pub calls: u64,
    /// In address order, as in the layout.
    pub blocks: Vec<BlockCount>,
    pub branches: Vec<BranchCount>,
    pub tables: Vec<TableCount>,
    /// By head address.
    pub loops: Vec<LoopCount>,
    /// The paths, or why they were not counted.
    pub paths: Result<PathCounts, String>,
    /// The blocks only the unwinder reaches (exception handlers and cleanups).
    pub landing_pads: Vec<u64>,
}

/// How often a block started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCount {
    pub start: u64,
    pub end: u64,
    pub count: u64,
}

/// A conditional branch's two edges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BranchCount {
    /// The branch instruction.
    pub at: u64,
    pub taken_to: u64,
    pub not_taken_to: u64,
    pub taken: u64,
    pub not_taken: u64,
}

/// A jump through a table: each entry's count, in entry order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCount {
    /// The jump instruction.
    pub at: u64,
    /// (target, count) per entry.
    pub entries: Vec<(u64, u64)>,
}

/// A block that back edges lead to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopCount {
    pub head: u64,
    /// How often the head block started.
    pub count: u64,
    /// How often a back edge led to it.
    pub back_edges: u64,
    /// How often it was entered otherwise: `count − back_edges`.
    pub entries: u64,
}

impl LoopCount {
    /// Head runs per entry (`count / entries`), when it was entered.
    pub fn iterations_per_entry(&self) -> Option<f64> {
        (self.entries > 0).then(|| self.count as f64 / self.entries as f64)
    }
}

impl EdgeProfile {
    /// The profile of `layout`, with `count(id)` the count of counter `id` (summed over
    /// the threads).
    pub fn derive(layout: &EdgeLayout, count: impl Fn(u32) -> u64) -> EdgeProfile {
        let blocks: Vec<BlockCount> = layout
            .blocks
            .iter()
            .map(|block| BlockCount {
                start: block.start,
                end: block.end,
                count: count(block.counter),
            })
            .collect();
        let mut branches = Vec::new();
        let mut tables = Vec::new();
        // Each block's outgoing edges: (target address, count).
        let mut edges: Vec<Vec<(u64, u64)>> = Vec::with_capacity(blocks.len());
        for (block, counted) in layout.blocks.iter().zip(&blocks) {
            edges.push(match &block.exit {
                EdgeExit::FallThrough { to } | EdgeExit::Jump { to } => vec![(*to, counted.count)],
                EdgeExit::Conditional {
                    branch,
                    taken,
                    not_taken,
                    taken_counter,
                } => {
                    let taken_count = count(*taken_counter);
                    // A thread still in the copy after the restore may have counted a
                    // branch after the counters were read: never below zero.
                    let not_taken_count = counted.count.saturating_sub(taken_count);
                    branches.push(BranchCount {
                        at: *branch,
                        taken_to: *taken,
                        not_taken_to: *not_taken,
                        taken: taken_count,
                        not_taken: not_taken_count,
                    });
                    vec![(*taken, taken_count), (*not_taken, not_taken_count)]
                }
                EdgeExit::Table { jump, entries } => {
                    let entries: Vec<(u64, u64)> = entries
                        .iter()
                        .map(|entry| (entry.target, count(entry.counter)))
                        .collect();
                    tables.push(TableCount {
                        at: *jump,
                        entries: entries.clone(),
                    });
                    entries
                }
                EdgeExit::ThroughPointer { .. } | EdgeExit::Return | EdgeExit::Stops => Vec::new(),
            });
        }
        let loops = loops(&blocks, &edges);
        EdgeProfile {
            address: layout.address,
            calls: count(layout.calls_counter),
            blocks,
            branches,
            tables,
            loops,
            paths: PathCounts::derive(layout, &count),
            landing_pads: layout.landing_pads.clone(),
        }
    }

    /// The largest block count (0 for a function never run).
    pub fn hottest(&self) -> u64 {
        self.blocks.iter().map(|b| b.count).max().unwrap_or(0)
    }

    /// The profile as `--json` prints it; offsets are from the function's start (a
    /// target outside the function, such as a `.cold` part, may have a negative one).
    pub fn to_json<'a>(&self, about: &'a About) -> JsonReport<'a> {
        let offset = |address: u64| address.wrapping_sub(self.address) as i64;
        JsonReport {
            function: &about.function,
            module: &about.module,
            pid: about.pid,
            address: self.address,
            size: about.size,
            calls: self.calls,
            duration_s: about.elapsed.as_secs_f64(),
            threads: about.threads,
            blocks: self
                .blocks
                .iter()
                .map(|b| JsonBlock {
                    offset: offset(b.start),
                    end_offset: offset(b.end),
                    count: b.count,
                })
                .collect(),
            branches: self
                .branches
                .iter()
                .map(|b| JsonBranch {
                    offset: offset(b.at),
                    taken: b.taken,
                    not_taken: b.not_taken,
                    taken_offset: offset(b.taken_to),
                    not_taken_offset: offset(b.not_taken_to),
                })
                .collect(),
            tables: self
                .tables
                .iter()
                .map(|t| JsonTable {
                    offset: offset(t.at),
                    entries: t
                        .entries
                        .iter()
                        .enumerate()
                        .map(|(index, &(target, count))| JsonTableEntry {
                            index,
                            target_offset: offset(target),
                            count,
                        })
                        .collect(),
                })
                .collect(),
            loops: self
                .loops
                .iter()
                .map(|l| JsonLoop {
                    offset: offset(l.head),
                    count: l.count,
                    back_edges: l.back_edges,
                    entries: l.entries,
                    iterations: l.iterations_per_entry(),
                })
                .collect(),
            paths: self.paths.as_ref().ok().map(|paths| {
                paths
                    .counted
                    .iter()
                    .map(|path| JsonPath {
                        count: path.count,
                        share: path.count as f64 / paths.total.max(1) as f64,
                        blocks: path.blocks.iter().map(|&b| offset(b)).collect(),
                        from_back_edge: path.from_back_edge,
                        from_landing_pad: path.from_landing_pad,
                        to_back_edge: path.to_back_edge,
                        number: path.number,
                    })
                    .collect()
            }),
            path_totals: self.paths.as_ref().ok().map(|paths| JsonPathTotals {
                paths: paths.paths,
                runs: paths.total,
                itemized: paths.itemized,
                beyond: paths.beyond,
                lost: paths.lost,
            }),
            paths_note: self.paths.as_ref().err().cloned(),
            landing_pads: (self.landing_pads.iter())
                .map(|&pad| JsonLandingPad {
                    offset: offset(pad),
                    count: (self.blocks.iter())
                        .find(|block| block.start == pad)
                        .map_or(0, |block| block.count),
                })
                .collect(),
        }
    }
}

/// `--json`'s shape, in the order its fields print.
#[derive(Serialize)]
pub struct JsonReport<'a> {
    function: &'a str,
    module: &'a str,
    pid: i32,
    address: u64,
    size: u64,
    calls: u64,
    duration_s: f64,
    threads: usize,
    blocks: Vec<JsonBlock>,
    branches: Vec<JsonBranch>,
    tables: Vec<JsonTable>,
    loops: Vec<JsonLoop>,
    /// Every path that ran, most frequent first; null when paths were not counted.
    paths: Option<Vec<JsonPath>>,
    path_totals: Option<JsonPathTotals>,
    /// Why paths were not counted; null when they were.
    paths_note: Option<String>,
    /// The blocks exceptions land in, and how often they did.
    landing_pads: Vec<JsonLandingPad>,
}

#[derive(Serialize)]
struct JsonLandingPad {
    offset: i64,
    count: u64,
}

#[derive(Serialize)]
struct JsonPath {
    count: u64,
    /// Of every path run.
    share: f64,
    /// The blocks' offsets, in order.
    blocks: Vec<i64>,
    from_back_edge: bool,
    from_landing_pad: bool,
    to_back_edge: bool,
    /// Its Ball–Larus number.
    number: u64,
}

#[derive(Serialize)]
struct JsonPathTotals {
    /// The function's acyclic paths.
    paths: u64,
    /// Every path run, `beyond` and `lost` included.
    runs: u64,
    /// Path numbers below this have a counter of their own.
    itemized: u64,
    /// Runs of paths numbered `itemized` or more, not told apart.
    beyond: u64,
    /// Runs whose number was lost (calls nested too deep).
    lost: u64,
}

#[derive(Serialize)]
struct JsonBlock {
    offset: i64,
    end_offset: i64,
    count: u64,
}

#[derive(Serialize)]
struct JsonBranch {
    offset: i64,
    taken: u64,
    not_taken: u64,
    taken_offset: i64,
    not_taken_offset: i64,
}

#[derive(Serialize)]
struct JsonTable {
    offset: i64,
    entries: Vec<JsonTableEntry>,
}

#[derive(Serialize)]
struct JsonTableEntry {
    index: usize,
    target_offset: i64,
    count: u64,
}

#[derive(Serialize)]
struct JsonLoop {
    offset: i64,
    count: u64,
    back_edges: u64,
    entries: u64,
    /// Head runs per entry; null when never entered.
    iterations: Option<f64>,
}

/// What the output says besides the counts.
#[derive(Debug, Clone)]
pub struct About {
    pub function: String,
    pub module: String,
    pub pid: i32,
    pub size: u64,
    pub elapsed: Duration,
    /// Threads that called the function while it was counted.
    pub threads: usize,
}

/// The loops of the graph `edges` (per block, (target address, count)): each block a
/// back edge leads to, from a depth-first walk from the first block.
fn loops(blocks: &[BlockCount], edges: &[Vec<(u64, u64)>]) -> Vec<LoopCount> {
    let index: HashMap<u64, usize> = blocks
        .iter()
        .enumerate()
        .map(|(i, b)| (b.start, i))
        .collect();
    // The successors inside the function, with the edges' counts.
    let successors: Vec<Vec<(usize, u64)>> = edges
        .iter()
        .map(|out| {
            out.iter()
                .filter_map(|(to, count)| index.get(to).map(|&i| (i, *count)))
                .collect()
        })
        .collect();
    #[derive(Clone, Copy, PartialEq)]
    enum Visit {
        New,
        OnStack,
        Done,
    }
    let mut visit = vec![Visit::New; blocks.len()];
    let mut back_edges = vec![0u64; blocks.len()];
    let mut is_head = vec![false; blocks.len()];
    // (block, next successor to look at); iterative, so a huge function cannot
    // overflow the stack.
    let mut stack: Vec<(usize, usize)> = Vec::new();
    if !blocks.is_empty() {
        visit[0] = Visit::OnStack;
        stack.push((0, 0));
    }
    while let Some((block, next)) = stack.last_mut() {
        let Some(&(to, count)) = successors[*block].get(*next) else {
            visit[*block] = Visit::Done;
            stack.pop();
            continue;
        };
        *next += 1;
        match visit[to] {
            Visit::New => {
                visit[to] = Visit::OnStack;
                stack.push((to, 0));
            }
            Visit::OnStack => {
                back_edges[to] += count;
                is_head[to] = true;
            }
            Visit::Done => {}
        }
    }
    blocks
        .iter()
        .enumerate()
        .filter(|&(i, _)| is_head[i])
        .map(|(i, block)| LoopCount {
            head: block.start,
            count: block.count,
            back_edges: back_edges[i],
            entries: block.count.saturating_sub(back_edges[i]),
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests;
