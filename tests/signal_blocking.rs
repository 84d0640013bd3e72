//! Threads that block every signal — one waiting in `sigwait`, one running user code
//! without a break, a background thread in timed sleeps as jemalloc's is — beside
//! ordinary workers (fixture `signal_blocking`), and threads that start and end all the
//! time (fixture `unwinding`): tendril counts and records them exactly, patches and
//! restores again and again, and leaves every byte of code as it found it, even when the
//! controller is killed in the middle of a large batch. No patch writes an `int3` a
//! thread could meet, so no thread's signal mask is a reason to refuse anything.

use crate::common;

use common::{Counting, Recording, Round, Target, code_bytes_match_file, tendril};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tendril::profile::Node;
use tendril::symbols::ProcessSymbols;
use tendril::targets;
use tendril_wire::{Hook, Request, Response};

const LINE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the agent may take to restore everything once its controller is gone.
const RESTORE_DEADLINE: Duration = Duration::from_secs(60);
/// The fixture's ordinary workers; the calling threads are these and the two masked ones.
const WORKERS: &str = "2";
const CALLERS: u64 = 4;
/// The threads that call the functions under test, by name, sorted.
const CALLING_THREADS: [&str; 4] = ["jemalloc_bg_thd", "masked_busy", "worker0", "worker1"];
/// The functions of one round and their calls per round and calling thread.
const ROUND_CALLS: [(&str, u64); 3] = [("work_round", 1), ("sb_outer", 3), ("sb_inner", 6)];

fn spawn() -> Target {
    let target = Target::spawn("signal_blocking", &[WORKERS]);
    let expected = format!("ready pid={} callers={CALLERS}", target.pid());
    assert_eq!(target.ready_line(), Some(expected.as_str()));
    target
}

/// Checks a `round` line of `rounds` rounds: every function counted exactly its calls on
/// every calling thread, and `sb_spin` never gave a wrong result. Returns its checksum.
fn check_round(round: &Round, rounds: u64) -> u64 {
    assert_eq!(round.get("callers"), Some(CALLERS), "{round:?}");
    assert_eq!(round.get("rounds"), Some(rounds), "{round:?}");
    for (function, per_round) in ROUND_CALLS {
        let expected = CALLERS * rounds * per_round;
        assert_eq!(round.get(function), Some(expected), "{function}: {round:?}");
    }
    assert_eq!(round.get("spin_errors"), Some(0), "{round:?}");
    round.get("checksum").expect("a checksum")
}

/// Has every calling thread do `rounds` rounds; returns the checked checksum.
fn run_rounds(target: &mut Target, rounds: u64) -> u64 {
    target.write_stdin(&format!("round {rounds}\n"));
    check_round(&target.rounds(1, LINE_TIMEOUT)[0], rounds)
}

/// The sigwaiter still takes SIGUSR2, which would end the process if it did not.
fn check_sigwaiter(target: &mut Target) {
    target.signal(libc::SIGUSR2);
    assert_eq!(
        target.expect_line("sigwait ", LINE_TIMEOUT),
        "sigwait got 12"
    );
}

/// The function named `name` in `count --json`'s report, and its calls per thread name
/// (threads with calls only, sorted).
fn counted_per_thread(report: &serde_json::Value, name: &str) -> (u64, Vec<(String, u64)>) {
    let function = report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("{name} was not counted: {report:#}"));
    let mut threads: Vec<(String, u64)> = function["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let name = t["name"].as_str().unwrap().to_string();
            (name, t["calls"].as_u64().unwrap())
        })
        .filter(|&(_, calls)| calls > 0)
        .collect();
    threads.sort();
    (function["calls"].as_u64().unwrap(), threads)
}

#[test]
fn count_is_exact_on_every_thread_whatever_signals_it_blocks() {
    const ROUNDS: u64 = 100;
    let mut target = spawn();
    let bare = run_rounds(&mut target, ROUNDS);
    let counting = Counting::start(
        target.pid(),
        &["work_round", "sb_outer", "sb_inner", "sb_spin", "--json"],
    );
    assert_eq!(run_rounds(&mut target, ROUNDS), bare);
    let report = counting.finish();
    let json: serde_json::Value = serde_json::from_str(&report.stdout).unwrap();
    assert_eq!(json["refused"], serde_json::json!([]), "{}", report.stderr);
    for (function, per_round) in ROUND_CALLS {
        let expected: Vec<(String, u64)> = CALLING_THREADS
            .iter()
            .map(|thread| (thread.to_string(), ROUNDS * per_round))
            .collect();
        assert_eq!(
            counted_per_thread(&json, function),
            (CALLERS * ROUNDS * per_round, expected),
            "{function}: {json:#}"
        );
    }
    // sb_spin runs on the masked busy thread alone, between commands.
    let (_, spinning) = counted_per_thread(&json, "sb_spin");
    assert!(
        spinning.iter().all(|(thread, _)| thread == "masked_busy"),
        "{spinning:?}"
    );
    code_bytes_match_file(target.pid()).unwrap();
    assert_eq!(run_rounds(&mut target, ROUNDS), bare);
    check_sigwaiter(&mut target);
}

/// Checks one tree of `record --root work_round`: the root called `rounds` times, with
/// exactly sb_outer below it and exactly sb_inner below that, with their exact calls.
fn check_tree(roots: &[Node], rounds: u64, whose: &str) {
    let names = |nodes: &[Node]| nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(roots), ["work_round"], "{whose}");
    let mut nodes = roots;
    for (depth, (function, per_round)) in ROUND_CALLS.iter().enumerate() {
        assert_eq!(names(nodes), [*function], "{whose}, depth {depth}");
        assert_eq!(nodes[0].calls, rounds * per_round, "{whose}: {function}");
        nodes = &nodes[0].children;
    }
    assert!(
        nodes.is_empty(),
        "{whose}: below sb_inner: {:?}",
        names(nodes)
    );
}

fn record_gives_exact_trees_on_every_calling_thread(scheme: &str) {
    const ROUNDS: u64 = 100;
    let mut target = spawn();
    let bare = run_rounds(&mut target, ROUNDS);
    let recording = Recording::start(target.pid(), &["--root", "work_round", "--scheme", scheme]);
    assert_eq!(run_rounds(&mut target, ROUNDS), bare);
    let recorded = recording.finish();
    let profile = &recorded.profile;
    let mut threads: Vec<&str> = profile.threads.iter().map(|t| t.name.as_str()).collect();
    threads.sort();
    assert_eq!(threads, CALLING_THREADS, "{}", recorded.stderr);
    for thread in &profile.threads {
        check_tree(&thread.roots, ROUNDS, &thread.name);
    }
    check_tree(&profile.merged.roots, CALLERS * ROUNDS, "merged");
    assert_eq!(profile.stats.lost_events, 0);
    code_bytes_match_file(target.pid()).unwrap();
    assert_eq!(run_rounds(&mut target, ROUNDS), bare);
    check_sigwaiter(&mut target);
}

#[test]
fn record_scheme_b_gives_exact_trees_on_every_calling_thread() {
    // Scheme B patches the callees from the target's own threads, the masked ones too.
    record_gives_exact_trees_on_every_calling_thread("b");
}

#[test]
fn record_scheme_a_gives_exact_trees_on_every_calling_thread() {
    record_gives_exact_trees_on_every_calling_thread("a");
}

#[test]
fn patch_and_restore_cycles_under_threads_that_block_every_signal() {
    // 40, or 200 with `TENDRIL_LONG_SOAK=1`.
    let cycles = common::soak_cycles(40, 200);
    const ROUNDS: u64 = 5;
    let mut target = spawn();
    let pid = target.pid();
    let bare = run_rounds(&mut target, ROUNDS);
    let symbols = ProcessSymbols::load(pid).unwrap();
    let patterns = ["work_round", "sb_outer", "sb_inner", "sb_spin"].map(String::from);
    let matched = targets::match_patterns(&symbols, &patterns).unwrap();
    let (_, mut session) = tendril::inject::attach(pid).unwrap();
    let chosen = targets::choose(&symbols, &matched, &mut session).unwrap();
    assert_eq!(chosen.len(), patterns.len());

    for cycle in 0..cycles {
        // The rounds run while their functions are patched and restored: the background
        // thread sleeps before each, and masked_busy spins in sb_spin all along.
        target.write_stdin(&format!("round {ROUNDS}\n"));
        let hook = if cycle % 2 == 0 {
            Hook::Count
        } else {
            Hook::CountReturns
        };
        let functions: Vec<_> = chosen.iter().map(|c| (&c.function, hook)).collect();
        let addresses = match session
            .request(&targets::patch_request(&symbols, &functions))
            .unwrap()
        {
            Response::Patched { outcomes } => {
                for outcome in &outcomes {
                    assert!(outcome.id.is_some(), "cycle {cycle}: {outcome:?}");
                }
                outcomes.iter().map(|o| o.address).collect::<Vec<_>>()
            }
            other => panic!("cycle {cycle}: {other:?}"),
        };
        match session.request(&Request::Unpatch { addresses }).unwrap() {
            Response::Unpatched { restored, .. } => assert_eq!(restored, chosen.len()),
            other => panic!("cycle {cycle}: {other:?}"),
        }
        let round = &target.rounds(1, LINE_TIMEOUT)[0];
        assert_eq!(check_round(round, ROUNDS), bare, "cycle {cycle}");
    }
    drop(session);
    code_bytes_match_file(pid).unwrap();
    assert_eq!(run_rounds(&mut target, 100), run_rounds(&mut target, 100));
    check_sigwaiter(&mut target);
    assert!(target.is_running());
}

#[test]
fn glibc_s_thread_start_and_end_are_counted_exactly_as_threads_come_and_go() {
    const THREADS: u64 = 40;
    // Functions glibc runs with every signal blocked, once per thread: as pthread_create
    // makes it (__clone_internal), as it starts (start_thread, __ctype_init), as it
    // ends (__madvise, freeing its stack) and as it is joined (__nptl_free_tcb).
    let once_per_thread = [
        "__clone_internal",
        "start_thread",
        "__ctype_init",
        "__madvise",
        "__nptl_free_tcb",
    ];
    let mut target = Target::spawn("unwinding", &[]);
    let mut patterns: Vec<String> = once_per_thread
        .iter()
        .map(|name| format!("libc.so.6:{name}"))
        .collect();
    patterns.push("exit_outer".to_string());
    let patterns: Vec<&str> = patterns.iter().map(String::as_str).collect();
    let counting = Counting::start(target.pid(), &patterns);
    // Each of the THREADS threads starts, calls pthread_exit and is joined, in turn.
    target.write_stdin(&format!("exit {THREADS}\n"));
    let line = target.expect_line("exit calls ", LINE_TIMEOUT);
    assert!(line.contains(&format!(" exit_outer={THREADS} ")), "{line}");
    let report = counting.finish();
    assert!(report.not_counted.is_empty(), "{}", report.stdout);
    assert_eq!(report.calls("exit_outer"), THREADS, "{}", report.stdout);
    for name in once_per_thread {
        assert_eq!(report.calls(name), THREADS, "{name}:\n{}", report.stdout);
    }
    code_bytes_match_file(target.pid()).unwrap();
    assert!(target.is_running());
}

#[test]
fn the_agent_restores_everything_when_its_controller_is_killed_during_a_large_batch() {
    const ROUNDS: u64 = 20;
    let mut target = spawn();
    let pid = target.pid();
    let bare = run_rounds(&mut target, ROUNDS);
    // Commands queued on stdin keep the threads calling into libc (the main thread's
    // stdio, the workers' locks, the background thread's nanosleep) during the batch.
    let queued = 20;
    target.write_stdin(&format!("round {ROUNDS}\n").repeat(queued));
    let mut count = tendril()
        .args(["count", &pid.to_string(), "libc.so.6:*"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The first byte patched shows the batch has begun; the controller dies at once.
    let deadline = Instant::now() + RESTORE_DEADLINE;
    while code_bytes_match_file(pid).is_ok() {
        if let Some(status) = count.try_wait().unwrap() {
            let output = count.wait_with_output().unwrap();
            panic!(
                "tendril count ended ({status}) before patching anything: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        assert!(Instant::now() < deadline, "the batch never began");
    }
    count.kill().unwrap(); // SIGKILL
    count.wait().unwrap();

    // The agent sees its connection end and restores what the batch patched.
    let deadline = Instant::now() + RESTORE_DEADLINE;
    while let Err(difference) = code_bytes_match_file(pid) {
        assert!(
            Instant::now() < deadline,
            "not restored within {RESTORE_DEADLINE:?}: {difference}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for round in target.rounds(queued, LINE_TIMEOUT) {
        assert_eq!(check_round(&round, ROUNDS), bare);
    }
    assert_eq!(run_rounds(&mut target, ROUNDS), bare);
    check_sigwaiter(&mut target);
    assert!(target.is_running());
}
