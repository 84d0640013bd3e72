//! Patching thousands of functions at once — every function of libc — while the
//! target's threads call them: the batch goes in and comes out whole, however loaded
//! the machine (the controller waits in proportion to the batch, and planning a patch
//! does not get slower with the batch's size), and the target keeps computing exactly
//! what it computes unpatched.

use crate::common;

use common::{Counting, Target, code_bytes_match_file, tendril};
use std::time::Duration;

const LINE_TIMEOUT: Duration = Duration::from_secs(60);
/// libc.so.6 has about 3,700 functions tendril can patch.
const MOST_OF_LIBC: usize = 3000;

fn steady_checksum(target: &mut Target, rounds: usize) -> u64 {
    target.steady_checksum(rounds, LINE_TIMEOUT)
}

#[test]
fn counting_every_function_of_libc() {
    let mut target = Target::spawn("calltree", &["2"]);
    let before = steady_checksum(&mut target, 2);
    let counting = Counting::start(target.pid(), &["libc.so.6:*"]);
    // A whole round while counting (each calls snprintf): two steady checksum lines
    // alone can come without one when load makes a round slow.
    target.whole_rounds(1, LINE_TIMEOUT);
    let during = steady_checksum(&mut target, 2);
    let report = counting.finish();
    assert_eq!(during, before, "checksum while counting");
    assert!(
        report.rows.len() > MOST_OF_LIBC,
        "{} functions counted:\n{}",
        report.rows.len(),
        report.stderr
    );
    assert!(report.calls("snprintf") > 0, "{}", report.stdout);
    code_bytes_match_file(target.pid()).unwrap();
    assert_eq!(steady_checksum(&mut target, 2), before);
}

#[test]
fn recording_from_every_function_of_libc() {
    let mut target = Target::spawn("calltree", &["2"]);
    let before = steady_checksum(&mut target, 2);
    let profile = std::env::temp_dir().join(format!("tendril-libc-{}.json", target.pid()));
    let output = tendril()
        .args(["record", &target.pid().to_string(), "--root", "libc.so.6:*"])
        .args(["--duration", "1", "-o"])
        .arg(&profile)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&profile).unwrap()).unwrap();
    let _ = std::fs::remove_file(&profile);
    let instrumented = written["stats"]["instrumented_functions"].as_u64().unwrap();
    assert!(instrumented as usize > MOST_OF_LIBC, "{stderr}");
    assert!(target.is_running());
    code_bytes_match_file(target.pid()).unwrap();
    assert_eq!(steady_checksum(&mut target, 2), before);
}
