//! The profile file's tests: what is written, read back, refused, and how deep.

use super::*;
use crate::profile::model::tests::chain;
use crate::profile::model::{Calibration, MergedProfile, Node, Stats, ThreadProfile};

pub(crate) fn small_profile() -> Profile {
    let mut root = Node::leaf("root", "app", 1, 100, 10);
    let mut mid = Node::leaf("mid \"quoted\"", "app", 3, 90, 30);
    mid.children
        .push(Node::leaf("leaf", "libc.so.6", 6, 60, 60));
    root.children.push(mid);
    Profile {
        duration_ns: 0,
        discovery: None,
        gross: Vec::new(),
        sampling: None,
        modules: Vec::new(),
        trace: None,
        format: Profile::FORMAT.to_owned(),
        version: Profile::VERSION,
        pid: 4242,
        exe: "/usr/bin/app".to_owned(),
        roots: vec!["root".to_owned()],
        scheme: "B".to_owned(),
        calibration: Calibration {
            tsc_hz: 3_000_000_000,
            inner_ns: 12.5,
            outer_ns: 20.0,
            inner_spread_ns: 0.0,
            outer_spread_ns: 0.0,
            ..Default::default()
        },
        stats: Stats {
            instrumented_functions: 3,
            invoked_functions: 3,
            events: 20,
            lost_events: 0,
            indirect_call_sites: 1,
            pause_ns: 0,
            unwound_exits: 0,
            unmatched_exits: 0,
            ..Stats::default()
        },
        threads: vec![
            ThreadProfile {
                tid: 7,
                name: "worker".to_owned(),
                roots: vec![root.clone()],
                ..ThreadProfile::default()
            },
            ThreadProfile {
                tid: 8,
                name: String::new(),
                roots: Vec::new(),
                ..ThreadProfile::default()
            },
        ],
        merged: MergedProfile { roots: vec![root] },
    }
}

fn to_text(profile: &Profile) -> String {
    let mut out = Vec::new();
    profile.write_json(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn writes_exactly_what_serde_json_pretty_writes() {
    let profile = small_profile();
    let expected = serde_json::to_string_pretty(&profile).unwrap() + "\n";
    assert_eq!(to_text(&profile), expected);
}

#[test]
fn reads_back_what_it_writes() {
    let profile = small_profile();
    let read = Profile::from_json(&to_text(&profile), "x.json").unwrap();
    assert_eq!(read, profile);
}

#[test]
fn every_measured_float_reads_back_to_the_same_bits() {
    // Without serde_json's `float_roundtrip`, 14% of such numbers read back one ulp off
    // (7929.4549880035365 as 7929.454988003536): a saved profile then differed from
    // the one read back in about one recording of ten.
    let mut profile = small_profile();
    for (i, value) in [7929.4549880035365, 12427.827411289307, 0.1 + 0.2]
        .into_iter()
        .enumerate()
    {
        profile.calibration.inner_ns = value;
        profile.calibration.outer_spread_ns = value * (i + 3) as f64;
        let read = Profile::from_json(&to_text(&profile), "x.json").unwrap();
        assert_eq!(read.calibration.inner_ns.to_bits(), value.to_bits());
        assert_eq!(read, profile);
    }
}

#[test]
fn reads_compact_json_with_unknown_fields_and_float_times() {
    let text = r#"{"format":"tendril-profile","version":1,"pid":1,"exe":"e","roots":["r"],
        "scheme":"B","future":{"a":[1,{"b":null}]},
        "calibration":{"tsc_hz":1000000000,"inner_ns":1,"outer_ns":2},
        "stats":{"instrumented_functions":1,"invoked_functions":1,"events":2,
                 "lost_events":0,"indirect_call_sites":0,"pause_ns":0},
        "threads":[{"tid":3,"name":"t","roots":[{"children":[{"name":"c","module":"m",
            "calls":1,"total_ns":1,"self_ns":1}],"name":"r","module":"m","calls":1,
            "total_ns":10.4,"self_ns":9.5,"colour":"red"}]}],
        "merged":{"roots":[{"name":"r","module":"m","calls":1,"total_ns":10,
            "self_ns":10}]}}"#;
    let profile = Profile::from_json(text, "x.json").unwrap();
    let mut thread_root = Node::leaf("r", "m", 1, 10, 10);
    thread_root.children.push(Node::leaf("c", "m", 1, 1, 1));
    assert_eq!(profile.threads[0].roots[0], thread_root);
    assert_eq!(profile.merged.roots[0], Node::leaf("r", "m", 1, 10, 10));
    assert_eq!(profile.stats.unwound_exits, 0);
    assert_eq!(profile.calibration.outer_ns, 2.0);
}

#[test]
fn a_20_000_deep_tree_round_trips() {
    let mut profile = small_profile();
    profile.merged.roots = vec![chain("fib", 20_000)];
    let text = to_text(&profile);
    let read = Profile::from_json(&text, "deep.json").unwrap();
    assert_eq!(read, profile);
}

#[test]
fn a_100_000_deep_tree_round_trips_in_linear_space() {
    let mut profile = small_profile();
    profile.threads[1].roots = vec![chain("fib", 100_000)];
    let text = to_text(&profile);
    // 9 lines per node, none longer than 100 bytes with the indentation capped.
    assert!(text.len() < 100_000 * 9 * 100, "{} bytes", text.len());
    let read = Profile::from_json(&text, "deep.json").unwrap();
    assert_eq!(read, profile);
}

#[test]
fn indentation_stops_growing_after_max_indent_levels() {
    let mut profile = small_profile();
    profile.merged.roots = vec![chain("fib", 40)];
    let text = to_text(&profile);
    let pretty = serde_json::to_string_pretty(&profile).unwrap() + "\n";
    let indent = |line: &str| line.len() - line.trim_start_matches(' ').len();
    let deepest = text.lines().map(indent).max().unwrap();
    assert_eq!(deepest, 2 * MAX_INDENT_LEVELS);
    assert!(pretty.lines().map(indent).max().unwrap() > deepest);
    // Only the indentation differs from serde_json's pretty output.
    let trimmed = |text: &str| -> Vec<String> {
        text.lines()
            .map(|line| line.trim_start().to_owned())
            .collect()
    };
    assert_eq!(trimmed(&text), trimmed(&pretty));
    // Above the cap, the lines are serde_json's, indentation included.
    let above_cap = text
        .lines()
        .take_while(|line| indent(line) < deepest)
        .count();
    assert!(above_cap > 100);
    assert!(
        text.lines()
            .take(above_cap)
            .eq(pretty.lines().take(above_cap))
    );
    assert_eq!(Profile::from_json(&text, "x.json").unwrap(), profile);
}

#[test]
fn a_100_000_deep_tree_round_trips_on_a_256_kib_stack() {
    let worker = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(|| {
            let mut profile = small_profile();
            profile.merged.roots = vec![chain("fib", 100_000)];
            let text = to_text(&profile);
            let read = Profile::from_json(&text, "deep.json").unwrap();
            let cut = Profile::from_json(&text[..text.len() / 2], "cut.json");
            (read == profile, cut.unwrap_err().to_string())
        })
        .unwrap();
    let (same, cut_error) = worker.join().unwrap();
    assert!(same);
    assert!(
        cut_error.starts_with("cut.json is a damaged tendril profile: EOF while parsing"),
        "{cut_error}"
    );
}

fn error_of(text: &str) -> String {
    Profile::from_json(text, "x.json").unwrap_err().to_string()
}

#[test]
fn says_when_a_file_is_not_a_profile() {
    let no_format = "x.json is not a tendril profile (no \"format\": \"tendril-profile\")";
    assert_eq!(error_of(r#"{"name": "left-pad", "version": 1}"#), no_format);
    assert_eq!(error_of(r#"{"format": "pprof", "version": 1}"#), no_format);
    assert_eq!(
        error_of("\u{7f}ELF binary"),
        "x.json is not a tendril profile (not a JSON object; no \"format\": \
         \"tendril-profile\")"
    );
    assert_eq!(
        error_of("\n  [1, 2]"),
        "x.json is not a tendril profile (not a JSON object; no \"format\": \
         \"tendril-profile\")"
    );
}

#[test]
fn says_which_version_a_file_is() {
    assert_eq!(
        error_of(r#"{"format": "tendril-profile", "version": 7, "threads": 5}"#),
        "x.json is a version 7 profile; this tendril reads version 1"
    );
    assert_eq!(
        error_of(r#"{"format": "tendril-profile"}"#),
        "x.json is a damaged tendril profile: no \"version\" number at the top level"
    );
}

#[test]
fn says_where_a_file_is_damaged() {
    let head = r#"{"format": "tendril-profile", "version": 1,"#;
    assert_eq!(
        error_of(&format!(
            "{head}\n\"merged\": {{\"roots\": [{{\"name\": \"a\", \"calls\": 1}}]}}}}"
        )),
        "x.json is a damaged tendril profile: missing field `module` at line 2 column 46"
    );
    assert_eq!(
        error_of(&format!(
            "{head}\n\"merged\": {{\"roots\": [{{\"name\": 1}}]}}}}"
        )),
        "x.json is a damaged tendril profile: invalid type: integer `1`, expected a string \
         at line 2 column 32"
    );
    assert_eq!(
        error_of(&format!(
            "{head}\n\"merged\": {{\"roots\": [{{\"calls\": -3}}]}}}}"
        )),
        "x.json is a damaged tendril profile: expected a number ≥ 0, not -3 at line 2 column 34"
    );
    assert_eq!(
        error_of(&format!("{head}\n \"pid\": -1}}")),
        "x.json is a damaged tendril profile: invalid value: integer `-1`, expected u32 \
         at line 2 column 11"
    );
    assert_eq!(
        error_of(&format!("{head}\n \"pid\": 1")),
        "x.json is a damaged tendril profile: EOF while parsing an object at line 2 column 9"
    );
    assert_eq!(
        error_of(&format!("{head}\n \"exe\": \"e\"}}")),
        "x.json is a damaged tendril profile: missing field `pid` at line 2 column 12"
    );
    let text = to_text(&small_profile());
    let lines = text.lines().count();
    assert_eq!(
        error_of(&format!("{text}x")),
        format!(
            "x.json is a damaged tendril profile: trailing characters at line {} column 1",
            lines + 1
        )
    );
}

#[test]
fn says_not_a_profile_or_which_version_before_saying_damaged() {
    assert_eq!(
        error_of(r#"{"format": "pprof", "version": 1, "pid": -1}"#),
        "x.json is not a tendril profile (no \"format\": \"tendril-profile\")"
    );
    assert_eq!(
        error_of(r#"{"format": 5, "version": 1}"#),
        "x.json is not a tendril profile (no \"format\": \"tendril-profile\")"
    );
    let mut profile = small_profile();
    profile.version = 2;
    assert_eq!(
        error_of(&to_text(&profile)),
        "x.json is a version 2 profile; this tendril reads version 1"
    );
}

#[test]
fn load_names_the_file_it_cannot_read() {
    let error = Profile::load(Path::new("/nonexistent/p.json")).unwrap_err();
    assert_eq!(
        error.to_string(),
        "cannot read /nonexistent/p.json: No such file or directory (os error 2)"
    );
}

#[test]
fn a_file_too_large_or_not_an_object_is_refused_unread() {
    let directory = std::env::temp_dir().join(format!("tendril-large-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    // A sparse file of 3 GB: its size alone refuses it.
    let sparse = directory.join("sparse.json");
    let file = std::fs::File::create(&sparse).unwrap();
    file.set_len(3 << 30).unwrap();
    let error = Profile::load(&sparse).unwrap_err().to_string();
    assert_eq!(
        error,
        format!(
            "{} is not a tendril profile: it holds 3221225472 bytes, and tendril reads \
             profiles of at most 1024 MiB",
            sparse.display()
        )
    );
    // A device without a size is refused by its first bytes.
    let error = Profile::load(Path::new("/dev/zero"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        "/dev/zero is not a tendril profile (not a JSON object; no \"format\": \
         \"tendril-profile\")"
    );
    let binary = directory.join("binary.json");
    std::fs::write(&binary, b"{\xff\xfe}").unwrap();
    let error = Profile::load(&binary).unwrap_err().to_string();
    assert!(
        error.ends_with("is not a tendril profile (not UTF-8 text)"),
        "{error}"
    );
    std::fs::remove_dir_all(&directory).unwrap();
}

#[test]
fn save_never_writes_through_a_link() {
    let directory = std::env::temp_dir().join(format!("tendril-link-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let victim = directory.join("victim");
    std::fs::write(&victim, "keep").unwrap();
    let link = directory.join("profile.json");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let error = small_profile().save(&link).unwrap_err();
    assert!(matches!(error, ProfileError::Write { .. }), "{error}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    std::fs::remove_dir_all(&directory).unwrap();
}

#[test]
fn save_then_load_gives_the_same_profile() {
    let profile = small_profile();
    let path = std::env::temp_dir().join(format!("tendril-profile-{}.json", std::process::id()));
    profile.save(&path).unwrap();
    let loaded = Profile::load(&path);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(loaded.unwrap(), profile);
}
