//! What a recording leaves in the target's memory once it is over: the rings' pages are
//! given back, and the library pages tendril patched are the file's again (no private
//! copies of them stay, and the library's code is one mapping again, as it was). The
//! agent itself stays resident, dormant.

use crate::common;

use common::{Target, code_bytes_match_file, tendril};

/// The kB of `field` (`Rss`, `Anonymous`) of the mappings of `pid` whose line names
/// `name`, from `/proc/PID/smaps`.
fn smaps_kb(pid: i32, name: &str, field: &str) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut in_mapping = false;
    let mut total = 0;
    for line in smaps.lines() {
        let is_header = line
            .split_whitespace()
            .next()
            .is_some_and(|range| range.contains('-') && !range.ends_with(':'));
        if is_header {
            in_mapping = line.contains(name);
        } else if in_mapping && let Some(rest) = line.strip_prefix(&format!("{field}:")) {
            total += rest
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .unwrap();
        }
    }
    total
}

/// How many lines of `/proc/PID/maps` name `name`.
fn mapping_count(pid: i32, name: &str) -> usize {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines().filter(|line| line.contains(name)).count()
}

/// Whether the system refuses memory beyond its commit limit: tendril then leaves a
/// patched library's code mapping split (joining it would charge the whole mapping).
fn strict_overcommit() -> bool {
    std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|m| m.trim() == "2")
}

#[test]
fn a_finished_recording_leaves_no_ring_memory_no_private_copy_and_no_split_of_patched_code() {
    let mut target = Target::spawn("calltree", &["2"]);
    let pid = target.pid();
    target.steady_checksum(2, std::time::Duration::from_secs(60));
    let libc_copies_before = smaps_kb(pid, "libc.so", "Anonymous");
    let libc_mappings_before = mapping_count(pid, "libc.so");
    let output = tendril()
        .args(["record", &pid.to_string(), "--root", "work_round"])
        .args(["--duration", "1", "-o", "/dev/null"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The session ended with the command; its thread in the agent gives the memory
    // back as it ends. What stays: the header, the registry's pages of the ids used,
    // each ring's header page.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut rings = smaps_kb(pid, "tendril-rings", "Rss");
    let mut libc_mappings = mapping_count(pid, "libc.so");
    while (rings >= 2 * 1024 || libc_mappings != libc_mappings_before)
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
        rings = smaps_kb(pid, "tendril-rings", "Rss");
        libc_mappings = mapping_count(pid, "libc.so");
    }
    assert!(rings < 2 * 1024, "the rings still hold {rings} kB");
    if strict_overcommit() {
        eprintln!("note: strict overcommit here: libc's code stays split, as documented");
    } else {
        assert_eq!(
            libc_mappings,
            libc_mappings_before,
            "libc's mappings stayed split:\n{}",
            std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap()
        );
    }
    assert_eq!(
        smaps_kb(pid, "libc.so", "Anonymous"),
        libc_copies_before,
        "private copies of libc's code stayed"
    );
    code_bytes_match_file(pid).unwrap();
}
