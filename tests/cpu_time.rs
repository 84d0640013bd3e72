//! CPU time per node: a recording takes the time each thread spent off the CPU (from the
//! kernel's context switches) out of the frames it fell in.
//!
//! The one idea: the `off_cpu` fixture's requests compute a fixed amount (`crunch`) and
//! then sleep 2 ms (`nap`), and the fixture measures `crunch`'s time on a CPU itself:
//! its wall time less the time the kernel says it waited for a core. Load cannot move
//! what is asserted: that is the time tendril means, however long the thread waits, a
//! sleep keeps a thread off the CPU at least as long as it asked, and sleeping takes
//! next to no CPU.
//!
//! Not the thread's CPU clock: on a virtual machine, the time the hypervisor takes
//! from a running vCPU ("steal") is in neither the waits nor that clock, and on this
//! VM it made `crunch`'s time on a CPU 8–18% more than its CPU clock while another
//! core was busy. Neither the scheduler nor tendril sees that time go.

use crate::common;

use common::{Recording, Target, node_at, number_after, waited_for_a_core_ns};
use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::time::{ClockId, clock_gettime};
use nix::unistd::Pid;
use std::time::Duration;
use tendril::profile::{Clock, Node};
use tendril::recording::{RecordOptions, Recorder, Scheme};

const LINE_TIMEOUT: Duration = Duration::from_secs(300);
const REQUESTS: u64 = 200;

fn per_call(node: &Node, time: u64) -> f64 {
    time as f64 / node.calls.max(1) as f64
}

#[test]
fn cpu_time_is_wall_time_less_the_time_off_the_cpu() {
    cpu_time_is_wall_time_less_the_time_off_the_cpu_with("0");
}

/// With 100 more threads, idle as a server's pool, the switches are read per core
/// (`off_cpu`'s `PER_CORE_FROM_THREADS`): the same times come out. A core's records are
/// every process's switches, and a switch record lost to a full ring counts as time on
/// the CPU: so this takes its turn with the tests whose fixtures switch hundreds of
/// thousands of times a second (`many_threads`), which filled those rings.
#[test]
fn cpu_time_of_a_target_of_many_threads_is_wall_time_less_the_time_off_the_cpu() {
    let _turn = common::live_target_turn();
    cpu_time_is_wall_time_less_the_time_off_the_cpu_with("100");
}

fn cpu_time_is_wall_time_less_the_time_off_the_cpu_with(idle_threads: &str) {
    let mut target = Target::spawn("off_cpu", &[idle_threads]);
    let recording = Recording::start(target.pid(), &["--root", "request"]);
    target.write_stdin(&format!("run {REQUESTS}\n"));
    let line = target.expect_line("run ", LINE_TIMEOUT);
    let crunch_on_cpu_truth: f64 = number_after(&line, "crunch_on_cpu");
    let crunch_cpu_clock: f64 = number_after(&line, "crunch_cpu");
    let nap_ns: f64 = number_after(&line, "nap_ns");
    let recorded = recording.finish();
    let profile = recorded.profile;
    assert_eq!(profile.stats.cpu_unmeasured, None);
    let roots = &profile.merged.roots;
    let request = node_at(roots, &["request"]).expect("request was recorded");
    let crunch = node_at(roots, &["request", "crunch"]).expect("crunch was recorded");
    let nap = node_at(roots, &["request", "nap"]).expect("nap was recorded");
    for node in [request, crunch, nap] {
        assert_eq!(node.calls, REQUESTS, "{} calls", node.name);
    }
    let cpu = |node: &Node| node.cpu_ns.expect("a CPU time");

    // The work's time on a CPU, as the fixture measured it.
    let crunch_cpu = per_call(crunch, cpu(crunch));
    assert!(
        (crunch_cpu / crunch_on_cpu_truth - 1.0).abs() <= 0.10,
        "crunch: {crunch_cpu:.0} ns of CPU per call; the fixture measured {crunch_on_cpu_truth:.0} \
         on a CPU ({crunch_cpu_clock:.0} by its thread CPU clock)"
    );
    // Each request sleeps at least nap_ns: at least that much of its wall time is off
    // the CPU, and all of it inside nap.
    let off = |node: &Node| per_call(node, node.total_ns - cpu(node));
    assert!(
        off(request) >= 0.95 * nap_ns && off(nap) >= 0.95 * nap_ns,
        "off the CPU per call: request {:.0} ns, nap {:.0} ns; each sleeps {nap_ns} ns",
        off(request),
        off(nap)
    );
    // Sleeping takes next to no CPU.
    let nap_cpu = per_call(nap, cpu(nap));
    assert!(
        nap_cpu < 0.15 * nap_ns,
        "nap: {nap_cpu:.0} ns of CPU per call for a {nap_ns} ns sleep"
    );

    // The report shows either clock.
    let mut shown = profile.clone();
    shown.show_clock(Clock::Cpu).unwrap();
    let request_shown = node_at(&shown.merged.roots, &["request"]).unwrap();
    assert_eq!(request_shown.total_ns, cpu(request));
    assert_eq!(request_shown.cpu_ns, Some(request.total_ns));
}

#[test]
fn gross_only_recordings_say_cpu_time_is_not_measured() {
    let mut target = Target::spawn("off_cpu", &[]);
    let recording = Recording::start(target.pid(), &["--root", "request", "--gross-only"]);
    target.write_stdin("run 5\n");
    target.expect_line("run ", LINE_TIMEOUT);
    let profile = recording.finish().profile;
    let why = profile.stats.cpu_unmeasured.clone().expect("a reason");
    assert!(why.contains("--gross-only"), "{why}");
    let mut shown = profile;
    let refused = shown
        .show_clock(Clock::Cpu)
        .expect_err("no CPU times to show");
    assert!(refused.to_string().contains("--gross-only"), "{refused}");
}

/// The first core this thread may run on.
fn first_allowed_core() -> usize {
    let allowed = sched_getaffinity(Pid::from_raw(0)).unwrap();
    (0..CpuSet::count())
        .find(|&cpu| allowed.is_set(cpu).unwrap_or(false))
        .expect("a core to run on")
}

/// Pins thread `tid` (0: the calling thread) to `core`.
fn pin(tid: i32, core: usize) {
    let mut only = CpuSet::new();
    only.set(core).unwrap();
    sched_setaffinity(Pid::from_raw(tid), &only).unwrap();
}

fn thread_cpu_ns() -> u64 {
    let now = clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).unwrap();
    now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64
}

/// Keeps this thread on the CPU for `ns` of its own CPU time.
fn burn_cpu(ns: u64) {
    let until = thread_cpu_ns() + ns;
    while thread_cpu_ns() < until {}
}

/// Pins every thread of `pid`, and the calling thread, to one core; returns a recorder
/// of `root`.
fn recording_on_one_core(pid: i32, root: &str) -> Recorder {
    let core = first_allowed_core();
    pin(0, core);
    for tid in tendril::process::thread_ids(pid).unwrap() {
        pin(tid, core);
    }
    Recorder::start(&RecordOptions {
        pid,
        roots: vec![root.into()],
        scheme: Scheme::B,
        gross_only: false,
        timing: Default::default(),
        pointer_candidates: false,
    })
    .unwrap()
}

/// Sends `command` and, until the reply starting with `reply` comes, holds the core by
/// turns: drain, then 2 ms of work. Returns the CPU time the turns took, and the reply.
fn drain_by_turns(
    target: &mut Target,
    recorder: &mut Recorder,
    command: &str,
    reply: &str,
) -> (u64, String) {
    target.write_stdin(&format!("{command}\n"));
    let cpu_before = thread_cpu_ns();
    loop {
        recorder.poll();
        burn_cpu(2_000_000);
        if let Some(line) = target.next_line(Duration::ZERO) {
            assert!(line.starts_with(reply), "{line}");
            return (thread_cpu_ns() - cpu_before, line);
        }
    }
}

/// The target and the thread that drains its recording share one core, and the drain
/// keeps it busy: whenever the drain runs while the target computes (`timed`'s `held`
/// spins for 400 ms), the target waits for the core. Those waits are tendril's doing, so
/// they are told apart and taken out of wall time like the agent's pauses. Load cannot
/// move what is asserted: whatever else shares the core, each moment the drain runs
/// there during the spin is a moment the pinned target waits for it, and no wait found
/// can be longer than the kernel's own count of the target's waits.
#[test]
fn waits_for_a_core_the_drain_held_are_pauses() {
    let mut target = Target::spawn("timed", &[]);
    let mut recorder = recording_on_one_core(target.pid(), "held");
    let kernel_waits_before = waited_for_a_core_ns(target.pid());
    let (drain_cpu, reply) = drain_by_turns(&mut target, &mut recorder, "hold 400", "hold ");
    let call_ns: f64 = number_after(&reply, "done");
    let kernel_waits = waited_for_a_core_ns(target.pid()) - kernel_waits_before;
    let profile = recorder.finish(false).unwrap().profile;
    assert_eq!(profile.stats.cpu_unmeasured, None);
    let waited = profile.stats.core_wait_ns;
    // The last turn may end after the spin, and the first begin before it; the two
    // clocks may differ by a hair.
    assert!(
        waited as f64 >= 0.5 * drain_cpu as f64 && waited as f64 <= 1.02 * kernel_waits as f64,
        "the target waited {waited} ns for the core the drain held; the drain ran {drain_cpu} \
         ns there during the spin, and the kernel counts {kernel_waits} ns of waits in all"
    );
    assert!(profile.stats.pause_ns >= waited);
    let held = node_at(&profile.merged.roots, &["held"]).expect("held was recorded");
    assert_eq!(held.calls, 1);
    assert!(held.cpu_ns.expect("a CPU time") <= held.total_ns);
    // The spin lasts 400 ms by the clock, however long it waits, and the call as long as
    // the fixture measured it (later, if it waited for a core once the spin was over):
    // its wall time is that less the waits taken out.
    let accounted = (held.total_ns + waited) as f64 / call_ns;
    assert!(
        (0.95..=1.05).contains(&accounted),
        "held: {} ns of wall time and {waited} ns of waits for the drain make {accounted:.3} of \
         the {call_ns} ns the call took",
        held.total_ns
    );
}

/// The same, with a target that sleeps inside its recorded calls (`off_cpu`'s requests:
/// a fixed computation, then a 2 ms nap): the drain's turns while it sleeps are no wait
/// for a core, so what is found stays within the kernel's own count of its waits.
#[test]
fn the_drains_turns_while_the_target_sleeps_are_no_wait() {
    let mut target = Target::spawn("off_cpu", &[]);
    let mut recorder = recording_on_one_core(target.pid(), "request");
    let kernel_waits_before = waited_for_a_core_ns(target.pid());
    drain_by_turns(&mut target, &mut recorder, "run 100", "run ");
    let kernel_waits = waited_for_a_core_ns(target.pid()) - kernel_waits_before;
    let profile = recorder.finish(false).unwrap().profile;
    let waited = profile.stats.core_wait_ns;
    assert!(
        waited as f64 <= 1.02 * kernel_waits as f64,
        "{waited} ns of waits for the drain found; the kernel counts {kernel_waits} ns of waits in all"
    );
    let request = node_at(&profile.merged.roots, &["request"]).expect("request was recorded");
    assert_eq!(request.calls, 100);
}
