//! A recording thread's ring is faulted in ahead of it, a part at a time (so the hooks
//! take no page fault on its first lap), and no more of it than its events need.

mod common;

use common::{Recording, Target};
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
    let mut recording = Recording::start(target.pid(), &["--root", "root"]);
    recording.wait_for_line("tendril: recording ", TIMEOUT);
    let before = rings_resident_kib(target.pid());
    // 1 + 3·100 calls: 602 events, the first part of the ring (16,384 events, 256 KiB).
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
        (256..1024).contains(&first_part),
        "{first_part} KiB of the ring resident after its first 602 events (16 B each): \
         the first part, 256 KiB, is faulted in before they are written, and no more"
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
