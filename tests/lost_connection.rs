//! A count whose agent stops answering (the target was stopped) never claims another
//! tendril detached the target, and never ends saying it is done while the target's
//! code is still patched: it says what happened and that the code waits to be restored,
//! exits non-zero, and the agent restores everything once the target runs again.

use crate::common;

use common::{RunningTendril, Target, code_bytes_match_file, tendril};
use std::process::Stdio;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn a_count_whose_target_stops_says_so_and_the_code_comes_back_when_it_runs() {
    let mut target = Target::spawn("calltree", &["2"]);
    let pid = target.pid();
    let before = target.steady_checksum(2, TIMEOUT);
    let mut command = tendril();
    command
        .args(["count", &pid.to_string(), "compute_block"])
        .stdout(Stdio::piped());
    let count = RunningTendril::start(command, "tendril: counting calls", TIMEOUT);
    target.signal(libc::SIGSTOP);
    // The agent cannot answer the next reading; the count gives up on it by itself.
    let (status, stdout, stderr) = count.wait();
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("did not answer"), "{stderr}");
    assert!(!stderr.contains("another tendril detached"), "{stderr}");
    assert!(
        stderr.contains("still has code patched"),
        "the count must not claim the code is restored: {stderr}"
    );
    assert!(
        stdout.contains("compute_block"),
        "counts up to then: {stdout}"
    );
    target.signal(libc::SIGCONT);
    let deadline = Instant::now() + TIMEOUT;
    while code_bytes_match_file(pid).is_err() {
        assert!(Instant::now() < deadline, "the code was never restored");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(target.steady_checksum(2, TIMEOUT), before);
}
