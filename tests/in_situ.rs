//! The hooks' cost where they run: a recording thread's ring is faulted in ahead of
//! it, a part at a time (so the hooks take no page fault on its first lap), and no more
//! of it than its events need; the hooks are calibrated on the target's own threads
//! while the recording runs, and nothing of that shows in the tree, the counts or the
//! target's code afterwards.

use crate::common;

use common::{Recording, Target, agent_code_matches_file, all_nodes, code_bytes_match_file};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(120);

/// Resident kilobytes of the target's mapping of the rings file.
fn rings_resident_kib(pid: i32) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut in_rings = false;
    let mut resident = 0;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            in_rings = line.contains("tendril-rings");
        } else if in_rings && first == "Rss:" {
            resident += line
                .split_whitespace()
                .nth(1)
                .unwrap()
                .parse::<u64>()
                .unwrap();
        }
    }
    resident
}

#[test]
fn a_ring_is_in_memory_as_far_as_its_events_need_and_no_further() {
    let mut target = Target::spawn("tightcall", &[]);
    // Every call timed: untimed (adaptive timing, when the judge runs before the run is
    // over, as it did in a clean-clone CI run), `mid` and `leaf` would write too few
    // events for a lap.
    let recording = Recording::start(target.pid(), &["--root", "root", "--time-all"]);
    let before = rings_resident_kib(target.pid());
    // 1 + 3·100 calls: 602 events (9.4 KiB): the ring's parts of one page, one page and
    // two pages are in memory (16 KiB), not a whole part of 256 KiB.
    target.write_stdin("run 100\n");
    target.expect_line("run calls 301 ", TIMEOUT);
    let small = rings_resident_kib(target.pid());
    // 1 + 3·200,000 calls: 1.2 M events, more than one lap of the 8 MiB ring.
    target.write_stdin("run 200000\n");
    let line = target.expect_line("run calls 600001 ", TIMEOUT);
    let large = rings_resident_kib(target.pid());
    let recorded = recording.finish();
    let first_part = small - before;
    assert!(
        (8..=64).contains(&first_part),
        "{first_part} KiB of the ring resident after its first 602 events (16 B each): \
         a page first, then parts as large as all before them (16 KiB), and no more"
    );
    assert!(
        large >= 8192,
        "{large} KiB resident after more than a lap of an 8 MiB ring"
    );
    let root = common::node_at(&recorded.profile.merged.roots, &["root"]).unwrap();
    assert_eq!(root.calls, 2, "both runs recorded: {line}");
    let mid = common::node_at(&recorded.profile.merged.roots, &["root", "mid"]).unwrap();
    assert_eq!(mid.calls, 200_100);
    assert_eq!(recorded.profile.stats.lost_events, 0);
}

#[test]
fn the_hooks_are_calibrated_on_the_targets_threads_and_leave_no_trace() {
    let mut target = Target::spawn("tightcall", &[]);
    target.write_stdin("run 200000\n");
    let bare = target.expect_line("run calls 600001 ", TIMEOUT);
    // Every call timed: adaptive timing would soon count `mid` and `leaf` untimed, and
    // their calls would then write no events to make batches of (it did so beside a
    // busy process, where the judge ran before the run was over).
    let recording = Recording::start(target.pid(), &["--root", "root", "--time-all"]);
    // 1.2 M events: a batch every 32 K events of the thread.
    target.write_stdin("run 200000\n");
    let recorded_line = target.expect_line("run calls 600001 ", TIMEOUT);
    let recorded = recording.finish();
    let checksum = |line: &str| line.split_whitespace().last().unwrap().to_string();
    assert_eq!(
        checksum(&recorded_line),
        checksum(&bare),
        "the target computes the same"
    );

    let calibration = &recorded.profile.calibration;
    assert!(
        calibration.in_situ_batches >= 5,
        "in-situ batches: {calibration:?}"
    );
    assert!(calibration.start_outer_ns > 0.0 && calibration.outer_ns > 0.0);
    // The pad-jump and call-thunk hooks are measured on functions of their own, in the
    // same batches.
    for (shape, values) in [
        ("pad jump", calibration.pad_jump),
        ("call thunk", calibration.call_thunk),
    ] {
        let values = values.unwrap_or_else(|| panic!("no {shape} calibration: {calibration:?}"));
        assert!(
            values.in_situ_batches >= 5 && values.outer_ns > 0.0,
            "{shape}: {values:?}"
        );
    }
    let roots = &recorded.profile.merged.roots;
    assert!(
        all_nodes(roots).iter().all(|n| !n.name.contains("tendril")),
        "the calibration's calls are not in the tree"
    );
    let root = common::node_at(roots, &["root"]).unwrap();
    let mid = common::node_at(roots, &["root", "mid"]).unwrap();
    let leaf = common::node_at(roots, &["root", "mid", "leaf"]).unwrap();
    assert_eq!((root.calls, mid.calls, leaf.calls), (1, 200_000, 400_000));
    assert_eq!(root.children.len(), 1);
    assert_eq!(mid.children.len(), 1);
    let mut report = Vec::new();
    let details = tendril::profile::report::TextOptions {
        columns: None,
        details: true,
    };
    tendril::profile::report::write_report_with(
        &recorded.profile,
        Default::default(),
        details,
        &mut report,
    )
    .unwrap();
    let report = String::from_utf8(report).unwrap();
    assert!(report.contains("measured in situ"), "{report}");
    assert!(report.contains("call-thunk hooks: "), "{report}");

    code_bytes_match_file(target.pid()).unwrap();
    agent_code_matches_file(target.pid()).unwrap();
    target.write_stdin("run 1000\n");
    target.expect_line("run calls 3001 ", TIMEOUT);
}
