//! `tendril count` against real fixture processes: exact counts, per-thread JSON, the
//! target's code restored byte for byte, targets that keep computing correct results,
//! a controller that dies, refusals with reasons, bad input, and a function named by its
//! address.

use crate::common;

use common::{Counting, Target, code_bytes_match_file, tendril};
use std::time::Duration;

const ROUND_TIMEOUT: Duration = Duration::from_secs(20);

fn steady_checksum(target: &mut Target, rounds: usize) -> u64 {
    target.steady_checksum(rounds, ROUND_TIMEOUT)
}

/// Runs calltree's counted workload (SIGUSR1) and returns its own report line.
fn run_counted_workload(target: &mut Target) -> String {
    target.signal(libc::SIGUSR1);
    target.expect_line("counted ", ROUND_TIMEOUT)
}

#[test]
fn count_reports_the_exact_calls_of_a_workload() {
    let mut target = Target::spawn("calltree", &["4"]);
    let counting = Counting::start(target.pid(), &["counted_*"]);
    let fixture_says = run_counted_workload(&mut target);
    assert_eq!(fixture_says, "counted outer=1 inner=1000 leaf=2000");
    let report = counting.finish();
    assert_eq!(report.calls("counted_outer"), 1, "{}", report.stdout);
    assert_eq!(report.calls("counted_inner"), 1000);
    assert_eq!(report.calls("counted_leaf"), 2000);
    assert_eq!(report.total, 3001);
    assert_eq!(report.rows[0].name, "counted_leaf", "sorted by calls");
    code_bytes_match_file(target.pid()).unwrap();
}

#[test]
fn count_with_returns_counts_every_return_of_a_workload() {
    let mut target = Target::spawn("calltree", &["2"]);
    let counting = Counting::start(target.pid(), &["counted_*", "--returns"]);
    run_counted_workload(&mut target);
    run_counted_workload(&mut target);
    let report = counting.finish();
    for (name, calls) in [
        ("counted_outer", 2),
        ("counted_inner", 2000),
        ("counted_leaf", 4000),
    ] {
        assert_eq!(report.calls(name), calls, "{}", report.stdout);
        assert_eq!(report.returns(name), calls, "{}", report.stdout);
    }
    code_bytes_match_file(target.pid()).unwrap();
}

#[test]
fn counting_hot_functions_never_changes_what_the_target_computes() {
    let mut target = Target::spawn("calltree", &["8"]);
    let before = steady_checksum(&mut target, 3);
    let patterns = [
        "work_round",
        "compute_block",
        "leaf_add",
        "apply_op",
        "op_*",
        "mix",
        "scramble",
        "fib_rec",
        "format_digest",
    ];
    for returns in [false, true] {
        let mut args: Vec<&str> = patterns.to_vec();
        if returns {
            args.push("--returns");
        }
        let counting = Counting::start(target.pid(), &args);
        // A whole round on every worker, however long load makes it take.
        let during = target.whole_rounds(1, ROUND_TIMEOUT);
        let report = counting.finish();
        assert!(
            during.iter().all(|&checksum| checksum == before),
            "checksum changed while counting: {during:?} against {before}"
        );
        assert!(report.calls("leaf_add") > 100_000, "{}", report.stdout);
        assert!(report.calls("fib_rec") > 57_313, "{}", report.stdout);
        // Every round makes 57313 fib_rec calls and 1024 leaf_add calls per block.
        assert!(report.not_counted.is_empty(), "{}", report.stdout);
        if returns {
            // Frames in flight when the hooks go in or out account for a few calls.
            let leaf = report.row("leaf_add");
            let returns = leaf.returns.unwrap();
            assert!(leaf.calls.abs_diff(returns) < 100, "{}", report.stdout);
        }
        code_bytes_match_file(target.pid()).unwrap();
        assert_eq!(steady_checksum(&mut target, 2), before);
    }
}

#[test]
fn json_lists_counts_per_thread() {
    let target = Target::spawn("calltree", &["3"]);
    let output = tendril()
        .args(["count", &target.pid().to_string(), "work_round", "--json"])
        .args(["--duration", "1"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["pid"], target.pid());
    let function = &report["functions"][0];
    assert_eq!(function["name"], "work_round");
    assert_eq!(function["module"], "calltree");
    let threads = function["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 3, "one entry per worker thread: {report}");
    let sum: u64 = threads.iter().map(|t| t["calls"].as_u64().unwrap()).sum();
    assert_eq!(sum, function["calls"].as_u64().unwrap());
    assert_eq!(report["total_calls"], function["calls"]);
    assert!(threads.iter().all(|t| t["tid"].as_i64().unwrap() > 0));
    code_bytes_match_file(target.pid()).unwrap();
}

#[test]
fn a_controller_killed_while_counting_leaves_the_target_restored() {
    let mut target = Target::spawn("calltree", &["4"]);
    let before = steady_checksum(&mut target, 2);
    let counting = Counting::start(target.pid(), &["leaf_add", "mix", "fib_rec", "--returns"]);
    counting.kill();
    // The agent notices its session end and restores everything by itself.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while code_bytes_match_file(target.pid()).is_err() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    code_bytes_match_file(target.pid()).unwrap();
    assert_eq!(steady_checksum(&mut target, 3), before);
}

#[test]
fn refused_functions_are_listed_with_their_reason() {
    let mut target = Target::spawn("calltree", &["1"]);
    // `_fini` declares no size and has no unwind information: nothing proves it safe.
    let counting = Counting::start(target.pid(), &["counted_outer", "calltree:_fini"]);
    run_counted_workload(&mut target);
    let report = counting.finish();
    assert_eq!(report.calls("counted_outer"), 1);
    assert_eq!(
        report.not_counted,
        [
            "not counted: _fini (calltree) — its size is unknown (no symbol size and no unwind information)"
        ],
        "{}",
        report.stdout
    );
}

#[test]
fn nothing_patchable_is_an_error_that_leaves_the_target_restored() {
    let target = Target::spawn("calltree", &["1"]);
    let output = tendril()
        .args(["count", &target.pid().to_string(), "calltree:_fini"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("tendril: none of the 1 matching functions could be patched"),
        "{stderr}"
    );
    code_bytes_match_file(target.pid()).unwrap();
}

#[test]
fn a_pattern_matching_nothing_fails_before_touching_the_target() {
    let target = Target::spawn("calltree", &["1"]);
    let output = tendril()
        .args(["count", &target.pid().to_string(), "counted_outr"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let expected = format!(
        "tendril: no function matches 'counted_outr' in pid {} — did you mean: counted_outer,",
        target.pid()
    );
    assert!(stderr.starts_with(&expected), "{stderr}");
    assert!(!output.status.success());
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", target.pid())).unwrap();
    assert!(!maps.contains("libtendril_agent"), "no agent was loaded");
}

#[test]
fn durations_out_of_range_are_one_line_with_the_limit_and_a_millisecond_prints_as_one() {
    let target = Target::spawn("calltree", &["1"]);
    let pid = target.pid().to_string();
    for (duration, expected) in [
        ("1e300", "must be at most 1000000000 seconds"),
        ("99999999999", "must be at most 1000000000 seconds"),
        ("-1", "must be a positive number of seconds"),
        ("0", "must be a positive number of seconds"),
        ("0.0001", "must be at least 0.001 seconds"),
        ("soon", "must be a number of seconds"),
    ] {
        let output = tendril()
            .args(["count", &pid, "counted_leaf", "--duration", duration])
            .output()
            .unwrap();
        assert!(!output.status.success(), "{duration} was accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with(&format!("tendril: invalid value '{duration}'"))
                && stderr.contains(expected),
            "{duration}: {stderr}"
        );
        // The value alone is echoed, never a 301-digit rendering of it.
        assert!(stderr.len() < 200, "{stderr}");
    }
    let output = tendril()
        .args(["count", &pid, "counted_leaf", "--duration", "0.001"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains(" for 0.001 s "), "{stderr}");
    code_bytes_match_file(target.pid()).unwrap();
}

#[test]
fn counting_the_allocator_of_a_program_hammering_it_never_deadlocks() {
    let mut target = Target::spawn("mallocs", &["4"]);
    for attempt in 0..5 {
        let counting = Counting::start(target.pid(), &["malloc", "free", "realloc", "memcpy"]);
        std::thread::sleep(Duration::from_millis(300));
        let report = counting.finish();
        assert!(
            report.calls("malloc") > 0,
            "attempt {attempt}: {}",
            report.stdout
        );
        assert!(
            report.calls("free") > 0,
            "attempt {attempt}: {}",
            report.stdout
        );
        let memcpy = report
            .rows
            .iter()
            .find(|r| r.name.starts_with("memcpy →"))
            .unwrap_or_else(|| panic!("memcpy's implementation is counted: {}", report.stdout));
        assert!(memcpy.calls > 0, "{}", report.stdout);
        code_bytes_match_file(target.pid()).unwrap();
        // The fixture checks every block it frees; it would have aborted on corruption.
        target.rounds(1, ROUND_TIMEOUT);
        assert!(target.is_running());
    }
}

#[test]
fn the_agent_never_counts_its_own_calls() {
    // Every thread of `blocked` sits in a system call: none of them calls these libc
    // functions while the count runs, but the agent's own threads do (its control
    // connection reads, writes and polls all the time).
    let target = Target::spawn("blocked", &[]);
    let counting = Counting::start(
        target.pid(),
        &[
            "libc.so.6:read",
            "libc.so.6:write",
            "libc.so.6:__poll",
            "libc.so.6:close",
            "--returns",
        ],
    );
    std::thread::sleep(Duration::from_millis(1500));
    let report = counting.finish();
    assert_eq!(report.total, 0, "{}", report.stdout);
    code_bytes_match_file(target.pid()).unwrap();
}

#[test]
fn a_bad_duration_is_one_clear_line() {
    let target = Target::spawn("calltree", &["1"]);
    let output = tendril()
        .args(["count", &target.pid().to_string(), "mix", "--duration", "0"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--duration"), "{stderr}");
}

#[test]
fn a_detach_from_another_tendril_ends_a_count_and_a_recording_with_a_note() {
    let mut target = Target::spawn("calltree", &["2"]);
    let pid = target.pid().to_string();
    let expected = steady_checksum(&mut target, 2);
    let detach = || {
        let output = tendril().args(["detach", &pid]).output().unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let started = |args: &[&str], line: &str| {
        let mut command = tendril();
        command.args(args).stdout(std::process::Stdio::piped());
        common::RunningTendril::start(command, line, Duration::from_secs(60))
    };

    // A count for a long time: the detach ends it, and it prints what it counted.
    let count = started(
        &["count", &pid, "mix", "--duration", "600"],
        "tendril: counting",
    );
    std::thread::sleep(Duration::from_millis(600));
    assert!(detach().contains("restored=1 functions"));
    let (status, stdout, stderr) = count.wait();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("another tendril detached process {pid}")),
        "{stderr}"
    );
    assert!(stdout.contains(" mix"), "{stdout}");
    code_bytes_match_file(target.pid()).unwrap();

    // A recording likewise: it writes the profile of the time before the detach.
    let record = started(
        &[
            "record",
            &pid,
            "--root",
            "work_round",
            "--duration",
            "600",
            "-o",
            "-",
        ],
        "tendril: recording",
    );
    std::thread::sleep(Duration::from_millis(600));
    detach();
    let (status, stdout, stderr) = record.wait();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("another tendril detached process {pid}")),
        "{stderr}"
    );
    let profile: tendril::profile::Profile = serde_json::from_str(&stdout).unwrap();
    assert!(
        common::node_at(&profile.merged.roots, &["work_round"]).is_some_and(|n| n.calls > 0),
        "{stdout}"
    );
    code_bytes_match_file(target.pid()).unwrap();
    let after = target.checksum_lines(2, ROUND_TIMEOUT);
    assert!(after.iter().all(|&c| c == expected), "{after:?}");
}

/// The fixture's own `thread <TID> tick <T> park <P>` lines after a `pause`.
fn pause_hooked_threads(target: &mut Target, threads: usize) -> Vec<(i64, u64, u64)> {
    target.write_stdin("pause\n");
    let mut counts = Vec::new();
    for _ in 0..threads {
        let line = target.expect_line("thread ", ROUND_TIMEOUT);
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            (words.len(), words[2], words[4]),
            (6, "tick", "park"),
            "{line}"
        );
        counts.push((
            words[1].parse().unwrap(),
            words[3].parse().unwrap(),
            words[5].parse().unwrap(),
        ));
    }
    target.expect_line("paused", ROUND_TIMEOUT);
    counts
}

#[test]
fn returns_and_calls_per_thread_are_exact_while_threads_call_through_the_patching() {
    const THREADS: usize = 4;
    let mut target = Target::spawn("hooked_threads", &[&THREADS.to_string()]);
    // The threads call tick() without pause while the hooks go in and while the count
    // starts: every call the hook saw is one the fixture saw, and the other way round.
    let counting = Counting::start(target.pid(), &["tick", "park", "--returns", "--json"]);
    let fixture_counts = pause_hooked_threads(&mut target, THREADS);
    let report = counting.finish();
    let json: serde_json::Value = serde_json::from_str(&report.stdout).unwrap();
    let per_thread = |name: &str| -> Vec<(i64, u64, u64)> {
        let function = json["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {json}"));
        function["threads"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["tid"].as_i64().unwrap(),
                    t["calls"].as_u64().unwrap(),
                    t["returns"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let (ticks, parks) = (per_thread("tick"), per_thread("park"));
    let workers: Vec<i64> = fixture_counts.iter().map(|row| row.0).collect();
    for (tid, fixture_ticks, fixture_parks) in fixture_counts {
        let counted = |rows: &[(i64, u64, u64)]| {
            rows.iter()
                .find(|row| row.0 == tid)
                .map_or((0, 0), |row| (row.1, row.2))
        };
        // Every tick() returned before the pause: calls = returns = the fixture's own.
        assert_eq!(
            counted(&ticks),
            (fixture_ticks, fixture_ticks),
            "tick on thread {tid}:\n{}",
            report.stdout
        );
        // park() is still open on every thread: one call, no return.
        assert_eq!(
            counted(&parks),
            (fixture_parks, 0),
            "park on thread {tid}:\n{}",
            report.stdout
        );
        assert_eq!(fixture_parks, 1);
    }
    // Counts come only from the fixture's worker threads (on a busy machine a worker
    // may make no call in the counting window: then it has no row, and the fixture's
    // own count, checked above, is 0 too).
    assert!(
        ticks.iter().all(|row| workers.contains(&row.0)),
        "{}",
        report.stdout
    );
    target.write_stdin("resume\n");
    target.expect_line("resumed", ROUND_TIMEOUT);
    code_bytes_match_file(target.pid()).unwrap();
}

#[test]
fn a_plt_stub_row_names_its_module_and_its_calls_are_in_the_total_once() {
    let mut target = Target::spawn("calltree", &["1"]);
    let counting = Counting::start(target.pid(), &["snprintf@plt", "libc.so.6:snprintf"]);
    target.drain();
    target.checksum_lines(2, ROUND_TIMEOUT);
    let report = counting.finish();
    let stub = report.calls("snprintf@plt (calltree)");
    let function = report.calls("snprintf");
    assert!(stub > 0 && function >= stub, "{}", report.stdout);
    assert_eq!(report.total, function, "{}", report.stdout);
    assert!(
        report.stdout.contains("calls through a PLT stub"),
        "{}",
        report.stdout
    );
    code_bytes_match_file(target.pid()).unwrap();
}

#[test]
fn an_address_counts_one_of_two_static_functions_that_share_a_name() {
    // Two `static` functions `step` in one module: 1,000 calls of one a round, 3,000 of
    // the other; only an address names one of them.
    let mut target = Target::spawn("twin_statics", &[]);
    let ready = target.ready_line().expect("a ready line").to_owned();
    let other = ready
        .split_whitespace()
        .find_map(|field| field.strip_prefix("other="))
        .expect("the other step's address")
        .to_owned();
    let here = ready
        .split_whitespace()
        .find_map(|field| field.strip_prefix("here="))
        .expect("this file's step's address")
        .to_owned();
    let bare = target.checksums_on_demand(1, ROUND_TIMEOUT)[0];
    let counting = Counting::start(target.pid(), &[&other]);
    let during = target.checksums_on_demand(2, ROUND_TIMEOUT);
    let report = counting.finish();
    assert_eq!(report.rows.len(), 1, "{}", report.stdout);
    assert_eq!(report.calls("step"), 6000, "{}", report.stdout);
    assert!(during.iter().all(|&c| c == bare), "{during:?}");
    code_bytes_match_file(target.pid()).unwrap();

    // Both, by name: each row says which one it is.
    let counting = Counting::start(target.pid(), &["twin_statics:step"]);
    let during = target.checksums_on_demand(1, ROUND_TIMEOUT);
    let report = counting.finish();
    assert_eq!(report.rows.len(), 2, "{}", report.stdout);
    let twin = |address: &str| format!("step (twin_statics at {address})");
    assert_eq!(report.calls(&twin(&here)), 1000, "{}", report.stdout);
    assert_eq!(report.calls(&twin(&other)), 3000, "{}", report.stdout);
    assert_eq!(during, [bare]);
    code_bytes_match_file(target.pid()).unwrap();
}
