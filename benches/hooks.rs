//! Benchmark: what tendril's hooks cost per call, and how long patching takes.
//!
//! Run with `cargo bench --bench hooks`.
//!
//! * Hook cost: the `tightcall` fixture times `root(N)` itself (1 + 3N calls). Every
//!   hooked figure is set against a bare run of the same process in the same run:
//!   bare, hooked, bare again, next hook kind... The overhead per call is
//!   `(hooked − bare) / calls`, from the median of several runs each.
//! * Patching: 100 functions of the `manyfuncs` fixture, which 16 threads call without
//!   pause, patched in one request and restored in another, timed as the controller
//!   sees it (request to reply).

#[path = "../tests/common/mod.rs"]
mod common;

use common::Target;
use std::time::{Duration, Instant};
use tendril::agent_connection::AgentConnection;
use tendril::symbols::ProcessSymbols;
use tendril::targets;
use tendril_wire::{Hook, Request, Response};

/// Mid calls per `root(N)`; 3N + 1 calls per run.
const N: u64 = 10_000_000;
const RUNS: usize = 7;
const PATCH_REPEATS: usize = 30;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Nanoseconds per call of `RUNS` runs of `root(N)` (median).
fn ns_per_call(target: &mut Target) -> f64 {
    let mut samples = Vec::new();
    for _ in 0..RUNS {
        target.write_stdin(&format!("run {N}\n"));
        // "run calls C ns T checksum X"
        let line = target.expect_line("run calls ", Duration::from_secs(60));
        let words: Vec<&str> = line.split_whitespace().collect();
        let calls: f64 = words[2].parse().unwrap();
        let nanoseconds: f64 = words[4].parse().unwrap();
        samples.push(nanoseconds / calls);
    }
    median(samples)
}

fn patch(session: &mut AgentConnection, request: Request) -> Vec<u64> {
    match session.request(&request).unwrap() {
        Response::Patched { outcomes } => outcomes
            .iter()
            .map(|o| {
                assert!(o.id.is_some(), "{o:?}");
                o.address
            })
            .collect(),
        other => panic!("{other:?}"),
    }
}

fn unpatch(session: &mut AgentConnection, addresses: Vec<u64>) {
    match session.request(&Request::Unpatch { addresses }).unwrap() {
        Response::Unpatched { .. } => {}
        other => panic!("{other:?}"),
    }
}

fn hook_costs() {
    let mut target = Target::spawn("tightcall", &[]);
    let pid = target.pid();
    let symbols = ProcessSymbols::load(pid).unwrap();
    let patterns = ["root", "mid", "leaf"].map(String::from);
    let matched = targets::match_patterns(&symbols, &patterns).unwrap();
    let functions: Vec<_> = matched.into_iter().cloned().collect();
    let (_, mut session) = tendril::inject::attach(pid).unwrap();
    ns_per_call(&mut target); // warm up

    println!(
        "hook cost per call, tightcall root(N={N}), {} calls per run, median of {RUNS} runs",
        3 * N + 1
    );
    for (label, hook) in [
        ("count (entry hook)", Hook::Count),
        (
            "count + returns (entry and return hooks)",
            Hook::CountReturns,
        ),
    ] {
        let bare = ns_per_call(&mut target);
        let hooked_functions: Vec<_> = functions.iter().map(|f| (f, hook)).collect();
        let addresses = patch(
            &mut session,
            targets::patch_request(&symbols, &hooked_functions),
        );
        let hooked = ns_per_call(&mut target);
        unpatch(&mut session, addresses);
        let bare_after = ns_per_call(&mut target);
        let baseline = (bare + bare_after) / 2.0;
        println!(
            "  {label:<42} bare {baseline:6.2} ns/call   hooked {hooked:6.2} ns/call   \
             overhead {:6.2} ns/call   ratio {:5.2}",
            hooked - baseline,
            hooked / baseline
        );
    }
}

fn patching_time() {
    let threads = std::env::var("MANY_THREADS").unwrap_or("16".into());
    let mut target = Target::spawn("manyfuncs", &[&threads]);
    let pid = target.pid();
    let before = target.checksum_lines(2, Duration::from_secs(20));
    let symbols = ProcessSymbols::load(pid).unwrap();
    let matched = targets::match_patterns(&symbols, &["func_*".to_string()]).unwrap();
    assert_eq!(matched.len(), 100);
    let (_, mut session) = tendril::inject::attach(pid).unwrap();
    let mut patching = Vec::new();
    let mut restoring = Vec::new();
    let mut back_to_back = Vec::new();
    let timed = |work: &mut dyn FnMut()| {
        let started = Instant::now();
        work();
        started.elapsed().as_secs_f64() * 1e3
    };
    let functions: Vec<_> = matched.iter().map(|&f| (f, Hook::Count)).collect();
    for _ in 0..PATCH_REPEATS {
        // A patch or restore the way a user makes one: the agent has been idle a
        // moment before the request (a command, a root change, a detach).
        let request = targets::patch_request(&symbols, &functions);
        std::thread::sleep(Duration::from_millis(10));
        let mut addresses = Vec::new();
        patching.push(timed(&mut || {
            addresses = patch(&mut session, request.clone())
        }));
        std::thread::sleep(Duration::from_millis(10));
        restoring.push(timed(&mut || unpatch(&mut session, addresses.clone())));
        // A patch sent the moment the restore's answer arrives: the agent's thread has
        // just run, and waits longer for a core behind the 16 busy callers.
        back_to_back.push(timed(&mut || {
            addresses = patch(&mut session, request.clone())
        }));
        std::thread::sleep(Duration::from_millis(10));
        unpatch(&mut session, addresses.clone());
    }
    let after = target.checksum_lines(2, Duration::from_secs(20));
    assert!(after.iter().all(|&c| c == before[0]), "checksums changed");
    let max = |times: &[f64]| times.iter().cloned().fold(0.0, f64::max);
    println!(
        "patching 100 functions of manyfuncs while 16 threads call them (n={PATCH_REPEATS}): \
         patch median {:.2} ms (max {:.2}), restore median {:.2} ms (max {:.2}); \
         patch right after a restore median {:.2} ms (max {:.2})",
        median(patching.clone()),
        max(&patching),
        median(restoring.clone()),
        max(&restoring),
        median(back_to_back.clone()),
        max(&back_to_back),
    );
}

fn main() {
    if std::env::var("SKIP_HOOKS").is_err() {
        hook_costs();
    }
    if std::env::var("SKIP_PATCHING").is_err() {
        patching_time();
    }
}
