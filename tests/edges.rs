//! Whole-function copies with edge counters (issue 18), driven through the agent's
//! `CopyWithCounters` request against the `branches` and `throw_through` fixtures: exact
//! per-block, per-branch and per-table-entry counts over rounds run on demand, C++
//! exceptions passing through a copy, correct results meanwhile, and every byte back
//! afterwards. `tests/edges_command.rs` tests the `edges` command built on it.

use crate::common;

use common::{Target, code_bytes_match_file, edge_counts};
use std::collections::BTreeMap;
use std::time::Duration;
use tendril::agent_connection::AgentConnection;
use tendril::symbols::ProcessSymbols;
use tendril::targets;
use tendril_wire::edges::{EdgeExit, EdgeLayout};
use tendril_wire::{Hook, Request, Response};

const ROUNDS: u64 = 5;
const LINE_TIMEOUT: Duration = Duration::from_secs(60);

/// The request that copies `name` of the target with counters.
fn copy_request(symbols: &ProcessSymbols, name: &str) -> (u64, Request) {
    let matched = targets::match_patterns(symbols, &[format!("{name}*")]).unwrap();
    let function = matched
        .iter()
        .filter(|f| !f.raw_name.ends_with(".cold"))
        .find(|f| f.name == name || f.name.starts_with(&format!("{name}(")))
        .unwrap_or_else(|| panic!("{name} not found"));
    let Request::Patch { code_ranges, .. } =
        targets::patch_request(symbols, &[(function, Hook::Count)])
    else {
        unreachable!()
    };
    let request = Request::CopyWithCounters {
        address: function.addr,
        size: function.size,
        code_ranges,
        cold_parts: targets::cold_parts(symbols, function),
        paths: true,
    };
    (function.addr, request)
}

fn install(session: &mut AgentConnection, symbols: &ProcessSymbols, name: &str) -> EdgeLayout {
    let (_, request) = copy_request(symbols, name);
    match session.request(&request).unwrap() {
        Response::EdgesInstalled { layout } => layout,
        other => panic!("{name}: {other:?}"),
    }
}

fn unpatch(session: &mut AgentConnection, addresses: Vec<u64>) {
    let count = addresses.len();
    match session.request(&Request::Unpatch { addresses }).unwrap() {
        Response::Unpatched { restored, .. } => assert_eq!(restored, count),
        other => panic!("{other:?}"),
    }
}

/// Runs `n` rounds on demand and returns their checksums.
fn run_rounds(target: &mut Target, n: u64) -> Vec<u64> {
    target.checksums_on_demand(n as usize, LINE_TIMEOUT)
}

/// The one conditional branch of `layout`: (taken, not taken).
fn branches(layout: &EdgeLayout, counts: &BTreeMap<u32, u64>) -> Vec<(u64, u64)> {
    layout
        .blocks
        .iter()
        .filter_map(|block| match &block.exit {
            EdgeExit::Conditional { taken_counter, .. } => {
                let taken = counts[taken_counter];
                Some((taken, counts[&block.counter] - taken))
            }
            _ => None,
        })
        .collect()
}

/// The paths `layout` counted: (runs under a path number, runs lost).
fn path_runs(layout: &EdgeLayout, counts: &BTreeMap<u32, u64>) -> (u64, u64) {
    let paths = layout.paths.as_ref().expect("paths are counted");
    let numbered: u64 = (0..paths.itemized)
        .map(|n| counts[&(paths.first_counter + n)])
        .sum::<u64>()
        + counts[&paths.beyond_counter];
    (numbered, counts[&paths.lost_counter])
}

#[test]
fn branch_table_and_loop_counts_are_exact_and_every_byte_comes_back() {
    let mut target = Target::spawn("branches", &["stdin"]);
    let bare = run_rounds(&mut target, 2);
    let pid = target.pid();
    let symbols = ProcessSymbols::load(pid).unwrap();
    let (_, mut session) = tendril::inject::attach(pid).unwrap();
    let classify = install(&mut session, &symbols, "classify");
    let dispatch = install(&mut session, &symbols, "dispatch");
    let trip = install(&mut session, &symbols, "trip");

    let during = run_rounds(&mut target, ROUNDS);
    unpatch(
        &mut session,
        vec![classify.address, dispatch.address, trip.address],
    );
    let counts: Vec<BTreeMap<u32, u64>> = [&classify, &dispatch, &trip]
        .iter()
        .map(|layout| edge_counts(&mut session, layout))
        .collect();
    drop(session);

    // classify(i), i = 0..299: taken 200 times of 300 (the compiler may invert it).
    let calls = |layout: &EdgeLayout, counts: &BTreeMap<u32, u64>| counts[&layout.calls_counter];
    assert_eq!(calls(&classify, &counts[0]), 300 * ROUNDS);
    assert_eq!(counts[0][&classify.blocks[0].counter], 300 * ROUNDS);
    let [(taken, not_taken)] = branches(&classify, &counts[0])[..] else {
        panic!("classify: {classify:?}")
    };
    let mut split = [taken, not_taken];
    split.sort();
    assert_eq!(split, [100 * ROUNDS, 200 * ROUNDS], "classify's branch");

    // dispatch(op), op = i % 9 for 90 calls: 7 table entries 10 times each.
    assert_eq!(calls(&dispatch, &counts[1]), 90 * ROUNDS);
    let table: Vec<u64> = dispatch
        .blocks
        .iter()
        .find_map(|block| match &block.exit {
            EdgeExit::Table { entries, .. } => {
                Some(entries.iter().map(|e| counts[1][&e.counter]).collect())
            }
            _ => None,
        })
        .expect("dispatch has a jump table");
    assert_eq!(table, vec![10 * ROUNDS; 7], "per case");

    // trip(n), n = 0..9: 45 iterations; the loop's head block runs once per iteration.
    assert_eq!(calls(&trip, &counts[2]), 10 * ROUNDS);
    let most = trip
        .blocks
        .iter()
        .map(|block| counts[2][&block.counter])
        .max()
        .unwrap();
    assert_eq!(most, 45 * ROUNDS, "the loop body's block");

    assert!(
        during.iter().all(|&c| c == bare[0]),
        "{during:?} vs {bare:?}"
    );
    code_bytes_match_file(pid).unwrap();
    assert_eq!(run_rounds(&mut target, 1), [bare[0]]);
}

/// Runs `n` rounds of `throw_through 0` and returns their (caught, checksum).
fn throwing_rounds(target: &mut Target, n: u64) -> Vec<(u64, u64)> {
    target
        .rounds_on_demand(n as usize, LINE_TIMEOUT)
        .iter()
        .map(|round| {
            let value = |key: &str| round.get(key).unwrap_or_else(|| panic!("{round:?}"));
            (value("caught"), value("checksum"))
        })
        .collect()
}

#[test]
fn exceptions_pass_through_the_copy_to_their_handler_and_its_branch_is_counted() {
    let mut target = Target::spawn("throw_through", &["0"]);
    let bare = throwing_rounds(&mut target, 1)[0];
    assert_eq!(bare.0, 250);
    let pid = target.pid();
    let symbols = ProcessSymbols::load(pid).unwrap();
    let (_, mut session) = tendril::inject::attach(pid).unwrap();
    let relay = install(&mut session, &symbols, "relay");
    let during = throwing_rounds(&mut target, ROUNDS);
    unpatch(&mut session, vec![relay.address]);
    let counts = edge_counts(&mut session, &relay);
    drop(session);
    assert!(
        during.iter().all(|&round| round == bare),
        "{during:?} vs {bare:?}"
    );
    // 1,000 calls a round; 250 leave through thrower's exception, 750 return to relay
    // and take one side of its branch or the other.
    assert_eq!(counts[&relay.calls_counter], 1000 * ROUNDS);
    let [(taken, not_taken)] = branches(&relay, &counts)[..] else {
        panic!("relay: {relay:?}")
    };
    assert_eq!(taken + not_taken, 750 * ROUNDS);
    // Only the calls that return end a path; the thrown-through ones leave their
    // entries, which later calls drop, so no path is lost or miscounted.
    assert_eq!(path_runs(&relay, &counts), (750 * ROUNDS, 0));
    code_bytes_match_file(pid).unwrap();
    assert_eq!(throwing_rounds(&mut target, 1), [bare]);
}

#[test]
fn a_function_that_catches_runs_its_handler_in_the_copy_and_counts_where_exceptions_land() {
    let mut target = Target::spawn("throw_through", &["0"]);
    let bare = throwing_rounds(&mut target, 1)[0];
    let pid = target.pid();
    let symbols = ProcessSymbols::load(pid).unwrap();
    let (_, mut session) = tendril::inject::attach(pid).unwrap();
    // do_round catches relay's exceptions in a try block; GCC puts the catch in a
    // `.cold` part, which jumps back into the loop: both parts are copied.
    let do_round = install(&mut session, &symbols, "do_round");
    let during = throwing_rounds(&mut target, ROUNDS);
    unpatch(&mut session, vec![do_round.address]);
    let counts = edge_counts(&mut session, &do_round);
    drop(session);
    assert!(
        during.iter().all(|&round| round == bare),
        "every exception still reaches its handler: {during:?} vs {bare:?}"
    );
    assert_eq!(counts[&do_round.calls_counter], ROUNDS);
    // 1,000 iterations a round, the 250 that caught an exception included: the loop
    // stays in the copy after each catch.
    let block_counts: Vec<u64> = (do_round.blocks.iter())
        .map(|block| counts[&block.counter])
        .collect();
    assert!(
        block_counts.contains(&(1000 * ROUNDS)),
        "the loop's body runs 1,000 times a round: {block_counts:?}"
    );
    // 250 exceptions a round land in the copy.
    let landed: Vec<u64> = (do_round.landing_pads.iter())
        .map(|pad| {
            let block = do_round.blocks.iter().find(|b| b.start == *pad).unwrap();
            counts[&block.counter]
        })
        .collect();
    assert!(landed.contains(&(250 * ROUNDS)), "landed: {landed:?}");
    // Every path ends at the loop's back edge or the return: 1,000 a round, none lost
    // (the 250 an exception cut short are not paths; the catches start new ones).
    assert_eq!(path_runs(&do_round, &counts), (1000 * ROUNDS, 0));
    code_bytes_match_file(pid).unwrap();
    assert_eq!(throwing_rounds(&mut target, 2), [bare, bare]);
}

#[test]
fn a_typed_catch_on_a_call_site_of_the_cold_part_finds_its_handler_in_the_copy() {
    let mut target = Target::spawn("throw_through", &["retry"]);
    let bare = throwing_rounds(&mut target, 1)[0];
    assert_eq!(bare.0, 500);
    let pid = target.pid();
    let symbols = ProcessSymbols::load(pid).unwrap();
    let (_, mut session) = tendril::inject::attach(pid).unwrap();
    // recover's catch block, in its `.cold` part, calls relay again inside a second
    // try: that call site's handler is chosen by a filter compiled into the pad.
    let recover = install(&mut session, &symbols, "recover");
    let during = throwing_rounds(&mut target, ROUNDS);
    unpatch(&mut session, vec![recover.address]);
    let counts = edge_counts(&mut session, &recover);
    drop(session);
    assert!(
        during.iter().all(|&round| round == bare),
        "both catches reach their handlers: {during:?} vs {bare:?}"
    );
    assert_eq!(counts[&recover.calls_counter], 1000 * ROUNDS);
    let mut landed: Vec<u64> = (recover.landing_pads.iter())
        .map(|pad| {
            let block = recover.blocks.iter().find(|b| b.start == *pad).unwrap();
            counts[&block.counter]
        })
        .filter(|&count| count > 0)
        .collect();
    landed.sort();
    assert_eq!(landed, [250 * ROUNDS, 250 * ROUNDS], "{recover:?}");
    assert_eq!(path_runs(&recover, &counts).1, 0, "no path lost");
    code_bytes_match_file(pid).unwrap();
    assert_eq!(throwing_rounds(&mut target, 1), [bare]);
}

#[test]
fn copy_cycles_under_eight_throwing_threads_leave_code_and_results_intact() {
    let mut target = Target::spawn("throw_through", &["8"]);
    let bare = target.checksum_lines(2, LINE_TIMEOUT);
    let pid = target.pid();
    let symbols = ProcessSymbols::load(pid).unwrap();
    let (_, mut session) = tendril::inject::attach(pid).unwrap();
    let cycles = common::soak_cycles(20, 100);
    for cycle in 0..cycles {
        let relay = install(&mut session, &symbols, "relay");
        // Let the threads run through the copy now and then (five times in all).
        if cycle % (cycles / 5) == 0 {
            target.checksum_lines(1, LINE_TIMEOUT);
        }
        unpatch(&mut session, vec![relay.address]);
    }
    drop(session);
    code_bytes_match_file(pid).unwrap();
    target.drain();
    let after = target.checksum_lines(3, LINE_TIMEOUT);
    assert!(after.iter().all(|&c| c == bare[0]), "{after:?} vs {bare:?}");
    assert!(target.is_running());
}

#[test]
fn copy_and_restore_cycles_leave_the_code_and_results_intact() {
    let mut target = Target::spawn("branches", &["stdin"]);
    let bare = run_rounds(&mut target, 1)[0];
    let pid = target.pid();
    let symbols = ProcessSymbols::load(pid).unwrap();
    let (_, mut session) = tendril::inject::attach(pid).unwrap();
    for cycle in 0..common::soak_cycles(20, 100) {
        let layouts: Vec<EdgeLayout> = ["classify", "dispatch", "trip"]
            .iter()
            .map(|name| install(&mut session, &symbols, name))
            .collect();
        let checksums = run_rounds(&mut target, 1);
        assert_eq!(checksums, [bare], "cycle {cycle}");
        unpatch(&mut session, layouts.iter().map(|l| l.address).collect());
        // Counters start from zero at each installation.
        let counts = edge_counts(&mut session, &layouts[0]);
        assert_eq!(counts[&layouts[0].calls_counter], 300, "cycle {cycle}");
    }
    drop(session);
    code_bytes_match_file(pid).unwrap();
    assert_eq!(run_rounds(&mut target, 1), [bare]);
}

#[test]
fn a_recursive_function_counts_every_level_through_its_copy() {
    // descend(8) → work(), descend(7) → ... → descend(0): 9 calls a request, on three
    // threads; the recursive call goes through the patched entry into the copy again.
    let mut target = Target::spawn("descend", &[]);
    let pid = target.pid();
    let symbols = ProcessSymbols::load(pid).unwrap();
    let (_, mut session) = tendril::inject::attach(pid).unwrap();
    let descend = install(&mut session, &symbols, "descend");
    let deadline = std::time::Instant::now() + LINE_TIMEOUT;
    while edge_counts(&mut session, &descend)[&descend.calls_counter] < 9_000 {
        assert!(
            std::time::Instant::now() < deadline,
            "descend is not being called"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    unpatch(&mut session, vec![descend.address]);
    let counts = edge_counts(&mut session, &descend);
    drop(session);
    let calls = counts[&descend.calls_counter];
    assert_eq!(
        counts[&descend.blocks[0].counter], calls,
        "every call starts the copy"
    );
    let [(taken, not_taken)] = branches(&descend, &counts)[..] else {
        panic!("descend: {descend:?}")
    };
    // Per request: level > 0 eight times, level 0 once (the compiler may invert the
    // test). Requests cut by the window's two ends (three threads) move it a little.
    let (recurse, bottom) = if taken > not_taken {
        (taken, not_taken)
    } else {
        (not_taken, taken)
    };
    assert!(
        recurse.abs_diff(8 * bottom) <= 8 * 2 * 3,
        "{recurse} vs 8 × {bottom}"
    );
    // Every call that returned before the reading ended one path; at most the nine
    // levels of each thread's request were still open then.
    let (runs, lost) = path_runs(&descend, &counts);
    assert_eq!(lost, 0);
    assert!(runs <= calls && calls - runs <= 9 * 3, "{runs} of {calls}");
    code_bytes_match_file(pid).unwrap();
    assert!(target.is_running());
}
