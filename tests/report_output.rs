//! `tendril report` on profile files that try to break it (issue #17): names that
//! carry terminal escape sequences, and a call chain 100,000 deep.
//!
//! The one idea: a profile file is input like any other — anyone can write one — so
//! the test writes such files itself and checks what reaches the terminal: never a raw
//! control character, and output whose size has a bound that follows from the depth
//! cap, stated on stderr when it applies.

use crate::common;

use common::tendril;
use std::io::Read;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tendril::profile::report::{MAX_STACK_DEPTH, MAX_TREE_INDENT};

/// Longest a report may take: a hang guard, not a measure. In a release build a capped
/// report takes a second or two; the tests run a debug build, whose deserialiser frames
/// for a 100,000-deep tree fill about 2 GB of fresh stack (50–140 s on a busy machine).
const REPORT_TIMEOUT: Duration = Duration::from_secs(600);

/// A profile file named `name` in the temporary directory, holding `merged` (a JSON
/// array of nodes) as both the merged tree and one thread's tree.
fn profile_file(name: &str, exe: &str, merged: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "tendril-report-output-{}-{name}.json",
        std::process::id()
    ));
    let json = format!(
        r#"{{"format":"tendril-profile","version":1,"pid":42,"exe":{exe},"roots":["main"],
        "scheme":"B","calibration":{{"tsc_hz":1000000000,"inner_ns":1.0,"outer_ns":2.0}},
        "stats":{{"instrumented_functions":2,"invoked_functions":2,"events":12,"lost_events":0,
        "indirect_call_sites":0,"pause_ns":0}},
        "threads":[{{"tid":42,"name":"app","roots":{merged}}}],"merged":{{"roots":{merged}}}}}"#
    );
    std::fs::write(&path, json).unwrap();
    path
}

/// One node's JSON opening (its children follow, then `]}`).
fn open_node(name: &str, module: &str, total_ns: u64, self_ns: u64) -> String {
    format!(
        r#"{{"name":{name},"module":{module},"calls":1,"total_ns":{total_ns},"self_ns":{self_ns},"children":["#
    )
}

/// What `tendril report FILE --format FORMAT` printed: (stdout bytes, stderr). Reading
/// stops, and the test fails, once stdout passes `limit` bytes.
fn report(file: &PathBuf, format: &str, limit: usize) -> (Vec<u8>, String) {
    let mut child = tendril()
        .args(["report", "--format", format])
        .arg(file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run tendril");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let stderr_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let started = Instant::now();
    let mut output = Vec::new();
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let read = stdout.read(&mut buffer).unwrap();
        if read == 0 {
            break;
        }
        output.extend_from_slice(&buffer[..read]);
        if output.len() > limit || started.elapsed() > REPORT_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "report --format {format} wrote more than {limit} bytes (or took over \
                 {REPORT_TIMEOUT:?}): {} bytes in {:?}",
                output.len(),
                started.elapsed()
            );
        }
    }
    let status = child.wait().unwrap();
    let stderr = stderr_reader.join().unwrap();
    assert!(
        status.success(),
        "report --format {format} failed: {stderr}"
    );
    (output, stderr)
}

/// The control characters in `text` other than the newlines that end its lines.
fn control_characters(text: &str) -> Vec<char> {
    text.chars()
        .filter(|&c| c.is_control() && c != '\n')
        .collect()
}

#[test]
fn names_with_escape_sequences_are_never_printed_raw() {
    // ESC sequences (colour, clear screen, window title), BEL, CR, newline, a C1 CSI.
    let evil = [
        r#""\u001b[31mred\u001b[0m""#,
        r#""clear\u001b[2J\u001b[H""#,
        r#""title\u001b]0;pwned\u0007""#,
        r#""bell\u0007\u0007""#,
        r#""hidden\rvisible""#,
        r#""two\nlines;and;frames""#,
        r#""c1\u009b2J""#,
    ];
    let mut children = String::new();
    for (index, name) in evil.iter().enumerate() {
        if index > 0 {
            children.push(',');
        }
        children.push_str(&open_node(name, r#""mod\u001b[7m""#, 100, 100));
        children.push_str("]}");
    }
    let merged = format!(
        "[{}{children}]}}]",
        open_node(r#""main""#, r#""app""#, 1000, 300)
    );
    let file = profile_file("escapes", r#""/usr/bin/\u001b[5mapp""#, &merged);

    for format in ["tree", "hot", "folded"] {
        let (output, stderr) = report(&file, format, 1 << 20);
        let text = String::from_utf8(output).expect("UTF-8 output");
        assert_eq!(
            control_characters(&text),
            Vec::<char>::new(),
            "--format {format}:\n{text}"
        );
        assert!(stderr.is_empty(), "{stderr}");
        // Each name is still there, its controls spelled out.
        assert!(
            text.contains("\\x1b[31mred\\x1b[0m"),
            "--format {format}:\n{text}"
        );
        assert!(
            text.contains("hidden\\x0dvisible"),
            "--format {format}:\n{text}"
        );
        assert!(text.contains("c1\\u{9b}2J"), "--format {format}:\n{text}");
    }
    let (folded, _) = report(&file, "folded", 1 << 20);
    let folded = String::from_utf8(folded).unwrap();
    // One line per context with self time: main and its seven children.
    assert_eq!(folded.lines().count(), 8, "{folded}");
    assert!(
        folded.contains("main;two\\x0alines:and:frames 100\n"),
        "{folded}"
    );

    let (json, _) = report(&file, "json", 1 << 20);
    let json = String::from_utf8(json).unwrap();
    let raw: Vec<char> = json
        .chars()
        .filter(|&c| (c as u32) < 0x20 && c != '\n')
        .collect();
    assert_eq!(raw, Vec::<char>::new(), "JSON escapes every C0 control");
    let profile = tendril::profile::Profile::from_json(&json, "report").unwrap();
    assert_eq!(profile.merged.roots[0].children[4].name, "hidden\rvisible");
    let _ = std::fs::remove_file(file);
}

#[test]
fn a_100_000_deep_chain_reports_in_bounded_output_and_says_what_was_cut() {
    const DEPTH: usize = 100_000;
    // f → f → … 100,000 deep, every level with self time: uncapped, the folded stacks
    // would repeat the path above each level, 10 GB in all.
    let mut merged = String::with_capacity(DEPTH * 90);
    merged.push('[');
    for level in 0..DEPTH {
        merged.push_str(&open_node(r#""f""#, r#""m""#, (DEPTH - level) as u64, 1));
    }
    for _ in 0..DEPTH {
        merged.push_str("]}");
    }
    merged.push(']');
    let file = profile_file("deep", r#""/usr/bin/deep""#, &merged);

    // Folded: one line per level drawn, the last one the cut frame that holds the
    // time of the 98,977 levels below: about MAX_STACK_DEPTH²/2 frames in all.
    let longest_line = 2 * MAX_STACK_DEPTH + "[99999 levels cut] 99999\n".len();
    let (folded, stderr) = report(&file, "folded", MAX_STACK_DEPTH * longest_line);
    assert_eq!(
        folded.iter().filter(|&&b| b == b'\n').count(),
        MAX_STACK_DEPTH
    );
    let cut_note = format!(
        "tendril: the call tree is deeper than {MAX_STACK_DEPTH} levels: 1 subtree below \
         level {} is drawn as one '[N levels cut]' frame, holding its time",
        MAX_STACK_DEPTH - 1
    );
    assert_eq!(stderr.trim_end(), cut_note);
    let last_line = folded[..folded.len() - 1]
        .rsplit(|&b| b == b'\n')
        .next()
        .unwrap();
    let last_line = String::from_utf8_lossy(last_line);
    let levels_cut = DEPTH - (MAX_STACK_DEPTH - 1);
    assert!(
        last_line.ends_with(&format!(";f;[{levels_cut} levels cut] {levels_cut}")),
        "{last_line:.60}"
    );
    assert_eq!(last_line.split(';').count(), MAX_STACK_DEPTH);

    // SVG: the same cut stacks, one rectangle a level (uncut, 6.7 GB of memory).
    let (svg, stderr) = report(&file, "svg", 4 << 20);
    assert_eq!(stderr.trim_end(), cut_note);
    let svg = String::from_utf8(svg).unwrap();
    assert!(
        svg.contains(&format!("[{levels_cut} levels cut]")),
        "the cut frame is drawn"
    );

    // Tree: indentation stops at MAX_TREE_INDENT levels and deeper rows show their
    // depth: each row is the columns, the indentation, "[depth 99999] " and "f (m)".
    let longest_row = 44 + 2 * MAX_TREE_INDENT + "[depth 99999] ".len() + "f (m)\n".len();
    let (tree, stderr) = report(&file, "tree", 4096 + DEPTH * longest_row);
    assert!(stderr.is_empty(), "{stderr}");
    let tree = String::from_utf8(tree).unwrap();
    assert!(
        tree.lines()
            .last()
            .unwrap()
            .ends_with("[depth 99999] f (m)"),
        "{:?}",
        tree.lines().last()
    );
    let _ = std::fs::remove_file(file);
}
