//! `tendril edges` against real processes: exact block, branch, jump-table and loop
//! counts of the `branches` fixture's functions over rounds run on demand, a C++
//! exception passing through the profiled copy, the text listing and `-o FILE`, the
//! code restored byte for byte with the fixture computing the same results, refusals
//! and bad input as one line each. (The agent's side alone is tested in `edges.rs`.)
//! A C++ function that catches is listed with its `.cold` part and its landing pad;
//! every function's paths are checked against its calls and loops; 20 runs in a row (100
//! with `TENDRIL_LONG_SOAK=1`) under 8 throwing threads leave everything intact.

use crate::common;
#[path = "edges_command/refusals.rs"]
mod refusals;

use common::{RunningTendril, Target, code_bytes_match_file, tendril};
use serde_json::Value;
use std::process::Stdio;
use std::time::Duration;

/// Rounds fed to the fixture while its function is profiled.
const K: u64 = 5;
const LINE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long tendril may take to attach and copy the function on a busy machine.
const START_TIMEOUT: Duration = Duration::from_secs(120);
const STARTED: &str = "tendril: counting edges of ";

/// Starts `tendril edges PID <args...>` and waits until the copy is in.
fn start_edges(pid: i32, args: &[&str]) -> RunningTendril {
    let mut command = tendril();
    command
        .arg("edges")
        .arg(pid.to_string())
        .args(args)
        .stdout(Stdio::piped());
    RunningTendril::start(command, STARTED, START_TIMEOUT)
}

/// Ends it with Ctrl-C (SIGINT); returns its stdout, which must be there.
fn finish(running: RunningTendril) -> String {
    running.interrupt();
    let (status, stdout, stderr) = running.wait();
    assert!(status.success(), "tendril edges failed: {stderr}\n{stdout}");
    stdout
}

/// Runs `n` rounds of `branches stdin` (or `throw_through 0`), each a line on its stdin,
/// and returns their `round` lines' checksums.
fn rounds(target: &mut Target, n: u64) -> Vec<u64> {
    target.checksums_on_demand(n as usize, LINE_TIMEOUT)
}

/// Profiles `function` of a fresh `branches stdin` over `K` rounds; checks that the
/// results are the bare ones meanwhile, and that the code is back afterwards.
fn profile_over_rounds(function: &str) -> Value {
    let mut target = Target::spawn("branches", &["stdin"]);
    let bare = rounds(&mut target, 1)[0];
    let running = start_edges(target.pid(), &[function, "--json"]);
    let during = rounds(&mut target, K);
    let stdout = finish(running);
    assert!(during.iter().all(|&c| c == bare), "{during:?} vs {bare}");
    code_bytes_match_file(target.pid()).unwrap();
    assert_eq!(rounds(&mut target, 1), [bare], "after the restore");
    let json: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(json["function"], function, "{json}");
    assert_eq!(json["module"], "branches");
    check_paths(&json);
    json
}

/// The paths agree with the calls and the loops: every call that returns ends one
/// path that starts at the entry, and every back edge ends one path and starts another.
fn check_paths(json: &Value) {
    assert_eq!(json["paths_note"], Value::Null, "{json}");
    let totals = &json["path_totals"];
    assert_eq!(number(&totals["lost"]), 0, "{json}");
    assert_eq!(number(&totals["beyond"]), 0, "{json}");
    let paths = json["paths"].as_array().unwrap();
    let sum = |pick: &dyn Fn(&Value) -> bool| -> u64 {
        paths
            .iter()
            .filter(|p| pick(p))
            .map(|p| number(&p["count"]))
            .sum()
    };
    let back_edges: u64 = loop_counts(json).iter().map(|l| l.1).sum();
    let calls = number(&json["calls"]);
    assert_eq!(number(&totals["runs"]), calls + back_edges, "{json}");
    assert_eq!(sum(&|_| true), calls + back_edges, "{json}");
    assert_eq!(sum(&|p| p["from_back_edge"] == false), calls, "{json}");
    assert_eq!(sum(&|p| p["to_back_edge"] == true), back_edges, "{json}");
    // Every path starts at the entry block or at a loop's head.
    let heads: Vec<&Value> = json["loops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| &l["offset"])
        .collect();
    for path in paths {
        let first = &path["blocks"][0];
        if path["from_back_edge"] == true {
            assert!(heads.contains(&first), "{path}");
        } else {
            assert_eq!(first, 0, "{path}");
        }
    }
}

/// The counts of the paths, most frequent first.
fn path_counts(json: &Value) -> Vec<u64> {
    json["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| number(&p["count"]))
        .collect()
}

fn number(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("not a count: {value}"))
}

/// (taken, not taken) of every conditional branch.
fn branch_splits(json: &Value) -> Vec<(u64, u64)> {
    json["branches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (number(&b["taken"]), number(&b["not_taken"])))
        .collect()
}

/// The pair sorted, as the compiler may invert a condition.
fn as_set((a, b): (u64, u64)) -> (u64, u64) {
    (a.min(b), a.max(b))
}

/// The loop's (head count, back edges, entries), checked against each other.
fn loop_counts(json: &Value) -> Vec<(u64, u64, u64)> {
    json["loops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            let (count, back, entries) = (
                number(&l["count"]),
                number(&l["back_edges"]),
                number(&l["entries"]),
            );
            assert_eq!(count, back + entries, "{l}");
            let per_entry = l["iterations"].as_f64().unwrap();
            assert!(
                (per_entry * entries as f64 - count as f64).abs() < 0.5,
                "{l}"
            );
            (count, back, entries)
        })
        .collect()
}

/// How often a loop's body ran: the head's count when the loop is tested at the bottom
/// (GCC's rotated loops), the back edges when tested at the top.
fn body_runs_match((count, back, _): (u64, u64, u64), runs: u64) -> bool {
    count == runs || back == runs
}

#[test]
fn classify_splits_its_calls_two_to_one_at_its_branch() {
    let json = profile_over_rounds("classify");
    let calls = number(&json["calls"]);
    assert_eq!(calls, 300 * K, "{json}");
    let splits = branch_splits(&json);
    let [split] = splits[..] else {
        panic!("one conditional branch: {json}")
    };
    assert_eq!(split.0 + split.1, calls);
    assert_eq!(as_set(split), (100 * K, 200 * K), "{json}");
    // Every call starts the entry block and goes on into one side of the branch.
    let blocks: Vec<u64> = json["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| number(&b["count"]))
        .collect();
    assert_eq!(blocks[0], calls, "{json}");
    assert_eq!(blocks[1..].iter().sum::<u64>(), calls, "{json}");
    assert_eq!(json["threads"], 1);
    assert!(json["loops"].as_array().unwrap().is_empty(), "{json}");
    // Two paths, one per side of the branch.
    assert_eq!(path_counts(&json), [200 * K, 100 * K], "{json}");
}

#[test]
fn dispatch_counts_each_case_of_its_jump_table() {
    let json = profile_over_rounds("dispatch");
    assert_eq!(number(&json["calls"]), 90 * K, "{json}");
    let tables = json["tables"].as_array().unwrap();
    let [table] = &tables[..] else {
        panic!("one jump table: {json}")
    };
    let entries: Vec<u64> = table["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| number(&e["count"]))
        .collect();
    // Ops 7 and 8 are turned away by the bound check before the table.
    assert_eq!(entries, vec![10 * K; 7], "{json}");
    assert_eq!(entries.iter().sum::<u64>(), 70 * K);
    // A path per case, and one for the default (ops 7 and 8).
    let mut expected = vec![20 * K];
    expected.extend([10 * K; 7]);
    assert_eq!(path_counts(&json), expected, "{json}");
}

#[test]
fn trip_runs_its_loop_body_45_times_a_round() {
    let json = profile_over_rounds("trip");
    assert_eq!(number(&json["calls"]), 10 * K, "{json}");
    let loops = loop_counts(&json);
    let [found] = loops[..] else {
        panic!("one loop: {json}")
    };
    // n = 0..9: 45 iterations; entered 10 times, or 9 when n = 0 skips the loop.
    assert!(body_runs_match(found, 45 * K), "{json}");
    assert!([9 * K, 10 * K].contains(&found.2), "{json}");
}

#[test]
fn depth_counts_its_thirteen_levels_as_calls_or_as_loop_trips() {
    let json = profile_over_rounds("depth");
    let calls = number(&json["calls"]);
    if calls == 13 * K {
        // Built as a recursion: n == 0 ends it once a call of depth(12).
        let splits: Vec<(u64, u64)> = branch_splits(&json).into_iter().map(as_set).collect();
        assert!(splits.contains(&(K, 12 * K)), "{json}");
    } else {
        // GCC -O2 turns the recursion into a loop: one call, 12 trips.
        assert_eq!(calls, K, "{json}");
        let loops = loop_counts(&json);
        let [found] = loops[..] else {
            panic!("one loop: {json}")
        };
        assert_eq!(found.2, K, "{json}");
        assert!(body_runs_match(found, 12 * K), "{json}");
    }
}

#[test]
fn the_listing_goes_to_a_file_and_a_duration_ends_it_with_the_code_restored() {
    let mut target = Target::spawn("branches", &["stdin"]);
    let bare = rounds(&mut target, 1)[0];
    let directory = std::env::temp_dir().join(format!("tendril-edges-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&directory);
    std::fs::create_dir_all(&directory).unwrap();
    let file = directory.join("classify.txt");
    let mut command = tendril();
    command
        .args([
            "edges",
            &target.pid().to_string(),
            "classify",
            "--duration",
            "600",
        ])
        .arg("-o")
        .arg(&file)
        .stdout(Stdio::piped());
    let running = RunningTendril::start(command, STARTED, START_TIMEOUT);
    rounds(&mut target, K);
    running.interrupt();
    let (status, stdout, stderr) = running.wait();
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout, "", "the listing went to the file");
    assert!(
        stderr.contains(&format!(
            "tendril: edge profile written to {}",
            file.display()
        )),
        "{stderr}"
    );
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.starts_with(&format!("classify (branches, process {})", target.pid())),
        "{text}"
    );
    // 1,500 calls, 1,000 of them taking one side of the branch.
    assert_eq!(K, 5, "the text below is that of 5 rounds");
    assert!(text.contains("1,500 calls in "), "{text}");
    assert!(
        text.contains("taken 1,000 (66.7%)") || text.contains("not taken 1,000"),
        "{text}"
    );
    assert!(
        text.contains("paths: 2 of 2 acyclic paths ran, 1,500 runs\n"),
        "{text}"
    );
    assert!(text.contains("  1,000   66.7%  +0x0 → +0x"), "{text}");
    code_bytes_match_file(target.pid()).unwrap();

    // A duration ends it by itself; nothing called meanwhile is said as such.
    let output = tendril()
        .args([
            "edges",
            &target.pid().to_string(),
            "trip",
            "--duration",
            "0.3",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(
        stdout.contains("trip was not called in the ")
            && stdout.contains(" s its edges were counted"),
        "{stdout}"
    );
    code_bytes_match_file(target.pid()).unwrap();
    assert_eq!(rounds(&mut target, 2), [bare, bare]);
    std::fs::remove_dir_all(&directory).unwrap();
}

#[test]
fn an_exception_passes_through_the_profiled_copy_to_its_handler() {
    let mut target = Target::spawn("throw_through", &["0"]);
    let bare = target_round(&mut target);
    assert_eq!(bare.0, 250);
    let running = start_edges(target.pid(), &["relay*", "--json"]);
    let during: Vec<(u64, u64)> = (0..K).map(|_| target_round(&mut target)).collect();
    let json: Value = serde_json::from_str(&finish(running)).unwrap();
    assert!(during.iter().all(|&r| r == bare), "{during:?} vs {bare:?}");
    // 1,000 calls a round; 250 leave through thrower's exception, 750 come back and
    // take one side of relay's branch or the other.
    assert_eq!(number(&json["calls"]), 1000 * K, "{json}");
    let taken_or_not: u64 = branch_splits(&json).iter().map(|(t, n)| t + n).sum();
    assert_eq!(taken_or_not, 750 * K, "{json}");
    code_bytes_match_file(target.pid()).unwrap();
    assert_eq!(target_round(&mut target), bare);
}

#[test]
fn a_function_that_catches_is_listed_with_its_cold_part_and_where_exceptions_landed() {
    let mut target = Target::spawn("throw_through", &["0"]);
    let bare = target_round(&mut target);
    // do_round's catch block is in its `.cold` part, which jumps back into the loop.
    let running = start_edges(target.pid(), &["do_round*", "--json"]);
    let during: Vec<(u64, u64)> = (0..K).map(|_| target_round(&mut target)).collect();
    let json: Value = serde_json::from_str(&finish(running)).unwrap();
    assert!(during.iter().all(|&r| r == bare), "{during:?} vs {bare:?}");
    assert_eq!(number(&json["calls"]), K, "{json}");
    let landed: Vec<u64> = (json["landing_pads"].as_array().unwrap().iter())
        .map(|pad| number(&pad["count"]))
        .collect();
    assert!(landed.contains(&(250 * K)), "{json}");
    // Paths: each iteration ends one (at the back edge, the last at the return), and
    // each catch starts one at the landing pad.
    assert_eq!(json["paths_note"], Value::Null, "{json}");
    assert_eq!(number(&json["path_totals"]["runs"]), 1000 * K, "{json}");
    assert_eq!(number(&json["path_totals"]["lost"]), 0, "{json}");
    let from_pads: u64 = (json["paths"].as_array().unwrap().iter())
        .filter(|path| path["from_landing_pad"] == true)
        .map(|path| number(&path["count"]))
        .sum();
    assert_eq!(from_pads, 250 * K, "{json}");
    // Every iteration of the loop, the 250 a round that caught included, is counted.
    let blocks = json["blocks"].as_array().unwrap();
    assert!(
        blocks.iter().any(|b| number(&b["count"]) == 1000 * K),
        "{json}"
    );
    // The text marks the landing pad and the cold part.
    let running = start_edges(target.pid(), &["do_round*"]);
    target_round(&mut target);
    let text = finish(running);
    assert!(text.contains("⤷ landing pad"), "{text}");
    assert!(
        text.contains("its .cold part") && text.contains("cold+0x"),
        "{text}"
    );
    assert!(
        text.contains("⤷ +0x"),
        "a path from the landing pad: {text}"
    );
    code_bytes_match_file(target.pid()).unwrap();
    assert_eq!(target_round(&mut target), bare);
}

#[test]
fn a_target_that_exits_still_gets_its_listing_from_the_last_reading() {
    let mut target = Target::spawn("branches", &["stdin"]);
    let pid = target.pid();
    let running = start_edges(pid, &["classify"]);
    rounds(&mut target, K);
    // End of input ends the fixture.
    target.close_stdin();
    target
        .wait_exit(LINE_TIMEOUT)
        .expect("branches exits at the end of its input");
    let (status, stdout, stderr) = running.wait();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("process {pid} "))
            && stderr.contains("counts are from its last reading"),
        "{stderr}"
    );
    // The code was read before the copy went in: the listing is whole.
    assert!(
        stdout.starts_with(&format!("classify (branches, process {pid})")),
        "{stdout}"
    );
    assert!(stdout.contains(" ret"), "{stdout}");
}

/// One round of `throw_through 0`: (caught, checksum).
fn target_round(target: &mut Target) -> (u64, u64) {
    target.write_stdin("go\n");
    let round = target.rounds(1, LINE_TIMEOUT).remove(0);
    (round.get("caught").unwrap(), round.get("checksum").unwrap())
}

/// Runs `tendril edges PID <args>` to its end, which must be a failure said in one
/// line on stderr starting with `start` (and nothing on stdout); returns the line.
fn refused(pid: i32, args: &[&str], start: &str) -> String {
    let output = tendril()
        .arg("edges")
        .arg(pid.to_string())
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{output:?}");
    assert!(output.stdout.is_empty(), "{output:?}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with(start), "{stderr}");
    stderr
}

fn agent_loaded(pid: i32) -> bool {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.contains("libtendril_agent")
}

#[test]
fn a_function_that_calls_setjmp_gets_its_edges_without_paths_and_says_why() {
    let mut target = Target::spawn("branches", &["stdin"]);
    let bare = rounds(&mut target, 1)[0];
    let output = tendril()
        .args([
            "edges",
            &target.pid().to_string(),
            "twice",
            "--duration",
            "0.2",
            "--json",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}\n{stdout}");
    let json: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(json["paths"], Value::Null, "{json}");
    let note = json["paths_note"].as_str().unwrap_or_default();
    assert!(note.contains("setjmp, which returns twice"), "{json}");
    assert!(!json["blocks"].as_array().unwrap().is_empty(), "{json}");
    code_bytes_match_file(target.pid()).unwrap();
    assert_eq!(rounds(&mut target, 1), [bare]);
}

#[test]
fn coroutines_switching_stacks_inside_the_function_lose_paths_but_never_miscount_them() {
    // co_work yields twice (inside co_leaf), then takes one side of its last branch in
    // coroutine 0 and the other in coroutine 1; the two coroutines' calls interleave on
    // one thread, each on a stack of its own.
    let mut target = Target::spawn("coroutines", &[]);
    target.write_stdin("run 3\n");
    target.rounds(1, LINE_TIMEOUT);
    let running = start_edges(target.pid(), &["co_work", "--json"]);
    target.write_stdin("run 1000\n");
    let round = target.rounds(1, LINE_TIMEOUT).remove(0);
    let stdout = finish(running);
    let json: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let calls = number(&json["calls"]);
    assert_eq!(Some(calls), round.get("co_work"), "{json}");
    let [branch] = &json["branches"].as_array().unwrap()[..] else {
        panic!("one branch: {json}")
    };
    let side = |key: &str| {
        (
            number(&branch[key]),
            branch[format!("{key}_offset")].clone(),
        )
    };
    let (taken, taken_offset) = side("taken");
    let (not_taken, not_taken_offset) = (
        number(&branch["not_taken"]),
        branch["not_taken_offset"].clone(),
    );
    // The two calls open on the coroutines' stacks when the copy went out return
    // after the last reading.
    assert!(taken + not_taken + 2 >= calls, "{json}");
    // Each path ran at most as often as the side of the branch it goes through: a
    // call whose register another coroutine's call displaced is lost, never counted
    // under the other path.
    let totals = &json["path_totals"];
    let mut counted = 0;
    for path in json["paths"].as_array().unwrap() {
        let blocks = path["blocks"].as_array().unwrap();
        let limit = if blocks.contains(&taken_offset) {
            taken
        } else {
            assert!(blocks.contains(&not_taken_offset), "{path}");
            not_taken
        };
        assert!(number(&path["count"]) <= limit, "{path} vs {json}");
        counted += number(&path["count"]);
    }
    assert_eq!(counted + number(&totals["lost"]), number(&totals["runs"]));
    assert_eq!(number(&totals["runs"]), taken + not_taken, "{json}");
    code_bytes_match_file(target.pid()).unwrap();
    target.write_stdin("run 10\n");
    assert_eq!(
        target.rounds(1, LINE_TIMEOUT).remove(0).get("co_work"),
        Some(10)
    );
}

#[test]
fn attach_profile_detach_cycles_under_eight_throwing_threads_leave_all_intact() {
    // Eight threads call relay all the time, a quarter of the calls thrown through it.
    let mut target = Target::spawn("throw_through", &["8"]);
    let bare = target.checksum_lines(2, LINE_TIMEOUT);
    let pid = target.pid().to_string();
    let mut called = 0;
    let cycles = common::soak_cycles(20, 100);
    for cycle in 0..cycles {
        let output = tendril()
            .args(["edges", &pid, "relay", "--duration", "0.02", "--json"])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "cycle {cycle}: {}\n{stdout}",
            String::from_utf8_lossy(&output.stderr)
        );
        let json: Value =
            serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("cycle {cycle}: {e}"));
        let calls = number(&json["calls"]);
        let totals = &json["path_totals"];
        // A call's path ends only if it returns: never more paths than calls.
        assert!(number(&totals["runs"]) <= calls, "cycle {cycle}: {json}");
        called += u64::from(calls > 0);
    }
    assert!(called > 0, "relay was never called in {cycles} cycles");
    code_bytes_match_file(target.pid()).unwrap();
    target.drain();
    let after = target.checksum_lines(3, LINE_TIMEOUT);
    assert!(after.iter().all(|&c| c == bare[0]), "{after:?} vs {bare:?}");
    assert!(target.is_running());
}
