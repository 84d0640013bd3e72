//! `tendril` without a terminal: the demo prints its call tree, an attach is one clear
//! error, and bad arguments are refused before any terminal is needed.

use super::assert_untouched;
use crate::common::live_target_turn;
use crate::common::{Target, tendril};

#[test]
fn demo_without_a_terminal_prints_the_call_tree() {
    let _turn = live_target_turn();
    let output = tendril().arg("demo").output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "stderr:\n{stderr}");
    for function in [
        "demo_handle_request",
        "demo_lookup_cache",
        "demo_hash_block",
        "demo_fib",
    ] {
        assert!(
            stdout.contains(function),
            "{function} missing from:\n{stdout}\nstderr:\n{stderr}"
        );
    }
    assert!(stdout.contains("merged call tree"), "{stdout}");
}

#[test]
fn attach_without_a_terminal_is_one_clear_error() {
    let _turn = live_target_turn();
    let target = Target::spawn("calltree", &["1"]);
    let output = tendril()
        .args(["attach", &target.pid().to_string()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("tendril: ") && stderr.contains("tendril record"),
        "{stderr}"
    );
    // The error came before anything was done to the target.
    assert_untouched(target.pid());
}

#[test]
fn arguments_are_checked_before_the_terminal() {
    let target = Target::spawn("calltree", &["1"]);
    let pid = target.pid().to_string();
    let missing = i32::MAX.to_string();
    let cases: [(&[&str], &str); 5] = [
        (
            &["view", "/no/such/profile.json"],
            "cannot read /no/such/profile.json",
        ),
        (
            &["view", "/etc/passwd"],
            "/etc/passwd is not a tendril profile",
        ),
        (&["attach", &missing], "no process with pid"),
        (
            &["attach", &pid, "--root", "no_such_function"],
            "no function matches 'no_such_function'",
        ),
        // Good arguments: only then is the missing terminal the error.
        (
            &["attach", &pid, "--root", "work_round"],
            "--root work_round --duration SECS",
        ),
    ];
    for (args, expected) in cases {
        let output = tendril().args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    assert_untouched(target.pid());
}
