//! Attaching to real running processes: `status` and `detach` on every fixture, repeated
//! attaches, targets that keep computing correct results, and syscalls that survive.

use crate::common;

use common::{Target, tendril};
use std::os::unix::process::CommandExt;
use std::time::Duration;

/// Runs `tendril <args>` and returns (success, stdout, stderr).
fn run_tendril(args: &[&str]) -> (bool, String, String) {
    let output = tendril().args(args).output().expect("cannot run tendril");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Parses `agent ready: pid=P version=V threads=N patched=K`.
fn parse_status(line: &str, pid: i32) -> (usize, usize) {
    let rest = line
        .trim_end()
        .strip_prefix(&format!("agent ready: pid={pid} version="))
        .unwrap_or_else(|| panic!("unexpected status line: {line:?}"));
    let fields: Vec<&str> = rest.split(' ').collect();
    assert_eq!(fields.len(), 3, "unexpected status line: {line:?}");
    let threads = fields[1].strip_prefix("threads=").unwrap().parse().unwrap();
    let patched = fields[2].strip_prefix("patched=").unwrap().parse().unwrap();
    (threads, patched)
}

fn status_ok(pid: i32) -> (usize, usize) {
    let (ok, stdout, stderr) = run_tendril(&["status", &pid.to_string()]);
    assert!(ok, "status {pid} failed: {stderr}");
    assert_eq!(
        stdout.lines().count(),
        1,
        "status must print exactly one line: {stdout:?}"
    );
    parse_status(&stdout, pid)
}

fn agent_mappings(pid: i32) -> Vec<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut paths: Vec<String> = maps
        .lines()
        .filter(|l| l.contains("libtendril_agent"))
        .map(|l| l.split_whitespace().last().unwrap().to_string())
        .collect();
    paths.dedup();
    paths
}

fn control_threads(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .unwrap_or_default()
                .trim()
                == "tendril-control"
        })
        .count()
}

/// The process is running freely: not stopped, not traced.
fn assert_running_untraced(pid: i32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status.contains("TracerPid:\t0\n"),
        "target left traced:\n{status}"
    );
    let state = status.lines().find(|l| l.starts_with("State:")).unwrap();
    assert!(
        !state.contains("stopped") && !state.contains("tracing stop"),
        "target left stopped: {state}"
    );
}

#[test]
fn status_attaches_to_every_fixture_and_reports_its_threads() {
    // (fixture, args, threads the target itself has)
    let cases: &[(&str, &[&str], usize)] = &[
        ("calltree", &["2"], 3),
        ("calltree_stripped", &["3"], 4),
        ("exceptions", &[], 1),
        ("rust_panics", &[], 0),
        ("blocked", &[], 4),
        ("mallocs", &["2"], 3),
    ];
    for &(name, args, threads) in cases {
        let mut target = Target::spawn(name, args);
        let pid = target.pid();
        let (reported_threads, patched) = status_ok(pid);
        if threads > 0 {
            assert_eq!(reported_threads, threads, "{name}: thread count");
        }
        assert_eq!(patched, 0, "{name}: nothing is patched by status");
        assert_eq!(agent_mappings(pid).len(), 1, "{name}: agent loaded once");
        assert_eq!(control_threads(pid), 1, "{name}: one control thread");
        assert_running_untraced(pid);
        if name != "blocked" {
            assert!(
                target.next_line(Duration::from_secs(5)).is_some(),
                "{name} stopped printing after the attach"
            );
        }
        common::code_bytes_match_file(pid).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn fifty_attaches_in_a_row_reuse_the_agent_and_never_disturb_the_checksums() {
    let reference = {
        let mut bare = Target::spawn("calltree", &["8"]);
        bare.checksum_lines(3, Duration::from_secs(10))[0]
    };
    let mut target = Target::spawn("calltree", &["8"]);
    let pid = target.pid();
    for attempt in 0..50 {
        let (threads, _) = status_ok(pid);
        assert_eq!(threads, 9, "attempt {attempt}: 8 workers + main");
    }
    assert_eq!(
        agent_mappings(pid).len(),
        1,
        "the agent was loaded once and reused"
    );
    assert_eq!(control_threads(pid), 1);
    assert_running_untraced(pid);
    for checksum in target.checksum_lines(10, Duration::from_secs(10)) {
        assert_eq!(
            checksum, reference,
            "a round computed a wrong checksum after the attaches"
        );
    }
}

/// A deadlock is a state in which nobody runs: the target's threads wait on malloc's
/// lock and `tendril status` waits for the agent. A slow machine is one in which they
/// run, slowly. So the verdict is "no CPU time used by either process for 10 s", which
/// load cannot reach (the target's four threads are runnable the whole time unless
/// blocked), not a bound on the wall-clock time.
#[test]
fn injecting_into_threads_hammering_malloc_never_deadlocks() {
    /// How long neither process may run before it is a deadlock.
    const STILL: Duration = Duration::from_secs(10);
    /// Far beyond any load: a livelock (both spinning) would still end the test.
    const LIVELOCK: Duration = Duration::from_secs(600);
    for attempt in 0..20 {
        let target = Target::spawn("mallocs", &["4"]);
        let pid = target.pid();
        let mut child = tendril()
            .args(["status", &pid.to_string()])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        let status_pid = child.id() as i32;
        let ran = || common::ran_on_a_core_ns(pid) + common::ran_on_a_core_ns(status_pid);
        let mut last_ran = ran();
        let mut last_progress = started;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            let now = ran();
            if now != last_ran {
                last_ran = now;
                last_progress = std::time::Instant::now();
            }
            let still = last_progress.elapsed();
            if still > STILL || started.elapsed() > LIVELOCK {
                let states = thread_states(pid);
                let _ = child.kill();
                panic!(
                    "attempt {attempt}: status did not finish in {:.1} s, neither it nor \
                     the target ran for the last {:.1} s (deadlock); target threads: \
                     {states}",
                    started.elapsed().as_secs_f64(),
                    still.as_secs_f64()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(status.success(), "attempt {attempt}: status failed");
        assert_running_untraced(pid);
    }
}

/// Each thread's state and wait channel (`/proc/PID/task/TID/{stat,wchan}`), for the
/// message of a deadlock.
fn thread_states(pid: i32) -> String {
    let tids = tendril::process::thread_ids(pid).unwrap_or_default();
    tids.iter()
        .map(|tid| {
            let read = |file: &str| {
                std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/{file}"))
                    .unwrap_or_default()
            };
            let stat = read("stat");
            let state = stat.rsplit_once(") ").map_or("?", |(_, rest)| &rest[..1]);
            format!("{tid} {state} {}", read("wchan"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
fn a_read_interrupted_by_the_attach_still_receives_its_data() {
    let mut target = Target::spawn("blocked", &[]);
    let pid = target.pid();
    status_ok(pid);
    assert_running_untraced(pid);
    target.write_stdin("hello after attach\n");
    let line = target
        .next_line(Duration::from_secs(5))
        .expect("the blocked read never returned");
    assert_eq!(line.trim_end(), "got: hello after attach");
    // And it still works a second time, with the agent resident.
    status_ok(pid);
    target.write_stdin("second\n");
    assert_eq!(
        target.next_line(Duration::from_secs(5)).unwrap().trim_end(),
        "got: second"
    );
}

#[test]
fn the_runtime_directory_is_private_and_the_socket_owner_only() {
    use std::os::unix::fs::MetadataExt;
    let target = Target::spawn("calltree", &["1"]);
    status_ok(target.pid());
    let dir = std::fs::symlink_metadata("/tmp/tendril-0").unwrap();
    assert!(dir.is_dir());
    assert_eq!(dir.mode() & 0o777, 0o700);
    let socket =
        std::fs::symlink_metadata(format!("/tmp/tendril-0/agent-{}.sock", target.pid())).unwrap();
    assert_eq!(socket.mode() & 0o777, 0o600);
}

#[test]
fn detach_restores_through_a_resident_agent_and_never_injects() {
    let target = Target::spawn("calltree", &["1"]);
    let pid = target.pid().to_string();
    let (ok, stdout, stderr) = run_tendril(&["detach", &pid]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("has no tendril agent"), "{stdout}");
    assert!(
        agent_mappings(target.pid()).is_empty(),
        "detach must not load an agent"
    );

    status_ok(target.pid());
    let (ok, stdout, stderr) = run_tendril(&["detach", &pid]);
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout.trim_end(),
        format!("detached: pid={pid} restored=0 functions; the agent stays dormant")
    );
    common::code_bytes_match_file(target.pid()).unwrap();
}

#[test]
fn a_process_of_another_user_can_be_attached_by_that_user() {
    let target = Target::spawn_as_user("calltree", &["1"], 65534, 65534);
    let output = tendril()
        .args(["status", &target.pid().to_string()])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    parse_status(&String::from_utf8_lossy(&output.stdout), target.pid());
}

#[test]
fn a_shell_keeping_allocator_pointers_on_its_stack_can_be_attached() {
    // bash keeps pointers to `free` in locals while it waits for a child; only real
    // return addresses into the allocator may stop an attach, not such pointers.
    // A process group of its own, so that its `sleep` goes with it; no inherited
    // output, which the `sleep` would otherwise hold open after the test.
    let mut shell = std::process::Command::new("bash")
        .args(["-c", "sleep 1000; true"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = shell.id() as i32;
    // Waiting for its child: bash has forked `sleep` and waits for it.
    let children = format!("/proc/{pid}/task/{pid}/children");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(&children).is_ok_and(|c| c.trim().is_empty()) {
        assert!(
            std::time::Instant::now() < deadline,
            "bash started no child"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let result = std::panic::catch_unwind(|| status_ok(pid));
    // SAFETY: kill(2) on the process group created above for this shell and its child.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    let _ = shell.wait();
    result.expect("status on a waiting bash");
}

/// The nice value of each of the agent's threads in `pid` (named `tendril-…`).
fn agent_thread_nice_values(pid: i32) -> Vec<i32> {
    let mut values = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `tid (comm) state ...`: the comm may hold spaces, the fields after it do not;
        // the nice value is the 19th field, the 17th after the comm.
        let Some((comm_part, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        if !comm_part.contains("(tendril-") {
            continue;
        }
        values.push(rest.split(' ').nth(16).unwrap().parse().unwrap());
    }
    values
}

#[test]
fn the_agents_threads_run_ahead_of_the_target_during_a_session_and_not_after() {
    // SAFETY: geteuid only reads the caller's effective user id.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("note: skipped: raising the agent's threads takes root (or CAP_SYS_NICE)");
        return;
    }
    let mut target = Target::spawn("calltree", &["2"]);
    let pid = target.pid();
    target.steady_checksum(2, Duration::from_secs(60));
    let recording = common::Recording::start(pid, &["--root", "work_round"]);
    // The session is open: the agent's threads run at nice -20, its discoverer with
    // them (the target's threads hand it their discoveries when they are many).
    let during = agent_thread_nice_values(pid);
    assert!(
        during.contains(&-20),
        "the agent's threads during the session: {during:?}"
    );
    assert!(common::thread_names(pid).contains(&"tendril-discove".to_string()));
    recording.finish();
    // The session is over: each is back at the target's nice value, 0, and the
    // discoverer has ended.
    let after = agent_thread_nice_values(pid);
    assert!(
        !after.is_empty() && after.iter().all(|&nice| nice == 0),
        "{after:?}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while common::thread_names(pid).contains(&"tendril-discove".to_string()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the discoverer did not end"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    target.steady_checksum(2, Duration::from_secs(60));
}
