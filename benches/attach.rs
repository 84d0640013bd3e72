//! Benchmark: how long `tendril status` takes on the 8-thread calltree fixture — the
//! first time (attach + inject + handshake) and when the agent is already resident.
//!
//! Run with `cargo bench --bench attach`. Each sample is the wall time of one whole
//! `tendril status <PID>` process, as a user experiences it. A first injection needs a
//! fresh target each time; resident timings reuse one target.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{Target, tendril};
use std::time::{Duration, Instant};

const FIRST_INJECTIONS: usize = 20;
const RESIDENT_ATTACHES: usize = 50;

fn time_status(pid: i32) -> Duration {
    let started = Instant::now();
    let output = tendril()
        .args(["status", &pid.to_string()])
        .output()
        .expect("cannot run tendril");
    let elapsed = started.elapsed();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    elapsed
}

fn summary(label: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    println!(
        "{label:<34} n={:<3} median {:7.2} ms   p90 {:7.2} ms   min {:7.2} ms   max {:7.2} ms",
        samples.len(),
        ms(at(0.5)),
        ms(at(0.9)),
        ms(samples[0]),
        ms(samples[samples.len() - 1])
    );
}

fn main() {
    // `cargo bench` passes flags such as --bench; this benchmark takes none.
    let mut first = Vec::new();
    for _ in 0..FIRST_INJECTIONS {
        let target = Target::spawn("calltree", &["8"]);
        first.push(time_status(target.pid()));
    }
    let target = Target::spawn("calltree", &["8"]);
    time_status(target.pid());
    let resident: Vec<Duration> = (0..RESIDENT_ATTACHES)
        .map(|_| time_status(target.pid()))
        .collect();
    drop(target);
    // The same on a target whose threads are blocked, which separates tendril's own
    // cost from the wait for a cpu that 8 busy threads on 2 cores impose.
    let idle = Target::spawn("blocked", &[]);
    time_status(idle.pid());
    let idle_resident: Vec<Duration> = (0..RESIDENT_ATTACHES)
        .map(|_| time_status(idle.pid()))
        .collect();
    summary("status, first injection", first);
    summary("status, agent resident", resident);
    summary("status, resident, idle target", idle_resident);
}
