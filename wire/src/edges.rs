//! What the agent tells the controller about a function it copied with edge counters
//! (`tendril edges`, issue 18).
//!
//! The agent relocates the whole function into a copy with a counter at the start of
//! every basic block, on the taken side of every conditional branch and behind every
//! jump-table entry, and points the entry at the copy. Each counter is a function id
//! of the agent's per-thread counter tables, so the controller reads them with
//! [`crate::Request::ReadCounters`] (a counter's count is its `calls`) and sums the
//! threads. A conditional branch's not-taken count is its block's count minus the
//! taken count. All addresses are the original function's, never the copy's.
//!
//! Paths (Ball–Larus, `tendril_callgraph::paths`): when the copy also counts paths, its
//! [`PathLayout`] says which counters hold which path numbers; the controller decodes
//! a number into its blocks with a `tendril_callgraph::paths::PathNumbering` of
//! [`EdgeLayout::path_successors`], the very lists the agent numbered.

use serde::{Deserialize, Serialize};

/// The layout of a function copied with counters: its blocks and their counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeLayout {
    /// The function's entry.
    pub address: u64,
    /// The counter of calls that entered the copy.
    pub calls_counter: u32,
    /// The basic blocks: the function's, in address order (the first starts at the
    /// entry), then those of its `.cold` parts, copied with it.
    pub blocks: Vec<EdgeBlock>,
    /// The path counters, or why paths are not counted.
    pub paths: Result<PathLayout, String>,
    /// The blocks only the unwinder reaches: the landing pads of the function's
    /// exception tables (handlers and cleanups), in address order.
    #[serde(default)]
    pub landing_pads: Vec<u64>,
}

/// Where a copy counts its paths. Path number `n` below `itemized` is counted by
/// counter `first_counter + n` (consecutive ids); the numbers from `itemized` up to
/// `paths` share `beyond_counter`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathLayout {
    /// The function's acyclic paths: their numbers are `0..paths`.
    pub paths: u64,
    pub first_counter: u32,
    pub itemized: u32,
    pub beyond_counter: u32,
    /// Counts paths whose number was lost: a call nested deeper than the per-thread
    /// path stack holds (see the agent's `path_register`).
    pub lost_counter: u32,
}

/// One basic block of the copied function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeBlock {
    /// Address of its first instruction.
    pub start: u64,
    /// Address just past its last instruction.
    pub end: u64,
    /// Counts every time the block starts.
    pub counter: u32,
    pub exit: EdgeExit,
}

/// Where control goes from a block. A successor is an address: a block's start, or an
/// address outside the function (a tail call, a `.cold` part).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EdgeExit {
    /// Runs on into `to`.
    FallThrough { to: u64 },
    /// An unconditional direct `jmp` to `to`.
    Jump { to: u64 },
    /// A conditional branch at `branch`; `taken_counter` counts its taken edge.
    Conditional {
        branch: u64,
        taken: u64,
        not_taken: u64,
        taken_counter: u32,
    },
    /// A jump at `jump` through a table: one counter per entry, in entry order.
    Table { jump: u64, entries: Vec<TableEntry> },
    /// A jump through a code pointer, out of the function.
    ThroughPointer { jump: u64 },
    /// A `ret`.
    Return,
    /// Nothing runs after it (`ud2`, `int3`, `hlt`).
    Stops,
}

/// One entry of a jump table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableEntry {
    /// The block the entry jumps to.
    pub target: u64,
    /// Counts the jumps through this entry.
    pub counter: u32,
}

impl EdgeLayout {
    /// Every block's edges, as `tendril_callgraph::paths::PathNumbering::new` takes
    /// them: in [`EdgeExit`] order (taken before not taken; a table's targets in entry
    /// order, without repeats), `Some(block index)` inside the function, `None` out of it.
    pub fn path_successors(&self) -> Vec<Vec<Option<usize>>> {
        let index_of = |address: u64| self.blocks.iter().position(|b| b.start == address);
        self.blocks
            .iter()
            .map(|block| match &block.exit {
                EdgeExit::FallThrough { to } | EdgeExit::Jump { to } => vec![index_of(*to)],
                EdgeExit::Conditional {
                    taken, not_taken, ..
                } => vec![index_of(*taken), index_of(*not_taken)],
                EdgeExit::Table { entries, .. } => {
                    let mut targets: Vec<Option<usize>> = Vec::new();
                    for entry in entries {
                        let target = index_of(entry.target);
                        if !targets.contains(&target) {
                            targets.push(target);
                        }
                    }
                    targets
                }
                EdgeExit::ThroughPointer { .. } | EdgeExit::Return | EdgeExit::Stops => Vec::new(),
            })
            .collect()
    }

    /// Every counter id, the calls counter first, then per block: its counter and its
    /// exit's counters, then the path counters.
    pub fn counters(&self) -> Vec<u32> {
        let mut ids = vec![self.calls_counter];
        for block in &self.blocks {
            ids.push(block.counter);
            match &block.exit {
                EdgeExit::Conditional { taken_counter, .. } => ids.push(*taken_counter),
                EdgeExit::Table { entries, .. } => {
                    ids.extend(entries.iter().map(|entry| entry.counter))
                }
                _ => {}
            }
        }
        if let Ok(paths) = &self.paths {
            ids.extend((0..paths.itemized).map(|n| paths.first_counter + n));
            ids.push(paths.beyond_counter);
            ids.push(paths.lost_counter);
        }
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layout_round_trips_and_lists_every_counter_once() {
        let layout = EdgeLayout {
            address: 0x1000,
            calls_counter: 7,
            blocks: vec![
                EdgeBlock {
                    start: 0x1000,
                    end: 0x1008,
                    counter: 8,
                    exit: EdgeExit::Conditional {
                        branch: 0x1006,
                        taken: 0x1010,
                        not_taken: 0x1008,
                        taken_counter: 9,
                    },
                },
                EdgeBlock {
                    start: 0x1008,
                    end: 0x1010,
                    counter: 10,
                    exit: EdgeExit::Table {
                        jump: 0x100e,
                        entries: vec![TableEntry {
                            target: 0x1010,
                            counter: 11,
                        }],
                    },
                },
                EdgeBlock {
                    start: 0x1010,
                    end: 0x1011,
                    counter: 12,
                    exit: EdgeExit::Return,
                },
            ],
            landing_pads: Vec::new(),
            paths: Ok(PathLayout {
                paths: 3,
                first_counter: 13,
                itemized: 2,
                beyond_counter: 15,
                lost_counter: 16,
            }),
        };
        let line = crate::encode(&layout);
        assert_eq!(crate::decode::<EdgeLayout>(&line).unwrap(), layout);
        assert_eq!(layout.counters(), [7, 8, 9, 10, 11, 12, 13, 14, 15, 16]);
        assert_eq!(
            layout.path_successors(),
            [vec![Some(2), Some(1)], vec![Some(2)], vec![]]
        );
    }
}
