//! Benchmark: on-CPU times on an oversubscribed machine.
//!
//! Run with `cargo bench --bench cpu_time`.
//!
//! The `off_cpu` fixture's `crunch` computes a fixed amount per call (and `nap` sleeps
//! 2 ms). Its bare CPU cost per call is what the fixture's own thread CPU clock gives
//! with nothing attached and nothing else running. Then four busy processes share the
//! two cores with it, and tendril records it: `crunch`'s on-CPU time per call should stay
//! within 10% of the bare cost, while its wall-clock time grows with the wait for a core.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{Target, number_after};
use std::process::{Child, Command};
use std::time::Duration;
use tendril::profile::Node;
use tendril::recording::{RecordOptions, Recorder, Scheme};

const REQUESTS: u32 = 300;
const BUSY_PROCESSES: usize = 4;
const TIMEOUT: Duration = Duration::from_secs(600);

/// The fixture's own mean CPU nanoseconds per `crunch` for `run REQUESTS`.
fn run(target: &mut Target) -> f64 {
    target.write_stdin(&format!("run {REQUESTS}\n"));
    let line = target.expect_line("run ", TIMEOUT);
    number_after(&line, "crunch_cpu")
}

struct Busy(Vec<Child>);

impl Drop for Busy {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn find<'a>(roots: &'a [Node], name: &str) -> &'a Node {
    let mut pending: Vec<&Node> = roots.iter().collect();
    while let Some(node) = pending.pop() {
        if node.name == name {
            return node;
        }
        pending.extend(node.children.iter());
    }
    panic!("{name} was not recorded")
}

fn main() {
    let mut target = Target::spawn("off_cpu", &[]);
    run(&mut target); // warm-up
    let bare = run(&mut target);
    let busy = Busy(
        (0..BUSY_PROCESSES)
            .map(|_| {
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .spawn()
                    .expect("sh")
            })
            .collect(),
    );
    let mut recorder = Recorder::start(&RecordOptions {
        pid: target.pid(),
        roots: vec!["request".into()],
        scheme: Scheme::B,
        gross_only: false,
        timing: Default::default(),
        pointer_candidates: false,
    })
    .expect("record the fixture");
    let poller = std::thread::spawn(move || {
        let mut target = target;
        let own = run(&mut target);
        (own, target)
    });
    while !poller.is_finished() {
        recorder.poll();
        std::thread::sleep(Duration::from_millis(2));
    }
    let (own_loaded, _target) = poller.join().unwrap();
    let profile = recorder.finish(false).expect("finish").profile;
    drop(busy);
    let crunch = find(&profile.merged.roots, "crunch");
    let calls = crunch.calls.max(1) as f64;
    let cpu = crunch.cpu_ns.expect("CPU time") as f64 / calls;
    let wall = crunch.total_ns as f64 / calls;
    println!(
        "crunch, {BUSY_PROCESSES} busy processes on {} cores, {} calls:",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        crunch.calls
    );
    println!("  bare CPU cost (fixture's own clock, unloaded)   {bare:>10.0} ns");
    println!("  fixture's own CPU clock, loaded and recorded    {own_loaded:>10.0} ns");
    println!(
        "  tendril on-CPU time per call                    {cpu:>10.0} ns  ({:+.1}% of bare)",
        (cpu / bare - 1.0) * 100.0
    );
    println!(
        "  tendril wall-clock time per call                {wall:>10.0} ns  ({:.2}x bare)",
        wall / bare
    );
}
