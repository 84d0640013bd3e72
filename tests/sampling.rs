//! Sampling real processes from the outside (`tendril sample`, `compare`, the
//! `sampling` module): the split a fixture is known to have, unwinding code without
//! frame pointers to `main`, stripped code named `module+0x…`, a thread that blocks every
//! signal, and a target left exactly as it was.
//!
//! The one idea: CPU-clock samples count only the time a thread runs, so the shares of
//! a CPU-bound thread's functions do not move with the machine's load; the tests wait
//! until enough samples arrived (never a fixed sleep) and then assert those shares.

use crate::common;

use common::{Target, code_bytes_match_file, tendril};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tendril::profile::{Node, Profile, Visit, walk};
use tendril::sampling::{Sampler, SamplerOptions};

/// The longest a test waits for its samples (a loaded machine gives fewer per second).
const SAMPLES_TIMEOUT: Duration = Duration::from_secs(90);

/// Samples `pid` until `enough` says the profile so far has what the test needs.
fn sample_until(pid: i32, options: SamplerOptions, enough: impl Fn(&Profile) -> bool) -> Profile {
    let mut sampler = Sampler::start(pid, options).expect("sampling starts");
    let deadline = Instant::now() + SAMPLES_TIMEOUT;
    let mut last_check = Instant::now();
    loop {
        sampler.poll(Duration::from_millis(50)).expect("poll");
        if last_check.elapsed() >= Duration::from_millis(250) {
            last_check = Instant::now();
            if enough(&sampler.profile()) {
                return sampler.finish();
            }
        }
        assert!(
            Instant::now() < deadline,
            "not enough samples of process {pid} within {SAMPLES_TIMEOUT:?}: {} so far",
            sampler.trees().samples
        );
    }
}

/// Self samples per function name, summed over all contexts of the merged tree.
fn self_samples(profile: &Profile) -> HashMap<String, u64> {
    let mut counts = HashMap::new();
    let _ = walk(&profile.merged.roots, |step| -> Result<(), ()> {
        if let Visit::Enter { node, .. } = step {
            let inner: u64 = node.children.iter().filter_map(|c| c.samples).sum();
            *counts.entry(node.name.clone()).or_default() +=
                node.samples.unwrap_or(0).saturating_sub(inner);
        }
        Ok(())
    });
    counts
}

/// Every call path (names from the root, `;`-joined) with its samples.
fn paths(roots: &[Node]) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut path: Vec<&str> = Vec::new();
    let _ = walk(roots, |step| -> Result<(), ()> {
        match step {
            Visit::Enter { node, .. } => {
                path.push(&node.name);
                out.push((path.join(";"), node.samples.unwrap_or(0)));
            }
            Visit::Leave { .. } => {
                path.pop();
            }
        }
        Ok(())
    });
    out
}

fn parts_samples(profile: &Profile) -> u64 {
    let counts = self_samples(profile);
    ["part_a", "part_b", "part_c"]
        .iter()
        .map(|name| counts.get(*name).copied().unwrap_or(0))
        .sum()
}

/// `tendril compare SAMPLED RECORDED`'s output, the two files removed after.
fn compare_and_remove(sampled: &Path, recorded: &Path) -> String {
    let compare = tendril()
        .arg("compare")
        .arg(sampled)
        .arg(recorded)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(sampled);
    let _ = std::fs::remove_file(recorded);
    assert!(
        compare.status.success(),
        "{}",
        String::from_utf8_lossy(&compare.stderr)
    );
    String::from_utf8_lossy(&compare.stdout).into_owned()
}

fn scratch_file(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tendril-sampling-{}-{name}", std::process::id()))
}

#[test]
fn the_split_fixture_samples_within_5_points_of_25_50_25() {
    let target = Target::spawn("sampled", &["split"]);
    let profile = sample_until(target.pid(), SamplerOptions::default(), |p| {
        parts_samples(p) >= 2000
    });
    let counts = self_samples(&profile);
    let total = parts_samples(&profile) as f64;
    for (name, expected) in [("part_a", 25.0), ("part_b", 50.0), ("part_c", 25.0)] {
        let share = 100.0 * counts[name] as f64 / total;
        eprintln!("{name}: {share:.1}% of {total} samples (expected {expected}%)");
        assert!(
            (share - expected).abs() <= 5.0,
            "{name}: {share:.1}% of the parts' samples, expected {expected}% ± 5 ({counts:?})"
        );
    }
    assert_eq!(profile.scheme, "sampled");
    let sampling = profile.sampling.as_ref().expect("sampling info");
    assert_eq!(sampling.clock, "cpu");
    assert_eq!(sampling.rate_hz, 499);
}

#[test]
fn code_without_frame_pointers_unwinds_to_main() {
    let binary = common::fixture("sampled");
    let objdump = std::process::Command::new("objdump")
        .args(["-d", "--no-show-raw-insn"])
        .arg(&binary)
        .output()
        .expect("objdump runs");
    let text = String::from_utf8_lossy(&objdump.stdout);
    let part_a = text
        .split("<part_a>:")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .expect("part_a in the disassembly");
    assert!(
        !part_a.contains("%rbp"),
        "the fixture must not use a frame pointer in part_a:\n{part_a}"
    );

    let target = Target::spawn("sampled", &["split"]);
    let profile = sample_until(target.pid(), SamplerOptions::default(), |p| {
        parts_samples(p) >= 300
    });
    let paths = paths(&profile.merged.roots);
    let in_parts: Vec<&(String, u64)> = paths
        .iter()
        .filter(|(path, _)| {
            path.ends_with(";part_a") || path.ends_with(";part_b") || path.ends_with(";part_c")
        })
        .collect();
    assert!(!in_parts.is_empty(), "no samples in the parts: {paths:?}");
    for (path, samples) in &in_parts {
        assert!(
            path.contains(";main;split_round;part_"),
            "{samples} samples were not walked up to main: {path}"
        );
    }
    let sampling = profile.sampling.as_ref().expect("sampling info");
    assert_eq!(
        sampling.truncated_stacks, 0,
        "every stack walks to its outermost frame"
    );
}

#[test]
fn stripped_code_is_named_module_plus_offset() {
    let target = Target::spawn("sampled_stripped", &["split"]);
    let module_frames = |p: &Profile| -> Vec<(String, u64)> {
        let mut names = HashMap::<String, u64>::new();
        let _ = walk(&p.merged.roots, |step| -> Result<(), ()> {
            if let Visit::Enter { node, .. } = step
                && node.module == "sampled_stripped"
            {
                *names.entry(node.name.clone()).or_default() += node.samples.unwrap_or(0);
            }
            Ok(())
        });
        names.into_iter().collect()
    };
    let profile = sample_until(target.pid(), SamplerOptions::default(), |p| {
        p.sampling.as_ref().is_some_and(|s| s.samples >= 300)
    });
    let names = module_frames(&profile);
    // main, split_round and the three parts at least, each an FDE of its own.
    assert!(
        names.len() >= 5,
        "too few functions of the stripped module: {names:?}"
    );
    for (name, _) in &names {
        let offset = name
            .strip_prefix("sampled_stripped+0x")
            .unwrap_or_else(|| panic!("{name} is not named module+0xOFFSET"));
        assert!(
            u64::from_str_radix(offset, 16).is_ok(),
            "{name}: the offset is not hexadecimal"
        );
    }
}

#[test]
fn a_thread_that_blocks_every_signal_is_sampled() {
    let target = Target::spawn("sampled", &["blocked"]);
    let tid: u32 = target
        .ready_line()
        .and_then(|line| line.split("tid=").nth(1))
        .and_then(|tid| tid.trim().parse().ok())
        .expect("the ready line names the thread");
    let status = std::fs::read_to_string(format!("/proc/{}/task/{tid}/status", target.pid()))
        .expect("the thread's status");
    let blocked = status
        .lines()
        .find_map(|line| line.strip_prefix("SigBlk:"))
        .map(str::trim)
        .expect("SigBlk");
    assert_eq!(
        u64::from_str_radix(blocked, 16).map(u64::count_ones).ok(),
        Some(62),
        "the thread blocks every signal it can ({blocked})"
    );
    let thread_samples = |p: &Profile| -> u64 {
        p.threads
            .iter()
            .find(|t| t.tid == tid)
            .map_or(0, |t| t.roots.iter().filter_map(|r| r.samples).sum())
    };
    let profile = sample_until(target.pid(), SamplerOptions::default(), |p| {
        thread_samples(p) >= 100
    });
    let thread = profile.threads.iter().find(|t| t.tid == tid).unwrap();
    assert_eq!(thread.name, "blocked");
    let spinning: u64 = paths(&thread.roots)
        .iter()
        .filter(|(path, _)| path.ends_with("blocked_thread;blocked_spin"))
        .map(|(_, samples)| samples)
        .sum();
    assert!(
        spinning * 10 >= thread_samples(&profile) * 9,
        "most of the thread's samples are in blocked_spin: {spinning} of {}",
        thread_samples(&profile)
    );
}

#[test]
fn sampling_leaves_the_targets_code_and_mappings_unchanged() {
    let target = Target::spawn("sampled", &["split"]);
    let pid = target.pid();
    let maps_before = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let threads_before = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count();
    let file = scratch_file("unchanged.json");
    let output = tendril()
        .args([
            "sample",
            &pid.to_string(),
            "--duration",
            "1",
            "--rate",
            "999",
            "-o",
        ])
        .arg(&file)
        .output()
        .expect("tendril runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "tendril sample failed: {stderr}");
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap(),
        maps_before,
        "sampling maps nothing into the target"
    );
    assert_eq!(
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .count(),
        threads_before,
        "sampling starts no thread in the target"
    );
    code_bytes_match_file(pid).expect("the target's code is its files' code");
    let profile = Profile::load(&file).expect("a profile");
    let _ = std::fs::remove_file(&file);
    assert_eq!(profile.scheme, "sampled");
    assert_eq!(profile.pid, pid as u32);
    assert!(profile.merged.roots.iter().all(|r| r.samples.is_some()));
    assert!(stderr.contains("samples from 1 thread"), "{stderr}");
}

#[test]
fn report_and_exports_read_a_sampled_profile() {
    let target = Target::spawn("sampled", &["split"]);
    let profile = sample_until(target.pid(), SamplerOptions::default(), |p| {
        parts_samples(p) >= 100
    });
    let file = scratch_file("report.json");
    std::fs::write(&file, serde_json::to_vec(&profile).unwrap()).unwrap();
    let report = tendril().arg("report").arg(&file).output().unwrap();
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(report.status.success());
    assert!(text.contains("sampled:"), "{text}");
    assert!(text.contains("   samples    total ms"), "{text}");
    assert!(text.contains("part_b (sampled)"), "{text}");
    for format in ["hot", "folded", "speedscope", "chrome", "svg"] {
        let out = tendril()
            .arg("report")
            .arg(&file)
            .args(["--format", format])
            .output()
            .unwrap();
        assert!(
            out.status.success() && !out.stdout.is_empty(),
            "{format}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::fs::remove_file(&file);
}

#[test]
fn compare_of_a_sampled_and_an_instrumented_profile_overlaps_by_at_least_0_85() {
    // The instrumented times are wall-clock: on a loaded machine the time a thread
    // waits for a core counts as the function's own, in chunks of a whole time slice
    // (milliseconds, against 0.1 ms calls). A real-time priority keeps the fixture on
    // a core, so its wall-clock times are its CPU times, as the samples are.
    let target = Target::spawn_realtime("sampled", &["split"]);
    let pid = target.pid();
    let sampled = sample_until(pid, SamplerOptions::default(), |p| parts_samples(p) >= 1000);
    let sampled_file = scratch_file("compare-sampled.json");
    std::fs::write(&sampled_file, serde_json::to_vec(&sampled).unwrap()).unwrap();
    let recorded_file = scratch_file("compare-recorded.json");
    let record = tendril()
        .args([
            "record",
            &pid.to_string(),
            "--root",
            "split_round",
            "--duration",
            "2",
            "-o",
        ])
        .arg(&recorded_file)
        .output()
        .unwrap();
    assert!(
        record.status.success(),
        "record: {}",
        String::from_utf8_lossy(&record.stderr)
    );
    let text = compare_and_remove(&sampled_file, &recorded_file);
    let first = text.lines().next().unwrap_or_default();
    let words: Vec<&str> = first.split_whitespace().collect();
    assert!(
        first.starts_with("overlap ") && first.contains("  hotcover ") && words.len() == 4,
        "first line: {first:?}"
    );
    let overlap: f64 = words[1].parse().unwrap();
    let hotcover: f64 = words[3].parse().unwrap();
    eprintln!("{text}");
    assert!(overlap >= 0.85, "overlap {overlap} < 0.85:\n{text}");
    assert_eq!(hotcover, 1.0, "{text}");
    assert!(text.contains("below split_round"), "{text}");
}

#[test]
fn a_process_another_user_cannot_sample_is_refused_in_one_line() {
    let target = Target::spawn("sampled", &["split"]);
    let output = tendril()
        .args([
            "sample",
            &target.pid().to_string(),
            "--duration",
            "1",
            "-o",
            "-",
        ])
        .uid(65534)
        .gid(65534)
        .output()
        .expect("tendril runs as nobody");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(output.stdout.is_empty());
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.starts_with("tendril: ") && stderr.contains("permission denied"),
        "{stderr}"
    );
    assert!(stderr.contains("or as root"), "says what to do: {stderr}");
    let missing = tendril().args(["sample", "999999999"]).output().unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no process"));
}

use std::os::unix::process::CommandExt;

/// Raw records of every thread of `pid`, as the kernel wrote them, until at least
/// `count` samples arrived (under load the kernel adds throttling and lost records).
fn raw_samples(pid: i32, count: usize) -> Vec<Vec<u8>> {
    use tendril::sampling::perf::{EventKind, PerfEvent, Ring};
    let options = SamplerOptions::default();
    let mut rings = Vec::new();
    for tid in tendril::process::thread_ids(pid).expect("thread ids") {
        let kind = EventKind::CpuClock {
            period_ns: 1_000_000,
        };
        let event = PerfEvent::open(tid, kind, options.stack_bytes, false, 1).expect("event");
        let ring = Ring::map(&event, options.ring_pages).expect("ring");
        event.enable().expect("enable");
        rings.push((event, ring));
    }
    // `perf_event_header.type` of a sample.
    const PERF_RECORD_SAMPLE: u32 = 9;
    let is_sample = |bytes: &Vec<u8>| bytes.get(..4) == Some(&PERF_RECORD_SAMPLE.to_le_bytes());
    let mut records = Vec::new();
    let deadline = Instant::now() + SAMPLES_TIMEOUT;
    while records.iter().filter(|r| is_sample(r)).count() < count {
        assert!(
            Instant::now() < deadline,
            "{} records of {count} samples",
            records.len()
        );
        std::thread::sleep(Duration::from_millis(5));
        for (_, ring) in rings.iter_mut() {
            ring.drain(|bytes| records.push(bytes.to_vec()));
        }
    }
    records
}

#[test]
fn stack_marking_gives_the_trees_a_full_walk_of_every_sample_gives() {
    // 300 frames, and 1100: deeper than a walk keeps (1,024 frames, then truncated).
    for depth in ["300", "1100"] {
        let target = Target::spawn("sampled", &["deep", depth]);
        let records = raw_samples(target.pid(), 200);
        let walker = |marking: bool| {
            let mut walker =
                tendril::sampling::walker::SampleWalker::for_process(target.pid(), 1_000_000)
                    .expect("walker");
            walker.set_marking(marking);
            for record in &records {
                walker.add_record(record);
            }
            walker
        };
        let (marked, plain) = (walker(true), walker(false));
        let trees = |walker: &tendril::sampling::walker::SampleWalker| {
            walker.trees.merged.to_nodes(&walker.trees.functions)
        };
        assert_eq!(trees(&marked), trees(&plain), "depth {depth}");
        assert_eq!(marked.truncated, plain.truncated, "depth {depth}");
        if depth == "1100" {
            assert_eq!(
                plain.truncated, plain.trees.samples,
                "every walk is cut at 1,024"
            );
        }
        // (A sample the kernel took without the thread's user registers is not walked.)
        assert!(marked.trees.samples >= 190, "{}", marked.trees.samples);
        // Spinning at the bottom of the recursion: nearly every walk meets the previous
        // one's frames a frame or two in.
        assert!(
            marked.marks.frames_reused > 250 * (marked.trees.samples - 10),
            "depth {depth}: {} frames reused over {} samples",
            marked.marks.frames_reused,
            marked.trees.samples
        );
        assert_eq!(plain.marks.frames_reused, 0);
    }
}

#[test]
fn compare_reads_a_recording_as_a_sampled_stack_shows_its_tail_calls() {
    // calltree's compute_block() and format_digest() end in a tail call of mix(), and
    // mix() in one of scramble(): a sampled stack in mix or scramble lacks their
    // caller. work_round() both calls mix() and tail-calls it: not marked.
    let target = Target::spawn("calltree", &["1"]);
    let pid = target.pid();
    let recorded_file = scratch_file("tail-recorded.json");
    let record = tendril()
        .args(["record", &pid.to_string(), "--root", "work_round"])
        .args(["--duration", "1", "-o"])
        .arg(&recorded_file)
        .output()
        .unwrap();
    assert!(
        record.status.success(),
        "{}",
        String::from_utf8_lossy(&record.stderr)
    );
    let recorded = Profile::load(&recorded_file).unwrap();
    let tail_calls = [
        ("compute_block", "mix"),
        ("format_digest", "mix"),
        ("mix", "scramble"),
    ];
    let mut scramble_under_mix = 0;
    let _ = walk(&recorded.merged.roots, |step| -> Result<(), ()> {
        if let Visit::Enter { node, .. } = step {
            for child in &node.children {
                let tail = tail_calls.contains(&(node.name.as_str(), child.name.as_str()));
                scramble_under_mix += usize::from(node.name == "mix" && child.name == "scramble");
                assert_eq!(child.tail_call, tail, "{} under {}", child.name, node.name);
            }
        }
        Ok(())
    });
    assert!(scramble_under_mix > 0, "scramble under mix was recorded");
    let sampled = sample_until(pid, SamplerOptions::default(), |p| {
        p.sampling.as_ref().is_some_and(|s| s.samples >= 200)
    });
    let sampled_file = scratch_file("tail-sampled.json");
    std::fs::write(&sampled_file, serde_json::to_vec(&sampled).unwrap()).unwrap();
    let text = compare_and_remove(&sampled_file, &recorded_file);
    let moved = text
        .lines()
        .find_map(|line| line.strip_prefix("tail calls: "))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<usize>().ok());
    assert!(moved.is_some_and(|n| n >= scramble_under_mix), "{text}");
}
