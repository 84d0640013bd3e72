//! The derived numbers on layouts shaped like GCC's build of the `branches` fixture,
//! with the counts one round of it gives.

use super::*;
use serde_json::json;
use std::collections::BTreeMap;
use tendril_wire::edges::{EdgeBlock, TableEntry};

/// A layout and the counts of its counters.
pub(crate) struct Counted {
    pub layout: EdgeLayout,
    pub counts: BTreeMap<u32, u64>,
}

impl Counted {
    pub fn profile(&self) -> EdgeProfile {
        EdgeProfile::derive(&self.layout, |id| self.counts[&id])
    }
}

fn block(start: u64, end: u64, counter: u32, exit: EdgeExit) -> EdgeBlock {
    EdgeBlock {
        start,
        end,
        counter,
        exit,
    }
}

/// A layout whose calls counter is 1, with paths not counted.
fn layout(address: u64, blocks: Vec<EdgeBlock>) -> EdgeLayout {
    EdgeLayout {
        address,
        calls_counter: 1,
        blocks,
        paths: Err("not counted in this test".into()),
        landing_pads: Vec::new(),
    }
}

/// A path as a test writes it: from a back edge, its blocks' starts, to a back edge.
pub(crate) type Run<'a> = (bool, &'a [u64], bool, u64);

impl Counted {
    /// Counts paths too: path `n` is counter 100 + n, `beyond` 98 and `lost` 99; each
    /// run's path is found by decoding every number.
    pub fn with_paths(mut self, runs: &[Run], beyond: u64, lost: u64) -> Counted {
        let numbering =
            tendril_callgraph::paths::PathNumbering::new(&self.layout.path_successors()).unwrap();
        self.layout.paths = Ok(tendril_wire::edges::PathLayout {
            paths: numbering.paths,
            first_counter: 100,
            itemized: numbering.paths as u32,
            beyond_counter: 98,
            lost_counter: 99,
        });
        for number in 0..numbering.paths {
            self.counts.insert(100 + number as u32, 0);
        }
        self.counts.insert(98, beyond);
        self.counts.insert(99, lost);
        for &(from_back_edge, blocks, to_back_edge, count) in runs {
            let number = (0..numbering.paths)
                .find(|&n| {
                    let path = numbering.path(n).unwrap();
                    let starts: Vec<u64> = path
                        .blocks
                        .iter()
                        .map(|&b| self.layout.blocks[b].start)
                        .collect();
                    path.from_back_edge == from_back_edge
                        && path.to_back_edge == to_back_edge
                        && starts == blocks
                })
                .unwrap_or_else(|| panic!("no path {blocks:x?}"));
            self.counts.insert(100 + number as u32, count);
        }
        self
    }
}

/// `trip`'s paths for n = 0..9: n = 0 skips the loop, n = 1 runs it once without a
/// back edge, n ≥ 2 takes n − 1 back edges.
pub(crate) fn trip_with_paths() -> Counted {
    trip().with_paths(
        &[
            (false, &[0x14c0, 0x14f0], false, 1),
            (false, &[0x14c0, 0x14c4, 0x14d0, 0x14e5], false, 1),
            (false, &[0x14c0, 0x14c4, 0x14d0], true, 8),
            (true, &[0x14d0], true, 28),
            (true, &[0x14d0, 0x14e5], false, 8),
        ],
        0,
        0,
    )
}

fn conditional(branch: u64, taken: u64, not_taken: u64, taken_counter: u32) -> EdgeExit {
    EdgeExit::Conditional {
        branch,
        taken,
        not_taken,
        taken_counter,
    }
}

/// `trip(n)` for n = 0..9 as GCC builds it: `n == 0` skips the loop; the loop is
/// rotated (its test at the bottom), so its head is the body's first block.
pub(crate) fn trip() -> Counted {
    let layout = layout(
        0x14c0,
        vec![
            block(0x14c0, 0x14c4, 2, conditional(0x14c2, 0x14f0, 0x14c4, 3)),
            block(0x14c4, 0x14d0, 4, EdgeExit::FallThrough { to: 0x14d0 }),
            block(0x14d0, 0x14e5, 5, conditional(0x14e3, 0x14d0, 0x14e5, 6)),
            block(0x14e5, 0x14e8, 7, EdgeExit::Return),
            block(0x14f0, 0x14f5, 8, EdgeExit::Return),
        ],
    );
    let counts = [
        (1, 10),
        (2, 10),
        (3, 1),
        (4, 9),
        (5, 45),
        (6, 36),
        (7, 9),
        (8, 1),
    ];
    Counted {
        layout,
        counts: counts.into_iter().collect(),
    }
}

/// `classify(i)` for i = 0..299: the branch is taken 200 times of 300.
pub(crate) fn classify() -> Counted {
    let layout = layout(
        0x1430,
        vec![
            block(0x1430, 0x143d, 2, conditional(0x143b, 0x1450, 0x143d, 3)),
            block(0x143d, 0x144d, 4, EdgeExit::Return),
            block(0x1450, 0x145d, 5, EdgeExit::Return),
        ],
    );
    let counts = [(1, 300), (2, 300), (3, 200), (4, 100), (5, 200)];
    Counted {
        layout,
        counts: counts.into_iter().collect(),
    }
}

/// `dispatch(op, x)` for op = i % 9, i = 0..89: the bound check sends ops 7 and 8 to
/// `dispatch.cold` (before the function); the table's 7 entries run 10 times each.
pub(crate) fn dispatch() -> Counted {
    // The cases' blocks, in table order (case 0 is at +0x30, and so on).
    let cases: [u64; 7] = [0x1490, 0x1498, 0x14a0, 0x14b0, 0x14b8, 0x1480, 0x1488];
    let mut blocks = vec![
        block(0x1460, 0x1469, 2, conditional(0x1463, 0x10e0, 0x1469, 3)),
        block(
            0x1469,
            0x147b,
            4,
            EdgeExit::Table {
                jump: 0x1479,
                entries: cases
                    .iter()
                    .enumerate()
                    .map(|(i, &target)| TableEntry {
                        target,
                        counter: 10 + i as u32,
                    })
                    .collect(),
            },
        ),
    ];
    let mut sorted = cases;
    sorted.sort();
    let ends = [0x1485, 0x148d, 0x1494, 0x149c, 0x14a6, 0x14b4, 0x14c0];
    for (i, (&start, end)) in sorted.iter().zip(ends).enumerate() {
        blocks.push(block(start, end, 20 + i as u32, EdgeExit::Return));
    }
    let mut counts: BTreeMap<u32, u64> = [(1, 90), (2, 90), (3, 20), (4, 70)].into();
    counts.extend((0..7).map(|i| (10 + i, 10)));
    counts.extend((0..7).map(|i| (20 + i, 10)));
    Counted {
        layout: layout(0x1460, blocks),
        counts,
    }
}

#[test]
fn not_taken_is_the_block_count_minus_taken() {
    let profile = classify().profile();
    assert_eq!(profile.calls, 300);
    assert_eq!(
        profile.branches,
        [BranchCount {
            at: 0x143b,
            taken_to: 0x1450,
            not_taken_to: 0x143d,
            taken: 200,
            not_taken: 100,
        }]
    );
    assert!(profile.loops.is_empty(), "{:?}", profile.loops);
    assert_eq!(profile.hottest(), 300);
}

#[test]
fn a_rotated_loop_is_found_by_its_back_edge_with_its_trips_per_entry() {
    let profile = trip().profile();
    assert_eq!(
        profile.loops,
        [LoopCount {
            head: 0x14d0,
            count: 45,
            back_edges: 36,
            entries: 9,
        }]
    );
    assert_eq!(profile.loops[0].iterations_per_entry(), Some(5.0));
    let split: Vec<(u64, u64)> = profile
        .branches
        .iter()
        .map(|b| (b.taken, b.not_taken))
        .collect();
    assert_eq!(split, [(1, 9), (36, 9)]);
}

#[test]
fn a_loop_whose_head_is_the_entry_counts_the_calls_as_its_entries() {
    // do { ... } while (--n) at the entry: 4 calls, 20 head runs, 16 back edges.
    let layout = layout(
        0x2000,
        vec![
            block(0x2000, 0x2010, 2, conditional(0x200e, 0x2000, 0x2010, 3)),
            block(0x2010, 0x2011, 4, EdgeExit::Return),
        ],
    );
    let counts: BTreeMap<u32, u64> = [(1, 4), (2, 20), (3, 16), (4, 4)].into();
    let profile = EdgeProfile::derive(&layout, |id| counts[&id]);
    assert_eq!(
        profile.loops,
        [LoopCount {
            head: 0x2000,
            count: 20,
            back_edges: 16,
            entries: 4,
        }]
    );
    assert_eq!(profile.loops[0].iterations_per_entry(), Some(5.0));
}

#[test]
fn a_forward_join_is_no_loop_and_a_head_never_entered_has_no_trip_count() {
    // A diamond: both sides join at 0x3020; nothing loops.
    let diamond = layout(
        0x3000,
        vec![
            block(0x3000, 0x3010, 2, conditional(0x300e, 0x3018, 0x3010, 3)),
            block(0x3010, 0x3018, 4, EdgeExit::Jump { to: 0x3020 }),
            block(0x3018, 0x3020, 5, EdgeExit::FallThrough { to: 0x3020 }),
            block(0x3020, 0x3021, 6, EdgeExit::Return),
        ],
    );
    let profile = EdgeProfile::derive(&diamond, |_| 0);
    assert!(profile.loops.is_empty());
    let never = LoopCount {
        head: 0,
        count: 0,
        back_edges: 0,
        entries: 0,
    };
    assert_eq!(never.iterations_per_entry(), None);
}

#[test]
fn table_entries_keep_their_order_and_counts() {
    let profile = dispatch().profile();
    assert_eq!(profile.calls, 90);
    let [table] = &profile.tables[..] else {
        panic!("{:?}", profile.tables)
    };
    assert_eq!(table.at, 0x1479);
    assert_eq!(table.entries.len(), 7);
    assert_eq!(table.entries[0], (0x1490, 10));
    assert_eq!(table.entries.iter().map(|e| e.1).sum::<u64>(), 70);
    // The bound check's taken side leaves the function (ops 7 and 8).
    assert_eq!(
        (profile.branches[0].taken, profile.branches[0].not_taken),
        (20, 70)
    );
    assert!(profile.loops.is_empty());
}

#[test]
fn json_has_the_documented_shape_with_offsets_from_the_start() {
    let about = About {
        function: "trip".into(),
        module: "branches".into(),
        pid: 42,
        size: 0x35,
        elapsed: Duration::from_millis(1500),
        threads: 1,
    };
    let json = serde_json::to_value(trip().profile().to_json(&about)).unwrap();
    assert_eq!(json["function"], "trip");
    assert_eq!(json["module"], "branches");
    assert_eq!(json["address"], 0x14c0);
    assert_eq!(json["calls"], 10);
    assert_eq!(json["duration_s"], 1.5);
    assert_eq!(
        json["blocks"][2],
        json!({ "offset": 0x10, "end_offset": 0x25, "count": 45 })
    );
    assert_eq!(json["branches"][1]["offset"], 0x23);
    assert_eq!(json["branches"][1]["taken"], 36);
    assert_eq!(json["branches"][1]["not_taken"], 9);
    assert_eq!(json["branches"][1]["taken_offset"], 0x10);
    assert_eq!(
        json["loops"][0],
        json!({ "offset": 0x10, "count": 45, "back_edges": 36, "entries": 9, "iterations": 5.0 })
    );
    assert_eq!(json["tables"], json!([]));
    assert_eq!(json["paths"], serde_json::Value::Null);
    assert_eq!(json["paths_note"], "not counted in this test");

    let json = serde_json::to_value(trip_with_paths().profile().to_json(&about)).unwrap();
    assert_eq!(json["paths_note"], serde_json::Value::Null);
    assert_eq!(
        json["path_totals"],
        json!({ "paths": 5, "runs": 46, "itemized": 5, "beyond": 0, "lost": 0 })
    );
    let paths = json["paths"].as_array().unwrap();
    assert_eq!(paths.len(), 5);
    assert_eq!(paths[0]["count"], 28);
    assert_eq!(paths[0]["blocks"], json!([0x10]));
    assert_eq!(paths[0]["from_back_edge"], true);
    assert_eq!(paths[0]["to_back_edge"], true);
    // The two paths that ran once, in either order.
    let once: Vec<&serde_json::Value> = paths[3..].iter().map(|p| &p["blocks"]).collect();
    assert!(once.contains(&&json!([0, 4, 0x10, 0x25])), "{paths:?}");
    assert!(once.contains(&&json!([0, 0x30])), "{paths:?}");

    let json = serde_json::to_value(dispatch().profile().to_json(&about)).unwrap();
    // dispatch.cold lies before the function: a negative offset.
    assert_eq!(json["branches"][0]["taken_offset"], 0x10e0 - 0x1460);
    assert_eq!(
        json["tables"][0]["entries"][1],
        json!({ "index": 1, "target_offset": 0x38, "count": 10 })
    );
    assert_eq!(json["tables"][0]["offset"], 0x19);
}

#[test]
fn path_numbers_decode_to_their_blocks_most_frequent_first() {
    let profile = trip_with_paths().profile();
    let paths = profile.paths.unwrap();
    assert_eq!(paths.total, 46);
    let order: Vec<(u64, bool, bool)> = paths
        .counted
        .iter()
        .map(|p| (p.count, p.from_back_edge, p.to_back_edge))
        .collect();
    assert_eq!(order[0], (28, true, true));
    assert_eq!(order[3], (1, false, false));
    // The back edges the loop took are the paths that end at one.
    let back_edges: u64 = paths
        .counted
        .iter()
        .filter(|p| p.to_back_edge)
        .map(|p| p.count)
        .sum();
    assert_eq!(back_edges, 36);

    // A layout whose numbering disagrees with the agent's is not decoded.
    let mut counted = trip_with_paths();
    if let Ok(paths) = &mut counted.layout.paths {
        paths.paths += 1;
    }
    let refused = counted.profile().paths.unwrap_err();
    assert!(refused.contains("cannot be decoded"), "{refused}");
}
