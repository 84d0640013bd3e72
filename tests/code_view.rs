//! The live view's annotated code (issue 18): a recorded function's copy with edge
//! counters put behind its recording hook while the recording goes on. Against real
//! fixture processes: the copy counts exactly the calls the recording's tree counts
//! (the root's and Scheme B's callees', a jump table's and a recursion's included), the
//! target computes the same checksums meanwhile, the recording stays consistent, and
//! the end of the recording puts every byte back; two `static` functions of one name
//! are told apart by address. Then `e` in the terminal UI, as a user presses it.

use crate::common;

use common::{
    EXIT_TIMEOUT, Target, Tmux, calls_of, code_bytes_match_file, edge_counts, node_at,
    start_recorder,
};
use std::collections::BTreeMap;
use std::time::Duration;
use tendril::recording::{HookedCopy, Recorder};
use tendril_wire::edges::{EdgeExit, EdgeLayout};

const LINE_TIMEOUT: Duration = Duration::from_secs(60);
const ROUNDS: u64 = 5;

/// Runs `n` rounds of `branches stdin`, draining the recording's rings meanwhile.
fn rounds(target: &mut Target, recorder: &mut Recorder, n: u64) -> Vec<u64> {
    (0..n)
        .flat_map(|_| {
            let checksums = target.checksums_on_demand(1, LINE_TIMEOUT);
            recorder.poll();
            checksums
        })
        .collect()
}

fn copy_behind_hook(recorder: &mut Recorder, name: &str) -> HookedCopy {
    let function = recorder
        .recorded_function(name, "branches", None)
        .unwrap_or_else(|| panic!("{name} is not recorded"));
    recorder
        .copy_behind_hook(&function, true)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The paths counted under a number, and the lost ones.
fn path_runs(layout: &EdgeLayout, counts: &BTreeMap<u32, u64>) -> (u64, u64) {
    let paths = layout.paths.as_ref().expect("paths are counted");
    let numbered: u64 = (0..paths.itemized)
        .map(|n| counts[&(paths.first_counter + n)])
        .sum::<u64>()
        + counts[&paths.beyond_counter];
    (numbered, counts[&paths.lost_counter])
}

#[test]
fn a_copy_behind_the_recording_hook_counts_exactly_the_calls_the_tree_counts() {
    let mut target = Target::spawn("branches", &["stdin"]);
    let bare = target.checksums_on_demand(1, LINE_TIMEOUT)[0];
    let pid = target.pid();
    let mut recorder = start_recorder(pid, "round_of_work");
    // The root's copy goes in before its callees are instrumented (Scheme B, in the
    // first round): the functions found after it still get their names.
    let root = copy_behind_hook(&mut recorder, "round_of_work");
    let before = rounds(&mut target, &mut recorder, 1);
    // Asked twice, the same copy comes back with its counts from zero.
    let first = copy_behind_hook(&mut recorder, "classify");
    let classify = copy_behind_hook(&mut recorder, "classify");
    assert_eq!(first.layout, classify.layout);
    let dispatch = copy_behind_hook(&mut recorder, "dispatch");
    let depth = copy_behind_hook(&mut recorder, "depth");
    assert!(
        !root.code.is_empty() && root.code[..5] != code_bytes(pid, root.function.addr),
        "the answer carries the original bytes, not the entry's jump"
    );
    // Both kinds of entry are retargeted: a jump (classify's first instruction is
    // long), and a short jump to a pad (the others start with 2- or 3-byte ones).
    let entries: Vec<u8> = [&root, &classify, &dispatch, &depth]
        .iter()
        .map(|copy| code_bytes(pid, copy.function.addr)[0])
        .collect();
    assert!(
        entries.contains(&0xe9) && entries.contains(&0xeb),
        "entries {entries:x?}"
    );
    let during = rounds(&mut target, &mut recorder, ROUNDS);
    assert!(
        before.iter().chain(&during).all(|&c| c == bare),
        "checksums changed: {bare} then {before:?} {during:?}"
    );

    let (_, mut reader) = tendril::inject::connect_existing(pid)
        .unwrap()
        .expect("the agent is loaded");
    let calls = |copy: &HookedCopy, counts: &BTreeMap<u32, u64>| counts[&copy.layout.calls_counter];
    let counts = edge_counts(&mut reader, &root.layout);
    assert_eq!(calls(&root, &counts), 1 + ROUNDS, "the root's calls");
    assert_eq!(
        path_runs(&root.layout, &counts).1,
        0,
        "the root's lost paths"
    );

    // classify(i), i = 0..299: one branch, taken 200 times of 300 (or the inverse).
    let counts = edge_counts(&mut reader, &classify.layout);
    assert_eq!(calls(&classify, &counts), 300 * ROUNDS);
    let branches: Vec<[u64; 2]> = (classify.layout.blocks.iter())
        .filter_map(|block| match &block.exit {
            EdgeExit::Conditional { taken_counter, .. } => {
                let taken = counts[taken_counter];
                let mut split = [taken, counts[&block.counter] - taken];
                split.sort();
                Some(split)
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        branches,
        [[100 * ROUNDS, 200 * ROUNDS]],
        "classify's branch"
    );
    assert_eq!(path_runs(&classify.layout, &counts), (300 * ROUNDS, 0));

    // dispatch: 7 cases reached 10 times a round each through its table.
    let counts = edge_counts(&mut reader, &dispatch.layout);
    assert_eq!(calls(&dispatch, &counts), 90 * ROUNDS);
    let mut entries: BTreeMap<u64, u64> = BTreeMap::new();
    for block in &dispatch.layout.blocks {
        if let EdgeExit::Table { entries: table, .. } = &block.exit {
            for entry in table {
                *entries.entry(entry.target).or_default() += counts[&entry.counter];
            }
        }
    }
    // The default (ops 7 and 8) is the table's bound check, before the table.
    let per_target: Vec<u64> = entries.into_values().filter(|&c| c > 0).collect();
    assert_eq!(per_target, [10 * ROUNDS; 7], "every case 10 times a round");

    // depth(12): recursion (or the loop GCC made of it); every call's path is counted.
    let counts = edge_counts(&mut reader, &depth.layout);
    let depth_calls = calls(&depth, &counts);
    assert!(
        depth_calls == ROUNDS || depth_calls == 13 * ROUNDS,
        "depth: {depth_calls}"
    );
    assert_eq!(path_runs(&depth.layout, &counts).1, 0, "depth's lost paths");
    drop(reader);

    // The tree counted the round before the copies too; the copies, the rounds after.
    let finished = recorder.finish(false).expect("the recording ends cleanly");
    common::check_profile(&finished.profile);
    let tree_calls = |name: &str| -> u64 {
        (finished.profile.threads.iter())
            .flat_map(|thread| common::all_nodes(&thread.roots))
            .filter(|node| node.name == name)
            .map(|node| node.calls)
            .sum()
    };
    assert_eq!(tree_calls("round_of_work"), 1 + ROUNDS);
    assert_eq!(tree_calls("classify"), 300 * (1 + ROUNDS));
    assert_eq!(tree_calls("dispatch"), 90 * (1 + ROUNDS));
    code_bytes_match_file(pid).expect("every byte is back after the recording");
    let after = target.checksums_on_demand(2, LINE_TIMEOUT);
    assert!(after.iter().all(|&c| c == bare), "{after:?}");
}

/// The address after `key=` in `twin_statics`' ready line.
fn address_after(ready: &str, key: &str) -> u64 {
    let field = ready
        .split_whitespace()
        .find_map(|field| field.strip_prefix(key)?.strip_prefix("=0x"))
        .unwrap_or_else(|| panic!("no {key}= in {ready:?}"));
    u64::from_str_radix(field, 16).unwrap()
}

#[test]
fn two_static_functions_of_one_name_are_told_apart_by_their_addresses() {
    // Two `step`s in module twin_statics: 1,000 calls of this one a round, 3,000 of the
    // other file's (under other_steps).
    let mut target = Target::spawn("twin_statics", &[]);
    let ready = target.ready_line().expect("a ready line").to_owned();
    let (here, other) = (
        address_after(&ready, "here"),
        address_after(&ready, "other"),
    );
    let bare = target.checksums_on_demand(1, LINE_TIMEOUT)[0];
    let pid = target.pid();
    let mut recorder = start_recorder(pid, "round_of_steps");
    let first = rounds(&mut target, &mut recorder, 1);

    // Each node of the live tree carries its own function's address.
    let profile = recorder.snapshot();
    let roots = &profile.merged.roots;
    let step_here = node_at(roots, &["round_of_steps", "step"]).expect("this file's step");
    let step_other =
        node_at(roots, &["round_of_steps", "other_steps", "step"]).expect("the other file's step");
    assert_eq!((step_here.address, step_here.calls), (Some(here), 1000));
    assert_eq!((step_other.address, step_other.calls), (Some(other), 3000));

    // `e` names the function by that address: each copy counts its own twin's calls,
    // and takes its own `step.cold` (both are named so), found from its hooked code.
    let mut cold_parts = Vec::new();
    let mut copy_at = |recorder: &mut Recorder, address: u64| -> HookedCopy {
        let function = recorder
            .recorded_function("step", "twin_statics", Some(address))
            .expect("both steps are recorded");
        assert_eq!(function.addr, address);
        let cold = tendril::targets::cold_parts(recorder.symbols(), &function);
        assert_eq!(cold.len(), 1, "{address:#x}'s own step.cold: {cold:?}");
        cold_parts.extend(cold);
        recorder.copy_behind_hook(&function, true).unwrap()
    };
    let copy_other = copy_at(&mut recorder, other);
    let copy_here = copy_at(&mut recorder, here);
    assert_ne!(cold_parts[0], cold_parts[1]);
    let during = rounds(&mut target, &mut recorder, ROUNDS);
    assert!(
        first.iter().chain(&during).all(|&c| c == bare),
        "checksums changed: {bare} then {first:?} {during:?}"
    );
    let (_, mut reader) = tendril::inject::connect_existing(pid)
        .unwrap()
        .expect("the agent is loaded");
    for (copy, per_round) in [(&copy_here, 1000), (&copy_other, 3000)] {
        let counts = edge_counts(&mut reader, &copy.layout);
        assert_eq!(counts[&copy.layout.calls_counter], per_round * ROUNDS);
    }
    drop(reader);

    let finished = recorder.finish(false).expect("the recording ends cleanly");
    common::check_profile(&finished.profile);
    let roots = &finished.profile.merged.roots;
    let step_other = node_at(roots, &["round_of_steps", "other_steps", "step"]).unwrap();
    assert_eq!(
        (step_other.address, step_other.calls),
        (Some(other), 3000 * (1 + ROUNDS))
    );
    code_bytes_match_file(pid).expect("every byte is back after the recording");
    let after = target.checksums_on_demand(2, LINE_TIMEOUT);
    assert!(after.iter().all(|&c| c == bare), "{after:?}");
}

/// The first 5 bytes of the target's code at `address` now.
fn code_bytes(pid: i32, address: u64) -> Vec<u8> {
    tendril::symbols::maps::read_memory(pid, address, address + 5).unwrap()
}

#[test]
fn e_shows_the_selected_functions_code_counted_live_and_esc_goes_back() {
    let mut target = Target::spawn("calltree", &["2"]);
    let expected = target.steady_checksum(2, LINE_TIMEOUT);
    let ui = Tmux::tendril(
        "code-view",
        &["attach", &target.pid().to_string(), "--root", "work_round"],
    );
    ui.wait_for("work_round with calls", |screen| {
        (calls_of(screen, "work_round")? > 0.0).then_some(())
    });
    ui.press("Home"); // the root's row
    ui.press("e");
    let calls_shown = |screen: &str| -> Option<u64> {
        let title = screen
            .lines()
            .find(|line| line.contains("work_round (calltree):"))?;
        let count = title.split(':').nth(1)?.split_whitespace().next()?;
        count.replace(',', "").parse().ok()
    };
    let first = ui.wait_for("the annotated code with counts", |screen| {
        let calls = calls_shown(screen)?;
        (calls > 0 && screen.contains("COUNT") && screen.contains("INSTRUCTION")).then_some(calls)
    });
    // The counts grow while the recording goes on, and a hot block is marked.
    ui.wait_for("more calls counted, and a hot block marked", |screen| {
        (calls_shown(screen)? > first && screen.contains("▶")).then_some(())
    });
    ui.press("Escape");
    ui.wait_for("the call tree again", |screen| {
        (calls_of(screen, "work_round").is_some() && !screen.contains("INSTRUCTION")).then_some(())
    });
    ui.press("q");
    assert_eq!(ui.wait_exit(), 0, "the screen:\n{}", ui.screen());
    target.drain();
    let after = target.checksum_lines(3, EXIT_TIMEOUT);
    assert!(
        after.iter().all(|&c| c == expected),
        "checksums changed: {expected} then {after:?}"
    );
    code_bytes_match_file(target.pid()).expect("the target's code equals its files");
}
