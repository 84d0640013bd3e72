//! Return hooks on frames that are left without returning: C++ exceptions, Rust panics,
//! `longjmp`, `pthread_exit`, cancellation, recursion deeper than the shadow stack, and
//! signal handlers (on the thread's stack and on an alternate one) that call hooked
//! functions. In every case the fixture prints what it did itself; it must print the
//! same with the hooks in, and `tendril count --returns` must count exactly that.

use crate::common;

use common::{CountReport, Counting, Target, code_bytes_match_file};
use std::collections::HashMap;
use std::time::Duration;

const LINE_TIMEOUT: Duration = Duration::from_secs(30);

/// Parses an `unwinding` fixture report: `<cmd> calls f=n ... returns f=n ... cleanups
/// C signals S checksum X`.
struct FixtureReport {
    calls: HashMap<String, u64>,
    returns: HashMap<String, u64>,
    rest: String,
}

fn parse_fixture_report(line: &str) -> FixtureReport {
    let (_, after_calls) = line.split_once(" calls ").expect(line);
    let (calls_part, after_returns) = after_calls.split_once(" returns ").expect(line);
    let (returns_part, rest) = after_returns.split_once(" cleanups ").expect(line);
    let pairs = |text: &str| -> HashMap<String, u64> {
        text.split_whitespace()
            .map(|pair| {
                let (name, value) = pair.split_once('=').expect(pair);
                (name.to_string(), value.parse().unwrap())
            })
            .collect()
    };
    FixtureReport {
        calls: pairs(calls_part),
        returns: pairs(returns_part),
        rest: rest.to_string(),
    }
}

/// Runs one `unwinding` command with its functions counted (returns hooked), and checks
/// that tendril's counts equal the fixture's and that its report is what an unhooked
/// run of the same command prints.
fn command_counts_match(command: &str, exact_returns: bool) -> (FixtureReport, CountReport) {
    let mut target = Target::spawn("unwinding", &[]);
    let reply = format!("{} calls ", command.split_whitespace().next().unwrap());
    target.write_stdin(&format!("{command}\n"));
    let bare = parse_fixture_report(&target.expect_line(&reply, LINE_TIMEOUT));

    let patterns: Vec<String> = bare.calls.keys().cloned().collect();
    let mut args: Vec<&str> = patterns.iter().map(String::as_str).collect();
    args.push("--returns");
    let counting = Counting::start(target.pid(), &args);
    target.write_stdin(&format!("{command}\n"));
    let hooked = parse_fixture_report(&target.expect_line(&reply, LINE_TIMEOUT));
    let report = counting.finish();

    assert_eq!(
        hooked.calls, bare.calls,
        "the fixture called the same functions"
    );
    assert_eq!(
        hooked.returns, bare.returns,
        "and they returned the same way"
    );
    assert_eq!(
        hooked.rest, bare.rest,
        "same cleanups, signals and checksum"
    );
    for (function, &calls) in &hooked.calls {
        assert_eq!(
            report.calls(function),
            calls,
            "{function}: {}",
            report.stdout
        );
        if exact_returns {
            assert_eq!(
                report.returns(function),
                hooked.returns[function],
                "{function}: {}",
                report.stdout
            );
        }
    }
    code_bytes_match_file(target.pid()).unwrap();
    target.write_stdin(&format!("{command}\n"));
    let after = parse_fixture_report(&target.expect_line(&reply, LINE_TIMEOUT));
    assert_eq!(after.rest, bare.rest, "the target still computes the same");
    (hooked, report)
}

#[test]
fn longjmp_over_hooked_frames() {
    command_counts_match("longjmp 3000", true);
}

#[test]
fn pthread_exit_from_hooked_frames_runs_every_cleanup() {
    let (fixture, _) = command_counts_match("exit 20", true);
    assert!(
        fixture.rest.starts_with("40 "),
        "two cleanups per thread: {}",
        fixture.rest
    );
}

#[test]
fn hooked_frames_still_running_when_the_hooks_come_out_return_correctly() {
    let mut target = Target::spawn("unwinding", &[]);
    let counting = Counting::start(target.pid(), &["hold_*", "--returns"]);
    target.write_stdin("hold 1500\n");
    // Both frames are entered (their return addresses replaced), then the hooks go.
    std::thread::sleep(Duration::from_millis(500));
    let report = counting.finish();
    assert_eq!(report.calls("hold_outer"), 1, "{}", report.stdout);
    assert_eq!(report.calls("hold_inner"), 1, "{}", report.stdout);
    code_bytes_match_file(target.pid()).unwrap();
    let fixture = parse_fixture_report(&target.expect_line("hold calls ", LINE_TIMEOUT));
    assert_eq!(
        fixture.returns["hold_outer"], 1,
        "returned normally after the hooks came out"
    );
    assert_eq!(fixture.returns["hold_inner"], 1);
    target.write_stdin("hold 1\n");
    let again = parse_fixture_report(&target.expect_line("hold calls ", LINE_TIMEOUT));
    assert_eq!(again.rest, fixture.rest, "the target computes the same");
}

#[test]
fn cancellation_inside_hooked_frames_runs_every_cleanup() {
    let (fixture, _) = command_counts_match("cancel 20", true);
    assert!(
        fixture.rest.starts_with("40 "),
        "two cleanups per thread: {}",
        fixture.rest
    );
}

#[test]
fn signal_handlers_calling_hooked_functions_on_both_stacks() {
    command_counts_match("signal 200", true);
}

#[test]
fn recursion_deeper_than_the_shadow_stack_degrades_without_harm() {
    let (fixture, report) = command_counts_match("recurse 200000", false);
    assert_eq!(fixture.returns["recurse"], 200_001);
    // The innermost calls run without a return hook; every hooked one returns.
    let returns = report.returns("recurse");
    assert!((32 * 1024..200_001).contains(&returns), "{}", report.stdout);
    assert!(
        report
            .stdout
            .contains("calls ran deeper than tendril's return stack"),
        "{}",
        report.stdout
    );
}

/// Expected calls and returns of one round of the `exceptions` or `rust_panics`
/// fixture, from the structure their comments document.
struct RoundShape {
    iterations: u64,
    thrown: u64,
    escaping_level1: u64,
}

fn exceptions_through_hooked_frames(fixture: &str, shape: RoundShape) {
    let mut target = Target::spawn(fixture, &["0"]);
    target.write_stdin("round\n");
    let bare = target.rounds(1, LINE_TIMEOUT)[0].values.clone();
    let counting = Counting::start(
        target.pid(),
        &["level1", "level2", "level3", "run_round", "--returns"],
    );
    target.write_stdin("round\nround\n");
    let hooked = target.rounds(2, LINE_TIMEOUT);
    let report = counting.finish();
    for round in &hooked {
        assert_eq!(round.values, bare, "the fixture's own report is unchanged");
    }
    let name = |n: &str| {
        report
            .rows
            .iter()
            .find(|r| r.name == n || r.name.starts_with(&format!("{n}(")))
            .unwrap_or_else(|| panic!("no {n} in {}", report.stdout))
            .clone()
    };
    let rounds = 2;
    let n = shape.iterations * rounds;
    assert_eq!(
        (name("run_round").calls, name("run_round").returns),
        (rounds, Some(rounds))
    );
    let level3 = name("level3");
    assert_eq!(
        (level3.calls, level3.returns),
        (n, Some(n - shape.thrown * rounds))
    );
    let level2 = name("level2");
    assert_eq!(
        (level2.calls, level2.returns),
        (n, Some(n - shape.thrown * rounds))
    );
    let level1 = name("level1");
    assert_eq!(
        (level1.calls, level1.returns),
        (n, Some(n - shape.escaping_level1 * rounds)),
        "{}",
        report.stdout
    );
    code_bytes_match_file(target.pid()).unwrap();
}

#[test]
fn cxx_exceptions_through_hooked_frames() {
    // 1000 iterations: level3 throws for i % 4 == 0 (250) or i % 7 == 3 (108 more);
    // level1 lets the out_of_range ones (108) and the rethrown ones (i % 12 == 0, 84) out.
    exceptions_through_hooked_frames(
        "exceptions",
        RoundShape {
            iterations: 1000,
            thrown: 358,
            escaping_level1: 192,
        },
    );
}

#[test]
fn rust_panics_caught_by_catch_unwind_through_hooked_frames() {
    // 400 iterations: level3 panics for i % 4 == 0 (100) or i % 7 == 3 (43 more);
    // level1 resumes the OutOfRange ones (43) and the String ones with i % 3 == 0 (34).
    exceptions_through_hooked_frames(
        "rust_panics",
        RoundShape {
            iterations: 400,
            thrown: 143,
            escaping_level1: 77,
        },
    );
}
