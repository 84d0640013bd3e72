//! Code generated at run time, sampled: named from the perf map or the jitdump the
//! runtime wrote, unwound through to `main`, `[jit] 0x…` where nothing names it, a map
//! written after sampling began read on a later refresh, and names with terminal
//! escapes printed escaped. The `jit` fixture generates its code itself (every machine
//! can build it); Python 3.12+ and Node, where installed, are sampled too, and Python
//! recorded (`jit/runtimes.rs`). A recording that meets a call into the generated code shows it
//! as a marked leaf and never patches it (`jit/recorded.rs`).
//!
//! The one idea: the tests wait for what they look for — enough samples on the
//! expected path, the fixture's own lines — never for a fixed time; CPU-clock samples
//! come at the fixture's pace whatever the machine's load.

use crate::common;
#[path = "jit/recorded.rs"]
mod recorded;
#[path = "jit/runtimes.rs"]
mod runtimes;

use common::{RunningTendril, Target, tendril};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tendril::profile::{Node, Profile, Visit, walk};
use tendril::sampling::{Sampler, SamplerOptions};

/// The longest a test waits for its samples (a loaded machine gives fewer per second).
const SAMPLES_TIMEOUT: Duration = Duration::from_secs(120);

/// The fixture's call chain below `main`, innermost last.
const CHAIN: &str = "main;run_jit;jit_trampoline;jit_function;c_callee";

/// Samples `pid` until `enough` holds of the profile so far; the profile, and what the
/// sampler said it could not read.
pub fn sample_until(pid: i32, enough: impl Fn(&Profile) -> bool) -> (Profile, Vec<String>) {
    let mut sampler = Sampler::start(pid, SamplerOptions::default()).expect("sampling starts");
    let deadline = Instant::now() + SAMPLES_TIMEOUT;
    let mut last_check = Instant::now();
    let mut notes = Vec::new();
    loop {
        sampler.poll(Duration::from_millis(50)).expect("poll");
        notes.extend(sampler.take_notes());
        if last_check.elapsed() >= Duration::from_millis(250) {
            last_check = Instant::now();
            let profile = sampler.profile();
            if enough(&profile) {
                return (sampler.finish(), notes);
            }
        }
        assert!(
            Instant::now() < deadline,
            "not enough samples of process {pid} within {SAMPLES_TIMEOUT:?}: {} so far; \
             the heaviest paths:\n{}",
            sampler.trees().samples,
            heaviest(&sampler.profile())
        );
    }
}

/// Every call path of the merged tree (names from the root, `;`-joined), with its
/// samples.
pub fn paths(profile: &Profile) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut path: Vec<&str> = Vec::new();
    let _ = walk(&profile.merged.roots, |step| -> Result<(), ()> {
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

/// The samples at or below the paths that contain `chain` (`;`-joined names) and end
/// with it.
pub fn samples_through(profile: &Profile, chain: &str) -> u64 {
    paths(profile)
        .iter()
        .filter(|(path, _)| path.ends_with(chain) && path.contains(&format!(";{chain}")))
        .map(|(_, samples)| samples)
        .sum()
}

/// The ten paths with most samples, one per line, for a failure message.
pub fn heaviest(profile: &Profile) -> String {
    let mut all = paths(profile);
    all.sort_by_key(|(_, samples)| std::cmp::Reverse(*samples));
    all.iter()
        .take(10)
        .map(|(path, samples)| format!("{samples:>6} {path}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every node of the merged tree.
fn nodes(profile: &Profile) -> Vec<&Node> {
    let mut out = Vec::new();
    let _ = walk(&profile.merged.roots, |step| -> Result<(), ()> {
        if let Visit::Enter { node, .. } = step {
            out.push(node);
        }
        Ok(())
    });
    out
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tendril-jit-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn tendril_sample_names_a_jit_function_from_the_perf_map_between_its_caller_and_callee() {
    let dir = scratch_dir("map");
    let output = dir.join("sampled.json");
    let mut target = Target::spawn("jit", &["map", "/tmp", "10000"]);
    let pid = target.pid();
    let mut command = tendril();
    command
        .args(["sample", &pid.to_string(), "-o"])
        .arg(&output);
    let running = RunningTendril::start(command, "tendril: sampling", SAMPLES_TIMEOUT);
    // The fixture does its rounds and exits; `sample` ends with it.
    target.write_stdin("go\n");
    let (status, _, stderr) = running.wait();
    assert!(status.success(), "tendril sample failed:\n{stderr}");
    assert!(
        stderr.contains(&format!("named from /tmp/perf-{pid}.map")),
        "{stderr}"
    );
    let report = tendril()
        .args(["report", "--format", "folded"])
        .arg(&output)
        .output()
        .unwrap();
    let folded = String::from_utf8(report.stdout).unwrap();
    let through: u64 = folded
        .lines()
        .filter_map(|line| line.rsplit_once(' '))
        .filter(|(path, _)| path.ends_with(CHAIN))
        .filter_map(|(_, weight)| weight.parse::<u64>().ok())
        .sum();
    assert!(
        through > 0,
        "no stack ends with {CHAIN} in the folded stacks:\n{folded}"
    );
    // The JIT function's own loop: it is the innermost frame too.
    assert!(
        folded
            .lines()
            .any(|line| line.contains("main;run_jit;jit_trampoline;jit_function ")),
        "{folded}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
}

#[test]
fn a_jitdump_names_the_code_and_a_frame_without_a_name_is_jit_never_a_module_offset() {
    let dir = scratch_dir("dump");
    let target = Target::spawn("jit", &["dump", dir.to_str().unwrap()]);
    let (profile, notes) = sample_until(target.pid(), |p| samples_through(p, CHAIN) >= 50);
    assert!(notes.is_empty(), "{notes:?}");
    let named = nodes(&profile);
    let named: Vec<&&Node> = named.iter().filter(|n| n.name == "jit_function").collect();
    assert!(!named.is_empty());
    assert!(
        named
            .iter()
            .all(|n| n.module == "[jit]" && n.address.is_some() && n.jit)
    );
    drop(target);

    // Nothing names the code: `[jit] 0x…`, module `[jit]`.
    let target = Target::spawn("jit", &["none"]);
    let unnamed = |p: &Profile| {
        nodes(p)
            .iter()
            .filter(|n| n.name.starts_with("[jit] 0x") && n.module == "[jit]")
            .filter_map(|n| n.samples)
            .sum::<u64>()
    };
    let (profile, _) = sample_until(target.pid(), |p| unnamed(p) >= 50);
    let misnamed: Vec<&str> = nodes(&profile)
        .iter()
        .map(|n| n.name.as_str())
        .filter(|name| name.starts_with("jit+0x"))
        .collect();
    assert!(
        misnamed.is_empty(),
        "module offsets for JIT code: {misnamed:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_map_written_after_sampling_began_names_the_code_on_a_later_refresh() {
    let mut target = Target::spawn("jit", &["later"]);
    let pid = target.pid();
    let mut sampler = Sampler::start(pid, SamplerOptions::default()).expect("sampling starts");
    let deadline = Instant::now() + SAMPLES_TIMEOUT;
    let mut asked = false;
    loop {
        sampler.poll(Duration::from_millis(50)).expect("poll");
        let profile = sampler.profile();
        let unnamed = nodes(&profile)
            .iter()
            .any(|n| n.name.starts_with("[jit] 0x"));
        if !asked && unnamed {
            // Frames of the code were seen without a name: now the map is written.
            target.write_stdin("names\n");
            target.expect_line("named", SAMPLES_TIMEOUT);
            asked = true;
        }
        if asked && samples_through(&profile, CHAIN) >= 50 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the late map never named the code (asked: {asked}):\n{}",
            heaviest(&profile)
        );
    }
    let summary = sampler.jit_summary().expect("names came from a file");
    assert!(
        summary.contains(&format!("/tmp/perf-{pid}.map")),
        "{summary}"
    );
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
}

#[test]
fn a_name_with_terminal_escapes_is_printed_escaped() {
    let target = Target::spawn("jit", &["hostile"]);
    let hostile = "jit_\x1b]0;owned\x07\x1b[31mfunction";
    let (profile, _) = sample_until(target.pid(), |p| {
        nodes(p)
            .iter()
            .any(|n| n.name == hostile && n.samples >= Some(20))
    });
    let dir = scratch_dir("hostile");
    let file = dir.join("hostile.json");
    std::fs::write(&file, serde_json::to_vec(&profile).unwrap()).unwrap();
    for format in ["tree", "folded", "hot"] {
        let report = tendril()
            .args(["report", "--format", format])
            .arg(&file)
            .output()
            .unwrap();
        assert!(report.status.success(), "report --format {format}");
        assert!(
            !report.stdout.contains(&0x1b) && !report.stdout.contains(&0x07),
            "report --format {format} printed a raw escape"
        );
        let text = String::from_utf8_lossy(&report.stdout);
        assert!(
            text.contains(r"jit_\x1b]0:owned\x07\x1b[31mfunction")
                || text.contains(r"jit_\x1b]0;owned\x07\x1b[31mfunction"),
            "report --format {format}:\n{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(format!("/tmp/perf-{}.map", target.pid()));
}
