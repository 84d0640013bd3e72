//! The unwinder's hooks are in whenever a frame holds a return hook's exit: they go in
//! before the return hooks and come out after them, and a frame still running when the
//! hooks come out gets its real return address back, so an exception, a panic or a
//! `pthread_exit` can unwind through it later. (An unwinder that meets an exit aborts
//! a Rust program with "failed to initiate panic, error 5".)

use crate::common;

use common::{Counting, Target, code_bytes_match_file};
use std::time::Duration;

const LINE_TIMEOUT: Duration = Duration::from_secs(30);
/// Count sessions per test: each one hooks and unhooks while the threads unwind.
const SESSIONS: usize = 3;

fn steady_checksum(target: &mut Target, rounds: usize) -> u64 {
    target.steady_checksum(rounds, LINE_TIMEOUT)
}

/// Counts every function of `fixture`'s own module with returns hooked, `SESSIONS`
/// times, while its worker threads throw and catch all the time.
fn every_function_with_returns(fixture: &str) {
    let mut target = Target::spawn(fixture, &["4"]);
    let before = steady_checksum(&mut target, 2);
    let pattern = format!("{fixture}:*");
    for session in 0..SESSIONS {
        let counting = Counting::start(target.pid(), &[&pattern, "--returns"]);
        let during = steady_checksum(&mut target, 2);
        let report = counting.finish();
        assert_eq!(during, before, "session {session}: checksum while counting");
        let level3 = report
            .rows
            .iter()
            .find(|r| r.name == "level3" || r.name.starts_with("level3("))
            .unwrap_or_else(|| panic!("no level3 in {}", report.stdout));
        assert!(level3.calls > 0, "{}", report.stdout);
        assert!(target.is_running(), "session {session}");
        // A thread caught inside a hook as the count ended keeps the unwinder's hooks in
        // for a moment (count says so); they come out by themselves.
        common::wait_until_no_hook_is_left_in(target.pid(), LINE_TIMEOUT);
        code_bytes_match_file(target.pid()).unwrap();
        assert_eq!(steady_checksum(&mut target, 2), before, "session {session}");
    }
}

#[test]
fn a_rust_program_keeps_panicking_through_all_its_functions_counted_with_returns() {
    every_function_with_returns("rust_panics");
}

#[test]
fn a_cxx_program_keeps_throwing_through_all_its_functions_counted_with_returns() {
    every_function_with_returns("exceptions");
}

#[test]
fn a_frame_running_when_the_hooks_come_out_unwinds_later() {
    let mut target = Target::spawn("unwinding", &[]);
    let counting = Counting::start(target.pid(), &["hold_*", "--returns"]);
    target.write_stdin("holdexit 0\n");
    // Both frames are entered, their return addresses replaced; then the hooks go.
    target.expect_line("holding", LINE_TIMEOUT);
    let report = counting.finish();
    assert_eq!(report.calls("hold_outer"), 1, "{}", report.stdout);
    assert_eq!(report.calls("hold_inner"), 1, "{}", report.stdout);
    code_bytes_match_file(target.pid()).unwrap();
    // Now the thread calls pthread_exit, whose unwinder walks both frames.
    target.signal(libc::SIGUSR1);
    let line = target.expect_line("holdexit calls ", LINE_TIMEOUT);
    assert!(
        line.contains(" cleanups 2 "),
        "both frames' cleanup handlers ran: {line}"
    );
    assert!(target.is_running());
}

/// A thread asleep with a dead hook address on its live stack (it kept a copy of a
/// return address, as allocators and loggers do) does not keep tendril's unwinder hooks
/// in: which threads are inside a hook is known exactly, never guessed from stack
/// memory. Every byte is back as soon as the count ends, and `status` says so.
#[test]
fn a_sleeping_thread_holding_a_dead_hook_address_does_not_keep_the_hooks_in() {
    // The worker sleeps a second after each round of calls: far longer than a restore
    // tries, so the dead address is on its stack whenever the hooks come out.
    let mut target = Target::spawn("stale_exit", &["1000"]);
    let before = steady_checksum(&mut target, 2);
    let counting = Counting::start(target.pid(), &["touch_inner", "--returns"]);
    // Lines printed before the hooks went in (a busy machine may leave some unread) do
    // not count: the second round's calls after this started after the hooks went in;
    // the worker now sleeps holding touch_inner's return address as the hook left it.
    target.drain();
    let during = steady_checksum(&mut target, 2);
    let report = counting.finish();
    assert_eq!(during, before);
    assert!(report.calls("touch_inner") >= 1000, "{}", report.stdout);
    code_bytes_match_file(target.pid()).unwrap();
    let line = status_line(target.pid());
    assert!(
        line.contains(" patched=0") && !line.contains("pending"),
        "{line}"
    );
    assert_eq!(steady_checksum(&mut target, 2), before);
}

/// A thread asleep inside tendril's code (a system call in the first bytes of a hooked
/// function runs from the hook's copy of them) keeps the unwinder's hooks in when the
/// count ends: tendril says so, `status` shows them and why, and they come out by
/// themselves once the thread has left.
#[test]
fn hooks_a_restore_must_leave_in_are_reported_and_come_out_by_themselves() {
    let mut target = Target::spawn("stale_exit", &["20"]);
    let pid = target.pid();
    let before = steady_checksum(&mut target, 2);
    let counting = Counting::start(pid, &["touch_inner", "read_syscall_first", "--returns"]);
    target.write_stdin("rawread\n");
    target.expect_line("reading", LINE_TIMEOUT);
    // The main thread is asleep in `read` once its syscall file names it (read is 0).
    let deadline = std::time::Instant::now() + LINE_TIMEOUT;
    while !std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/syscall"))
        .unwrap()
        .starts_with("0 0x0 ")
    {
        assert!(std::time::Instant::now() < deadline, "never read");
        std::thread::sleep(Duration::from_millis(10));
    }
    let report = counting.finish();
    assert_eq!(report.calls("read_syscall_first"), 1, "{}", report.stdout);
    assert!(
        report.stderr.contains(&format!(
            "hooks on the unwinder are still in (thread {pid} is inside"
        )),
        "{}",
        report.stderr
    );
    let status = status_line(pid);
    assert!(status.contains(" patched=0 pending_restore="), "{status}");
    // A detach restores nothing more, and says so rather than claiming it did.
    let detach = common::tendril()
        .args(["detach", &pid.to_string()])
        .output()
        .unwrap();
    let detached = String::from_utf8_lossy(&detach.stdout);
    assert!(detach.status.success(), "{detach:?}");
    assert!(
        detached.contains("restored=0 functions;") && detached.contains("are still in"),
        "{detached}"
    );
    // Once the line arrives, the thread leaves, and nothing needs to be asked.
    target.write_stdin("wake\n");
    target.expect_line("read 5", LINE_TIMEOUT);
    common::wait_until_no_hook_is_left_in(pid, LINE_TIMEOUT);
    code_bytes_match_file(pid).unwrap();
    assert_eq!(steady_checksum(&mut target, 2), before);
}

fn status_line(pid: i32) -> String {
    let output = common::tendril()
        .args(["status", &pid.to_string()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}
