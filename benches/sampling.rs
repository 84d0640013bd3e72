//! Benchmark: sampling from the outside (`tendril sample`, `top`).
//!
//! Run with `cargo bench --bench sampling`. Four figures, each against a bare run or a
//! budget measured in the same run:
//!
//! 1. slowdown: the fixed-work fixture (`sampled rounds N`, real-time priority so the
//!    machine's load cannot take its core) run bare and sampled at 1 kHz, alternately;
//!    the ratio of its wall time and of its CPU time (from `wait4`) sampled / bare.
//! 2. walking: real samples captured from running fixtures (calltree with 8 threads,
//!    `sampled deep 100` and `deep 1000`), then unwound, named and added to the trees
//!    by `SampleWalker` on one core; samples per second against the 64,000 a second
//!    that 64 threads × 1 kHz bring.
//! 3. stack marking (Whaley, Gnedt; `sampling::marks`): each walking figure with marks
//!    off and on, on the same records — a walk stops at a frame the thread's previous
//!    sample walked, whose registers and stack bytes outward are unchanged.
//! 4. top: one refresh (per-function rows from the counts, sort, draw at 120×40) after
//!    sampling calltree's 64 threads, and the controller's CPU time while sampling them.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{Target, fixture};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tendril::commands::top::TopTable;
use tendril::sampling::perf::{EventKind, PerfEvent, Ring};
use tendril::sampling::walker::SampleWalker;
use tendril::sampling::{Sampler, SamplerOptions};
use tendril_tui::TopView;
use tendril_tui::ratatui::{Terminal, backend::TestBackend};

/// split_round() calls of one slowdown run (about 0.35 ms each).
const ROUNDS: &str = "4000";
const SLOWDOWN_PAIRS: usize = 7;
const BUDGET_SAMPLES_PER_SECOND: f64 = 64.0 * 1000.0;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Runs `sampled rounds ROUNDS` once, sampled at `rate` Hz or bare; (wall s, CPU s,
/// samples).
fn fixed_work(rate: Option<u32>) -> (f64, f64, u64) {
    let mut command = Command::new(fixture("sampled"));
    command
        .args(["rounds", ROUNDS])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let parameters = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler is a plain system call on the child, reading a valid
    // sched_param; async-signal-safe and allocation-free.
    unsafe {
        command.pre_exec(move || {
            libc::sched_setscheduler(0, libc::SCHED_FIFO, &parameters);
            Ok(())
        });
    }
    // Reaped below with wait4, which also gives its CPU time.
    #[allow(clippy::zombie_processes)]
    let mut child = command.spawn().expect("the fixture starts");
    let pid = child.id() as i32;
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.starts_with("ready"), "{line}");
    let mut sampler = rate.map(|rate_hz| {
        Sampler::start(
            pid,
            SamplerOptions {
                rate_hz,
                ..SamplerOptions::default()
            },
        )
        .expect("sampling starts")
    });
    let started = Instant::now();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 on our own child, writing status and usage through valid pointers.
        let done = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if done == pid {
            break;
        }
        match sampler.as_mut() {
            Some(sampler) => sampler.poll(Duration::from_millis(5)).unwrap(),
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let cpu = seconds(usage.ru_utime) + seconds(usage.ru_stime);
    let samples = sampler.map_or(0, |s| s.finish().sampling.map_or(0, |s| s.samples));
    (wall, cpu, samples)
}

fn slowdown() {
    let (mut wall_ratios, mut cpu_ratios, mut samples) = (Vec::new(), Vec::new(), Vec::new());
    let (mut bare_walls, mut sampled_walls) = (Vec::new(), Vec::new());
    for _ in 0..SLOWDOWN_PAIRS {
        let (bare_wall, bare_cpu, _) = fixed_work(None);
        let (wall, cpu, taken) = fixed_work(Some(1000));
        wall_ratios.push(wall / bare_wall);
        cpu_ratios.push(cpu / bare_cpu);
        bare_walls.push(bare_wall);
        sampled_walls.push(wall);
        samples.push(taken as f64);
    }
    println!(
        "slowdown at 1 kHz ({SLOWDOWN_PAIRS} pairs, {ROUNDS} rounds): wall ratio median {:.4} \
         (bare {:.3} s, sampled {:.3} s), CPU ratio median {:.4}, {:.0} samples per run",
        median(wall_ratios.clone()),
        median(bare_walls),
        median(sampled_walls),
        median(cpu_ratios),
        median(samples)
    );
    println!("  wall ratios: {wall_ratios:.4?}");
}

/// Raw sample records of every thread of `pid`, `seconds` long, at 1 kHz.
fn capture(pid: i32, seconds: f64) -> Vec<Vec<u8>> {
    let options = SamplerOptions::default();
    let mut rings = Vec::new();
    for tid in tendril::process::thread_ids(pid).unwrap() {
        let event = match PerfEvent::open(
            tid,
            EventKind::CpuClock {
                period_ns: 1_000_000,
            },
            options.stack_bytes,
            false,
            1,
        ) {
            Ok(event) => event,
            Err(_) => continue,
        };
        let ring = Ring::map(&event, options.ring_pages).unwrap();
        event.enable().unwrap();
        rings.push((event, ring));
    }
    let mut records = Vec::new();
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
        for (_, ring) in rings.iter_mut() {
            ring.drain(|bytes| records.push(bytes.to_vec()));
        }
    }
    records
}

/// Unwinds, names and adds `records` again and again for at least a second; samples
/// per second, and the frames per sample.
fn walk_rate(pid: i32, records: &[Vec<u8>], marking: bool) -> (f64, f64) {
    let mut walker = SampleWalker::for_process(pid, 1_000_000).unwrap();
    walker.set_marking(marking);
    let mut walked = 0u64;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(1) {
        for record in records {
            walked += u64::from(walker.add_record(record));
        }
    }
    let rate = walked as f64 / started.elapsed().as_secs_f64();
    // The unwinding alone (no naming, no trees), for where the time goes.
    let mut unwinder = tendril::sampling::unwind::StackUnwinder::for_process(pid).unwrap();
    let mut frames = Vec::new();
    let (mut unwound, unwind_started) = (0u64, Instant::now());
    while unwind_started.elapsed() < Duration::from_millis(500) {
        for record in records {
            if let tendril::sampling::records::Record::Sample(sample) =
                tendril::sampling::records::parse(record)
                && let Some(regs) = sample.regs
            {
                unwinder.walk(regs, sample.stack, &mut frames);
                unwound += 1;
            }
        }
    }
    println!(
        "  unwinding alone: {:.2} µs per sample",
        unwind_started.elapsed().as_secs_f64() * 1e6 / unwound.max(1) as f64
    );
    let frames = walker
        .trees
        .merged
        .to_nodes(&walker.trees.functions)
        .iter()
        .map(depth_weighted)
        .sum::<f64>()
        / walker.trees.samples.max(1) as f64;
    (rate, frames)
}

/// Σ over nodes of self samples × depth (so / samples = mean frames per sample).
fn depth_weighted(root: &tendril::profile::Node) -> f64 {
    let mut sum = 0.0;
    let mut pending = vec![(root, 1.0)];
    while let Some((node, depth)) = pending.pop() {
        let inner: u64 = node.children.iter().filter_map(|c| c.samples).sum();
        sum += node.samples.unwrap_or(0).saturating_sub(inner) as f64 * depth;
        pending.extend(node.children.iter().map(|c| (c, depth + 1.0)));
    }
    sum
}

fn walking() {
    for (name, args) in [
        ("calltree 8 threads", ("calltree", vec!["8"])),
        ("sampled deep 5", ("sampled", vec!["deep", "5"])),
        ("sampled deep 100", ("sampled", vec!["deep", "100"])),
        ("sampled deep 1000", ("sampled", vec!["deep", "1000"])),
    ] {
        let target = Target::spawn(args.0, &args.1);
        let records = capture(target.pid(), 1.5);
        for marking in [false, true] {
            let (rate, frames) = walk_rate(target.pid(), &records, marking);
            println!(
                "walk+name+add, {name:<20} {}, {} records, {frames:6.1} frames/sample: \
                 {:>9.0} samples/s on one core = {:.1}× the 64 threads × 1 kHz budget \
                 ({:.2} µs per sample)",
                if marking { "marks on " } else { "marks off" },
                records.len(),
                rate,
                rate / BUDGET_SAMPLES_PER_SECOND,
                1e6 / rate
            );
        }
    }
}

fn top_refresh() {
    let target = Target::spawn("calltree", &["64"]);
    let mut sampler = Sampler::start(target.pid(), SamplerOptions::default()).unwrap();
    let cpu_before = thread_cpu_seconds();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        sampler.poll(Duration::from_millis(20)).unwrap();
    }
    let cpu = thread_cpu_seconds() - cpu_before;
    let wall = started.elapsed().as_secs_f64();
    let mut table = TopTable::new(format!("pid {}", target.pid()));
    let mut view = TopView::new();
    let mut terminal = Terminal::new(TestBackend::new(120, 40)).unwrap();
    let mut times = Vec::new();
    for _ in 0..20 {
        let begin = Instant::now();
        view.update(table.refresh(&sampler));
        terminal.draw(|frame| view.draw(frame)).unwrap();
        times.push(begin.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "top with {} threads sampled at 499 Hz: refresh (rows, sort, draw 120×40) median \
         {:.2} ms, max {:.2} ms over {} rows; the controller used {:.1}% of one core while \
         sampling ({} samples in {wall:.1} s)",
        sampler.thread_count(),
        median(times.clone()),
        times.iter().cloned().fold(0.0, f64::max),
        view.snapshot().rows.len(),
        100.0 * cpu / wall,
        sampler.trees().samples
    );
}

fn thread_cpu_seconds() -> f64 {
    // SAFETY: an all-zero rusage is valid for getrusage to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage through a valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

fn main() {
    let only = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    let wanted = |name: &str| only.as_deref().is_none_or(|o| name.contains(o));
    if wanted("slowdown") {
        slowdown();
    }
    if wanted("walking") || wanted("marking") {
        walking();
    }
    if wanted("top") {
        top_refresh();
    }
}
