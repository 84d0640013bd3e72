//! The listing of GCC's build of the `branches` fixture's functions (their real bytes),
//! with the counts one round gives.

use super::*;
use crate::edge_analysis::derived::tests::{classify, dispatch, trip, trip_with_paths};
use std::time::Duration;

const TRIP: [u8; 53] = [
    0x85, 0xff, 0x74, 0x2c, 0x31, 0xc0, 0x31, 0xc9, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x89, 0xc6, 0x89, 0xca, 0x0f, 0xaf, 0xf0, 0xc1, 0xea, 0x03, 0x83, 0xc0, 0x01, 0x31, 0xf2, 0x01,
    0xd1, 0x39, 0xc7, 0x75, 0xeb, 0x89, 0xc8, 0xc3, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x31, 0xc9, 0x89, 0xc8, 0xc3,
];

const CLASSIFY: [u8; 45] = [
    0x69, 0xc7, 0xab, 0xaa, 0xaa, 0xaa, 0x3d, 0x55, 0x55, 0x55, 0x55, 0x77, 0x13, 0x89, 0xf8, 0xba,
    0xab, 0xaa, 0xaa, 0xaa, 0x48, 0x0f, 0xaf, 0xc2, 0x48, 0xc1, 0xe8, 0x21, 0xc3, 0x0f, 0x1f, 0x00,
    0x8d, 0x04, 0xfd, 0x00, 0x00, 0x00, 0x00, 0x29, 0xf8, 0x83, 0xc0, 0x01, 0xc3,
];

const DISPATCH: [u8; 96] = [
    0x83, 0xff, 0x06, 0x0f, 0x87, 0x77, 0xfc, 0xff, 0xff, 0x48, 0x8d, 0x15, 0x94, 0x0b, 0x00, 0x00,
    0x89, 0xff, 0x48, 0x63, 0x04, 0xba, 0x48, 0x01, 0xd0, 0xff, 0xe0, 0x0f, 0x1f, 0x44, 0x00, 0x00,
    0x89, 0xf0, 0xd1, 0xe8, 0xc3, 0x0f, 0x1f, 0x00, 0x89, 0xf0, 0xf7, 0xd0, 0xc3, 0x0f, 0x1f, 0x00,
    0x8d, 0x46, 0x01, 0xc3, 0x0f, 0x1f, 0x40, 0x00, 0x8d, 0x04, 0x76, 0xc3, 0x0f, 0x1f, 0x40, 0x00,
    0x89, 0xf0, 0x83, 0xf0, 0x55, 0xc3, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x8d, 0x46, 0xf9, 0xc3, 0x0f, 0x1f, 0x40, 0x00, 0x8d, 0x04, 0xb5, 0x00, 0x00, 0x00, 0x00, 0xc3,
];

fn listing_of(name: &str, code: &[u8], profile: &EdgeProfile) -> String {
    let about = About {
        function: name.into(),
        module: "branches".into(),
        pid: 4242,
        size: code.len() as u64,
        elapsed: Duration::from_millis(2000),
        threads: 1,
    };
    let name_of = |address: u64| (address == 0x10e0).then(|| "dispatch.cold".to_string());
    let listing = Listing {
        about: &about,
        code,
        cold: &[],
        name_of: &name_of,
    };
    let mut out = Vec::new();
    write_text(&mut out, &listing, profile).unwrap();
    let text = String::from_utf8(out).unwrap();
    println!("{text}");
    text
}

fn line_with<'a>(text: &'a str, part: &str) -> &'a str {
    text.lines()
        .find(|line| line.contains(part))
        .unwrap_or_else(|| panic!("no line with {part:?} in:\n{text}"))
}

#[test]
fn a_loop_shows_its_head_branches_and_trips() {
    let text = listing_of("trip", &TRIP, &trip().profile());
    assert!(text.starts_with("trip (branches, process 4242) at 0x14c0, 53 bytes, 5 blocks\n"));
    assert!(text.contains("10 calls in 2.0 s from 1 thread;"), "{text}");
    // The entry block: count, share, and its branch's split.
    let entry = line_with(&text, "+0x0 ");
    assert!(entry.starts_with("▶"), "{entry}");
    assert!(entry.contains(" 10  100.0%  +0x0 "), "{entry}");
    let skip = line_with(&text, "je +0x30");
    assert!(skip.ends_with("taken 1 (10.0%) / not taken 9"), "{skip}");
    // The loop: its head line, then the body's count (450% of the calls).
    assert!(
        text.contains("↻ loop: 5.0 iterations per entry (9 entries, 36 back edges)\n"),
        "{text}"
    );
    assert!(line_with(&text, "+0x10   mov").contains(" 45  450.0%  +0x10 "));
    let back = line_with(&text, "jne +0x10");
    assert!(back.ends_with("taken 36 (80.0%) / not taken 9"), "{back}");
    assert!(
        text.contains("… 8 bytes no path reaches (padding)"),
        "{text}"
    );
    // The rarely run block is not marked hot (1 of 45 is under a tenth).
    assert!(line_with(&text, "+0x30   xor").starts_with(' '));
    assert!(
        text.trim_end()
            .ends_with("paths: not counted: not counted in this test"),
        "{text}"
    );
    assert!(
        text.lines().all(|l| l.chars().count() <= MAX_WIDTH),
        "{text}"
    );
}

#[test]
fn a_branch_out_of_the_function_is_named_and_a_table_lists_its_targets() {
    let text = listing_of("dispatch", &DISPATCH, &dispatch().profile());
    let bound = line_with(&text, "ja dispatch.cold");
    assert!(
        bound.ends_with("taken 20 (22.2%) / not taken 70"),
        "{bound}"
    );
    assert!(line_with(&text, "jmp rax").contains("+0x19"));
    let targets: Vec<&str> = text.lines().filter(|l| l.contains("→ ")).collect();
    assert_eq!(targets.len(), 7, "{text}");
    assert!(
        targets[0]
            .trim_start()
            .starts_with("→ +0x30  entry 0: 10 (14.3%)"),
        "{text}"
    );
    assert!(line_with(&text, "lea rdx,[rip+0xb94]").contains("+0x9"));
}

#[test]
fn a_two_way_branch_splits_its_block_count() {
    let text = listing_of("classify", &CLASSIFY, &classify().profile());
    let branch = line_with(&text, "ja +0x20");
    assert!(
        branch.ends_with("taken 200 (66.7%) / not taken 100"),
        "{branch}"
    );
    assert!(line_with(&text, "+0x20   lea").contains("200   66.7%  +0x20 "));
    assert!(
        text.contains("… 3 bytes no path reaches (padding)"),
        "{text}"
    );
    assert!(!text.contains("loop"), "{text}");
}

#[test]
fn a_function_never_called_says_so() {
    let mut counted = classify();
    counted.counts.values_mut().for_each(|c| *c = 0);
    let text = listing_of("classify", &CLASSIFY, &counted.profile());
    assert!(text.contains("classify was not called in the 2.0 s its edges were counted"));
    assert!(!text.contains('▶'), "{text}");
}

#[test]
fn index_ranges_are_compact() {
    assert_eq!(index_ranges(&[0, 1, 2, 3, 7, 9, 10]), "0-3, 7, 9-10");
    assert_eq!(index_ranges(&[5]), "5");
}

#[test]
fn the_hottest_paths_follow_the_code_as_block_offsets() {
    let text = listing_of("trip", &TRIP, &trip_with_paths().profile());
    assert!(
        text.contains("paths: 5 of 5 acyclic paths ran, 46 runs\n(a path ends"),
        "{text}"
    );
    let lines: Vec<&str> = text.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.contains("SHARE  PATH"))
        .unwrap();
    assert_eq!(lines[header + 1], "     28   60.9%  ↺ +0x10 ↺");
    assert!(lines[header + 2..].contains(&"      8   17.4%  +0x0 → +0x4 → +0x10 ↺"));
    assert!(lines[header + 2..].contains(&"      1    2.2%  +0x0 → +0x4 → +0x10 → +0x25"));
    assert!(
        text.lines().all(|l| l.chars().count() <= MAX_WIDTH),
        "{text}"
    );
}

#[test]
fn lost_and_unitemized_runs_are_said_even_when_no_path_was_counted() {
    let text = listing_of("trip", &TRIP, &trip().with_paths(&[], 7, 3).profile());
    assert!(
        text.contains("paths: 0 of 5 acyclic paths ran, 10 runs\n"),
        "{text}"
    );
    assert!(!text.contains("SHARE  PATH"), "{text}");
    assert!(
        text.contains("  7 runs of paths numbered 5 and above"),
        "{text}"
    );
    assert!(
        text.contains("  3 runs lost, counted under no number"),
        "{text}"
    );
    assert!(
        text.lines().all(|l| l.chars().count() <= MAX_WIDTH),
        "{text}"
    );
}
