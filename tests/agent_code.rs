//! tendril never instruments its own agent: a glob (`mi*`, `*`) leaves the agent's
//! library out, a pattern that names the agent's module gets each function refused with
//! the reason, and the target keeps running and computing exactly what it did.
//!
//! The one idea: the agent is only in the process after a first attach, so every test
//! loads it first (`tendril status`), as a user's earlier session would have.

use crate::common;

use common::{Counting, Target, code_bytes_match_file, tendril};
use std::time::Duration;

const ROUND_TIMEOUT: Duration = Duration::from_secs(120);
const REFUSAL: &str = "part of tendril's agent, which never instruments itself";

/// Starts calltree with `threads` workers and loads the agent into it; returns the
/// target and its steady checksum.
fn calltree_with_agent(threads: &str) -> (Target, u64) {
    let mut target = Target::spawn("calltree", &[threads]);
    let status = tendril()
        .args(["status", &target.pid().to_string()])
        .output()
        .unwrap();
    assert!(status.status.success(), "{status:?}");
    let checksum = steady_checksum(&mut target, 2);
    (target, checksum)
}

fn steady_checksum(target: &mut Target, rounds: usize) -> u64 {
    target.steady_checksum(rounds, ROUND_TIMEOUT)
}

fn is_agent_module(module: &str) -> bool {
    module.starts_with("libtendril_agent")
}

#[test]
fn a_glob_never_picks_up_the_agent() {
    let (mut target, before) = calltree_with_agent("2");
    // The agent links miniz_oxide, whose functions start with "mi" too.
    let output = tendril()
        .args(["count", &target.pid().to_string(), "mi*", "--json"])
        .args(["--duration", "1"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let listed: Vec<&serde_json::Value> = report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .chain(report["refused"].as_array().unwrap())
        .collect();
    assert!(
        listed.iter().any(|f| f["name"] == "mix"),
        "calltree's mix is counted: {report}"
    );
    let agent: Vec<&&serde_json::Value> = listed
        .iter()
        .filter(|f| is_agent_module(f["module"].as_str().unwrap()))
        .collect();
    assert!(agent.is_empty(), "agent functions matched: {agent:?}");
    code_bytes_match_file(target.pid()).unwrap();
    assert_eq!(steady_checksum(&mut target, 2), before);
}

#[test]
fn naming_the_agents_module_gets_each_function_refused_with_the_reason() {
    let (mut target, before) = calltree_with_agent("2");
    let pid = target.pid().to_string();
    let output = tendril()
        .args(["count", &pid, "libtendril_agent*:*", "--duration", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{output:?}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("tendril: none of the ") && stderr.contains(REFUSAL),
        "{stderr}"
    );
    assert!(target.is_running());
    code_bytes_match_file(target.pid()).unwrap();
    assert_eq!(steady_checksum(&mut target, 2), before);

    // One agent function among others: the others are counted, it is listed.
    let counting = Counting::start(
        target.pid(),
        &["mix", "libtendril_agent*:tendril_agent_start"],
    );
    steady_checksum(&mut target, 1);
    let report = counting.finish();
    assert!(report.calls("mix") > 0, "{}", report.stdout);
    assert_eq!(report.not_counted.len(), 1, "{}", report.stdout);
    let line = &report.not_counted[0];
    assert!(
        line.starts_with("not counted: tendril_agent_start (libtendril_agent")
            && line.ends_with(&format!("— {REFUSAL}")),
        "{line}"
    );

    let recorded = tendril()
        .args(["record", &pid, "--root", "libtendril_agent*:*"])
        .args(["--duration", "1", "-o", "/dev/null"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&recorded.stderr);
    assert!(!recorded.status.success(), "{recorded:?}");
    assert!(
        stderr.contains("no root could be instrumented") && stderr.contains(REFUSAL),
        "{stderr}"
    );
    code_bytes_match_file(target.pid()).unwrap();
    assert_eq!(steady_checksum(&mut target, 2), before);
}

#[test]
fn counting_every_function_of_a_process_that_has_the_agent() {
    let (mut target, before) = calltree_with_agent("2");
    let counting = Counting::start(target.pid(), &["*"]);
    let during = steady_checksum(&mut target, 3);
    let report = counting.finish();
    assert_eq!(during, before, "checksum changed while counting");
    assert!(report.calls("leaf_add") > 0, "{}", report.stdout);
    assert!(
        report
            .not_counted
            .iter()
            .all(|line| !line.contains(REFUSAL)),
        "{}",
        report.stdout
    );
    code_bytes_match_file(target.pid()).unwrap();
    assert_eq!(steady_checksum(&mut target, 3), before);
}

#[test]
fn symbols_globs_leave_the_agent_out_unless_its_module_is_named() {
    let (target, _) = calltree_with_agent("1");
    let pid = target.pid().to_string();
    let list = |pattern: &str| {
        let output = tendril()
            .args(["symbols", &pid, pattern, "--json"])
            .output()
            .unwrap();
        let listed: Vec<serde_json::Value> =
            serde_json::from_slice(&output.stdout).unwrap_or_default();
        (output.status.success(), listed, output.stderr)
    };
    let (ok, listed, stderr) = list("mi*");
    assert!(ok, "{}", String::from_utf8_lossy(&stderr));
    assert!(listed.iter().any(|f| f["name"] == "mix"));
    assert!(
        listed
            .iter()
            .all(|f| !is_agent_module(f["module"].as_str().unwrap())),
        "agent functions listed for a glob"
    );
    // Named by its module, the agent's functions are listed.
    let (ok, listed, _) = list("libtendril_agent*:tendril_agent_start");
    assert!(ok && listed.len() == 1, "{listed:?}");
    // A glob only the agent's functions match says so.
    let (ok, _, stderr) = list("tendril_agent_star*");
    let stderr = String::from_utf8_lossy(&stderr);
    assert!(
        !ok && stderr.contains("but tendril's own agent's"),
        "{stderr}"
    );
}
