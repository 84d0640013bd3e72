//! Benchmark: how many events per second the CCT builder's `push_events` takes on one
//! core (product requirement: ≥ 50 million).
//!
//! Run with `cargo bench --bench cct`. The stream is made up front, then timed alone:
//! 4 threads, each running rounds of `root → mid ×100 → leaf ×2`, a recursive `fib(12)`,
//! a fan-out node calling 64 different functions, one pause (adjust event) and one
//! unwound call per round. Each thread's stream is a whole number of rounds, so it can be
//! replayed (no frame spans the seam), and it is pushed in ring-sized batches of 8,192
//! events, the threads taking turns, as a consumer draining rings would.

use std::time::{Duration, Instant};
use tendril::profile::{Calibration, CctBuilder, FunctionName, RecordingInfo};
use tendril_wire::events::{Event, EventKind};

const THREADS: u32 = 4;
const EVENTS_PER_THREAD_STREAM: usize = 4_000_000;
const REPLAYS: usize = 4;
const BATCH: usize = 8_192;
const REPETITIONS: usize = 5;

const ROOT: u32 = 0;
const MID: u32 = 1;
const LEAF: u32 = 2;
const FIB: u32 = 3;
const FAN_OUT: u32 = 4;
const THROWS: u32 = 5;
const FAN_OUT_FIRST_CALLEE: u32 = 100;
const FAN_OUT_CALLEES: u32 = 64;

/// Writes one thread's events with a clock that advances a few ticks per event.
struct StreamWriter {
    events: Vec<Event>,
    ts: u64,
    /// A cheap deterministic jitter for the tick steps (xorshift).
    seed: u64,
}

impl StreamWriter {
    fn tick(&mut self) -> u64 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        self.ts += 3 + self.seed % 40;
        self.ts
    }

    fn event(&mut self, kind: EventKind, function: u32) {
        let value = self.tick();
        self.events.push(Event::new(kind, function, value));
    }

    fn call(&mut self, function: u32, body: impl FnOnce(&mut StreamWriter)) {
        self.event(EventKind::Entry, function);
        body(self);
        self.event(EventKind::Exit, function);
    }

    fn fib(&mut self, n: u32) {
        self.call(FIB, |w| {
            if n >= 2 {
                w.fib(n - 1);
                w.fib(n - 2);
            }
        });
    }

    fn round(&mut self, mids: u32) {
        self.call(ROOT, |w| {
            for _ in 0..mids {
                w.call(MID, |w| {
                    w.call(LEAF, |_| {});
                    w.call(LEAF, |_| {});
                });
            }
            w.fib(12);
            w.call(FAN_OUT, |w| {
                for callee in 0..FAN_OUT_CALLEES {
                    w.call(FAN_OUT_FIRST_CALLEE + callee, |_| {});
                }
            });
            w.events.push(Event::new(EventKind::Adjust, 0, 5_000));
            w.event(EventKind::Entry, THROWS);
            w.event(EventKind::Entry, LEAF);
            w.event(EventKind::Unwind, LEAF);
            w.event(EventKind::Unwind, THROWS);
        });
    }
}

fn thread_stream(thread: u32) -> Vec<Event> {
    let mut writer = StreamWriter {
        events: Vec::with_capacity(EVENTS_PER_THREAD_STREAM + 4_096),
        ts: 1_000_000,
        seed: 0x9e37_79b9_7f4a_7c15 ^ u64::from(thread + 1),
    };
    while writer.events.len() < EVENTS_PER_THREAD_STREAM {
        writer.round(100 + thread);
    }
    writer.events
}

fn calibration() -> Calibration {
    Calibration {
        tsc_hz: 2_995_000_000,
        inner_ns: 12.0,
        outer_ns: 20.0,
        inner_spread_ns: 0.0,
        outer_spread_ns: 0.0,
        ..Default::default()
    }
}

/// Pushes every thread's stream `REPLAYS` times, batch by batch, threads in turn.
fn push_all(builder: &mut CctBuilder, streams: &[Vec<Event>]) -> u64 {
    let mut pushed = 0;
    for _ in 0..REPLAYS {
        let mut batches: Vec<_> = streams.iter().map(|s| s.chunks(BATCH)).collect();
        let mut any = true;
        while any {
            any = false;
            for (tid, batch_iter) in (1..).zip(batches.iter_mut()) {
                if let Some(batch) = batch_iter.next() {
                    builder.push_events(tid, batch);
                    pushed += batch.len() as u64;
                    any = true;
                }
            }
        }
    }
    pushed
}

fn main() {
    let started = Instant::now();
    let streams: Vec<Vec<Event>> = (0..THREADS).map(thread_stream).collect();
    let total: usize = streams.iter().map(Vec::len).sum::<usize>() * REPLAYS;
    println!(
        "stream: {THREADS} threads, {total} events ({:.1} M), made in {:.2} s",
        total as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );

    let mut times: Vec<Duration> = Vec::new();
    let mut last_builder = None;
    for repetition in 0..REPETITIONS {
        let mut builder = CctBuilder::new(calibration()).expect("valid calibration");
        let started = Instant::now();
        let pushed = push_all(&mut builder, &streams);
        let elapsed = started.elapsed();
        assert_eq!(pushed as usize, total);
        assert_eq!(builder.counters().events, pushed);
        println!(
            "run {}: {:7.1} M events/s   {:5.2} ns/event   ({:.3} s)",
            repetition + 1,
            pushed as f64 / elapsed.as_secs_f64() / 1e6,
            elapsed.as_secs_f64() * 1e9 / pushed as f64,
            elapsed.as_secs_f64()
        );
        times.push(elapsed);
        last_builder = Some(builder);
    }
    times.sort();
    let rate = |d: Duration| total as f64 / d.as_secs_f64() / 1e6;
    let median = times[times.len() / 2];
    println!(
        "push_events: median {:.1} M events/s ({:.2} ns/event), best {:.1} M events/s",
        rate(median),
        median.as_secs_f64() * 1e9 / total as f64,
        rate(times[0])
    );

    let builder = last_builder.expect("at least one run");
    let names: Vec<FunctionName> = (0..FAN_OUT_FIRST_CALLEE + FAN_OUT_CALLEES)
        .map(|id| FunctionName {
            name: format!("function_{id}"),
            module: "bench".to_owned(),
            address: None,
        })
        .collect();
    let started = Instant::now();
    let profile = builder.snapshot(&RecordingInfo::default(), &names);
    let snapshot_time = started.elapsed();
    let counters = builder.counters();
    println!(
        "snapshot: {:.2} ms ({} threads, {} merged roots); unwound exits {}, unmatched {}",
        snapshot_time.as_secs_f64() * 1e3,
        profile.threads.len(),
        profile.merged.roots.len(),
        counters.unwound_exits,
        counters.unmatched_exits
    );
}
