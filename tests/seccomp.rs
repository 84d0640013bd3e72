//! Targets under seccomp filters (the `seccomp_filtered` fixture): tendril reads the
//! filter before it loads anything and refuses, with the reason, when the filter would
//! kill the target or refuse a call the agent needs; a load that fails anyway leaves
//! nothing of the agent mapped; and tendril's own list of the calls it checks is
//! complete — a target that traps every call not on it goes through status, count,
//! record and detach without a single trap.

use crate::common;

use common::{Target, tendril};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::time::Duration;

const LINE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the fixture itself calls once its filter is installed: `write` (printf, and
/// the SIGSYS handler), `clock_nanosleep` (nanosleep) and `exit_group`.
const FIXTURE_SYSCALLS: [i64; 3] = [
    libc::SYS_write,
    libc::SYS_clock_nanosleep,
    libc::SYS_exit_group,
];

/// Runs `tendril <args>` and returns (success, stdout, stderr).
fn run_tendril(args: &[&str]) -> (bool, String, String) {
    let output = tendril().args(args).output().expect("cannot run tendril");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The lines of the target's memory map that map a tendril agent's file.
fn agent_mappings(pid: i32) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .expect("the target's maps")
        .lines()
        .filter(|line| line.contains("libtendril_agent"))
        .map(str::to_string)
        .collect()
}

/// The target runs on as before: not traced, not stopped, computing what it computed.
fn assert_untouched(target: &mut Target, checksum: u64) {
    let pid = target.pid();
    assert!(target.is_running(), "the target died");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(status.contains("TracerPid:\t0\n"), "left traced:\n{status}");
    let state = status.lines().find(|l| l.starts_with("State:")).unwrap();
    assert!(!state.contains("stopped"), "left stopped: {state}");
    target.drain();
    assert_eq!(target.steady_checksum(2, LINE_TIMEOUT), checksum);
}

/// `status` and `count` on a target under filter `mode` are refused with one line that
/// says `reason`, and leave it untouched with nothing of the agent mapped.
fn assert_refused(mode: &str, reason: &str) {
    let mut target = Target::spawn("seccomp_filtered", &[mode]);
    let pid = target.pid().to_string();
    let checksum = target.steady_checksum(2, LINE_TIMEOUT);
    for args in [
        vec!["status", &pid],
        vec!["count", &pid, "seccomp_leaf", "--duration", "1"],
    ] {
        let (ok, stdout, stderr) = run_tendril(&args);
        assert!(!ok, "{args:?} succeeded: {stdout}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        let expected = format!("tendril: cannot attach to {pid}: its seccomp filter would ");
        assert!(stderr.starts_with(&expected), "{stderr}");
        assert!(stderr.contains(reason), "{args:?}: {stderr}");
        assert!(
            stderr.trim_end().ends_with("; nothing was changed"),
            "{stderr}"
        );
        assert_untouched(&mut target, checksum);
        assert_eq!(agent_mappings(target.pid()), Vec::<String>::new());
    }
}

#[test]
fn a_filter_that_kills_executable_mappings_is_refused_before_the_load() {
    assert_refused(
        "kill-exec",
        "would kill it (SECCOMP_RET_KILL_PROCESS) on mmap with PROT_READ|PROT_EXEC, \
         MAP_PRIVATE|MAP_FIXED|MAP_DENYWRITE, which loading tendril's agent needs",
    );
}

#[test]
fn a_filter_that_kills_socket_is_refused_before_the_load() {
    assert_refused(
        "kill-socket",
        "would kill it (SECCOMP_RET_KILL_PROCESS) on socket with AF_UNIX, \
         SOCK_STREAM|SOCK_CLOEXEC, which tendril's agent needs",
    );
}

#[test]
fn a_filter_that_refuses_socket_is_refused_before_the_load() {
    assert_refused(
        "eperm-socket",
        "would fail with EPERM (SECCOMP_RET_ERRNO) on socket with AF_UNIX, \
         SOCK_STREAM|SOCK_CLOEXEC, which tendril's agent needs",
    );
}

/// Installs a filter that allows every call on the calling process (a child about to
/// exec tendril): a process under seccomp may not read another's filters.
fn allow_everything_under_seccomp() -> std::io::Result<()> {
    let mut filter = [libc::sock_filter {
        code: 0x06, // BPF_RET | BPF_K
        jt: 0,
        jf: 0,
        k: libc::SECCOMP_RET_ALLOW,
    }];
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: prctl with PR_SET_NO_NEW_PRIVS takes plain integers; PR_SET_SECCOMP reads
    // the program through a pointer valid for the call (the kernel copies it). Both are
    // async-signal-safe and allocate nothing.
    let failed = unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &program as *const libc::sock_fprog,
            ) != 0
    };
    if failed {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[test]
fn a_filter_tendril_cannot_read_is_refused_with_the_reason() {
    let mut target = Target::spawn("seccomp_filtered", &["kill-socket"]);
    let pid = target.pid().to_string();
    let checksum = target.steady_checksum(2, LINE_TIMEOUT);
    let mut status = tendril();
    status.args(["status", &pid]);
    // SAFETY: the closure runs in the child between fork and exec and only makes the
    // async-signal-safe system calls of `allow_everything_under_seccomp`.
    unsafe { status.pre_exec(allow_everything_under_seccomp) };
    let output = status.output().expect("cannot run tendril");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert_eq!(
        stderr.trim_end(),
        format!(
            "tendril: cannot attach to {pid}: it runs under a seccomp filter tendril cannot \
             read (reading it needs CAP_SYS_ADMIN, and a tendril that is not under seccomp \
             itself); attaching could get it killed; nothing was changed"
        )
    );
    assert_untouched(&mut target, checksum);
    assert_eq!(agent_mappings(target.pid()), Vec::<String>::new());
}

/// A file named as an agent is (a copy of the fixture), for the fixture to map
/// read-only as a failed load used to leave the agent.
fn fake_leftover(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tendril-seccomp-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("libtendril_agent-leftover.so");
    std::fs::copy(common::fixture("seccomp_filtered"), &path).unwrap();
    path
}

#[test]
fn a_load_that_fails_anyway_leaves_nothing_of_the_agent_mapped() {
    // The filter refuses executable mappings longer than 1 MiB, a length the check
    // cannot know: the loader's mapping of the agent's code fails with EPERM.
    let leftover = fake_leftover("failed-load");
    let map = format!("map={}", leftover.display());
    let mut target = Target::spawn("seccomp_filtered", &["eperm-big-exec", &map]);
    let pid = target.pid().to_string();
    let checksum = target.steady_checksum(2, LINE_TIMEOUT);
    assert_eq!(agent_mappings(target.pid()).len(), 1);
    for _ in 0..2 {
        let (ok, _, stderr) = run_tendril(&["status", &pid]);
        assert!(!ok);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        // Not the leftover's start function called as a resident agent's, but a load.
        assert!(
            stderr.contains("the target could not load tendril's agent from a memfd: ")
                && stderr.contains("failed to map segment")
                && stderr.trim_end().ends_with("; nothing of it stays mapped"),
            "{stderr}"
        );
        assert_eq!(agent_mappings(target.pid()), Vec::<String>::new());
        assert_untouched(&mut target, checksum);
    }
    let _ = std::fs::remove_dir_all(leftover.parent().unwrap());
}

#[test]
fn a_read_only_leftover_of_the_agent_is_not_taken_for_a_resident_agent() {
    let leftover = fake_leftover("leftover");
    let map = format!("map={}", leftover.display());
    let mut target = Target::spawn("seccomp_filtered", &["none", &map]);
    let pid = target.pid().to_string();
    let checksum = target.steady_checksum(2, LINE_TIMEOUT);
    let (ok, stdout, stderr) = run_tendril(&["status", &pid]);
    assert!(ok, "{stderr}");
    assert!(stdout.starts_with("agent ready: "), "{stdout}");
    assert!(
        agent_mappings(target.pid())
            .iter()
            .any(|line| line.contains("r-xp") && !line.contains("leftover")),
        "the agent was not loaded: {:?}",
        agent_mappings(target.pid())
    );
    let (ok, _, stderr) = run_tendril(&["detach", &pid]);
    assert!(ok, "{stderr}");
    assert_untouched(&mut target, checksum);
    let _ = std::fs::remove_dir_all(leftover.parent().unwrap());
}

/// Calls of `function` that `tendril count --json` reported.
fn counted_calls(json: &str, function: &str) -> u64 {
    let report: serde_json::Value = serde_json::from_str(json).expect("count's JSON");
    report["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .find(|f| f["name"] == function)
        .and_then(|f| f["calls"].as_u64())
        .unwrap_or_else(|| panic!("no count of {function}: {json}"))
}

#[test]
fn tendrils_list_of_system_calls_is_all_the_agent_makes() {
    let mut allowed = tendril::inject::seccomp::agent_syscalls();
    allowed.extend(FIXTURE_SYSCALLS);
    let numbers: Vec<String> = allowed.iter().map(i64::to_string).collect();
    let mut args = vec!["trap-unlisted"];
    args.extend(numbers.iter().map(String::as_str));
    let mut target = Target::spawn("seccomp_filtered", &args);
    let pid = target.pid().to_string();
    let checksum = target.steady_checksum(2, LINE_TIMEOUT);
    let profile = std::env::temp_dir().join(format!("tendril-seccomp-{}.json", std::process::id()));
    let profile_arg = profile.to_str().unwrap();

    let stdout = succeed(&mut target, &["status", &pid]);
    assert!(stdout.starts_with("agent ready: "), "{stdout}");
    let stdout = succeed(
        &mut target,
        &["count", &pid, "seccomp_leaf", "--duration", "1", "--json"],
    );
    assert!(counted_calls(&stdout, "seccomp_leaf") > 0, "{stdout}");
    let record = [
        "record",
        &pid,
        "--root",
        "seccomp_work",
        "--duration",
        "1",
        "-o",
        profile_arg,
    ];
    succeed(&mut target, &record);
    let profile_text = std::fs::read_to_string(&profile).unwrap();
    let _ = std::fs::remove_file(&profile);
    assert!(profile_text.contains("seccomp_leaf"));
    succeed(&mut target, &["detach", &pid]);

    // Every line the agent's threads wrote comes before the mark, once they are done.
    wait_until_only_the_control_thread_runs(target.pid());
    target.signal(libc::SIGUSR1);
    target.expect_line("mark", LINE_TIMEOUT);
    let trapped = trapped_calls(&mut target);
    assert!(trapped.is_empty(), "{MISSING}: {trapped:?}");
    assert_untouched(&mut target, checksum);
}

const MISSING: &str = "calls missing from tendril::inject::seccomp::SYSCALLS";

/// Runs `tendril <args>` on the trap-unlisted target, which must succeed; its stdout.
/// On failure, says what became of the target and what it trapped.
fn succeed(target: &mut Target, args: &[&str]) -> String {
    let (ok, stdout, stderr) = run_tendril(args);
    if ok {
        return stdout;
    }
    let fate = match target.wait_exit(Duration::from_millis(100)) {
        None => "the target runs".to_string(),
        Some(status) if status.signal() == Some(libc::SIGSYS) => format!(
            "the target was killed by SIGSYS: a thread of the agent (which blocks SIGSYS) \
             made one of the {MISSING}; `perf trace -p PID` shows the calls"
        ),
        Some(status) => format!("the target ended: {status}"),
    };
    panic!(
        "tendril {args:?} failed: {stderr}; {fate}; trapped: {:?}",
        trapped_calls(target)
    );
}

/// The `sigsys <NR> ...` lines the target printed so far.
fn trapped_calls(target: &mut Target) -> Vec<String> {
    target
        .drain()
        .into_iter()
        .filter(|line| line.starts_with("sigsys"))
        .collect()
}

/// Waits until the agent's only thread in `pid` is its control thread: its sessions
/// and the restorer have ended.
fn wait_until_only_the_control_thread_runs(pid: i32) {
    let agent_threads = || -> Vec<String> {
        let mut names = common::thread_names(pid);
        names.retain(|name| name.starts_with("tendril-"));
        names
    };
    let deadline = std::time::Instant::now() + LINE_TIMEOUT;
    while agent_threads() != ["tendril-control"] {
        assert!(
            std::time::Instant::now() < deadline,
            "agent threads still run: {:?}",
            agent_threads()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
