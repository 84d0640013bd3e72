//! A patch writes an `int3` for a moment; a thread that runs into it with SIGTRAP
//! blocked is not sent on by tendril's handler — the kernel ends the process. glibc
//! blocks every signal while a thread starts or ends, so the agent starts its own
//! threads only between code changes and never ends them, the functions glibc runs
//! then are refused by name, and a target thread that keeps SIGTRAP blocked makes a
//! patch impossible, and tendril says so instead.

mod common;

use common::{Target, code_bytes_match_file, tendril};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

const LINE_TIMEOUT: Duration = Duration::from_secs(30);
const COUNTS: usize = 4;

/// `tendril count <pid> <args...>`, which must succeed; returns its stdout.
fn count(pid: i32, args: &[&str]) -> String {
    let output = tendril()
        .args(["count", &pid.to_string()])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn sessions_start_and_end_while_another_patches_all_of_libc() {
    let mut target = Target::spawn("calltree", &["2"]);
    let pid = target.pid();
    let before = target.checksum_lines(2, LINE_TIMEOUT)[0];
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        // Each `tendril status` is a session: a thread of the agent serves it.
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                let status = tendril()
                    .args(["status", &pid.to_string()])
                    .output()
                    .unwrap();
                assert!(status.status.success(), "{status:?}");
            }
        });
        for _ in 0..COUNTS {
            let report = count(pid, &["libc.so.6:*", "--duration", "0.2"]);
            assert!(report.contains("total ("), "{report}");
        }
        done.store(true, Ordering::Relaxed);
    });
    assert!(target.is_running());
    code_bytes_match_file(pid).unwrap();
    assert_eq!(target.checksum_lines(2, LINE_TIMEOUT), [before, before]);
}

#[test]
fn a_thread_that_keeps_sigtrap_blocked_makes_patching_refuse() {
    let mut target = Target::spawn("blocked", &["masked"]);
    let output = tendril()
        .args(["count", &target.pid().to_string(), "libc.so.6:read"])
        .args(["--duration", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("could be patched") && stderr.contains("(sleeper) blocks SIGTRAP"),
        "{stderr}"
    );
    code_bytes_match_file(target.pid()).unwrap();
    target.write_stdin("still here\n");
    assert_eq!(
        target.expect_line("got: ", LINE_TIMEOUT),
        "got: still here",
        "the target runs on"
    );
}

#[test]
fn the_target_starts_and_ends_threads_while_all_of_libc_is_patched() {
    let mut target = Target::spawn("unwinding", &[]);
    let pid = target.pid();
    let (sender, finished) = mpsc::channel();
    std::thread::spawn(move || {
        // Recording from every function of libc: each of them is patched, and restored.
        let outputs: Vec<_> = (0..COUNTS)
            .map(|_| {
                tendril()
                    .args(["record", &pid.to_string(), "--root", "libc.so.6:*"])
                    .args(["--duration", "0.3", "-o", "/dev/null"])
                    .output()
                    .unwrap()
            })
            .collect();
        let _ = sender.send(outputs);
    });
    // Five threads start, call pthread_exit and end, again and again, all along.
    let mut commands = 0;
    let outputs = loop {
        if let Ok(outputs) = finished.try_recv() {
            break outputs;
        }
        target.write_stdin("exit 5\n");
        let line = target.expect_line("exit calls ", LINE_TIMEOUT);
        assert!(line.contains(" cleanups 10 "), "{line}");
        commands += 1;
    };
    assert!(commands > 0);
    for output in &outputs {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        assert!(
            stderr.contains("__ctype_init (libc.so.6)")
                && stderr.contains(": glibc runs it with every signal blocked"),
            "{stderr}"
        );
    }
    assert!(target.is_running());
    code_bytes_match_file(pid).unwrap();
}
