//! Code generated at run time met by an instrumented recording: `run_jit` calls the
//! fixture's generated code through a function pointer, and the recorded tree gets a
//! leaf under `run_jit` named from the perf map, module `[jit]`, marked `jit`, with no
//! calls or time; `discovery.not_followed` says why; the generated code's bytes are
//! the same while the recording runs (never patched); and `report`'s tree, the
//! Chrome trace and the pprof export carry the mark. A jitdump names the leaf as the
//! perf map does.
//!
//! The one idea: the test records in its own process and polls snapshots until the
//! leaf is there, waiting for the event rather than a fixed time.

use super::common::{Target, check_profile, start_recorder, tendril};
use super::{SAMPLES_TIMEOUT, scratch_dir};
use flate2::read::GzDecoder;
use prost::Message;
use std::io::Read;
use std::time::{Duration, Instant};
use tendril::profile::export::pprof::PprofProfile;
use tendril::profile::{Node, Profile};

/// The fixture's generated code: `sub rsp, 8; call …` (the trampoline's first bytes).
const TRAMPOLINE_START: [u8; 4] = [0x48, 0x83, 0xec, 0x08];

fn code_bytes(pid: i32, address: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).expect("the target's memory");
    let mut bytes = vec![0; len];
    mem.read_exact_at(&mut bytes, address).expect("read code");
    bytes
}

/// The `jit`-marked children of `run_jit` in `roots`.
fn jit_leaves(roots: &[Node]) -> Vec<&Node> {
    jit_leaves_below(roots, "run_jit")
}

/// The `jit`-marked children of the roots named `root` in `roots`.
fn jit_leaves_below<'a>(roots: &'a [Node], root: &str) -> Vec<&'a Node> {
    roots
        .iter()
        .filter(|node| node.name == root)
        .flat_map(|node| &node.children)
        .filter(|child| child.jit)
        .collect()
}

/// Records below `run_jit` in process `pid` until the tree has a JIT leaf under it;
/// the recorder, still recording, and that profile.
fn record_until_a_jit_leaf(pid: i32) -> (tendril::recording::Recorder, Profile) {
    record_until_a_jit_leaf_below(pid, "run_jit")
}

/// [`record_until_a_jit_leaf`], below the root `root`.
fn record_until_a_jit_leaf_below(pid: i32, root: &str) -> (tendril::recording::Recorder, Profile) {
    let mut recorder = start_recorder(pid, root);
    let deadline = Instant::now() + SAMPLES_TIMEOUT;
    let profile = loop {
        recorder.poll();
        let profile = recorder.snapshot();
        let calls: u64 = profile
            .merged
            .roots
            .iter()
            .filter(|node| node.name == root)
            .map(|node| node.calls)
            .sum();
        if calls >= 10 && !jit_leaves_below(&profile.merged.roots, root).is_empty() {
            break profile;
        }
        assert!(
            Instant::now() < deadline,
            "no JIT leaf under {root} ({calls} calls) within {SAMPLES_TIMEOUT:?}"
        );
        // Pace the polls; what ends the loop is the leaf showing up.
        std::thread::sleep(Duration::from_millis(50));
    };
    (recorder, profile)
}

#[test]
fn a_call_into_jit_code_through_a_computed_pointer_is_a_leaf_the_pointer_check_found() {
    // run_jit_hidden computes its pointer in a register: no reading of its code finds
    // the generated code; the agent's check meets it as the call is made.
    let target = Target::spawn("jit", &["hidden"]);
    let (recorder, profile) = record_until_a_jit_leaf_below(target.pid(), "run_jit_hidden");
    recorder.finish(false).expect("the recording ends");
    check_profile(&profile);
    let leaves = jit_leaves_below(&profile.merged.roots, "run_jit_hidden");
    assert_eq!(
        leaves
            .iter()
            .map(|l| (l.name.as_str(), l.module.as_str(), l.calls))
            .collect::<Vec<_>>(),
        [("jit_trampoline", "[jit]", 0)]
    );
    drop(target);
}

#[test]
fn a_jitdump_names_the_leaf_as_the_perf_map_does() {
    let dir = scratch_dir("recorded-dump");
    let target = Target::spawn("jit", &["dump", dir.to_str().unwrap()]);
    let (recorder, profile) = record_until_a_jit_leaf(target.pid());
    recorder.finish(false).expect("the recording ends");
    let leaves = jit_leaves(&profile.merged.roots);
    assert_eq!(
        leaves
            .iter()
            .map(|l| (l.name.as_str(), l.module.as_str()))
            .collect::<Vec<_>>(),
        [("jit_trampoline", "[jit]")]
    );
    drop(target);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_recording_that_meets_a_call_into_jit_code_shows_a_marked_leaf_and_never_patches_it() {
    let target = Target::spawn("jit", &["map"]);
    let pid = target.pid();
    let ready = target.ready_line().expect("ready line").to_string();
    let trampoline = ready
        .split_whitespace()
        .find_map(|word| word.strip_prefix("trampoline=0x"))
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .expect("the trampoline's address");
    let before = code_bytes(pid, trampoline, 64);
    assert_eq!(before[..4], TRAMPOLINE_START);

    let (recorder, profile) = record_until_a_jit_leaf(pid);
    // Consistent (the leaf's zero times add up), and the generated code is as the
    // runtime wrote it.
    check_profile(&profile);
    assert_eq!(
        code_bytes(pid, trampoline, 64),
        before,
        "JIT code was patched"
    );
    let leaves = jit_leaves(&profile.merged.roots);
    assert_eq!(leaves.len(), 1, "{:?}", profile.merged.roots);
    let leaf = leaves[0];
    assert_eq!(
        (leaf.name.as_str(), leaf.module.as_str(), leaf.address),
        ("jit_trampoline", "[jit]", Some(trampoline))
    );
    assert_eq!((leaf.calls, leaf.total_ns, leaf.self_ns), (0, 0, 0));
    assert!(leaf.children.is_empty());
    for thread in &profile.threads {
        assert_eq!(jit_leaves(&thread.roots).len(), 1);
    }
    let discovery = profile.discovery.as_ref().expect("discovery");
    assert!(
        discovery
            .not_followed
            .iter()
            .any(|n| n.target == "jit_trampoline ([jit])" && n.reason.contains("never patched")),
        "{:?}",
        discovery.not_followed
    );
    recorder.finish(false).expect("the recording ends");
    drop(target);

    // The saved profile carries the mark, and so do the report and the exports.
    let dir = scratch_dir("recorded");
    let file = dir.join("recorded.json");
    let json = serde_json::to_vec(&profile).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&json)
            .matches("\"jit\":true")
            .count(),
        1 + profile.threads.len()
    );
    std::fs::write(&file, json).unwrap();
    let report = |format: &str| {
        let out = tendril()
            .args(["report", "--format", format])
            .arg(&file)
            .output()
            .unwrap();
        assert!(out.status.success(), "report --format {format}");
        out.stdout
    };
    let tree = String::from_utf8(report("tree")).unwrap();
    assert!(
        tree.lines()
            .any(|l| l.trim_start().starts_with("jit ") && l.ends_with("jit_trampoline ([jit])")),
        "{tree}"
    );
    let chrome = String::from_utf8(report("chrome")).unwrap();
    assert!(
        chrome.contains(r#""module":"[jit]","calls":0,"total_ns":0,"self_ns":0,"jit":true"#),
        "{chrome}"
    );
    let mut raw = Vec::new();
    GzDecoder::new(report("pprof").as_slice())
        .read_to_end(&mut raw)
        .expect("gzip");
    let pprof = PprofProfile::decode(raw.as_slice()).expect("profile.proto");
    let text = |i: i64| pprof.string_table[i as usize].as_str();
    let marked = pprof
        .sample
        .iter()
        .filter(|s| {
            s.label
                .iter()
                .any(|l| text(l.key) == "jit" && text(l.str) == "true")
        })
        .count();
    // (pprof holds the merged tree.)
    assert_eq!(marked, 1);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
}
