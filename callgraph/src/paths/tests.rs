//! Path numbers are a bijection onto `0..paths`, decode back to their blocks, and the
//! edge actions count exactly the paths an execution takes.

use super::*;

/// Successor lists from slices: `None` leaves the function, `[]` returns.
fn graph(successors: &[&[Option<usize>]]) -> Vec<Vec<Option<usize>>> {
    successors.iter().map(|list| list.to_vec()).collect()
}

/// Runs `trace` (the blocks an execution visits, from the entry until it leaves) through
/// the edge actions; returns the path numbers counted, in order.
fn counted(numbering: &PathNumbering, trace: &[usize]) -> Vec<u64> {
    assert_eq!(trace[0], 0);
    let mut register = 0u64;
    let mut counted = Vec::new();
    for (at, &from) in trace.iter().enumerate() {
        let to = trace.get(at + 1).copied();
        let edge = numbering
            .edges
            .iter()
            .find(|edge| edge.from == from && edge.to == to)
            .unwrap_or_else(|| panic!("no edge {from} -> {to:?}"));
        match edge.action {
            EdgeAction::Add { increment } => register += increment,
            EdgeAction::Exit { increment } => counted.push(register + increment),
            EdgeAction::Back { end, restart } => {
                counted.push(register + end);
                register = restart;
            }
        }
    }
    counted
}

/// Every path's number decodes to a distinct path, and all of `0..paths` are used.
fn check_bijection(numbering: &PathNumbering) {
    let mut seen = std::collections::HashSet::new();
    for number in 0..numbering.paths {
        let path = numbering.path(number).unwrap();
        let key = (
            path.from_back_edge,
            path.blocks.first().copied(),
            path.edges.clone(),
        );
        assert!(seen.insert(key), "{number}: {path:?}");
        // The edges and blocks agree.
        for (i, &edge) in path.edges.iter().enumerate() {
            assert_eq!(numbering.edges[edge].from, path.blocks[i]);
            assert_eq!(
                numbering.edges[edge].to,
                path.blocks.get(i + 1).copied().or(if path.to_back_edge {
                    numbering.edges[edge].to
                } else {
                    None
                })
            );
        }
    }
    assert_eq!(numbering.path(numbering.paths), None);
}

#[test]
fn an_if_else_has_two_paths() {
    let g = graph(&[&[Some(2), Some(1)], &[Some(3)], &[Some(3)], &[]]);
    let numbering = PathNumbering::new(&g).unwrap();
    assert_eq!(numbering.paths, 2);
    check_bijection(&numbering);
    let through_taken = counted(&numbering, &[0, 2, 3]);
    let through_fall = counted(&numbering, &[0, 1, 3]);
    assert_ne!(through_taken, through_fall);
    let path = numbering.path(through_taken[0]).unwrap();
    assert_eq!(path.blocks, [0, 2, 3]);
    assert!(!path.from_back_edge && !path.to_back_edge);
    // Only one of the four edges needs an increment.
    let increments = numbering
        .edges
        .iter()
        .filter(|e| !matches!(e.action, EdgeAction::Add { increment: 0 }))
        .filter(|e| !matches!(e.action, EdgeAction::Exit { increment: 0 }))
        .count();
    assert_eq!(increments, 1, "{:?}", numbering.edges);
}

#[test]
fn a_loop_counts_its_entry_its_iterations_and_its_way_out_apart() {
    // 0 → 1 (head) → 2 (body) → 1 … ; 1 → 3 (return).
    let g = graph(&[&[Some(1)], &[Some(2), Some(3)], &[Some(1)], &[]]);
    let numbering = PathNumbering::new(&g).unwrap();
    // entry→head→out, entry→head→body→back, head→out, head→body→back.
    assert_eq!(numbering.paths, 4);
    check_bijection(&numbering);
    let numbers = counted(&numbering, &[0, 1, 2, 1, 2, 1, 2, 1, 3]);
    assert_eq!(numbers.len(), 4);
    let paths: Vec<(bool, Vec<usize>, bool)> = numbers
        .iter()
        .map(|&n| numbering.path(n).unwrap())
        .map(|p| (p.from_back_edge, p.blocks, p.to_back_edge))
        .collect();
    assert_eq!(paths[0], (false, vec![0, 1, 2], true));
    assert_eq!(paths[1], paths[2]);
    assert_eq!(paths[1], (true, vec![1, 2], true));
    assert_eq!(paths[3], (true, vec![1, 3], false));
}

#[test]
fn a_loop_back_to_the_entry_block_and_a_self_loop_are_numbered() {
    // Block 0 loops to itself, then 1 loops back to 0.
    let g = graph(&[&[Some(0), Some(1)], &[Some(0), None]]);
    let numbering = PathNumbering::new(&g).unwrap();
    check_bijection(&numbering);
    let numbers = counted(&numbering, &[0, 0, 1, 0, 1]);
    let paths: Vec<Path> = numbers
        .iter()
        .map(|&n| numbering.path(n).unwrap())
        .collect();
    assert_eq!(paths.len(), 3);
    assert_eq!(paths[0].blocks, [0]);
    assert!(paths[0].to_back_edge);
    assert_eq!(paths[1].blocks, [0, 1]);
    assert!(paths[1].from_back_edge && paths[1].to_back_edge);
    assert_eq!(paths[2].blocks, [0, 1]);
    assert!(!paths[2].to_back_edge);
}

#[test]
fn a_switch_and_parallel_edges_give_one_path_each() {
    // A table (its targets without repeats), and a branch whose both sides go to
    // block 4.
    let g = graph(&[
        &[Some(1), Some(2), Some(3)],
        &[Some(4), Some(4)],
        &[Some(4)],
        &[None],
        &[],
    ]);
    let numbering = PathNumbering::new(&g).unwrap();
    // 0→1→4 twice (two edges), 0→2→4, 0→3→out.
    assert_eq!(numbering.paths, 4);
    check_bijection(&numbering);
}

/// `n` diamonds in a row (block `3d` branches to `3d + 1` and `3d + 2`, which both go
/// on to `3d + 3`), then a return: 2^n paths.
fn diamonds(n: usize) -> Vec<Vec<Option<usize>>> {
    let mut successors: Vec<Vec<Option<usize>>> = Vec::new();
    for d in 0..n {
        let base = 3 * d;
        successors.push(vec![Some(base + 1), Some(base + 2)]);
        successors.push(vec![Some(base + 3)]);
        successors.push(vec![Some(base + 3)]);
    }
    successors.push(vec![]);
    successors
}

#[test]
fn nested_diamonds_number_every_path_exactly_once() {
    // n diamonds in a row: 2^n paths, each execution counted under its own number.
    let n = 10;
    let numbering = PathNumbering::new(&diamonds(n)).unwrap();
    assert_eq!(numbering.paths, 1 << n);
    let mut seen = std::collections::HashSet::new();
    for choice in 0..1u32 << n {
        let mut trace = Vec::new();
        for d in 0..n {
            trace.push(3 * d);
            trace.push(3 * d + if choice >> d & 1 == 1 { 1 } else { 2 });
        }
        trace.push(3 * n);
        let numbers = counted(&numbering, &trace);
        assert_eq!(numbers.len(), 1);
        assert!(seen.insert(numbers[0]));
        let mut expected = trace.clone();
        expected.dedup();
        assert_eq!(numbering.path(numbers[0]).unwrap().blocks, expected);
    }
}

#[test]
fn too_many_paths_are_refused() {
    // 70 diamonds: 2^70 paths.
    let n = 70;
    assert_eq!(PathNumbering::new(&diamonds(n)), Err(TooManyPaths));
}

#[test]
fn an_empty_graph_has_no_path() {
    let numbering = PathNumbering::new(&[]).unwrap();
    assert_eq!(numbering.paths, 0);
    assert_eq!(numbering.path(0), None);
}

#[test]
fn a_landing_pad_starts_paths_of_its_own() {
    // 0: a call that may throw, then a loop 1 ↔ 2 over more calls, out at 2; the
    // landing pad 3 (a catch) goes back into the loop at 2, or the cleanup pad 4 leaves
    // (to `_Unwind_Resume`).
    let successors = graph(&[
        &[Some(1)],
        &[Some(2)],
        &[Some(1), None],
        &[Some(2)],
        &[None],
    ]);
    let numbering = PathNumbering::with_landing_pads(&successors, &[3, 4]).unwrap();
    check_bijection(&numbering);
    // From the entry: 0 1 2 out, 0 1 2 back; from the loop head: 1 2 out, 1 2 back;
    // from the catch: 3 2 out, 3 2 back; from the cleanup: 4 out.
    assert_eq!(numbering.paths, 7);
    let from_pads: Vec<Vec<usize>> = (0..numbering.paths)
        .map(|n| numbering.path(n).unwrap())
        .filter(|path| path.from_landing_pad)
        .map(|path| {
            assert!(!path.from_back_edge);
            path.blocks
        })
        .collect();
    assert_eq!(from_pads.len(), 3);
    assert!(
        from_pads
            .iter()
            .all(|blocks| blocks[0] == 3 || blocks[0] == 4)
    );
    // A path starting at a pad begins with the pad's value and goes on like any other:
    // the catch, the loop's test, out.
    let (pad, start) = numbering.landing_pads[0];
    assert_eq!(pad, 3);
    let mut register = start;
    for (from, to) in [(3, Some(2)), (2, None)] {
        let edge = numbering
            .edges
            .iter()
            .find(|e| e.from == from && e.to == to)
            .unwrap();
        match edge.action {
            EdgeAction::Add { increment } => register += increment,
            EdgeAction::Exit { increment } => register += increment,
            EdgeAction::Back { .. } => unreachable!(),
        }
    }
    assert_eq!(numbering.path(register).unwrap().blocks, [3, 2]);
    // Without pads, blocks 3 and 4 are on no path.
    assert_eq!(PathNumbering::new(&successors).unwrap().paths, 2 + 2);
}
