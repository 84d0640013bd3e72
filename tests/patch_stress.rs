//! Patching and restoring, again and again, functions that eight threads call at full
//! speed: nothing crashes, the target computes exactly what it computes unpatched, and
//! after the last restore every byte of every executable mapping equals the file's.

use crate::common;

use common::{Target, code_bytes_match_file};
use std::time::Duration;
use tendril::symbols::ProcessSymbols;
use tendril::targets;
use tendril_wire::{Hook, Request, Response};

/// Patch-and-restore cycles: 40, or 200 with `TENDRIL_LONG_SOAK=1` (`common::soak_cycles`).
fn cycles() -> usize {
    common::soak_cycles(40, 200)
}

#[test]
fn patch_and_restore_cycles_under_load() {
    let mut target = Target::spawn("calltree", &["8"]);
    let bare = target.checksum_lines(3, Duration::from_secs(20));
    assert!(bare.windows(2).all(|w| w[0] == w[1]), "{bare:?}");

    let pid = target.pid();
    let symbols = ProcessSymbols::load(pid).unwrap();
    let patterns: Vec<String> = [
        "work_round",
        "compute_block",
        "leaf_add",
        "apply_op",
        "op_*",
        "mix",
        "scramble",
        "fib_rec",
        "format_digest",
        "libc.so.6:snprintf",
    ]
    .map(String::from)
    .to_vec();
    let matched = targets::match_patterns(&symbols, &patterns).unwrap();
    let (_, mut session) = tendril::inject::attach(pid).unwrap();
    let chosen = targets::choose(&symbols, &matched, &mut session).unwrap();

    for cycle in 0..cycles() {
        let hook = if cycle % 2 == 0 {
            Hook::Count
        } else {
            Hook::CountReturns
        };
        let functions: Vec<_> = chosen.iter().map(|c| (&c.function, hook)).collect();
        let addresses = match session
            .request(&targets::patch_request(&symbols, &functions))
            .unwrap()
        {
            Response::Patched { outcomes } => {
                for outcome in &outcomes {
                    assert!(outcome.id.is_some(), "cycle {cycle}: {outcome:?}");
                }
                outcomes.iter().map(|o| o.address).collect::<Vec<_>>()
            }
            other => panic!("cycle {cycle}: {other:?}"),
        };
        // Let the threads run through the hooks for a moment now and then.
        if cycle % 4 == 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
        match session.request(&Request::Unpatch { addresses }).unwrap() {
            Response::Unpatched { restored, .. } => assert_eq!(restored, chosen.len()),
            other => panic!("cycle {cycle}: {other:?}"),
        }
    }
    drop(session);
    code_bytes_match_file(pid).unwrap();
    let after = target.checksum_lines(3, Duration::from_secs(20));
    assert!(after.iter().all(|&c| c == bare[0]), "{after:?} vs {bare:?}");
    assert!(target.is_running());
}
