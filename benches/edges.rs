//! Benchmark: the cost of edge counters and of path numbers in a function's copy
//! (issue 18).
//!
//! Run with `cargo bench --bench edges`. The `branches` fixture times `ROUNDS` rounds
//! back to back (`timed N` on its stdin): bare, then with `classify`, `dispatch` and
//! `trip` copied with edge counters only (the agent's `CopyWithCounters` request,
//! `paths: false`), then copied with counters and the path register, then bare again,
//! `RUNS` times. The counters are read back exactly: the edge-only copies' extra time
//! is divided by their increments (each block start, taken branch and table entry, and
//! each call's count), and the path register's extra time over the edge-only copies by
//! the calls that paid for it.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{Target, edge_counts};
use std::collections::BTreeMap;
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
    let requests = |paths: bool| -> Vec<Request> {
        FUNCTIONS
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
                    cold_parts: Vec::new(),
                    paths,
                }
            })
            .collect()
    };
    let (edges_only, with_paths) = (requests(false), requests(true));
    // Times `ROUNDS` rounds with `requests` installed; the counts of every counter and
    // of the calls, read after the restore.
    let mut copied = |target: &mut Target, requests: &[Request]| -> (f64, u64, u64) {
        let layouts: Vec<EdgeLayout> = requests
            .iter()
            .map(|request| match session.request(request).unwrap() {
                Response::EdgesInstalled { layout } => layout,
                other => panic!("{other:?}"),
            })
            .collect();
        let time = timed(target);
        let addresses = layouts.iter().map(|l| l.address).collect();
        session.request(&Request::Unpatch { addresses }).unwrap();
        let mut counts = BTreeMap::new();
        for layout in &layouts {
            counts.extend(edge_counts(&mut session, layout));
        }
        let increments = counts.values().sum();
        let calls = layouts.iter().map(|l| counts[&l.calls_counter]).sum();
        (time, increments, calls)
    };
    timed(&mut target); // warm up
    let (mut bare_ns, mut edges_ns, mut paths_ns) = (Vec::new(), Vec::new(), Vec::new());
    let (mut per_increment, mut per_call) = (Vec::new(), Vec::new());
    let (mut increments_per_round, mut calls_per_round) = (0.0, 0.0);
    for run in 0..RUNS {
        let before = timed(&mut target);
        let (edges, increments, _) = copied(&mut target, &edges_only);
        let (paths, _, calls) = copied(&mut target, &with_paths);
        let after = timed(&mut target);
        let bare = (before + after) / 2.0;
        increments_per_round = increments as f64 / ROUNDS as f64;
        calls_per_round = calls as f64 / ROUNDS as f64;
        let increment_cost = (edges - bare) / increments as f64;
        let path_cost = (paths - edges) / calls as f64;
        let per_round = |ns: f64| ns / ROUNDS as f64 / 1e3;
        println!(
            "run {run}: bare {:.2} µs/round, edges {:.2}, edges+paths {:.2}; \
             {increments_per_round:.0} increments and {calls_per_round:.0} calls per round; \
             {increment_cost:.2} ns per increment, {path_cost:.2} ns per call for paths",
            per_round(bare),
            per_round(edges),
            per_round(paths),
        );
        bare_ns.push(bare);
        edges_ns.push(edges);
        paths_ns.push(paths);
        per_increment.push(increment_cost);
        per_call.push(path_cost);
    }
    let bare = median(bare_ns);
    let edges = median(edges_ns);
    let paths = median(paths_ns);
    println!(
        "median of {RUNS}: bare {:.2} µs/round, edges {:.2} ({:.2}×), edges+paths {:.2} \
         ({:.2}×); {increments_per_round:.0} increments, {calls_per_round:.0} calls per round; \
         {:.2} ns per increment (target < 2 ns per edge), {:.2} ns per call for paths \
         (target < 5 ns)",
        bare / ROUNDS as f64 / 1e3,
        edges / ROUNDS as f64 / 1e3,
        edges / bare,
        paths / ROUNDS as f64 / 1e3,
        paths / bare,
        median(per_increment),
        median(per_call),
    );
}
