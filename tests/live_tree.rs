//! The live recorder's tree across pauses, resets and root changes (issue #16): frames
//! that are open when the recording stops watching — deep inside the demo's recursion,
//! on several threads at once — must not swallow what the threads do afterwards.
//!
//! Each test drives a real [`Recorder`] (the one the terminal UI drives) on the real
//! demo workload (`tendril demo-target`: three workers, `demo_handle_request` →
//! `demo_render_response` → the recursive `demo_fib`), acts 10 times while at least two
//! threads are in the middle of calls, and then checks what load cannot change: the
//! root only ever appears at the top of a tree, nothing but a root does, the tree is no
//! deeper than an uninterrupted recording's, every thread's root keeps counting, no
//! thread spent longer inside its roots than the recording watched it, the hot
//! spots' count of the root is the tree's, and every profile is consistent
//! (`common::check_profile`). The depth is compared with uninterrupted recordings of
//! the same process, made just before, and of a second demo process recorded all the
//! while; per-call times are printed, not bounded (load moves them: `print_per_call`;
//! `tests/interruptions.rs` bounds them on a fixture made for it). Every call is timed (`--time-all`): the depth the
//! tests wait for and check is that of timed frames, and adaptive timing would count
//! `demo_fib`'s recursion flat once it judged its calls too short.

use crate::common;

use std::fs;
use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tendril::demo_workload::{DEMO_PROCESS_NAME, DEMO_ROOT, DEMO_WORKERS};
use tendril::profile::{Node, Profile};
use tendril::recording::{RecordOptions, Recorder, Scheme};

/// How long any one wait may take on a loaded machine before the test gives up.
const WAIT: Duration = Duration::from_secs(120);
/// Times each test pauses, resets or changes the roots: each time at least two threads
/// are deep in the recursion, so each is a chance for their frames to be left open
/// (20 until issue #36, which halved it: a start costs the debug demo 2–3 s).
const ROUNDS: usize = 10;
/// Root calls an uninterrupted recording collects for its per-call time (each is some
/// 20,000 calls of `demo_fib`, so 200 give a steady mean; 600 until issue #36).
const BASELINE_CALLS: u64 = 200;
/// Root calls recorded between two actions: enough for every thread to leave the frames
/// it was in when the recording acted, and to start new ones (50 until issue #36).
const CALLS_BETWEEN: u64 = 20;
/// Depth at which a thread is inside `demo_fib`'s recursion (request, render, fib, …).
const MID_RECURSION: usize = 5;

/// The demo workload, killed when dropped.
struct Demo {
    child: Child,
}

impl Demo {
    fn start() -> Demo {
        let mut command = common::tendril();
        command
            .arg("demo-target")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        // SAFETY: only async-signal-safe prctl between fork and exec.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
                Ok(())
            });
        }
        let child = command.spawn().expect("cannot start tendril demo-target");
        let demo = Demo { child };
        // Its workers are threads of their own: wait until they all exist.
        let tasks = format!("/proc/{}/task", demo.pid());
        wait_for("the demo's worker threads", || {
            fs::read_dir(&tasks).map_or(0, |dir| dir.count()) > DEMO_WORKERS
        });
        demo
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The CPU time the demo has used, in clock ticks (`/proc/PID/stat`).
    fn cpu_ticks(&self) -> u64 {
        let stat = fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        // utime and stime are fields 14 and 15; `fields` starts at field 3.
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        field(14).unwrap_or(0) + field(15).unwrap_or(0)
    }

    /// Waits until the demo has run on its own for a while (at least `ticks` of CPU
    /// time): every request that was in progress has long finished.
    fn run_on_its_own(&self, ticks: u64) {
        let from = self.cpu_ticks();
        wait_for("the demo to run while not watched", || {
            self.cpu_ticks() >= from + ticks
        });
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_demo_process_is_named_tendril_demo() {
    let demo = Demo::start();
    let comm = format!("/proc/{}/comm", demo.pid());
    wait_for("the demo's name", || {
        fs::read_to_string(&comm).is_ok_and(|name| name.trim() == DEMO_PROCESS_NAME)
    });
}

/// Waits for `condition`, checking every millisecond, up to [`WAIT`].
fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Drains the rings until `condition` holds for the recorder.
fn record_until(
    recorder: &mut Recorder,
    what: &str,
    mut condition: impl FnMut(&mut Recorder) -> bool,
) {
    let mut checked = Instant::now();
    wait_for(what, || {
        recorder.poll();
        // A snapshot costs more than a drain: look at it now and then.
        if checked.elapsed() < Duration::from_millis(20) {
            return false;
        }
        checked = Instant::now();
        condition(recorder)
    });
}

/// Calls of the root at the top of the merged tree.
fn root_calls(profile: &Profile) -> u64 {
    profile
        .merged
        .roots
        .iter()
        .filter(|node| node.name == DEMO_ROOT)
        .map(|node| node.calls)
        .sum()
}

/// Records `calls` more calls of the root (counted at the top of the tree).
fn record_calls(recorder: &mut Recorder, calls: u64) {
    let from = root_calls(&recorder.snapshot());
    record_until(recorder, "root calls", |r| {
        root_calls(&r.snapshot()) >= from + calls
    });
}

/// Waits until at least two threads are in the middle of `demo_fib`'s recursion.
fn until_mid_recursion(recorder: &mut Recorder) {
    record_until(recorder, "two threads inside demo_fib", |r| {
        r.threads_at_depth(MID_RECURSION) >= 2
    });
}

fn start(demo: &Demo, root: &str, scheme: Scheme) -> Recorder {
    Recorder::start(&RecordOptions {
        pid: demo.pid(),
        roots: vec![root.to_string()],
        scheme,
        gross_only: false,
        timing: tendril::recording::TimingOptions {
            time_all: true,
            ..Default::default()
        },
        pointer_candidates: false,
    })
    .unwrap_or_else(|e| panic!("cannot record the demo: {e}"))
}

/// Every node with its depth (1 at the top).
fn nodes_with_depth(roots: &[Node]) -> Vec<(usize, &Node)> {
    let mut out = Vec::new();
    let mut stack: Vec<(usize, &Node)> = roots.iter().map(|n| (1, n)).collect();
    while let Some((depth, node)) = stack.pop() {
        out.push((depth, node));
        stack.extend(node.children.iter().map(|c| (depth + 1, c)));
    }
    out
}

fn max_depth(profile: &Profile) -> usize {
    nodes_with_depth(&profile.merged.roots)
        .iter()
        .map(|(depth, _)| *depth)
        .max()
        .unwrap_or(0)
}

/// On-CPU times per call (ns) of the root and of its `demo_render_response` child.
fn per_call(profile: &Profile) -> [f64; 2] {
    let root = profile
        .merged
        .roots
        .iter()
        .find(|n| n.name == DEMO_ROOT)
        .expect("the root was recorded");
    let render = root
        .children
        .iter()
        .find(|n| n.name == "demo_render_response")
        .expect("demo_render_response was recorded");
    [root, render].map(|n| {
        let cpu = n.cpu_ns.expect("the recording measures CPU time");
        cpu as f64 / n.calls.max(1) as f64
    })
}

/// An uninterrupted recording of [`BASELINE_CALLS`] root calls.
fn uninterrupted(demo: &Demo, scheme: Scheme) -> Profile {
    let mut recorder = start(demo, DEMO_ROOT, scheme);
    record_calls(&mut recorder, BASELINE_CALLS);
    let profile = recorder.finish(false).expect("the recording ends").profile;
    common::check_profile(&profile);
    profile
}

/// Checks the tree's shape against an uninterrupted recording's, and that the hot
/// spots agree with it.
fn check_shape(profile: &Profile, baseline_depth: usize, what: &str) {
    let trees = std::iter::once(("merged", &profile.merged.roots))
        .chain(profile.threads.iter().map(|t| ("a thread", &t.roots)));
    for (which, roots) in trees {
        for (depth, node) in nodes_with_depth(roots) {
            assert!(
                (depth == 1) == (node.name == DEMO_ROOT),
                "after {what}: {} at depth {depth} of {which} tree (only the root {DEMO_ROOT} \
                 belongs at the top, and only at the top)",
                node.name
            );
        }
    }
    let depth = max_depth(profile);
    assert!(
        depth <= baseline_depth,
        "after {what}: the tree is {depth} deep, an uninterrupted one {baseline_depth}"
    );
    let everywhere: u64 = nodes_with_depth(&profile.merged.roots)
        .iter()
        .filter(|(_, n)| n.name == DEMO_ROOT)
        .map(|(_, n)| n.calls)
        .sum();
    assert_eq!(
        everywhere,
        root_calls(profile),
        "hot spots and tree disagree after {what}"
    );
}

/// Prints per-call on-CPU times beside those of the uninterrupted recording of the same
/// process made just before (`before`); asserts nothing about them. Both are made while
/// the second demo process is recorded (`Concurrent`), so under the same load.
///
/// The 10% bound of issue #16 is asserted in `tests/interruptions.rs`, on a fixture
/// whose requests are a fixed amount of work in few calls (`descend`: within 2.5%
/// beside two busy loops). On the demo the ratio moves with the load: its requests are
/// some 20,000 calls of a few ns, timed one by one, and a recording of it makes tens of
/// millions of events, whose drain and full rings load the machine. After 10 pauses
/// its per-call times came out 1.7 times the uninterrupted ones on a quiet machine and
/// up to 4.9 times beside two busy loops with the controller at opt-level 0; at
/// opt-level 1, whose demo runs faster, 0.2 to 16 times, so no bound here can tell the
/// bug (more than 10 times) from the load. The checks load cannot move are
/// [`check_shape`] and [`check_watched_time`], which catch the bug's cause: frames
/// left open across an interruption.
fn print_per_call(profile: &Profile, before: &Profile, what: &str) {
    println!(
        "{what}: per call {:.0?} ns; uninterrupted {:.0?} ns",
        per_call(profile),
        per_call(before)
    );
}

/// No thread can have spent longer inside its roots than the recording watched it:
/// `watched` bounds the time from above (it includes the requests to the agent). Frames
/// left open across a pause, or nested under stale frames, break this.
fn check_watched_time(profile: &Profile, watched: Duration, what: &str) {
    for thread in &profile.threads {
        let inside: u64 = thread.roots.iter().map(|r| r.total_ns).sum();
        assert!(
            inside as u128 <= watched.as_nanos(),
            "after {what}: thread {} spent {:.3} s inside its roots in {:.3} s watched",
            thread.tid,
            inside as f64 / 1e9,
            watched.as_secs_f64()
        );
    }
}

/// A second demo process recorded without interruption, on a thread of its own, while
/// a test acts on the first: a reference made under the same load.
struct Concurrent {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Profile>,
    _demo: Demo,
}

impl Concurrent {
    fn start(scheme: Scheme) -> Concurrent {
        let demo = Demo::start();
        let mut recorder = start(&demo, DEMO_ROOT, scheme);
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                recorder.poll();
                std::thread::sleep(Duration::from_millis(1));
            }
            recorder.finish(false).expect("the recording ends").profile
        });
        Concurrent {
            stop,
            thread,
            _demo: demo,
        }
    }

    fn finish(self) -> Profile {
        self.stop.store(true, Ordering::Relaxed);
        let profile = self.thread.join().expect("the reference recording ends");
        common::check_profile(&profile);
        profile
    }
}

/// Every worker thread's root count grows while the root is called 300 more times
/// (the threads tab of a frozen tree stops counting).
fn check_threads_keep_counting(recorder: &mut Recorder, what: &str) {
    let calls_by_thread = |profile: &Profile| -> Vec<(u32, u64)> {
        profile
            .threads
            .iter()
            .map(|t| (t.tid, t.roots.iter().map(|r| r.calls).sum()))
            .collect()
    };
    let before = calls_by_thread(&recorder.snapshot());
    let from = before.iter().map(|(_, calls)| calls).sum::<u64>();
    record_until(recorder, "300 more root calls", |r| {
        let now: u64 = calls_by_thread(&r.snapshot()).iter().map(|(_, c)| c).sum();
        now >= from + 300
    });
    let now = calls_by_thread(&recorder.snapshot());
    for (tid, calls) in before {
        let later = now
            .iter()
            .find(|(other, _)| *other == tid)
            .map_or(0, |t| t.1);
        assert!(
            later > calls,
            "after {what}: thread {tid}'s root stays at {calls} calls while others count \
             on: {now:?}"
        );
    }
}

/// Checks a test's profile against the uninterrupted recordings: `before`, of the same
/// process, and the concurrent one, of a second process, ended here.
fn check_against_references(
    profile: &Profile,
    before: &Profile,
    concurrent: Concurrent,
    what: &str,
) {
    let during = concurrent.finish();
    let baseline_depth = max_depth(before).max(max_depth(&during));
    check_shape(profile, baseline_depth, what);
    print_per_call(profile, before, what);
}

#[test]
fn pausing_and_resuming_mid_recursion_leaves_the_tree_as_if_uninterrupted() {
    let _serial = common::live_target_turn();
    let demo = Demo::start();
    let concurrent = Concurrent::start(Scheme::B);
    let before = uninterrupted(&demo, Scheme::B);
    let mut watched = Duration::ZERO;
    let mut watching_since = Instant::now();
    let mut recorder = start(&demo, DEMO_ROOT, Scheme::B);
    for _ in 0..ROUNDS {
        until_mid_recursion(&mut recorder);
        recorder.pause().expect("pause");
        watched += watching_since.elapsed();
        // While paused, the threads leave the frames they were in and go on, for at
        // least a tenth of a second (the bug charged the pauses to those frames).
        demo.run_on_its_own(10);
        watching_since = Instant::now();
        recorder.resume().expect("resume");
        record_calls(&mut recorder, CALLS_BETWEEN);
    }
    check_threads_keep_counting(&mut recorder, "pauses");
    let from = root_calls(&recorder.snapshot());
    record_calls(&mut recorder, BASELINE_CALLS.saturating_sub(from));
    let profile = recorder.finish(false).expect("the recording ends").profile;
    common::check_profile(&profile);
    watched += watching_since.elapsed();
    check_watched_time(&profile, watched, "10 pauses");
    check_against_references(&profile, &before, concurrent, "10 pauses");
}

#[test]
fn resetting_mid_recursion_starts_the_tree_afresh_at_the_root() {
    let _serial = common::live_target_turn();
    let demo = Demo::start();
    let concurrent = Concurrent::start(Scheme::B);
    let before = uninterrupted(&demo, Scheme::B);
    let mut recorder = start(&demo, DEMO_ROOT, Scheme::B);
    let mut since_reset = Instant::now();
    for _ in 0..ROUNDS {
        until_mid_recursion(&mut recorder);
        since_reset = Instant::now();
        recorder.reset();
        record_calls(&mut recorder, CALLS_BETWEEN);
    }
    check_threads_keep_counting(&mut recorder, "resets");
    record_calls(&mut recorder, BASELINE_CALLS);
    let profile = recorder.finish(false).expect("the recording ends").profile;
    common::check_profile(&profile);
    check_watched_time(&profile, since_reset.elapsed(), "10 resets");
    check_against_references(&profile, &before, concurrent, "10 resets");
}

/// With Scheme A, the new roots' whole static graph is instrumented at once, so the
/// threads still inside the old roots' calls run instrumented code at once.
#[test]
fn changing_the_roots_mid_recursion_starts_the_tree_afresh_at_the_new_root() {
    let _serial = common::live_target_turn();
    let demo = Demo::start();
    let concurrent = Concurrent::start(Scheme::A);
    let before = uninterrupted(&demo, Scheme::A);
    let mut recorder = start(&demo, DEMO_ROOT, Scheme::A);
    let mut since_change = Instant::now();
    for round in 0..ROUNDS {
        until_mid_recursion(&mut recorder);
        // Alternately a root inside the old one and the old one again; the last
        // change comes back to the demo's root.
        let root = if round % 2 == 0 {
            "demo_render_response"
        } else {
            DEMO_ROOT
        };
        since_change = Instant::now();
        recorder.set_roots(&[root.to_string()]).expect("new roots");
        assert_eq!(recorder.roots(), [root]);
        if root == DEMO_ROOT {
            record_calls(&mut recorder, CALLS_BETWEEN);
        } else {
            record_until(&mut recorder, "calls of the new root", |r| {
                r.snapshot()
                    .merged
                    .roots
                    .iter()
                    .any(|n| n.name == root && n.calls >= CALLS_BETWEEN)
            });
            let tops: Vec<String> = recorder
                .snapshot()
                .merged
                .roots
                .iter()
                .map(|n| n.name.clone())
                .collect();
            assert!(
                tops.iter().all(|name| name == root),
                "after changing the root to {root}: {tops:?} at the top of the tree"
            );
        }
    }
    check_threads_keep_counting(&mut recorder, "root changes");
    record_calls(&mut recorder, BASELINE_CALLS);
    let profile = recorder.finish(false).expect("the recording ends").profile;
    common::check_profile(&profile);
    check_watched_time(&profile, since_change.elapsed(), "10 root changes");
    check_against_references(&profile, &before, concurrent, "10 root changes");
}
