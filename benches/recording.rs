//! Benchmark: what recording costs (issue 4).
//!
//! Run with `cargo bench --bench recording`. Every hooked figure is set against a bare
//! run of the same process in the same run.
//!
//! * Recording hook per instrumented call: `tightcall` recorded from `root` (Scheme B
//!   instruments `mid` and `leaf` as they first run); the controller drains the rings
//!   while the fixture runs, as `tendril record` does.
//! * An instrumented function called outside the call graph: `tightcall` recorded with
//!   Scheme A from `main`, which is already running and never entered again, so
//!   `root`, `mid` and `leaf` are all instrumented but never inside the graph.
//! * Discovery pauses: `calltree` (1 and 4 worker threads) recorded from `work_round`
//!   (median over discoveries).
//! * `--gross-only`: `timed`'s `parent` (about 155 us per call) timed gross-only.

#[path = "../tests/common/mod.rs"]
mod common;

use common::Target;
use std::time::Duration;
use tendril::recording::{RecordOptions, Recorder, Scheme};

const N: u64 = 5_000_000;
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
    let deadline = std::time::Instant::now() + LINE_TIMEOUT;
    loop {
        if let Some(recorder) = recorder.as_mut() {
            recorder.poll();
        }
        if let Some(line) = target.next_line(Duration::from_millis(1))
            && line.starts_with(reply)
        {
            return line;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no reply to {command}"
        );
    }
}

/// Median nanoseconds per call of `RUNS` runs of tightcall's `root(N)`.
fn tightcall_ns(target: &mut Target, recorder: &mut Option<Recorder>) -> f64 {
    let samples = (0..RUNS)
        .map(|_| {
            // "run calls C ns T checksum X"
            let line = ask(target, recorder, &format!("run {N}"), "run calls ");
            let words: Vec<&str> = line.split_whitespace().collect();
            words[4].parse::<f64>().unwrap() / words[2].parse::<f64>().unwrap()
        })
        .collect();
    median(samples)
}

fn record(pid: i32, roots: &[&str], scheme: Scheme, gross_only: bool) -> Recorder {
    Recorder::start(&RecordOptions {
        pid,
        roots: roots.iter().map(|r| r.to_string()).collect(),
        scheme,
        gross_only,
        timing: Default::default(),
        pointer_candidates: false,
    })
    .unwrap()
}

fn recording_hook_cost() {
    let mut target = Target::spawn("tightcall", &[]);
    let pid = target.pid();
    let mut none = None;
    tightcall_ns(&mut target, &mut none);
    let bare = tightcall_ns(&mut target, &mut none);
    let mut recorder = Some(record(pid, &["root"], Scheme::B, false));
    ask(&mut target, &mut recorder, "run 1000", "run calls "); // discovery happens here
    let recorded = tightcall_ns(&mut target, &mut recorder);
    let profile = recorder.take().unwrap().finish(false).unwrap().profile;
    let bare_after = tightcall_ns(&mut target, &mut none);
    let baseline = (bare + bare_after) / 2.0;
    println!(
        "recording hook, tightcall from root (N={N}, median of {RUNS}): bare {baseline:.2} ns/call, \
         recorded {recorded:.2} ns/call, overhead {:.2} ns per instrumented call \
         (calibrated inner {:.1} ns, outer {:.1} ns; {} events, {} lost)",
        recorded - baseline,
        profile.calibration.inner_ns,
        profile.calibration.outer_ns,
        profile.stats.events,
        profile.stats.lost_events,
    );

    // Scheme A from main: root, mid and leaf instrumented, never inside the graph.
    let bare = tightcall_ns(&mut target, &mut none);
    let mut recorder = Some(record(pid, &["main"], Scheme::A, false));
    let outside = tightcall_ns(&mut target, &mut recorder);
    let profile = recorder.take().unwrap().finish(false).unwrap().profile;
    let bare_after = tightcall_ns(&mut target, &mut none);
    let baseline = (bare + bare_after) / 2.0;
    println!(
        "instrumented functions called outside the call graph ({} instrumented, {} events): \
         bare {baseline:.2} ns/call, hooked {outside:.2} ns/call, overhead {:.2} ns per call",
        profile.stats.instrumented_functions,
        profile.stats.events,
        outside - baseline
    );
}

fn discovery_pauses(threads: usize) {
    let mut target = Target::spawn("calltree", &[&threads.to_string()]);
    target.checksum_lines(2, LINE_TIMEOUT);
    let mut recorder = record(target.pid(), &["work_round"], Scheme::B, false);
    for _ in 0..200 {
        recorder.poll();
        std::thread::sleep(Duration::from_millis(5));
    }
    let profile = recorder.finish(false).unwrap().profile;
    let discovery = profile.discovery.unwrap();
    println!(
        "discovery pauses (calltree from work_round, {threads} threads): {} discoveries, median {:.1} us, \
         mean {:.1} us, {} functions instrumented; {} waits of other threads meanwhile, \
         mean {:.1} us",
        discovery.discoveries,
        discovery.median_pause_ns as f64 / 1e3,
        discovery.mean_pause_ns as f64 / 1e3,
        profile.stats.instrumented_functions,
        discovery.waits,
        discovery.mean_wait_ns as f64 / 1e3,
    );
}

fn gross_only_cost() {
    let mut target = Target::spawn("timed", &[]);
    let mut none = None;
    let parent_ns = |target: &mut Target, recorder: &mut Option<Recorder>| {
        let samples = (0..RUNS)
            .map(|_| {
                // "run N parent P"
                let line = ask(target, recorder, "run 2000", "run ");
                line.split_whitespace()
                    .nth(3)
                    .unwrap()
                    .parse::<f64>()
                    .unwrap()
            })
            .collect();
        median(samples)
    };
    let bare = parent_ns(&mut target, &mut none);
    let mut recorder = Some(record(target.pid(), &["parent"], Scheme::B, true));
    let gross = parent_ns(&mut target, &mut recorder);
    recorder.take().unwrap().finish(false).unwrap();
    let bare_after = parent_ns(&mut target, &mut none);
    let baseline = (bare + bare_after) / 2.0;
    println!(
        "gross-only timing of timed's parent (about 155 us per call, median of {RUNS} runs of 2000): \
         bare {:.1} us, timed {:.1} us, slowdown {:+.2}%",
        baseline / 1e3,
        gross / 1e3,
        100.0 * (gross - baseline) / baseline
    );
}

fn main() {
    let only = std::env::var("ONLY").unwrap_or_default();
    if only.is_empty() || only == "hooks" {
        recording_hook_cost();
    }
    if only.is_empty() || only == "discovery" {
        // One worker thread, then more busy threads than cores: each serialisation of
        // the cores then interrupts a core running the target, and a stop waits for
        // threads to get a core.
        discovery_pauses(1);
        discovery_pauses(4);
    }
    if only.is_empty() || only == "gross" {
        gross_only_cost();
    }
}
