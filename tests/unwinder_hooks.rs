//! The unwinder's hooks are in whenever a frame holds a return hook's exit: they go in
//! before the return hooks and come out after them, and a frame still running when the
//! hooks come out gets its real return address back, so an exception, a panic or a
//! `pthread_exit` can unwind through it later. (An unwinder that meets an exit aborts
//! a Rust program with "failed to initiate panic, error 5".)

mod common;

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
