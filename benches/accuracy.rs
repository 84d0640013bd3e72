//! Benchmark: how close tendril's corrected times come to the bare truth (issue 15).
//!
//! Run with `cargo bench --bench accuracy` (`ONLY=tight|fib|leaves` runs one part;
//! `ONLY=phases` runs a part the default leaves out, below).
//! Every figure is a ratio against a bare run of the same process in the same run (for
//! the tight calls and recursion, bare runs made before and after the recorded ones;
//! for the leaves, bare twins run between the recorded calls):
//!
//! * tight calls: `tightcall`'s `root(N)` — root → mid ×N → leaf ×2, functions of 1–2 ns
//!   — recorded from `root` with Scheme B; the root's corrected total per call against
//!   its bare time (the fixture's own clock);
//! * recursion: `tightcall`'s `fib(N)`, about 3 ns per call, recorded from `fib`; the
//!   outermost node's corrected total per call against the bare time (GCC makes one
//!   of the two recursive calls a loop, so `fib(25)` makes about 122,000 calls, not
//!   the 242,785 of the source);
//! * leaves: `timed`'s leaves of 200 ns, 2 µs and 20 µs (busy-waits) and their parent;
//!   self time per call (the parent's total) against the truth: the fixture's bare twins
//!   of the same functions, timed right after each recorded call of the parent.
//!
//! * phases (`ONLY=phases` only): the raw cost of a hooked call, nothing removed, by
//!   `tightcall`'s own clock over `flat_root`'s 200,000 calls of a 1.3 ns leaf: 40 runs
//!   in one recording, each beside the outer cost the in-situ batches measured during
//!   it; then 7 runs before and 7 after 0 and 20 pause/resume cycles.
//!
//! The oversubscribed case, in CPU time, is `cargo bench --bench cpu_time`.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{Target, node_at, number_after, thread_waited_for_a_core_ns};
use std::time::{Duration, Instant};
use tendril::profile::{Node, Profile};
use tendril::recording::{RecordOptions, Recorder, Scheme};
use tendril_wire::events::HookShape;

const TIMEOUT: Duration = Duration::from_secs(300);
const RUNS: usize = 5;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Sends `command` and returns the reply starting with `reply`, draining the recorder
/// (if any) meanwhile, as `tendril record` does.
fn ask(target: &mut Target, recorder: &mut Option<Recorder>, command: &str, reply: &str) -> String {
    target.write_stdin(&format!("{command}\n"));
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(recorder) = recorder.as_mut() {
            recorder.poll();
        }
        if let Some(line) = target.next_line(Duration::from_millis(2))
            && line.starts_with(reply)
        {
            return line;
        }
        assert!(Instant::now() < deadline, "no reply to {command}");
    }
}

fn record(pid: i32, roots: &[&str]) -> Recorder {
    Recorder::start(&RecordOptions {
        pid,
        roots: roots.iter().map(|r| r.to_string()).collect(),
        scheme: Scheme::B,
        gross_only: false,
        timing: Default::default(),
        pointer_candidates: false,
    })
    .unwrap()
}

/// The median over `RUNS` of the fixture's own nanoseconds for one `command`.
fn bare_ns(target: &mut Target, command: &str, reply: &str) -> f64 {
    let mut none = None;
    median(
        (0..RUNS)
            .map(|_| number_after::<f64>(&ask(target, &mut none, command, reply), "ns"))
            .collect(),
    )
}

/// A root recorded against its bare runs.
struct Measured {
    /// The root's corrected total per call, ns.
    corrected: f64,
    /// Its bare time per call around the recording, ns.
    bare: f64,
    /// How long the target waited for a core in each recorded run: a wall-clock time
    /// includes such waits, and no correction removes them.
    waits: String,
    profile: Profile,
}

/// Records `root` while `command` runs `RUNS` times (after one run that discovers the
/// callees), against bare runs before and after.
fn corrected_against_bare(target: &mut Target, root: &str, command: &str, reply: &str) -> Measured {
    let bare_before = bare_ns(target, command, reply);
    let mut recorder = Some(record(target.pid(), &[root]));
    ask(target, &mut recorder, command, reply);
    let profile_before = recorder.as_mut().unwrap().snapshot();
    let before = node_at(&profile_before.merged.roots, &[root]).map(|n| (n.calls, n.total_ns));
    let mut waits = Vec::new();
    for _ in 0..RUNS {
        let waited_before = thread_waited_for_a_core_ns(target.pid(), target.pid());
        ask(target, &mut recorder, command, reply);
        let waited = thread_waited_for_a_core_ns(target.pid(), target.pid()) - waited_before;
        waits.push(format!("{:.2}", waited as f64 / 1e6));
    }

    let profile = recorder.take().unwrap().finish(false).unwrap().profile;
    let bare_after = bare_ns(target, command, reply);
    let node = node_at(&profile.merged.roots, &[root]).expect("the root was recorded");
    let (calls_before, total_before) = before.unwrap_or((0, 0));
    let per_call =
        (node.total_ns as f64 - total_before as f64) / (node.calls - calls_before).max(1) as f64;
    Measured {
        corrected: per_call,
        bare: (bare_before + bare_after) / 2.0,
        waits: format!(
            "  the target waited for a core, in ms per recorded run: {}",
            waits.join(" ")
        ),
        profile,
    }
}

/// The root's estimated error per call (`error_ns`: the calibration's spread times the
/// calls below it), and whether the bare time lies within it of the corrected time.
fn error_bar(profile: &Profile, root: &str, recorded: f64, bare: f64) -> String {
    let node = node_at(&profile.merged.roots, &[root]).expect("the root was recorded");
    match node.error_ns {
        Some(error) => {
            let per_call = error as f64 / node.calls as f64;
            let covers = (recorded - bare).abs() <= per_call;
            format!(
                "  estimated error ±{:.3} ms per call: the bare time is {}",
                per_call / 1e6,
                if covers { "inside it" } else { "OUTSIDE it" }
            )
        }
        None => "  no estimated error (the calibration gave no spread)".to_string(),
    }
}

fn print_calibration(profile: &Profile) {
    let c = &profile.calibration;
    println!(
        "  calibration: inner {:.1} ns, outer {:.1} ns (spread {:.1} / {:.1}; {} in-situ batches); pauses removed {:.1} ms ({:.1} ms of them waits for a core the drain held); {} events",
        c.inner_ns,
        c.outer_ns,
        c.inner_spread_ns,
        c.outer_spread_ns,
        c.in_situ_batches,
        profile.stats.pause_ns as f64 / 1e6,
        profile.stats.core_wait_ns as f64 / 1e6,
        profile.stats.events
    );
    for (shape, values) in [("pad jump", c.pad_jump), ("call thunk", c.call_thunk)] {
        if let Some(v) = values {
            println!(
                "  {shape}: inner {:.1} ns, outer {:.1} ns ({} batches)",
                v.inner_ns, v.outer_ns, v.in_situ_batches
            );
        }
    }
}

fn tight_calls() {
    let mut target = Target::spawn("tightcall", &[]);
    let Measured {
        corrected: recorded,
        bare,
        waits,
        profile,
    } = corrected_against_bare(&mut target, "root", "run 1000000", "run calls ");
    println!(
        "tight calls (root → mid ×1M → leaf ×2): bare {:.3} ms, corrected {:.3} ms per root call: {:.2}× (goal ≤ 1.5×)",
        bare / 1e6,
        recorded / 1e6,
        recorded / bare
    );
    println!("{}", error_bar(&profile, "root", recorded, bare));
    println!("{waits}");
    print_calibration(&profile);
}

fn recursion() {
    let mut target = Target::spawn("tightcall", &[]);
    let Measured {
        corrected: recorded,
        bare,
        waits,
        profile,
    } = corrected_against_bare(&mut target, "fib", "fib 25", "fib calls ");
    let root = node_at(&profile.merged.roots, &["fib"]).expect("the root was recorded");
    let calls = calls_in(root) as f64 / root.calls as f64;
    println!(
        "recursion (fib(25), {calls:.0} calls of {:.1} ns): bare {:.3} ms, corrected {:.3} ms per call of the outermost fib: {:.2}× (goal ≤ 1.5×)",
        bare / calls,
        bare / 1e6,
        recorded / 1e6,
        recorded / bare
    );
    println!("{}", error_bar(&profile, "fib", recorded, bare));
    println!("{waits}");
    print_calibration(&profile);
}

/// The calls made in `node`'s contexts, itself and everything below it.
fn calls_in(node: &Node) -> u64 {
    node.calls + node.children.iter().map(calls_in).sum::<u64>()
}

fn leaves() {
    const CALLS: u32 = 300;
    const ROUNDS: usize = 3;
    let mut target = Target::spawn("timed", &[]);
    let mut recorder = Some(record(target.pid(), &["parent"]));
    // Each recorded parent() is followed by its bare twin, so the truth is taken at
    // the same moment as the recording (see the fixture).
    let pairs = format!("pairs {CALLS}");
    let replies: Vec<String> = (0..ROUNDS)
        .map(|_| ask(&mut target, &mut recorder, &pairs, "pairs "))
        .collect();
    let profile = recorder.take().unwrap().finish(false).unwrap().profile;
    let bare = |name: &str| {
        let values = replies.iter().map(|line| {
            let twins = &line[line.find(" bare ").expect("the twins' times")..];
            number_after::<f64>(twins, name)
        });
        values.sum::<f64>() / ROUNDS as f64
    };
    let roots = &profile.merged.roots;
    let per_call = |node: &Node, total: bool| {
        (if total { node.total_ns } else { node.self_ns }) as f64 / node.calls as f64
    };
    for (name, path, total) in [
        ("short", &["parent", "leaf_short"][..], false),
        ("medium", &["parent", "leaf_medium"][..], false),
        ("long", &["parent", "leaf_long"][..], false),
        ("parent", &["parent"][..], true),
    ] {
        let node = node_at(roots, path).expect("recorded");
        let truth = bare(name);
        let measured = per_call(node, total);
        println!(
            "leaf {name:>6}: truth {truth:>9.0} ns, measured {measured:>9.0} ns per call ({:+.2}%, goal ±5%)",
            100.0 * (measured - truth) / truth
        );
    }
    print_calibration(&profile);
}

/// The mean of `a − b`, and the correlation of `a` with `b` (Pearson's r).
fn gap_and_correlation(a: &[f64], b: &[f64]) -> (f64, f64) {
    let n = a.len() as f64;
    let (mean_a, mean_b) = (a.iter().sum::<f64>() / n, b.iter().sum::<f64>() / n);
    let dot = |x: &[f64], mx: f64, y: &[f64], my: f64| -> f64 {
        x.iter().zip(y).map(|(x, y)| (x - mx) * (y - my)).sum()
    };
    let r =
        dot(a, mean_a, b, mean_b) / (dot(a, mean_a, a, mean_a) * dot(b, mean_b, b, mean_b)).sqrt();
    (mean_a - mean_b, r)
}

/// The raw ns per call of one `flat 200000` (the hooks' whole cost included).
fn flat_run(target: &mut Target, recorder: &mut Option<Recorder>) -> f64 {
    let line = ask(target, recorder, "flat 200000", "flat calls");
    number_after::<f64>(&line, "ns") / number_after::<f64>(&line, "calls")
}

fn phases() {
    let mut target = Target::spawn("tightcall", &[]);
    for recording in 1..=2 {
        let mut recorder = Some(record(target.pid(), &["flat_root"]));
        // Per run: the raw ns per hooked call, and the median outer cost of the in-situ
        // batches the run's thread made meanwhile, of the shape `leaf` has (a 5-byte jump).
        let runs: Vec<(f64, Option<f64>)> = (0..40)
            .map(|_| {
                let batches = |recorder: &Option<Recorder>| {
                    recorder.as_ref().unwrap().in_situ_batches(HookShape::Jump)
                };
                let (read_before, _) = batches(&recorder);
                let raw = flat_run(&mut target, &mut recorder);
                recorder.as_mut().unwrap().poll();
                let (read_after, kept) = batches(&recorder);
                let new = ((read_after - read_before) as usize).min(kept.len());
                let outer: Vec<f64> = kept[kept.len() - new..].iter().map(|b| b.1).collect();
                (raw, (!outer.is_empty()).then(|| median(outer)))
            })
            .collect();
        let shown: Vec<String> = runs
            .iter()
            .map(|(raw, outer)| match outer {
                Some(outer) => format!("{raw:.1}/{outer:.1}"),
                None => format!("{raw:.1}/-"),
            })
            .collect();
        println!(
            "phases, recording {recording}, ns per hooked call / the run's in-situ t_O: {}",
            shown.join(" ")
        );
        // The first two runs discover `leaf` and fault the ring in.
        let (raws, outers): (Vec<f64>, Vec<f64>) = runs[2..]
            .iter()
            .filter_map(|&(raw, outer)| Some((raw, outer?)))
            .unzip();
        if raws.len() > 2 {
            let (mean, correlation) = gap_and_correlation(&raws, &outers);
            println!(
                "phases, recording {recording}: hooked call − in-situ t_O: mean {mean:.2} ns \
                 (the leaf's bare 1.3 ns and the batches' own share of the run included); \
                 correlation over runs {correlation:.2}"
            );
        }
        recorder.take().unwrap().finish(false).unwrap();
    }
    for cycles in [0, 20] {
        let mut recorder = Some(record(target.pid(), &["flat_root"]));
        for _ in 0..3 {
            flat_run(&mut target, &mut recorder);
        }
        let before = median(
            (0..7)
                .map(|_| flat_run(&mut target, &mut recorder))
                .collect(),
        );
        for _ in 0..cycles {
            recorder.as_mut().unwrap().pause().unwrap();
            recorder.as_mut().unwrap().resume().unwrap();
            flat_run(&mut target, &mut recorder);
        }
        let after = median(
            (0..7)
                .map(|_| flat_run(&mut target, &mut recorder))
                .collect(),
        );
        println!(
            "phases: {cycles} pause/resume cycles: {before:.1} ns per hooked call before, \
             {after:.1} after"
        );
        recorder.take().unwrap().finish(false).unwrap();
    }
}

fn main() {
    let only = std::env::var("ONLY").unwrap_or_default();
    if only == "phases" {
        phases();
    }
    if only.is_empty() || only == "tight" {
        tight_calls();
    }
    if only.is_empty() || only == "fib" {
        recursion();
    }
    if only.is_empty() || only == "leaves" {
        leaves();
    }
}
