//! Threads that run with signals blocked never stop a patch: glibc blocks every signal
//! while a thread starts or ends, and a program's own threads may keep them all blocked
//! (one that waits in `sigwait`). No patch writes an `int3` such a thread could meet, so
//! all of libc is patched and restored while threads come and go and while sessions
//! start and end, and a thread that keeps every signal blocked is no reason to refuse.

use crate::common;

use common::{Counting, Target, code_bytes_match_file, tendril};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

const LINE_TIMEOUT: Duration = Duration::from_secs(30);
const COUNTS: usize = 4;

/// `tendril count <pid> <args...>`, which must succeed; returns its stdout.
fn count(pid: i32, args: &[&str]) -> String {
    loop {
        let output = tendril()
            .args(["count", &pid.to_string()])
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        // A `status` attaching at that very moment holds the process: the documented
        // answer (`bad_input.rs`) is to try again.
        if !output.status.success() && stderr.contains("another tendril is attaching") {
            continue;
        }
        assert!(output.status.success(), "{stderr}");
        return String::from_utf8_lossy(&output.stdout).into_owned();
    }
}

/// Sets its flag when dropped, a panic's unwinding included: a loop waiting for the
/// flag then ends, instead of keeping a failed test's scope open for ever.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
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
                // A `count` attaching at that very moment holds the process: the
                // documented answer (`bad_input.rs`) is to try again.
                let raced = String::from_utf8_lossy(&status.stderr)
                    .contains("another tendril is attaching to it; try again");
                assert!(status.status.success() || raced, "{status:?}");
            }
        });
        let _stop_statuses = SetOnDrop(&done);
        for _ in 0..COUNTS {
            let report = count(pid, &["libc.so.6:*", "--duration", "0.2"]);
            assert!(report.contains("total ("), "{report}");
        }
    });
    assert!(target.is_running());
    code_bytes_match_file(pid).unwrap();
    assert_eq!(target.checksum_lines(2, LINE_TIMEOUT), [before, before]);
}

/// The system call the thread named `name` of process `pid` is in (`-1`: none).
fn syscall_of(pid: i32, name: &str) -> i64 {
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let syscall = std::fs::read_to_string(task.join("syscall")).unwrap_or_default();
            let number = syscall
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok());
            return number.unwrap_or(-1);
        }
    }
    panic!("process {pid} has no thread named {name}");
}

#[test]
fn a_thread_that_keeps_every_signal_blocked_is_no_reason_to_refuse() {
    const LINES: u64 = 3;
    // The sleeper blocks every signal and sleeps; the reader reads stdin, echoing lines.
    let mut target = Target::spawn("blocked", &["masked"]);
    let pid = target.pid();
    let counting = Counting::start(pid, &["libc.so.6:read", "--json"]);
    // The read the reader was blocked in began before the hooks: each line echoed is
    // followed by one counted read, which is done once the reader is back in read(2).
    for line in 0..LINES {
        target.write_stdin(&format!("line {line}\n"));
        assert_eq!(
            target.expect_line("got: ", LINE_TIMEOUT),
            format!("got: line {line}")
        );
    }
    let deadline = std::time::Instant::now() + LINE_TIMEOUT;
    while syscall_of(pid, "reader") != libc::SYS_read {
        assert!(
            std::time::Instant::now() < deadline,
            "the reader never read again"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let report = counting.finish();
    let json: serde_json::Value = serde_json::from_str(&report.stdout).unwrap();
    assert_eq!(json["refused"], serde_json::json!([]), "{}", report.stderr);
    let read = &json["functions"][0];
    assert_eq!(read["calls"], LINES, "{json:#}");
    let callers: Vec<&serde_json::Value> = read["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|thread| thread["calls"] != 0)
        .collect();
    assert_eq!(callers.len(), 1, "{json:#}");
    assert_eq!(callers[0]["name"], "reader", "{json:#}");
    code_bytes_match_file(pid).unwrap();
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
        // Nothing is refused for the signals a thread blocks.
        assert!(!stderr.contains("every signal blocked"), "{stderr}");
        assert!(!stderr.contains("blocks SIGTRAP"), "{stderr}");
    }
    assert!(target.is_running());
    code_bytes_match_file(pid).unwrap();
}
