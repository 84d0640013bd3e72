//! The CCT builder's tests: event streams in, trees and counters out.

use super::*;
use crate::profile::model::Node;
use crate::profile::model::ShapeCalibration;
use crate::profile::tests_support::{
    entry, exit, info, names, pause, resumed, shaped_entry, unwind,
};
use tendril_wire::events::{EventKind, HookShape};

/// 1 tick = 1 ns and no overhead to remove, so times are the raw tick differences.
fn exact_builder() -> CctBuilder {
    CctBuilder::new(Calibration {
        tsc_hz: 1_000_000_000,
        inner_ns: 0.0,
        outer_ns: 0.0,
        inner_spread_ns: 0.0,
        outer_spread_ns: 0.0,
        ..Default::default()
    })
    .unwrap()
}

const NAMES: [&str; 4] = ["main", "fib", "work", "other"];

fn snapshot(builder: &CctBuilder) -> Profile {
    builder.snapshot(&info(), &names(&NAMES))
}

fn n(name: &str, calls: u64, total: u64, self_ns: u64, children: Vec<Node>) -> Node {
    let mut node = Node::leaf(name, "app", calls, total, self_ns);
    node.children = children;
    node
}

#[test]
fn recursion_stays_nested() {
    let mut builder = exact_builder();
    builder.push_events(
        1,
        &[
            entry(1, 0),
            entry(1, 10),
            entry(1, 20),
            exit(1, 25),
            exit(1, 40),
            exit(1, 100),
        ],
    );
    let profile = snapshot(&builder);
    let expected = n(
        "fib",
        1,
        100,
        70,
        vec![n("fib", 1, 30, 25, vec![n("fib", 1, 5, 5, vec![])])],
    );
    assert_eq!(profile.threads[0].roots, vec![expected.clone()]);
    assert_eq!(profile.merged.roots, vec![expected]);
}

#[test]
fn an_exit_below_the_top_closes_the_frames_above_it_as_unwound() {
    let mut builder = exact_builder();
    // work → fib → fib; then work exits directly (longjmp past both fibs).
    builder.push_events(1, &[entry(2, 0), entry(1, 10), entry(1, 20), exit(2, 50)]);
    let profile = snapshot(&builder);
    let expected = n(
        "work",
        1,
        50,
        10,
        vec![n("fib", 1, 40, 10, vec![n("fib", 1, 30, 30, vec![])])],
    );
    assert_eq!(profile.merged.roots, vec![expected]);
    assert_eq!(profile.stats.unwound_exits, 2);
    assert_eq!(profile.stats.unmatched_exits, 0);
    assert_eq!(builder.open_frames(1), 0);
}

#[test]
fn after_a_stop_nothing_nests_under_the_frames_open_then_and_only_roots_start_a_tree() {
    let mut builder = exact_builder();
    builder.set_root_functions([0]);
    // main → fib, then the recording stops watching at 20 (a pause).
    builder.push_events(1, &[entry(0, 0), entry(1, 10)]);
    builder.stop_watching(20);
    builder.push_events(
        1,
        &[
            // After the resume: the old frames' exits, without their entries…
            exit(1, 30),
            // …a call made inside them (not a root: left out)…
            entry(1, 35),
            entry(1, 36),
            exit(1, 37),
            exit(1, 38),
            exit(0, 40),
            // …and the next call of the root, at the top.
            entry(0, 70),
            entry(1, 80),
            exit(1, 90),
            exit(0, 100),
        ],
    );
    let profile = snapshot(&builder);
    let expected = n("main", 2, 50, 30, vec![n("fib", 2, 20, 20, vec![])]);
    assert_eq!(profile.merged.roots, vec![expected]);
    assert_eq!(profile.stats.unmatched_exits, 0);
    assert_eq!(builder.counters().stale_exits, 2);
    assert_eq!(builder.counters().discarded_calls, 2);
    assert_eq!(builder.open_frames(1), 0);
}

#[test]
fn an_exit_of_a_function_not_open_is_ignored_and_counted() {
    let mut builder = exact_builder();
    builder.push_events(
        1,
        &[
            entry(2, 0),
            exit(3, 5),
            entry(1, 10),
            exit(1, 20),
            exit(2, 30),
            exit(2, 31),
        ],
    );
    let profile = snapshot(&builder);
    let expected = n("work", 1, 30, 20, vec![n("fib", 1, 10, 10, vec![])]);
    assert_eq!(profile.merged.roots, vec![expected]);
    assert_eq!(profile.stats.unmatched_exits, 2);
    assert_eq!(profile.stats.unwound_exits, 0);
    assert_eq!(profile.stats.events, 6);
}

#[test]
fn open_frames_count_up_to_the_latest_event_and_snapshots_change_nothing() {
    let mut builder = exact_builder();
    builder.push_events(1, &[entry(0, 100), entry(2, 110), exit(2, 130)]);
    let first = snapshot(&builder);
    assert_eq!(
        first.merged.roots,
        vec![n("main", 1, 30, 10, vec![n("work", 1, 20, 20, vec![])])]
    );
    assert_eq!(
        snapshot(&builder),
        first,
        "a snapshot does not change the builder"
    );

    builder.push_events(1, &[entry(2, 200), pause(15)]);
    // main: 200 − 100 − 15 = 85. The open work entered at 200, the latest event is
    // at 200 and the pause fell inside it: 0 − 15, clamped at 0.
    let second = snapshot(&builder);
    assert_eq!(
        second.merged.roots,
        vec![n("main", 1, 85, 65, vec![n("work", 2, 20, 20, vec![])])]
    );

    builder.push_events(1, &[exit(2, 260), exit(0, 300)]);
    // work: 20 + (60 − 15) = 65; main: 200 − 15 = 185.
    let last = snapshot(&builder);
    assert_eq!(
        last.merged.roots,
        vec![n("main", 1, 185, 120, vec![n("work", 2, 65, 65, vec![])])]
    );
    assert_eq!(last.stats.pause_ns, 15);
    assert_eq!(builder.open_frames(1), 0);
}

#[test]
fn finishing_closes_open_frames_as_unwound() {
    let mut builder = exact_builder();
    builder.push_events(1, &[entry(0, 0), entry(2, 10)]);
    builder.push_events(2, &[entry(0, 5)]);
    builder.finish_thread(1, 50);
    assert_eq!((builder.open_frames(1), builder.open_frames(2)), (0, 1));
    builder.finish_all(105);
    assert_eq!(builder.open_frames(2), 0);
    let profile = snapshot(&builder);
    assert_eq!(
        profile.threads[0].roots,
        vec![n("main", 1, 50, 10, vec![n("work", 1, 40, 40, vec![])])]
    );
    assert_eq!(
        profile.threads[1].roots,
        vec![n("main", 1, 100, 100, vec![])]
    );
    assert_eq!(profile.stats.unwound_exits, 3);
    // A later finish has nothing left to close.
    builder.finish_all(1_000);
    assert_eq!(snapshot(&builder), profile);
}

#[test]
fn threads_merge_by_call_path() {
    let mut builder = exact_builder();
    builder.set_thread_name(20, "worker-b");
    builder.push_events(10, &[entry(0, 0), entry(2, 10), exit(2, 30), exit(0, 40)]);
    builder.push_events(
        20,
        &[
            entry(0, 0),
            entry(3, 1),
            exit(3, 2),
            entry(2, 5),
            exit(2, 11),
            exit(0, 100),
        ],
    );
    builder.push_events(30, &[entry(2, 0), exit(2, 7)]);
    builder.set_thread_name(10, "worker-a");
    let profile = snapshot(&builder);
    let tids: Vec<(u32, &str)> = profile
        .threads
        .iter()
        .map(|t| (t.tid, t.name.as_str()))
        .collect();
    assert_eq!(tids, [(20, "worker-b"), (10, "worker-a"), (30, "")]);
    assert_eq!(
        profile.merged.roots,
        vec![
            n(
                "main",
                2,
                140,
                113,
                vec![n("other", 1, 1, 1, vec![]), n("work", 2, 26, 26, vec![])]
            ),
            n("work", 1, 7, 7, vec![]),
        ]
    );
}

#[test]
fn unwind_events_and_unknown_kinds_are_counted() {
    let mut builder = exact_builder();
    let bogus = Event {
        value: 1,
        function: 0,
        kind: 99,
    };
    builder.push_events(
        1,
        &[entry(0, 0), entry(2, 1), unwind(2, 4), bogus, exit(0, 9)],
    );
    let counters = builder.counters();
    assert_eq!(counters.events, 5);
    assert_eq!(counters.unwound_exits, 1);
    assert_eq!(counters.malformed_events, 1);
    assert_eq!(
        snapshot(&builder).merged.roots,
        vec![n("main", 1, 9, 6, vec![n("work", 1, 3, 3, vec![])])]
    );
}

#[test]
fn unknown_function_ids_get_placeholder_names() {
    let mut builder = exact_builder();
    builder.push_events(1, &[entry(40, 0), exit(40, 3)]);
    let profile = snapshot(&builder);
    assert_eq!(profile.merged.roots[0].name, "function #40");
    assert_eq!(profile.merged.roots[0].module, "?");
}

#[test]
fn a_wide_fan_out_keeps_every_callee_apart() {
    let mut builder = exact_builder();
    let mut events = vec![entry(0, 0)];
    let mut ts = 0;
    for round in 0..3 {
        for callee in 100..140 {
            events.push(entry(callee, ts));
            ts += u64::from(callee - 99) + round;
            events.push(exit(callee, ts));
        }
    }
    events.push(exit(0, ts));
    builder.push_events(1, &events);
    let profile = snapshot(&builder);
    let root = &profile.merged.roots[0];
    assert_eq!(root.children.len(), 40);
    for (index, child) in root.children.iter().enumerate() {
        assert_eq!(child.name, format!("function #{}", 100 + index));
        assert_eq!(child.calls, 3);
        assert_eq!(child.total_ns, 3 * (index as u64 + 1) + 3);
    }
    assert_eq!(root.self_ns, 0);
}

#[test]
fn a_100_000_deep_recursion_builds_and_snapshots() {
    let depth = 100_000u64;
    let mut events: Vec<Event> = (0..depth).map(|i| entry(1, i)).collect();
    let mut builder = exact_builder();
    builder.push_events(1, &events);
    let live = snapshot(&builder);
    let mut deepest = &live.merged.roots[0];
    let mut levels = 1;
    while let Some(child) = deepest.children.first() {
        deepest = child;
        levels += 1;
    }
    assert_eq!(levels, depth);
    assert_eq!(live.merged.roots[0].total_ns, depth - 1);

    events = (0..depth).map(|i| exit(1, depth + i)).collect();
    builder.push_events(1, &events);
    let done = snapshot(&builder);
    assert_eq!(done.merged.roots[0].total_ns, 2 * depth - 1);
    assert_eq!(done.merged.roots[0].self_ns, 2);
    assert_eq!(builder.counters().events, 2 * depth);
    assert_eq!(
        Event::new(EventKind::Exit, 1, 5),
        exit(1, 5),
        "the helpers make real events"
    );
}

#[test]
fn frames_resumed_after_a_stack_switch_are_counted_never_matched() {
    let mut builder = exact_builder();
    // main -> work, which yields: its frame and fib's are dropped (unwound) when
    // main's frame returns on the other stack; later both come back (one switch),
    // then work is entered again from main.
    builder.push_events(
        1,
        &[
            entry(0, 0),
            entry(2, 10),
            entry(1, 20),
            unwind(1, 30),
            unwind(2, 30),
            resumed(1, 40),
            resumed(2, 45),
            entry(2, 50),
            exit(2, 60),
            resumed(1, 70),
            exit(0, 100),
        ],
    );
    let profile = snapshot(&builder);
    assert_eq!(profile.stats.stack_switches, 2);
    assert_eq!(profile.stats.dropped_frames, 3);
    assert_eq!(profile.stats.unmatched_exits, 0);
    assert_eq!(profile.threads[0].stack_switches, 2);
    assert_eq!(profile.threads[0].dropped_frames, 3);
    let main = &profile.merged.roots[0];
    assert_eq!(
        (main.name.as_str(), main.calls, main.total_ns),
        ("main", 1, 100)
    );
    assert_eq!(main.children[0].calls, 2);
    let warning = crate::profile::stack_switch_warning(&profile).unwrap();
    assert!(warning.contains("2 times"), "{warning}");
    assert!(warning.contains("3 frames"), "{warning}");
}

/// `(name, calls, total, self, cpu, self cpu)` of every node, depth first.
fn cpu_times(roots: &[Node]) -> Vec<(String, u64, u64, u64, u64, u64)> {
    let mut out = Vec::new();
    for node in roots {
        out.push((
            node.name.clone(),
            node.calls,
            node.total_ns,
            node.self_ns,
            node.cpu_ns.expect("a CPU time"),
            node.self_cpu_ns.expect("a self CPU time"),
        ));
        out.extend(cpu_times(&node.children));
    }
    out
}

/// main [0, 1000] calls work [100, 400]; the thread is off the CPU at 150..250 (inside
/// work, `held` ticks of it waiting for a core tendril held) and at 500..800 (in main
/// only). Intervals are given first, as the recorder does.
fn main_and_work_off_the_cpu(held: u64) -> Profile {
    let mut builder = exact_builder();
    builder.measure_cpu();
    builder.push_off_cpu(1, 150, 250, held);
    builder.push_off_cpu(1, 500, 800, 0);
    builder.push_events(
        1,
        &[entry(0, 0), entry(2, 100), exit(2, 400), exit(0, 1000)],
    );
    snapshot(&builder)
}

#[test]
fn time_off_the_cpu_is_taken_out_of_the_frames_it_fell_in() {
    let profile = main_and_work_off_the_cpu(0);
    let expected = vec![
        ("main".to_owned(), 1, 1000, 700, 600, 400),
        ("work".to_owned(), 1, 300, 300, 200, 200),
    ];
    assert_eq!(cpu_times(&profile.threads[0].roots), expected);
    assert_eq!(cpu_times(&profile.merged.roots), expected);
}

#[test]
fn a_wait_for_a_core_tendril_held_is_taken_out_of_wall_time_too() {
    let profile = main_and_work_off_the_cpu(60);
    // Wall: the 60 ticks are gone from both; CPU: as without them.
    let expected = vec![
        ("main".to_owned(), 1, 940, 700, 600, 400),
        ("work".to_owned(), 1, 240, 240, 200, 200),
    ];
    assert_eq!(cpu_times(&profile.threads[0].roots), expected);
    assert_eq!(profile.stats.core_wait_ns, 60);
    assert_eq!(profile.stats.pause_ns, 60);
}

/// work [0, 1000] is paused 300 ticks by tendril (parked: off the CPU 350..650, `held`
/// ticks of it waiting for a core tendril held), and waits 100 more on its own
/// (700..800).
fn work_paused_off_the_cpu(held: u64) -> Profile {
    let mut builder = exact_builder();
    builder.measure_cpu();
    builder.push_off_cpu(1, 350, 650, held);
    builder.push_off_cpu(1, 700, 800, 0);
    builder.push_events(1, &[entry(2, 0), pause(300), entry(1, 690), exit(1, 900)]);
    builder.push_events(1, &[exit(2, 1000)]);
    snapshot(&builder)
}

#[test]
fn a_pause_spent_off_the_cpu_is_not_taken_out_twice() {
    // A wait for a core inside the agent's pause was measured by the pause already.
    for held in [0, 300] {
        let profile = work_paused_off_the_cpu(held);
        assert_eq!(
            cpu_times(&profile.threads[0].roots),
            vec![
                ("work".to_owned(), 1, 700, 490, 600, 490),
                ("fib".to_owned(), 1, 210, 210, 110, 110),
            ],
            "{held} ticks held"
        );
        assert_eq!(profile.stats.core_wait_ns, 0);
    }
}

#[test]
fn a_wait_for_a_core_outside_every_recorded_frame_is_no_pause() {
    let mut builder = exact_builder();
    builder.measure_cpu();
    // The thread waits for a core tendril held at 10..50, before it enters main.
    builder.push_off_cpu(1, 10, 50, 40);
    builder.push_events(1, &[entry(0, 100), exit(0, 200)]);
    let profile = snapshot(&builder);
    assert_eq!(profile.stats.core_wait_ns, 0);
    assert_eq!(profile.stats.pause_ns, 0);
    assert_eq!(profile.merged.roots[0].total_ns, 100);
}

#[test]
fn without_off_cpu_intervals_there_are_no_cpu_times() {
    let mut builder = exact_builder();
    builder.push_events(1, &[entry(0, 0), exit(0, 10)]);
    let profile = snapshot(&builder);
    assert_eq!(profile.merged.roots[0].cpu_ns, None);
}

#[test]
fn each_node_estimates_its_error_from_the_calibrations_spread() {
    let mut builder = CctBuilder::new(Calibration {
        tsc_hz: 1_000_000_000,
        inner_ns: 0.0,
        outer_ns: 0.0,
        inner_spread_ns: 2.0,
        outer_spread_ns: 5.0,
        ..Default::default()
    })
    .unwrap();
    // main calls work twice, and work calls fib once each time.
    builder.push_events(
        1,
        &[
            entry(0, 0),
            entry(2, 10),
            entry(1, 20),
            exit(1, 30),
            exit(2, 40),
            entry(2, 50),
            entry(1, 60),
            exit(1, 70),
            exit(2, 80),
            exit(0, 1000),
        ],
    );
    let profile = snapshot(&builder);
    let main = &profile.merged.roots[0];
    // main: 1 call × 2 ns + 4 calls below × 5 ns; work: 2 × 2 + 2 × 5; fib: 2 × 2.
    assert_eq!(main.error_ns, Some(22));
    assert_eq!(main.children[0].error_ns, Some(14));
    assert_eq!(main.children[0].children[0].error_ns, Some(4));
    // Without a spread (an older agent's calibration), no estimate.
    let plain = snapshot(&exact_builder());
    assert!(plain.merged.roots.iter().all(|n| n.error_ns.is_none()));
}

#[test]
fn many_switches_before_the_next_event_keep_their_off_cpu_time_in_bounded_memory() {
    let mut builder = exact_builder();
    builder.measure_cpu();
    builder.push_events(1, &[entry(0, 0)]);
    // 10,000 switches of 5 ticks each, far more than are kept one by one.
    for i in 0..10_000u64 {
        builder.push_off_cpu(1, 10 + i * 10, 15 + i * 10, 0);
    }
    builder.push_events(1, &[exit(0, 200_000)]);
    let profile = snapshot(&builder);
    let main = &profile.merged.roots[0];
    assert_eq!(main.total_ns, 200_000);
    assert_eq!(main.cpu_ns, Some(200_000 - 50_000));
}

#[test]
fn the_in_situ_calibrations_events_are_left_out_and_its_correction_applies_from_then_on() {
    let mut builder = exact_builder();
    builder.set_root_functions([0]);
    let mut own = OwnFunctions::default();
    own.set(HookShape::Jump, 3);
    builder.ignore_functions(own);
    // main [0, 100) calls work [10, 30), with a calibration call [12, 14) inside work
    // (its time removed by the agent's Adjust of 2 ticks).
    builder.push_events(
        1,
        &[
            entry(0, 0),
            entry(2, 10),
            entry(3, 12),
            exit(3, 14),
            pause(2),
            exit(2, 30),
        ],
    );
    // From now on 1 ns of inner and 5 ns of outer time per call are removed.
    builder
        .set_calibration(Calibration {
            tsc_hz: 1_000_000_000,
            inner_ns: 1.0,
            outer_ns: 5.0,
            in_situ_batches: 5,
            ..Default::default()
        })
        .unwrap();
    builder.push_events(1, &[exit(0, 100)]);
    let profile = snapshot(&builder);
    assert_eq!(profile.calibration.in_situ_batches, 5);
    let main = &profile.merged.roots[0];
    let work = &main.children[0];
    // work closed before the change: 20 − 2 (the batch) = 18, uncorrected; main after
    // it: 100 − 2 − 1 = 97, less work's outer cost when it returned, 0. No node for
    // the calibration function.
    assert_eq!(
        (work.name.as_str(), work.calls, work.total_ns),
        ("work", 1, 18)
    );
    assert!(work.children.is_empty(), "{work:?}");
    assert_eq!((main.calls, main.total_ns), (1, 97));
}

#[test]
fn every_call_is_corrected_with_its_own_hook_shapes_cost() {
    // t_I/t_O: 1/5 ns for a 5-byte jump, 2/7 for a pad jump, 3/11 for a call thunk.
    let shape = |inner_ns, outer_ns| {
        Some(ShapeCalibration {
            inner_ns,
            outer_ns,
            ..Default::default()
        })
    };
    let mut builder = CctBuilder::new(Calibration {
        tsc_hz: 1_000_000_000,
        inner_ns: 1.0,
        outer_ns: 5.0,
        pad_jump: shape(2.0, 7.0),
        call_thunk: shape(3.0, 11.0),
        ..Default::default()
    })
    .unwrap();
    // main (jump) [0, 200) calls work (pad jump) [10, 100), which calls leaf (thunk)
    // twice, [20, 40) and [50, 70); a third function (thunk) still open at the end.
    builder.push_events(
        1,
        &[
            entry(0, 0),
            shaped_entry(1, HookShape::PadJump, 10),
            shaped_entry(2, HookShape::CallThunk, 20),
            exit(2, 40),
            shaped_entry(2, HookShape::CallThunk, 50),
            exit(2, 70),
            exit(1, 100),
            shaped_entry(3, HookShape::CallThunk, 150),
            exit(0, 200),
        ],
    );
    let profile = snapshot(&builder);
    let main = &profile.merged.roots[0];
    let work = &main.children[0];
    let leaf = &work.children[0];
    // leaf: 2 × (20 − 3) = 34. work: 90 − 2 − 2·11 = 66.
    assert_eq!((leaf.calls, leaf.total_ns), (2, 34));
    assert_eq!(work.total_ns, 66);
    // main: 200 − 1 − (7 + 2·11) − 11 (the third call, unwound by main's exit).
    assert_eq!(main.total_ns, 200 - 1 - 29 - 11);
}
