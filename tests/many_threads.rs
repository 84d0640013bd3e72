//! A thousand threads in the call graph at once: each gets a ring of its own and a
//! tree of its own, no event is lost, and the target goes on computing correctly.
//!
//! The fixture `many_threads` runs THREADS threads that each call `thread_root` at a
//! steady pace and reports, every tenth of a second, the calls made and the longest
//! time any thread was held up (the figure the benchmark reports; a test cannot bound
//! it on a busy machine).

use crate::common;

use common::{
    Recording, Target, code_bytes_match_file, number_after, tendril, wait_until_no_hook_is_left_in,
};
use std::time::{Duration, Instant};
use tendril::profile::Profile;
use tendril::recording::drain_priority::READING_NICE;

const THREADS: usize = 1000;
const TICK_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn every_one_of_a_thousand_threads_has_its_tree_and_no_event_is_lost() {
    let _turn = common::live_target_turn();
    let mut target = running_fixture(THREADS, "20");
    let (profile, stderr) = record_for(&target, "2");
    assert_eq!(profile.stats.lost_events, 0, "{stderr}");
    let with_root: Vec<_> = profile
        .threads
        .iter()
        .filter(|t| {
            t.roots
                .iter()
                .any(|r| r.name == "thread_root" && r.calls > 0)
        })
        .collect();
    assert_eq!(with_root.len(), THREADS, "threads with a tree: {stderr}");
    // Each call of the root makes its 16 calls below it, in every thread's tree (the
    // one call the recording's end cut short may have made fewer).
    for thread in &with_root {
        let root = thread
            .roots
            .iter()
            .find(|r| r.name == "thread_root")
            .unwrap();
        let below: u64 = root.children.iter().map(|c| c.calls).sum();
        assert!(
            below <= 16 * root.calls && below >= 16 * (root.calls - 1),
            "thread {}: {below} calls below {} calls of the root: {:?}",
            thread.tid,
            root.calls,
            (root.children.iter())
                .map(|c| (&c.name, c.calls, c.children.len()))
                .collect::<Vec<_>>()
        );
    }
    // Still computing (a wrong result ends it), and every byte is back once the
    // unwinder's hooks, which stay while a thread may still return through a hook,
    // come out.
    wait_until_no_hook_is_left_in(target.pid(), TICK_TIMEOUT);
    target.drain();
    target.expect_line("tick ", TICK_TIMEOUT);
    assert!(target.is_running());
    code_bytes_match_file(target.pid()).unwrap();
}

/// Threads that wake every few milliseconds: at the end of a recording, the return
/// hooks' exits are retired with the threads stopped, and a stop of a few hundred
/// threads takes about as long as their sleeps, so threads found asleep have woken by
/// the time the pass looks at them. Such a thread no longer keeps the unwinder's hooks
/// in (it was in a system call at the stop, and has finished no slow call since); this
/// checks that the rule leaves every byte restored and the target computing. (How many
/// stops the end takes, the benchmark shows: `benches/scripts/many_threads.sh`.)
#[test]
fn the_unwinders_hooks_come_out_though_threads_keep_waking() {
    let _turn = common::live_target_turn();
    const WAKING_THREADS: usize = 300;
    const CALLS_PER_SECOND: &str = "250";
    let mut target = running_fixture(WAKING_THREADS, CALLS_PER_SECOND);
    record_for(&target, "1");
    // The threads wake all along; the hooks come out all the same.
    wait_until_no_hook_is_left_in(target.pid(), TICK_TIMEOUT);
    target.drain();
    target.expect_line("tick ", TICK_TIMEOUT);
    assert!(target.is_running());
    code_bytes_match_file(target.pid()).unwrap();
}

/// The thread of tendril's that reads the rings runs at a higher priority than the
/// target's threads (`drain_priority`): among a thousand busy threads it would get a
/// thousandth of the CPU, and the threads whose rings are full wait for it. The
/// target's own threads keep theirs.
#[test]
fn the_thread_that_reads_the_rings_runs_ahead_of_the_targets_threads() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: raising a thread's priority needs root (or CAP_SYS_NICE)");
        return;
    }
    let mut target = running_fixture(50, "20");
    let recording = Recording::start(target.pid(), &["--root", "thread_root"]);
    let deadline = Instant::now() + TICK_TIMEOUT;
    while !nice_values(recording.pid() as i32).contains(&READING_NICE) {
        assert!(
            Instant::now() < deadline,
            "no thread of tendril at nice {READING_NICE}: {:?}",
            nice_values(recording.pid() as i32)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(nice_values(target.pid()).iter().all(|&nice| nice == 0));
    let recorded = recording.finish();
    assert_eq!(recorded.profile.stats.lost_events, 0, "{}", recorded.stderr);
    wait_until_no_hook_is_left_in(target.pid(), TICK_TIMEOUT);
    target.drain();
    target.expect_line("tick ", TICK_TIMEOUT);
    code_bytes_match_file(target.pid()).unwrap();
}

/// A target that switches threads about 100,000 times a second (100 threads, each
/// sleeping between its 1,000 calls a second): the kernel's record of every switch
/// would cost it about a fifth of a core, so CPU time is not measured, and the profile
/// and tendril's output say why; `--cpu-time` measures it all the same.
#[test]
fn a_target_that_switches_very_often_gets_wall_clock_times_unless_cpu_time_is_asked_for() {
    let _turn = common::live_target_turn();
    let mut target = running_fixture(100, "1000");
    let (profile, stderr) = record_with(&target, "1", &[]);
    let why = profile.stats.cpu_unmeasured.clone().unwrap_or_default();
    assert!(
        why.contains("switched threads") && why.contains("--cpu-time"),
        "{why:?}\n{stderr}"
    );
    assert!(
        stderr.contains(&why),
        "said when the recording starts: {stderr}"
    );
    assert!(!profile.has_cpu_time());
    let (profile, stderr) = record_with(&target, "1", &["--cpu-time"]);
    assert_eq!(profile.stats.cpu_unmeasured, None, "{stderr}");
    assert!(profile.has_cpu_time(), "{stderr}");
    wait_until_no_hook_is_left_in(target.pid(), TICK_TIMEOUT);
    target.drain();
    target.expect_line("tick ", TICK_TIMEOUT);
    code_bytes_match_file(target.pid()).unwrap();
}

/// The fixture with `threads` threads calling the root `rate` times a second, once
/// every thread runs its loop.
fn running_fixture(threads: usize, rate: &str) -> Target {
    let mut target = Target::spawn("many_threads", &[&threads.to_string(), rate]);
    let line = target.expect_line("tick ", TICK_TIMEOUT);
    assert!(number_after::<u64>(&line, "total") > 0, "{line}");
    target
}

/// `tendril record --root thread_root` of `target` for `seconds`: the profile, and
/// what tendril said.
fn record_for(target: &Target, seconds: &str) -> (Profile, String) {
    record_with(target, seconds, &[])
}

/// [`record_for`] with more options.
fn record_with(target: &Target, seconds: &str, options: &[&str]) -> (Profile, String) {
    let output = tendril()
        .args(["record", &target.pid().to_string(), "--root", "thread_root"])
        .args(["--duration", seconds, "-o", "-"])
        .args(options)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    (serde_json::from_slice(&output.stdout).unwrap(), stderr)
}

/// The nice value of each thread of process `pid` (field 19 of its `stat`).
fn nice_values(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("stat")).ok())
        // The agent's threads (`tendril-…`) run ahead of the target's during a session.
        .filter(|stat| !stat.contains("(tendril-"))
        .filter_map(|stat| {
            let after_name = &stat[stat.rfind(')')? + 1..];
            after_name.split_whitespace().nth(16)?.parse().ok()
        })
        .collect()
}
