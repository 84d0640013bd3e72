//! A target whose names fight back (issue 31): the `hostile_names` fixture names its
//! functions with ESC sequences, a right-to-left override (U+202E), a C1 control and a
//! zero-width space, and its worker thread with an ESC sequence. What `symbols`,
//! `count`, `edges`, `record` and `report` print — stdout and stderr, the "did you
//! mean" line of an error included — holds none of those characters raw, shows each
//! escaped, and the functions stay findable by their exact names and by patterns.

use crate::common;

use common::{RunningTendril, Target, tendril};
use std::process::{Output, Stdio};
use std::time::Duration;
use tendril::terminal_text::is_unsafe;

const ROUND_TIMEOUT: Duration = Duration::from_secs(20);
const START_TIMEOUT: Duration = Duration::from_secs(600);

/// The four hostile names, exactly as the fixture's symbol table has them, and as
/// tendril must show them.
const NAMES: [(&str, &str); 4] = [
    (
        "evil_\x1b[31mred\x1b[0m_name",
        "evil_\\x1b[31mred\\x1b[0m_name",
    ),
    ("evil_\u{202e}cod.exe", "evil_\\u{202e}cod.exe"),
    ("evil_\u{9b}2J_c1", "evil_\\u{9b}2J_c1"),
    ("evil_\u{200b}zero", "evil_\\u{200b}zero"),
];

/// Panics if `text` (what tendril printed) holds a character a terminal would obey or
/// hide; the newlines that end lines are fine.
fn assert_printable(what: &str, text: &str) {
    let raw: Vec<char> = text
        .chars()
        .filter(|&c| c != '\n' && is_unsafe(c))
        .collect();
    assert!(raw.is_empty(), "{what} printed {raw:?} raw:\n{text}");
}

fn run(args: &[&str]) -> Output {
    tendril().args(args).output().expect("cannot run tendril")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("tendril prints UTF-8")
}

/// Waits until the fixture's worker has called `hostile_round` again since now: two
/// `round` lines printed from now on whose call counts differ (the lines printed while
/// tendril attached are dropped: under load they differ too, from calls before it).
fn wait_for_calls(target: &mut Target) {
    target.drain();
    let first = target.rounds(1, ROUND_TIMEOUT)[0].get("calls");
    while target.rounds(1, ROUND_TIMEOUT)[0].get("calls") == first {}
}

#[test]
fn symbols_shows_hostile_names_escaped_and_finds_them_by_name_and_pattern() {
    let target = Target::spawn("hostile_names", &[]);
    let pid = target.pid().to_string();
    let listing = run(&["symbols", &pid, "evil_*"]);
    assert!(listing.status.success(), "{listing:?}");
    let stdout = text(&listing.stdout);
    assert_printable("symbols", &stdout);
    for (_, shown) in NAMES {
        assert!(stdout.contains(shown), "{shown} missing:\n{stdout}");
    }
    assert_eq!(stdout.lines().count(), NAMES.len(), "{stdout}");

    // The exact name (the bytes of the symbol table) and globs find each one.
    for (exact, shown) in NAMES {
        let found = run(&["symbols", &pid, exact]);
        let stdout = text(&found.stdout);
        assert!(found.status.success(), "{shown}: {found:?}");
        assert_eq!(stdout.lines().count(), 1, "{shown}:\n{stdout}");
        assert!(stdout.trim_end().ends_with(shown), "{stdout}");
    }
    let glob = text(&run(&["symbols", &pid, "hostile_names:evil_*cod*"]).stdout);
    assert!(glob.trim_end().ends_with("evil_\\u{202e}cod.exe"), "{glob}");

    // JSON keeps the names exact, the characters a terminal obeys as \u escapes.
    let json = run(&["symbols", &pid, "evil_*", "--json"]);
    let json = text(&json.stdout);
    assert_printable("symbols --json", &json);
    let listed: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    for (exact, _) in NAMES {
        assert!(
            listed.iter().any(|f| f["name"] == exact),
            "{exact:?}: {json}"
        );
    }

    // A near miss: the error's "did you mean" names the hostile function, escaped.
    let miss = run(&["symbols", &pid, "evil_31mred_0m_name"]);
    assert!(!miss.status.success());
    let stderr = text(&miss.stderr);
    assert_printable("the no-match error", &stderr);
    assert!(
        stderr.contains("did you mean: evil_\\x1b[31mred\\x1b[0m_name"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn count_shows_hostile_names_and_thread_names_escaped() {
    let mut target = Target::spawn("hostile_names", &[]);
    let pid = target.pid().to_string();
    for json in [false, true] {
        let mut command = tendril();
        command
            .args(["count", &pid, "evil_*"])
            .stdout(Stdio::piped());
        if json {
            command.arg("--json");
        }
        let counting = RunningTendril::start(command, "tendril: counting calls", START_TIMEOUT);
        wait_for_calls(&mut target);
        counting.interrupt();
        let (status, stdout, stderr) = counting.wait();
        assert!(status.success(), "{stderr}\n{stdout}");
        assert_printable("count", &stdout);
        assert_printable("count's stderr", &stderr);
        if json {
            let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
            let functions = report["functions"].as_array().unwrap();
            for (exact, _) in NAMES {
                let function = functions.iter().find(|f| f["name"] == exact);
                let function = function.unwrap_or_else(|| panic!("{exact:?}: {stdout}"));
                assert!(function["calls"].as_u64().unwrap() > 0, "{stdout}");
                assert_eq!(function["threads"][0]["name"], "w\x1b[7mrk", "{stdout}");
            }
        } else {
            for (_, shown) in NAMES {
                let row = stdout.lines().find(|line| line.ends_with(shown));
                let row = row.unwrap_or_else(|| panic!("{shown} missing:\n{stdout}"));
                let calls: u64 = row.split_whitespace().next().unwrap().parse().unwrap();
                assert!(calls > 0, "{row}");
            }
        }
    }
}

#[test]
fn edges_lists_hostile_callees_and_functions_escaped() {
    let mut target = Target::spawn("hostile_names", &[]);
    let pid = target.pid().to_string();
    for function in ["hostile_round", "evil_*cod*"] {
        let mut command = tendril();
        command
            .args(["edges", &pid, function])
            .stdout(Stdio::piped());
        let counting = RunningTendril::start(command, "tendril: counting edges", START_TIMEOUT);
        wait_for_calls(&mut target);
        counting.interrupt();
        let (status, stdout, stderr) = counting.wait();
        assert!(status.success(), "{stderr}\n{stdout}");
        assert_printable("edges", &stdout);
        assert_printable("edges' stderr", &stderr);
        if function == "hostile_round" {
            for (_, shown) in NAMES {
                assert!(
                    stdout.contains(&format!("call {shown}")),
                    "{shown}:\n{stdout}"
                );
            }
        } else {
            let header = stdout.lines().next().unwrap();
            assert!(
                header.starts_with("evil_\\u{202e}cod.exe (hostile_names, process"),
                "{header}"
            );
            assert!(
                stderr.contains("edges of evil_\\u{202e}cod.exe"),
                "{stderr}"
            );
        }
    }
}

#[test]
fn record_and_report_show_hostile_names_escaped_and_keep_them_exact() {
    let mut target = Target::spawn("hostile_names", &[]);
    let pid = target.pid().to_string();
    let profile = std::env::temp_dir().join(format!("tendril-hostile-{}.json", target.pid()));
    let mut command = tendril();
    command.args([
        "record",
        &pid,
        "--root",
        "hostile_round",
        "--root",
        "evil_*cod*",
        // Every name must reach the folded stacks, which hold only stacks with time:
        // no callee is counted in its caller here.
        "--time-all",
        "-o",
        profile.to_str().unwrap(),
    ]);
    let recording = RunningTendril::start(command, "tendril: recording", START_TIMEOUT);
    wait_for_calls(&mut target);
    recording.interrupt();
    let (status, _, stderr) = recording.wait();
    assert!(status.success(), "{stderr}");
    assert_printable("record's stderr", &stderr);
    assert!(
        stderr.contains("tendril: recording hostile_round, evil_\\u{202e}cod.exe in process"),
        "{stderr}"
    );

    // The file's strings are exact to a JSON reader, and safe to print.
    let file = std::fs::read_to_string(&profile).unwrap();
    assert_printable("the profile file", &file);
    let saved = tendril::profile::Profile::load(&profile).unwrap();
    assert!(saved.threads.iter().any(|t| t.name == "w\x1b[7mrk"));
    let root = &saved.merged.roots;
    let below: Vec<&str> = root
        .iter()
        .flat_map(|r| r.children.iter().map(|c| c.name.as_str()))
        .collect();
    for (exact, _) in NAMES {
        assert!(below.contains(&exact), "{exact:?} not in {below:?}");
    }

    for format in ["tree", "hot", "folded", "json"] {
        let report = run(&["report", profile.to_str().unwrap(), "--format", format]);
        assert!(report.status.success(), "{report:?}");
        let stdout = text(&report.stdout);
        assert_printable(&format!("report --format {format}"), &stdout);
        if format != "json" {
            for (_, shown) in NAMES {
                assert!(stdout.contains(shown), "{format}: {shown}:\n{stdout}");
            }
        }
    }
    let _ = std::fs::remove_file(profile);
}
