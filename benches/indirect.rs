//! Benchmark: following calls through pointers (issue 12).
//!
//! Run with `cargo bench --bench indirect` (`ONLY=calls` or `ONLY=start` runs one half).
//! Every hooked figure is set against bare runs of the same process in the same run
//! (bare, hooked, bare).
//!
//! * Per call: the `indirect` fixture times `table_root(N)` (N calls through a table of
//!   three function pointers) and `direct_root(N)` (the same calls made directly).
//!   - an indirect call inside the graph: recorded from `table_root`;
//!   - a direct call inside the graph, for comparison: recorded from `direct_root`;
//!   - an indirect call outside the graph: recorded from `sort_root`, so the three
//!     targets carry the recording hook but `table_root` runs outside the graph;
//!   - the first call of a new target: the discovery pauses of that first recording
//!     (`table_root` and its three targets, each discovered on its first call).
//! * Start: `Recorder::start` (symbols, attach, address-taken functions found, roots
//!   and candidates patched in one batch) on CPython 3.11 (`/usr/bin/python3`, a
//!   non-PIE stripped interpreter with thousands of address-taken functions) running
//!   `sorted(..., key=...)` in a loop, and on tendril's own demo target; against a
//!   `--gross-only` start of the same process, which patches the root only.

#[path = "../tests/common/mod.rs"]
mod common;

use common::Target;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tendril::recording::{RecordOptions, Recorder, Scheme};

const N: u64 = 2_000_000;
const RUNS: usize = 7;
const LINE_TIMEOUT: Duration = Duration::from_secs(120);

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Sends `command` and waits for the reply starting with `reply`, draining the
/// recorder (if any) meanwhile.
fn ask(target: &mut Target, recorder: &mut Option<Recorder>, command: &str, reply: &str) -> String {
    target.write_stdin(&format!("{command}\n"));
    let deadline = Instant::now() + LINE_TIMEOUT;
    loop {
        if let Some(recorder) = recorder.as_mut() {
            recorder.poll();
        }
        if let Some(line) = target.next_line(Duration::from_millis(1))
            && line.starts_with(reply)
        {
            return line;
        }
        assert!(Instant::now() < deadline, "no reply to {command}");
    }
}

/// Median nanoseconds per call of `RUNS` runs of `time <which> N`.
fn ns_per_call(target: &mut Target, recorder: &mut Option<Recorder>, which: &str) -> f64 {
    let samples = (0..RUNS)
        .map(|_| {
            // "time table calls N ns T result X"
            let line = ask(target, recorder, &format!("time {which} {N}"), "time ");
            let words: Vec<&str> = line.split_whitespace().collect();
            words[5].parse::<f64>().unwrap() / words[3].parse::<f64>().unwrap()
        })
        .collect();
    median(samples)
}

fn record(pid: i32, roots: &[&str], gross_only: bool) -> Recorder {
    Recorder::start(&RecordOptions {
        pid,
        roots: roots.iter().map(|r| r.to_string()).collect(),
        scheme: Scheme::B,
        gross_only,
        timing: Default::default(),
        pointer_candidates: false,
    })
    .unwrap()
}

/// Overhead per call of `which` while recording from `root` (bare, hooked, bare).
fn overhead(target: &mut Target, root: &str, which: &str) -> (f64, f64, Recorder) {
    let mut none = None;
    let bare = ns_per_call(target, &mut none, which);
    let mut recorder = Some(record(target.pid(), &[root], false));
    ask(
        target,
        &mut recorder,
        &format!("time {which} 1000"),
        "time ",
    ); // discovery
    let hooked = ns_per_call(target, &mut recorder, which);
    let recorder = recorder.take().unwrap();
    (bare, hooked, recorder)
}

fn per_call_costs() {
    let mut target = Target::spawn("indirect", &[]);
    let mut none = None;
    ns_per_call(&mut target, &mut none, "table"); // warm up

    let (bare, hooked, recorder) = overhead(&mut target, "table_root", "table");
    let profile = recorder.finish(false).unwrap().profile;
    let bare_after = ns_per_call(&mut target, &mut none, "table");
    let baseline = (bare + bare_after) / 2.0;
    let discovery = profile.discovery.clone().unwrap();
    println!(
        "indirect call inside the graph (table_root, N={N}, median of {RUNS}): bare \
         {baseline:.2} ns/call, recorded {hooked:.2} ns/call, overhead {:.2} ns per call \
         ({} targets, {} of {} sites seen entering one)",
        hooked - baseline,
        profile.stats.indirect_targets,
        profile.stats.indirect_sites_followed,
        profile.stats.indirect_call_sites,
    );
    println!(
        "first call of a new target (the discoveries of table_root and its 3 targets): \
         {} discoveries, median {:.1} us, mean {:.1} us",
        discovery.discoveries,
        discovery.median_pause_ns as f64 / 1e3,
        discovery.mean_pause_ns as f64 / 1e3,
    );

    let (bare, hooked, recorder) = overhead(&mut target, "direct_root", "direct");
    recorder.finish(false).unwrap();
    let bare_after = ns_per_call(&mut target, &mut none, "direct");
    let baseline = (bare + bare_after) / 2.0;
    println!(
        "direct call inside the graph (direct_root): bare {baseline:.2} ns/call, recorded \
         {hooked:.2} ns/call, overhead {:.2} ns per call",
        hooked - baseline
    );

    let (bare, hooked, recorder) = overhead(&mut target, "sort_root", "table");
    let profile = recorder.finish(false).unwrap().profile;
    let bare_after = ns_per_call(&mut target, &mut none, "table");
    let baseline = (bare + bare_after) / 2.0;
    println!(
        "indirect call outside the graph (targets instrumented, recording from sort_root; \
         {} address-taken functions instrumented): bare {baseline:.2} ns/call, hooked \
         {hooked:.2} ns/call, overhead {:.2} ns per call",
        profile.stats.indirect_candidates,
        hooked - baseline
    );
}

/// A CPython 3.11 sorting with a key function, forever.
fn python_sorting() -> Option<Child> {
    let script = "import time\nprint('ready', flush=True)\n\
                  while True:\n    sorted(range(2000), key=lambda x: (x * 7919) % 2003)\n";
    Command::new("python3")
        .args(["-c", script])
        .stdout(Stdio::piped())
        .spawn()
        .ok()
}

/// Median wall time of starting (and finishing) a recording of `pid` from `root`.
fn start_times(pid: i32, root: &str, what: &str) {
    let mut full = Vec::new();
    let mut roots_only = Vec::new();
    let mut summary = String::new();
    for _ in 0..5 {
        let started = Instant::now();
        let recorder = record(pid, &[root], false);
        full.push(started.elapsed().as_secs_f64() * 1e3);
        let profile = recorder.finish(false).unwrap().profile;
        summary = format!(
            "{} address-taken functions instrumented, {} not",
            profile.stats.indirect_candidates,
            profile
                .discovery
                .as_ref()
                .map_or(0, |d| d.indirect_not_followed.len())
        );
        let started = Instant::now();
        let recorder = record(pid, &[root], true);
        roots_only.push(started.elapsed().as_secs_f64() * 1e3);
        recorder.finish(false).unwrap();
    }
    println!(
        "starting a recording of {what} from {root} (median of 5): {:.0} ms ({summary}); \
         the root alone (--gross-only): {:.0} ms",
        median(full),
        median(roots_only)
    );
}

fn start_cost() {
    match python_sorting() {
        Some(mut python) => {
            let mut line = String::new();
            let stdout = python.stdout.take().unwrap();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
            start_times(python.id() as i32, "PyObject_Vectorcall", "CPython 3.11");
            let _ = python.kill();
            let _ = python.wait();
        }
        None => println!("starting a recording of CPython: skipped, no python3 here"),
    }
    let mut demo = Command::new(env!("CARGO_BIN_EXE_tendril"))
        .arg("demo-target")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300)); // its workers start
    start_times(
        demo.id() as i32,
        "demo_handle_request",
        "tendril's demo target",
    );
    let _ = demo.kill();
    let _ = demo.wait();
}

fn main() {
    let only = std::env::var("ONLY").unwrap_or_default();
    if only.is_empty() || only == "calls" {
        per_call_costs();
    }
    if only.is_empty() || only == "start" {
        start_cost();
    }
}
