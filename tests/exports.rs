//! `tendril report --format pprof|speedscope|chrome|svg`, `record --trace` and
//! `tendril diff` (issue #14): every export is read back as the tool that opens it
//! would read it, and its totals are the profile's.
//!
//! The one idea: hand-written profiles with known times give exact totals to check
//! each format against; a real recording of a fixture (with a trace) checks the parts
//! only a recording has — addresses and mappings, and timelines whose frames last as
//! long as the tree says.

use crate::common;

use common::{Recording, Target, node_at, tendril};
use flate2::read::GzDecoder;
use prost::Message;
use serde_json::Value;
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;
use tendril::profile::Profile;
use tendril::profile::export::pprof::PprofProfile;

const LINE_TIMEOUT: Duration = Duration::from_secs(60);

/// A path of its own for each call: the tests run side by side in one process.
fn temp(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let unique = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "tendril-exports-{}-{unique}-{name}",
        std::process::id()
    ))
}

/// main (app) 1000 ns: parse 300 (self 100; read 200 in libc), compute 600 (self 600),
/// self 100. Thread 7 ran all of it; thread 8 ran compute once more (400 ns).
/// Merged: main 1000 and compute 400 as a second root: 1400 ns in all. CPU times are
/// half the wall times.
const PROFILE: &str = r#"{"format":"tendril-profile","version":1,"pid":4242,
 "exe":"/usr/bin/app","roots":["main","compute"],"scheme":"B",
 "calibration":{"tsc_hz":1000000000,"inner_ns":1.0,"outer_ns":2.0},
 "stats":{"instrumented_functions":4,"invoked_functions":4,"events":10,"lost_events":0,
          "indirect_call_sites":0,"pause_ns":0},
 "duration_ns":5000,
 "threads":[
  {"tid":7,"name":"worker","roots":[
   {"name":"main","module":"app","calls":1,"total_ns":1000,"self_ns":100,"self_cpu_ns":50,"children":[
     {"name":"parse","module":"app","calls":1,"total_ns":300,"self_ns":100,"self_cpu_ns":50,"children":[
       {"name":"read","module":"libc.so.6","calls":2,"total_ns":200,"self_ns":200,"self_cpu_ns":100}]},
     {"name":"compute","module":"app","calls":1,"total_ns":600,"self_ns":600,"self_cpu_ns":300}]}]},
  {"tid":8,"name":"","roots":[
   {"name":"compute","module":"app","calls":1,"total_ns":400,"self_ns":400,"self_cpu_ns":200}]}],
 "merged":{"roots":[
   {"name":"main","module":"app","calls":1,"total_ns":1000,"self_ns":100,"self_cpu_ns":50,"children":[
     {"name":"parse","module":"app","calls":1,"total_ns":300,"self_ns":100,"self_cpu_ns":50,"children":[
       {"name":"read","module":"libc.so.6","calls":2,"total_ns":200,"self_ns":200,"self_cpu_ns":100}]},
     {"name":"compute","module":"app","calls":1,"total_ns":600,"self_ns":600,"self_cpu_ns":300}]},
   {"name":"compute","module":"app","calls":1,"total_ns":400,"self_ns":400,"self_cpu_ns":200}]},
 "trace":{"seconds":1.0,"max_events":1000000,"capped":false,
  "functions":[{"name":"main","module":"app"},{"name":"compute","module":"app"}],
  "threads":[{"tid":7,"name":"worker","events":[["B",0,0],["B",1,100],["E",1,700],["E",0,1000]]},
             {"tid":8,"name":"","events":[["B",1,50],["E",1,450]]}]}}"#;

const TOTAL_NS: u64 = 1400;

fn profile_file(name: &str, text: &str) -> PathBuf {
    let path = temp(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn run(args: &[&str]) -> Output {
    tendril().args(args).output().expect("cannot run tendril")
}

/// `tendril report FILE --format FORMAT -o OUT`, which must succeed; returns OUT's bytes.
fn export(file: &Path, format: &str) -> Vec<u8> {
    let out = temp(&format!("out.{format}"));
    let output = run(&[
        "report",
        file.to_str().unwrap(),
        "--format",
        format,
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "{format}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let bytes = std::fs::read(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    bytes
}

fn decode_pprof(bytes: &[u8]) -> PprofProfile {
    let mut raw = Vec::new();
    GzDecoder::new(bytes).read_to_end(&mut raw).expect("gzip");
    PprofProfile::decode(raw.as_slice()).expect("profile.proto")
}

/// Each sample's values by sample type name, and the innermost function's name.
fn pprof_samples(pprof: &PprofProfile) -> Vec<(String, HashMap<String, i64>)> {
    let text = |i: i64| pprof.string_table[i as usize].clone();
    let types: Vec<String> = pprof.sample_type.iter().map(|t| text(t.r#type)).collect();
    pprof
        .sample
        .iter()
        .map(|sample| {
            let location = pprof
                .location
                .iter()
                .find(|l| l.id == sample.location_id[0])
                .unwrap();
            let function = pprof
                .function
                .iter()
                .find(|f| f.id == location.line[0].function_id)
                .unwrap();
            let values = types.iter().cloned().zip(sample.value.clone()).collect();
            (text(function.name), values)
        })
        .collect()
}

#[test]
fn pprof_holds_one_sample_per_context_with_calls_wall_and_cpu() {
    let file = profile_file("pprof.json", PROFILE);
    let pprof = decode_pprof(&export(&file, "pprof"));
    let text = |i: i64| pprof.string_table[i as usize].as_str();
    let types: Vec<(&str, &str)> = pprof
        .sample_type
        .iter()
        .map(|t| (text(t.r#type), text(t.unit)))
        .collect();
    assert_eq!(
        types,
        [
            ("calls", "count"),
            ("wall", "nanoseconds"),
            ("cpu", "nanoseconds")
        ]
    );
    let samples = pprof_samples(&pprof);
    // main, parse, read, compute under main, compute as a root.
    assert_eq!(samples.len(), 5);
    let sum = |kind: &str| samples.iter().map(|(_, v)| v[kind]).sum::<i64>();
    assert_eq!(sum("wall"), TOTAL_NS as i64);
    assert_eq!(sum("cpu"), TOTAL_NS as i64 / 2);
    assert_eq!(sum("calls"), 6);
    let read = samples.iter().find(|(name, _)| name == "read").unwrap();
    assert_eq!((read.1["calls"], read.1["wall"]), (2, 200));
    // read's stack: read, parse, main (innermost first).
    let read_sample = pprof.sample.iter().find(|s| s.value[1] == 200).unwrap();
    assert_eq!(read_sample.location_id.len(), 3);
    // Every location names its function and sits in its module's mapping.
    for location in &pprof.location {
        let mapping = pprof
            .mapping
            .iter()
            .find(|m| m.id == location.mapping_id)
            .unwrap();
        assert!(mapping.has_functions);
        assert!(!text(mapping.filename).is_empty());
    }
    std::fs::remove_file(file).unwrap();
}

/// `go tool pprof -top` reads the export (skipped, with a note, without Go).
#[test]
fn go_tool_pprof_reads_the_export() {
    if std::process::Command::new("go")
        .arg("version")
        .output()
        .is_err()
    {
        eprintln!("note: `go` is not installed (Debian: golang-go); go tool pprof not run");
        return;
    }
    let file = profile_file("go.json", PROFILE);
    let out = temp("go.pb.gz");
    std::fs::write(&out, export(&file, "pprof")).unwrap();
    let home = temp("gohome");
    let output = std::process::Command::new("go")
        .args(["tool", "pprof", "-top", "-sample_index=wall"])
        .arg(&out)
        .env("HOME", &home)
        .env("PPROF_TMPDIR", &home)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    // "Showing nodes accounting for 1400ns, 100% of 1400ns total" (newer Go: 1.40us).
    assert!(
        stdout.contains("100% of 1400ns total") || stdout.contains("100% of 1.40us total"),
        "{stdout}"
    );
    let compute = stdout.lines().find(|l| l.ends_with(" compute")).unwrap();
    let flat = compute.split_whitespace().next().unwrap();
    assert!(flat == "1000ns" || flat == "1us", "{compute}");
    assert!(stdout.lines().any(|l| l.ends_with(" read")), "{stdout}");
    let _ = std::fs::remove_file(out);
    let _ = std::fs::remove_dir_all(home);
    std::fs::remove_file(file).unwrap();
}

/// Checks that `events` (one thread's "B"/"E" or "O"/"C") nest, close every frame
/// they open, and never go back in time. Returns the frames' lengths, as (name, length).
fn check_timeline(events: &[(String, bool, f64)]) -> Vec<(String, f64)> {
    let mut open: Vec<(String, f64)> = Vec::new();
    let mut lengths = Vec::new();
    let mut last = f64::MIN;
    for (name, begins, at) in events {
        assert!(*at >= last, "time went back at {name} {at} < {last}");
        last = *at;
        if *begins {
            open.push((name.clone(), *at));
        } else {
            let (opened, start) = open.pop().expect("an end without a begin");
            assert_eq!(&opened, name, "ends must close the innermost frame");
            lengths.push((opened, at - start));
        }
    }
    assert!(open.is_empty(), "frames left open: {open:?}");
    lengths
}

fn chrome_timelines(chrome: &Value, pid: u64) -> HashMap<u64, Vec<(String, bool, f64)>> {
    let mut threads: HashMap<u64, Vec<(String, bool, f64)>> = HashMap::new();
    for event in chrome["traceEvents"].as_array().unwrap() {
        let phase = event["ph"].as_str().unwrap();
        if event["pid"].as_u64() != Some(pid) || !matches!(phase, "B" | "E") {
            continue;
        }
        threads
            .entry(event["tid"].as_u64().unwrap())
            .or_default()
            .push((
                event["name"].as_str().unwrap().to_owned(),
                phase == "B",
                event["ts"].as_f64().unwrap(),
            ));
    }
    threads
}

#[test]
fn chrome_has_nested_timelines_and_the_trees_with_their_totals() {
    let file = profile_file("chrome.json", PROFILE);
    let chrome: Value = serde_json::from_slice(&export(&file, "chrome")).unwrap();
    let events = chrome["traceEvents"].as_array().unwrap();
    for event in events {
        for field in ["name", "ph", "pid", "tid", "ts"] {
            assert!(!event[field].is_null(), "{field} missing in {event}");
        }
    }
    let timelines = chrome_timelines(&chrome, 4242);
    assert_eq!(timelines.len(), 2);
    let lengths = check_timeline(&timelines[&7]);
    assert_eq!(
        lengths,
        [("compute".to_owned(), 0.6), ("main".to_owned(), 1.0)]
    );
    check_timeline(&timelines[&8]);
    // The merged tree, laid out from 0: its roots' "X" events end at the profile's
    // total (µs).
    let tree_pid = tendril::profile::export::chrome::TREE_PID as u64;
    let merged_end = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["pid"] == tree_pid && e["tid"] == 0)
        .map(|e| e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(
        (merged_end * 1000.0 - TOTAL_NS as f64).abs() < 1e-6,
        "{merged_end}"
    );
    let main = events
        .iter()
        .find(|e| e["ph"] == "X" && e["tid"] == 0 && e["name"] == "main")
        .unwrap();
    assert_eq!(main["args"]["total_ns"], 1000);
    assert_eq!(main["dur"], 1.0);
    std::fs::remove_file(file).unwrap();
}

#[test]
fn speedscope_has_a_merged_profile_one_per_thread_and_the_timelines() {
    let file = profile_file("speedscope.json", PROFILE);
    let file_json: Value = serde_json::from_slice(&export(&file, "speedscope")).unwrap();
    assert_eq!(
        file_json["$schema"],
        "https://www.speedscope.app/file-format-schema.json"
    );
    let frames = file_json["shared"]["frames"].as_array().unwrap();
    let profiles = file_json["profiles"].as_array().unwrap();
    // Merged, thread 7, thread 8, then the two threads' timelines.
    assert_eq!(profiles.len(), 5);
    let weights = |p: &Value| -> u64 {
        p["weights"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_u64().unwrap())
            .sum()
    };
    assert_eq!(profiles[0]["type"], "sampled");
    assert_eq!(weights(&profiles[0]), TOTAL_NS);
    assert_eq!(profiles[0]["endValue"], TOTAL_NS);
    assert_eq!(weights(&profiles[1]), 1000);
    assert_eq!(weights(&profiles[2]), 400);
    for profile in &profiles[..3] {
        assert_eq!(profile["unit"], "nanoseconds");
        for sample in profile["samples"].as_array().unwrap() {
            for frame in sample.as_array().unwrap() {
                assert!((frame.as_u64().unwrap() as usize) < frames.len());
            }
        }
    }
    for profile in &profiles[3..] {
        assert_eq!(profile["type"], "evented");
        let events: Vec<(String, bool, f64)> = profile["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let frame = &frames[e["frame"].as_u64().unwrap() as usize];
                (
                    frame["name"].as_str().unwrap().to_owned(),
                    e["type"] == "O",
                    e["at"].as_f64().unwrap(),
                )
            })
            .collect();
        assert!(!events.is_empty());
        check_timeline(&events);
    }
    std::fs::remove_file(file).unwrap();
}

#[test]
fn svg_is_well_formed_and_titled_with_root_process_and_total() {
    let file = profile_file("svg.json", PROFILE);
    let svg = String::from_utf8(export(&file, "svg")).unwrap();
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..roxmltree::ParsingOptions::default()
    };
    let document = roxmltree::Document::parse_with_options(&svg, options).expect("well-formed XML");
    assert_eq!(document.root_element().tag_name().name(), "svg");
    let title = document
        .descendants()
        .find(|n| n.attribute("id") == Some("title"))
        .and_then(|n| n.text())
        .unwrap();
    assert_eq!(
        title,
        "main, compute — pid 4242 (/usr/bin/app) — total 0.001 ms"
    );
    // The whole graph is the profile's total: inferno's "all" frame says 1,400 ns.
    assert!(svg.contains("all (1,400 ns, 100%)"), "{svg:.2000}");
    assert!(
        svg.contains(">main<") || svg.contains("main ("),
        "no main frame"
    );
    std::fs::remove_file(file).unwrap();
}

#[test]
fn report_says_how_many_trace_events_a_profile_holds() {
    let file = profile_file("trace-report.json", PROFILE);
    let output = run(&["report", file.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success());
    assert!(
        stdout.contains("trace: 6 events on 2 threads over 0.001 ms"),
        "{stdout}"
    );
    std::fs::remove_file(file).unwrap();
}

#[test]
fn diff_lists_paths_by_absolute_change_and_writes_differential_folded_input() {
    let a = profile_file("diff-a.json", PROFILE);
    let b_text = PROFILE
        .replace(
            r#""name":"compute","module":"app","calls":1,"total_ns":600,"self_ns":600"#,
            r#""name":"compute","module":"app","calls":1,"total_ns":900,"self_ns":900"#,
        )
        .replace(
            r#""total_ns":1000,"self_ns":100"#,
            r#""total_ns":1300,"self_ns":100"#,
        );
    let b = profile_file("diff-b.json", &b_text);
    let output = run(&["diff", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    let rows: Vec<&str> = stdout.lines().skip(2).collect();
    assert!(rows[0].ends_with("  main;compute"), "{stdout}");
    assert!(rows[0].trim_start().starts_with("+0.000"), "{stdout}");
    assert!(rows[1].ends_with("  main"), "{stdout}");
    assert_eq!(rows.len(), 5);
    let output = run(&[
        "diff",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--format",
        "folded",
    ]);
    let folded = String::from_utf8(output.stdout).unwrap();
    assert!(
        folded.lines().any(|l| l == "main;compute 600 900"),
        "{folded}"
    );
    assert!(
        folded.lines().any(|l| l == "main;parse;read 200 200"),
        "{folded}"
    );
    std::fs::remove_file(a).unwrap();
    std::fs::remove_file(b).unwrap();
}

/// Runs tendril and expects a failure with exactly one line on stderr containing
/// `expected`.
fn fails_with_one_line(args: &[&str], expected: &str) {
    let output = run(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{args:?} succeeded");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(expected), "{stderr}");
}

#[test]
fn bad_input_gets_one_clear_line_and_a_failure() {
    let good = profile_file("bad-good.json", PROFILE);
    let good = good.to_str().unwrap();
    fails_with_one_line(
        &["report", good, "--format", "flame"],
        "invalid value 'flame' for '--format <FORMAT>'",
    );
    let newer = profile_file(
        "bad-newer.json",
        &PROFILE.replace("\"version\":1", "\"version\":9"),
    );
    fails_with_one_line(
        &[
            "report",
            newer.to_str().unwrap(),
            "--format",
            "pprof",
            "-o",
            "/dev/null",
        ],
        "is a version 9 profile; this tendril reads version 1",
    );
    let not_profile = profile_file("bad-not.json", "\u{7f}ELF\u{2}\u{1}");
    fails_with_one_line(
        &[
            "report",
            not_profile.to_str().unwrap(),
            "--format",
            "chrome",
        ],
        "is not a tendril profile",
    );
    fails_with_one_line(
        &["diff", good, not_profile.to_str().unwrap()],
        "is not a tendril profile",
    );
    let unwritable = "/nonexistent-dir/out.svg";
    fails_with_one_line(
        &["report", good, "--format", "svg", "-o", unwritable],
        "cannot write the profile to /nonexistent-dir/out.svg: the directory \
         /nonexistent-dir does not exist",
    );
    // A 3 GB sparse file is refused by its size, before a byte of it is read.
    let huge = profile_file("bad-huge.json", "");
    std::fs::File::options()
        .write(true)
        .open(&huge)
        .and_then(|file| file.set_len(3 << 30))
        .unwrap();
    fails_with_one_line(
        &["report", huge.to_str().unwrap(), "--format", "svg"],
        "is not a tendril profile: it holds 3221225472 bytes, and tendril reads profiles \
         of at most 1024 MiB",
    );
    for file in [newer, not_profile, huge] {
        std::fs::remove_file(file).unwrap();
    }
    std::fs::remove_file(good).unwrap();
}

/// A real recording with `--trace`: the timeline's frames last what the tree says,
/// and the pprof export carries addresses inside their modules' mappings.
#[test]
fn a_traced_recording_exports_timelines_that_agree_with_its_tree() {
    let mut target = Target::spawn("calltree", &["2"]);
    let recording = Recording::start(target.pid(), &["--root", "counted_outer", "--trace=60"]);
    target.signal(libc::SIGUSR1);
    target.expect_line("counted ", LINE_TIMEOUT);
    let recorded = recording.finish();
    let profile = &recorded.profile;
    assert!(
        recorded.stderr.contains("tracing the first 60"),
        "{}",
        recorded.stderr
    );
    let trace = profile.trace.as_ref().expect("a trace");
    // 1 + 1000 + 2000 calls, each a begin and an end.
    assert_eq!(trace.event_count(), 6002, "{}", recorded.stderr);
    let root = node_at(&profile.merged.roots, &["counted_outer"]).unwrap();

    let file = temp("traced.json");
    profile.save(&file).unwrap();
    let chrome: Value = serde_json::from_slice(&export(&file, "chrome")).unwrap();
    let timelines = chrome_timelines(&chrome, profile.pid as u64);
    assert_eq!(timelines.len(), 1);
    let lengths = check_timeline(timelines.values().next().unwrap());
    let outer: Vec<f64> = lengths
        .iter()
        .filter(|(name, _)| name == "counted_outer")
        .map(|(_, length)| *length)
        .collect();
    assert_eq!(outer.len(), 1);
    // µs on the timeline against ns in the tree: equal but for rounding, however many
    // calls measured less than the calibrated hook cost (those are nested inside their
    // parents, never the other way round).
    assert!(
        (outer[0] * 1000.0 - root.total_ns as f64).abs() <= 2.0,
        "timeline {} µs, tree {} ns",
        outer[0],
        root.total_ns
    );
    let leaves: f64 = lengths
        .iter()
        .filter(|(name, _)| name == "counted_leaf")
        .map(|(_, length)| length * 1000.0)
        .sum();
    let leaf = node_at(
        &profile.merged.roots,
        &["counted_outer", "counted_inner", "counted_leaf"],
    )
    .unwrap();
    assert!((leaves - leaf.total_ns as f64).abs() <= 2000.0 * 1.0 + 1.0);

    let pprof = decode_pprof(&export(&file, "pprof"));
    let wall: i64 = pprof.sample.iter().map(|s| s.value[1]).sum();
    let self_sum = tendril::profile::export::self_sum_ns(&profile.merged.roots);
    assert_eq!(wall, self_sum as i64);
    for location in &pprof.location {
        let mapping = pprof
            .mapping
            .iter()
            .find(|m| m.id == location.mapping_id)
            .unwrap();
        assert!(
            location.address >= mapping.memory_start && location.address < mapping.memory_limit,
            "{location:?} outside {mapping:?}"
        );
    }
    let report = run(&["report", file.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&report.stdout).contains("trace: 6002 events on 1 thread"),
        "{}",
        String::from_utf8_lossy(&report.stdout)
    );
    let loaded = Profile::load(&file).unwrap();
    assert_eq!(loaded.trace.as_ref().unwrap().event_count(), 6002);
    std::fs::remove_file(file).unwrap();
}
