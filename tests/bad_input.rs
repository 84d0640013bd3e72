//! Bad input: each case gets one clear line on stderr, a non-zero exit, and a target left
//! exactly as it was (running, untraced, with its original code).

use crate::common;

use common::{Target, tendril};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;
use tendril::process::{StatLine, status_field};

/// Runs tendril and returns its single error line, asserting failure and one line.
fn error_line(command: &mut Command) -> String {
    let output = command.output().expect("cannot run tendril");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !output.status.success(),
        "expected a failure, got success; stdout: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert_eq!(
        stderr.lines().count(),
        1,
        "expected exactly one error line, got: {stderr:?}"
    );
    assert!(stderr.starts_with("tendril: "), "{stderr}");
    stderr.trim_end().to_string()
}

fn status_of(pid: i32) -> Command {
    let mut command = tendril();
    command.args(["status", &pid.to_string()]);
    command
}

fn assert_untouched(pid: i32) {
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
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(
        !maps.contains("libtendril_agent"),
        "an agent was loaded despite the error"
    );
    common::code_bytes_match_file(pid).unwrap();
}

#[test]
fn a_mistyped_command_line_gets_what_was_meant_and_the_subcommands_help() {
    let line = error_line(tendril().args(["recrod", "1"]));
    assert!(
        line.contains("did you mean 'record'?") && line.ends_with("(see `tendril --help`)"),
        "{line}"
    );
    let line = error_line(tendril().args(["sample", "1", "--rat", "5"]));
    assert!(
        line.contains("did you mean '--rate'?") && line.ends_with("(see `tendril sample --help`)"),
        "{line}"
    );
    let line = error_line(tendril().args(["record", "abc", "--root", "main"]));
    assert!(line.ends_with("(see `tendril record --help`)"), "{line}");
}

#[test]
fn a_pid_that_does_not_exist() {
    let line = error_line(&mut status_of(i32::MAX));
    assert_eq!(line, format!("tendril: no process with pid {}", i32::MAX));
}

#[test]
fn tendril_itself() {
    // `exec` keeps the shell's pid, so tendril is given its own pid.
    let line = error_line(Command::new("sh").args([
        "-c",
        &format!("exec {:?} status $$", env!("CARGO_BIN_EXE_tendril")),
    ]));
    assert!(line.contains("is tendril itself"), "{line}");
}

#[test]
fn a_thread_id_instead_of_a_process_id() {
    let target = Target::spawn("calltree", &["2"]);
    let tid: i32 = std::fs::read_dir(format!("/proc/{}/task", target.pid()))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
        .find(|&tid| tid != target.pid())
        .unwrap();
    let line = error_line(&mut status_of(tid));
    assert!(
        line.contains(&format!("is a thread of process {}", target.pid())),
        "{line}"
    );
    assert_untouched(target.pid());
}

#[test]
fn a_zombie() {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    // Not reaped yet: it is a zombie until `wait`.
    while !std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .contains("State:\tZ")
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    let line = error_line(&mut status_of(pid));
    assert!(line.contains("is a zombie"), "{line}");
    child.wait().unwrap();
}

#[test]
fn a_kernel_thread() {
    // kthreadd is pid 2 wherever the kernel's threads are visible (not in a pid namespace).
    let stat =
        std::fs::read_to_string("/proc/2/stat").expect("this test needs the host pid namespace");
    assert!(
        stat.contains("(kthreadd)"),
        "pid 2 is not kthreadd here: {stat}"
    );
    let line = error_line(&mut status_of(2));
    assert!(line.contains("is a kernel thread"), "{line}");
    // Every command says it the same way.
    let listing = error_line(tendril().args(["symbols", "2"]));
    assert_eq!(listing, line);
}

#[test]
fn a_32_bit_program() {
    let target = Target::spawn_no_ready("i386_loop", &[]);
    let line = error_line(&mut status_of(target.pid()));
    assert!(line.contains("32-bit") && line.contains("x86-64"), "{line}");
}

#[test]
fn a_statically_linked_program() {
    let target = Target::spawn("static_loop", &[]);
    let line = error_line(&mut status_of(target.pid()));
    assert!(
        line.contains("statically linked") && line.contains("no dynamic loader"),
        "{line}"
    );
    assert_untouched(target.pid());
}

#[test]
fn a_process_already_traced() {
    let target = Target::spawn("calltree", &["1"]);
    let pid = target.pid();
    // This test process becomes the tracer, like strace or gdb would.
    // SAFETY: PTRACE_SEIZE takes no pointers; it only makes this process the tracer.
    let rc = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) };
    assert_eq!(
        rc,
        0,
        "cannot seize the fixture: {}",
        std::io::Error::last_os_error()
    );
    let line = error_line(&mut status_of(pid));
    // TracerPid names the tracing thread: this test's thread.
    // SAFETY: gettid has no preconditions.
    let tracer = unsafe { libc::gettid() };
    assert!(
        line.contains(&format!("already traced by pid {tracer}")),
        "{line}"
    );
    // SAFETY: the ptrace calls take no pointers; waitpid writes into a valid local.
    // PTRACE_DETACH needs the tracee stopped, hence the interrupt first.
    unsafe {
        libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0, 0);
        let mut status = 0;
        libc::waitpid(pid, &mut status, libc::__WALL);
        libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0);
    }
    assert_untouched(pid);
}

#[test]
fn a_stopped_process() {
    let mut target = Target::spawn("calltree", &["1"]);
    let pid = target.pid();
    let state = || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("State:")).unwrap();
        line.to_string()
    };
    let stopped = |target: &Target| {
        target.signal(libc::SIGSTOP);
        while !state().contains("stopped") {
            std::thread::sleep(Duration::from_millis(5));
        }
    };

    // Without an agent: nothing is loaded into it, and it stays stopped.
    stopped(&target);
    for command in ["status", "detach"] {
        let line = error_line(tendril().args([command, &pid.to_string()]));
        assert!(
            line.contains(&format!("process {pid} is stopped")) && line.contains("kill -CONT"),
            "{command}: {line}"
        );
        assert!(state().contains("stopped"), "{command}: {}", state());
    }
    target.signal(libc::SIGCONT);
    assert_untouched(pid);

    // With an agent resident: it cannot answer while stopped, so tendril says so at
    // once instead of waiting for it.
    let status = tendril()
        .args(["status", &pid.to_string()])
        .output()
        .unwrap();
    assert!(status.status.success(), "{status:?}");
    stopped(&target);
    for command in ["status", "detach"] {
        let line = error_line(tendril().args([command, &pid.to_string()]));
        assert!(line.contains("is stopped"), "{command}: {line}");
    }
    target.signal(libc::SIGCONT);
    target.drain();
    assert_eq!(target.checksum_lines(2, Duration::from_secs(30)).len(), 2);
}

#[test]
fn a_process_of_another_user() {
    let target = Target::spawn("calltree", &["1"]);
    let line = error_line(status_of(target.pid()).uid(65534).gid(65534));
    assert!(
        line.contains("operation not permitted") && line.contains("same user or as root"),
        "{line}"
    );
    assert_untouched(target.pid());
}

#[test]
fn a_process_that_exits_during_the_attach() {
    // Short-lived processes exit at every stage of the attach; each run must either
    // succeed or fail with one clear line — never hang, crash or print a trace.
    for delay_ms in [0u64, 1, 2, 3, 5, 8, 13, 21, 34, 55] {
        let mut child = Command::new("sleep")
            .arg(format!("0.0{delay_ms:02}"))
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let output = status_of(pid).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
            assert!(
                stderr.contains("exited")
                    || stderr.contains("zombie")
                    || stderr.contains("no process"),
                "unexpected error for a process that exits: {stderr}"
            );
        }
        child.wait().unwrap();
    }
}

#[test]
fn a_second_tendril_names_the_tendril_that_is_attaching() {
    // A first `tendril status` is frozen (SIGSTOP) at a moment it holds the fresh
    // single-threaded fixture, so the second always meets it; then it is let go and
    // finishes its own attach. A round whose first tendril was done before it could be
    // caught holding the target proves nothing and is run again.
    const ROUNDS: usize = 20;
    for _ in 0..ROUNDS {
        let mut target = Target::spawn("departing", &["exec"]);
        let pid = target.pid();
        let first = status_of(pid)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("cannot run tendril");
        let first_pid = first.id() as i32;
        let caught = freeze_while_it_traces(first_pid, pid);
        let second = caught.then(|| status_of(pid).output());
        // SAFETY: kill(2) on our own child, which has not been waited for yet.
        unsafe { libc::kill(first_pid, libc::SIGCONT) };
        let second = second.transpose().expect("cannot run tendril");
        let first = first.wait_with_output().unwrap();
        assert!(
            first.status.success(),
            "the first tendril failed: {}",
            String::from_utf8_lossy(&first.stderr)
        );
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        assert!(status.contains("TracerPid:\t0\n"), "left traced:\n{status}");
        target.drain();
        target.expect_line("round ", Duration::from_secs(10));
        let Some(second) = second else { continue };
        assert!(!second.status.success(), "the second tendril attached too");
        assert_eq!(
            String::from_utf8_lossy(&second.stderr).trim_end(),
            format!(
                "tendril: process {pid} is being traced by pid {first_pid} (tendril): another \
                 tendril is attaching to it; try again when it is done"
            ),
            "the second tendril's message"
        );
        return;
    }
    panic!("in {ROUNDS} rounds, the first tendril was never caught holding the target");
}

/// Stops process `tracer` with SIGSTOP once it traces `pid`, and says whether it was
/// stopped while still tracing it; `false` if it was done (or never traced it).
fn freeze_while_it_traces(tracer: i32, pid: i32) -> bool {
    let number = |path: String, key: &str| -> Option<i32> {
        let status = std::fs::read_to_string(path).ok()?;
        status_field(&status, key)?.parse().ok()
    };
    let traced_by_tracer = || match number(format!("/proc/{pid}/status"), "TracerPid") {
        Some(0) | None => false,
        Some(thread) => number(format!("/proc/{thread}/status"), "Tgid") == Some(tracer),
    };
    let state = || {
        let stat = std::fs::read_to_string(format!("/proc/{tracer}/stat")).unwrap_or_default();
        StatLine::parse(&stat).map_or('Z', |line| line.state)
    };
    // No sleep: the hold lasts milliseconds.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !traced_by_tracer() {
        if state() == 'Z' || std::time::Instant::now() >= deadline {
            return false;
        }
    }
    // SAFETY: kill(2) on our own child, which has not been waited for yet.
    unsafe { libc::kill(tracer, libc::SIGSTOP) };
    while !matches!(state(), 'T' | 'Z') {
        std::thread::yield_now();
    }
    traced_by_tracer()
}
