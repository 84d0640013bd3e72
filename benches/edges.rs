//! Benchmark: the cost of edge counters in a function's copy (issue 18).
//!
//! Run with `cargo bench --bench edges`. The `branches` fixture times `ROUNDS` rounds
//! back to back (`timed N` on its stdin): bare, then with `classify`, `dispatch` and
//! `trip` copied with counters (through the agent's `CopyWithCounters` request), then
//! bare again, `RUNS` times. Every counter increment of a timed run is read back
//! exactly (each block start, taken branch and table entry, and each call's count), so
//! the extra time is divided by the exact number of increments it paid for.

#[path = "../tests/common/mod.rs"]
mod common;

use common::Target;
use std::time::Duration;
use tendril::symbols::ProcessSymbols;
use tendril::targets;
use tendril_wire::edges::EdgeLayout;
use tendril_wire::{Hook, Request, Response};

const ROUNDS: u64 = 20_000;
const RUNS: usize = 5;
const LINE_TIMEOUT: Duration = Duration::from_secs(120);
const FUNCTIONS: [&str; 3] = ["classify", "dispatch", "trip"];

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Nanoseconds `ROUNDS` rounds took.
fn timed(target: &mut Target) -> f64 {
    target.write_stdin(&format!("{ROUNDS}\n"));
    let line = target.expect_line("timed ", LINE_TIMEOUT);
    let words: Vec<&str> = line.split(' ').collect();
    words[3].parse().unwrap()
}

fn main() {
    let mut target = Target::spawn("branches", &["stdin"]);
    let pid = target.pid();
    let symbols = ProcessSymbols::load(pid).unwrap();
    let (_, mut session) = tendril::inject::attach(pid).unwrap();
    let requests: Vec<Request> = FUNCTIONS
        .iter()
        .map(|name| {
            let matched = targets::match_patterns(&symbols, &[name.to_string()]).unwrap();
            let function = matched.iter().find(|f| f.name == *name).unwrap();
            let Request::Patch { code_ranges, .. } =
                targets::patch_request(&symbols, &[(function, Hook::Count)])
            else {
                unreachable!()
            };
            Request::CopyWithCounters {
                address: function.addr,
                size: function.size,
                code_ranges,
            }
        })
        .collect();
    timed(&mut target); // warm up
    let (mut bare_ns, mut counted_ns, mut per_increment) = (Vec::new(), Vec::new(), Vec::new());
    let mut increments_per_round = 0.0;
    for run in 0..RUNS {
        let before = timed(&mut target);
        let layouts: Vec<EdgeLayout> = requests
            .iter()
            .map(|request| match session.request(request).unwrap() {
                Response::EdgesInstalled { layout } => layout,
                other => panic!("{other:?}"),
            })
            .collect();
        let counted = timed(&mut target);
        let addresses = layouts.iter().map(|l| l.address).collect();
        session.request(&Request::Unpatch { addresses }).unwrap();
        let ids: Vec<u32> = layouts.iter().flat_map(|l| l.counters()).collect();
        let Response::Counters { threads } =
            session.request(&Request::ReadCounters { ids }).unwrap()
        else {
            panic!("no counters")
        };
        let increments: u64 = threads.iter().flat_map(|t| &t.calls).sum();
        let after = timed(&mut target);
        let bare = (before + after) / 2.0;
        increments_per_round = increments as f64 / ROUNDS as f64;
        let cost = (counted - bare) / increments as f64;
        println!(
            "run {run}: bare {:.1} µs/round, counted {:.1} µs/round, {:.0} increments/round, \
             {cost:.2} ns per increment",
            bare / ROUNDS as f64 / 1e3,
            counted / ROUNDS as f64 / 1e3,
            increments_per_round,
        );
        bare_ns.push(bare);
        counted_ns.push(counted);
        per_increment.push(cost);
    }
    let bare = median(bare_ns);
    let counted = median(counted_ns);
    println!(
        "median of {RUNS}: bare {:.1} µs/round, counted {:.1} µs/round ({:.2}×), \
         {increments_per_round:.0} increments per round, {:.2} ns per increment \
         (target < 2 ns per edge)",
        bare / ROUNDS as f64 / 1e3,
        counted / ROUNDS as f64 / 1e3,
        counted / bare,
        median(per_increment),
    );
}
