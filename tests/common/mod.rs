//! What the integration tests share: the fixture programs, built on demand (`fixture`),
//! running fixture processes (`Target`), the `tendril` binary (`tendril`), and the check
//! that a process runs exactly the code of its files (`code_bytes_match_file`), the
//! consistency every profile must have (`check_profile`), the counts of a function
//! copied with counters (`edge_counts`), and the kernel's count of a fixture's waits for
//! a core (`waited_for_a_core_ns`).
//!
//! The one idea: tests run real programs. The test binary (`tests/main.rs`) includes
//! this module once; some helpers serve only tests that skip on some machines, hence
//! the `allow` below.

#![allow(dead_code, unused_imports)]

mod code_check;
mod consistency;
mod counting;
mod fixture_build;
mod recording;
mod running;
mod schedstat;
mod target;
mod tmux;

#[allow(unused_imports)]
pub use code_check::{
    agent_code_matches_file, code_bytes_match_file, wait_until_no_hook_is_left_in,
};
pub use consistency::check_profile;
pub use counting::{CountReport, Counting, Row};
pub use fixture_build::{FIXTURE_NAMES, fixture, have_go};
pub use recording::{Recorded, Recording, all_nodes, node_at, start_recorder};
pub use running::RunningTendril;
pub use schedstat::{ran_on_a_core_ns, thread_waited_for_a_core_ns, waited_for_a_core_ns};
pub use target::{READY_TIMEOUT, Round, Target, number_after};
pub use tmux::{EXIT_TIMEOUT, SCREEN_TIMEOUT, Tmux, calls_of, parse_count};

use std::process::Command;

/// The names (`comm`) of process `pid`'s threads.
pub fn thread_names(pid: i32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
        .map(|name| name.trim().to_string())
        .collect()
}

/// A `Command` for the `tendril` binary that cargo built for these tests.
pub fn tendril() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tendril"))
}

/// Every counter of the copy `layout` describes, summed over the threads.
pub fn edge_counts(
    session: &mut tendril::agent_connection::AgentConnection,
    layout: &tendril_wire::edges::EdgeLayout,
) -> std::collections::BTreeMap<u32, u64> {
    let ids = layout.counters();
    let request = tendril_wire::Request::ReadCounters { ids: ids.clone() };
    let tendril_wire::Response::Counters { threads, .. } = session.request(&request).unwrap()
    else {
        panic!("no counters")
    };
    ids.iter()
        .enumerate()
        .map(|(i, &id)| (id, threads.iter().map(|t| t.calls[i]).sum()))
        .collect()
}

/// How many cycles a soak test runs: `quick` by default, `long` when the environment
/// has `TENDRIL_LONG_SOAK=1`.
///
/// The quick count proves what the test is about (patching, copying or attaching
/// again and again under threads that run through the code leaves everything intact);
/// the long one hunts rare races and is what these tests ran before issue #36. Run it
/// after a change to patching, the agent's channel or the copies:
/// `TENDRIL_LONG_SOAK=1 cargo test --workspace --no-fail-fast`.
pub fn soak_cycles(quick: usize, long: usize) -> usize {
    match std::env::var("TENDRIL_LONG_SOAK") {
        Ok(value) if value == "1" => long,
        _ => quick,
    }
}

/// Held by each test while it runs busy live targets (the terminal UI's, the live
/// recorder's, the interruptions' and the thousand threads'), whatever its module: on
/// a small machine, several such targets and debug-build consumers at once starve the
/// agent's brief stops of the target's threads (it gives up after 500 ms). Other tests
/// run beside them, as on any busy machine. Poisoning is ignored: one failed test must
/// not fail the others.
pub fn live_target_turn() -> std::sync::MutexGuard<'static, ()> {
    static LIVE_TARGET: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LIVE_TARGET
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
