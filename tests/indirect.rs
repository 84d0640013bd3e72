//! Calls through pointers inside the recorded call graph: a C dispatch table, `qsort`'s
//! comparator, C++ virtual calls (one interface implemented in another shared library,
//! one override that throws), Rust `dyn Trait` and `&dyn Fn` closures, and a callback in
//! a library loaded with `dlopen` after the recording started. Each target must appear
//! under its real caller with its exact call count. By default they are followed from
//! the call graph (each recorded function that calls through pointers runs from a copy
//! that checks those calls); `--pointer-candidates` and scheme a instrument every
//! address-taken function up front instead. A target whose entry no jump fits in gets
//! a hook in front of it, where the checks send its calls.

use crate::common;

use common::{Recording, Target, code_bytes_match_file, fixture, node_at, number_after};
use std::time::Duration;
use tendril::profile::{Node, Profile, Timing};

const LINE_TIMEOUT: Duration = Duration::from_secs(60);

/// Every node of `roots` with the names of the nodes above it (root first).
fn nodes_with_paths(roots: &[Node]) -> Vec<(Vec<&str>, &Node)> {
    let mut found = Vec::new();
    let mut stack: Vec<(Vec<&str>, &Node)> = roots.iter().map(|n| (Vec::new(), n)).collect();
    while let Some((path, node)) = stack.pop() {
        let mut below = path.clone();
        below.push(node.name.as_str());
        stack.extend(node.children.iter().map(|child| (below.clone(), child)));
        found.push((path, node));
    }
    found
}

/// The calls of every node named `name` (by `matches`), summed over contexts.
fn calls_of(profile: &Profile, matches: impl Fn(&str) -> bool) -> u64 {
    nodes_with_paths(&profile.merged.roots)
        .iter()
        .filter(|(_, node)| matches(&node.name))
        .map(|(_, node)| node.calls)
        .sum()
}

#[test]
fn a_dispatch_table_and_a_qsort_comparator_are_followed_under_their_callers() {
    let mut target = Target::spawn("indirect", &[]);
    let recording = Recording::start(
        target.pid(),
        &["--root", "table_root", "--root", "sort_root"],
    );
    target.write_stdin("table 300\n");
    target.expect_line("table calls 300 ", LINE_TIMEOUT);
    target.write_stdin("sort 1000\n");
    let sorted = target.expect_line("sort compares ", LINE_TIMEOUT);
    assert!(sorted.ends_with("sorted 1"), "{sorted}");
    let compares: u64 = number_after(&sorted, "compares");
    let recorded = recording.finish();
    let profile = &recorded.profile;
    let merged = &profile.merged.roots;
    let count = |path: &[&str]| node_at(merged, path).map(|n| n.calls);
    for op in ["op_add", "op_mul", "op_xor"] {
        assert_eq!(
            count(&["table_root", op]),
            Some(100),
            "{op}\n{}",
            recorded.stderr
        );
    }
    // The comparator runs below qsort (and whatever of libc's sort qsort calls), with
    // exactly the count the fixture kept.
    let comparators: Vec<(Vec<&str>, &Node)> = nodes_with_paths(merged)
        .into_iter()
        .filter(|(_, node)| node.name == "compare_numbers")
        .collect();
    assert!(!comparators.is_empty(), "{}", recorded.stderr);
    for (path, _) in &comparators {
        assert_eq!(path.first(), Some(&"sort_root"), "{path:?}");
        assert!(path.contains(&"qsort"), "below qsort: {path:?}");
    }
    let counted: u64 = comparators.iter().map(|(_, node)| node.calls).sum();
    assert_eq!(counted, compares, "{}", recorded.stderr);
    let stats = &profile.stats;
    assert!(stats.indirect_targets >= 4, "{stats:?}");
    assert!(stats.indirect_sites_followed >= 2, "{stats:?}");
    assert!(stats.indirect_call_sites >= stats.indirect_sites_followed);
    // Followed from the call graph: no address-taken function is instrumented up front
    // (libc alone has about 700), only what the roots reach.
    assert_eq!(stats.indirect_candidates, 0, "{stats:?}");
    assert!(stats.instrumented_functions < 100, "{stats:?}");
    code_bytes_match_file(target.pid()).unwrap();
}

#[test]
fn targets_whose_entries_cannot_be_patched_are_recorded_through_a_hook_in_front() {
    let mut target = Target::spawn("indirect", &[]);
    // The result before the recording, to check the target computes the same with it.
    target.write_stdin("tiny 300\n");
    let bare = target.expect_line("tiny calls 300 ", LINE_TIMEOUT);
    let recording = Recording::start(target.pid(), &["--root", "tiny_root"]);
    target.write_stdin("tiny 300\n");
    let recorded_line = target.expect_line("tiny calls 300 ", LINE_TIMEOUT);
    assert_eq!(recorded_line, bare);
    let recorded = recording.finish();
    let merged = &recorded.profile.merged.roots;
    // tiny_get is 4 bytes with no padding near; tiny_straddle's first two bytes lie on
    // two cache lines: neither entry is patched, and each has all its calls.
    for tiny in ["tiny_get", "tiny_straddle"] {
        let node = node_at(merged, &["tiny_root", tiny]);
        assert_eq!(
            node.map(|n| n.calls),
            Some(150),
            "{tiny}\n{}",
            recorded.stderr
        );
    }
    assert!(
        !recorded.stderr.contains("not instrumented"),
        "{}",
        recorded.stderr
    );
    assert_eq!(recorded.profile.stats.instrumented_functions, 3);
    code_bytes_match_file(target.pid()).unwrap();
    target.write_stdin("tiny 300\n");
    assert_eq!(target.expect_line("tiny calls 300 ", LINE_TIMEOUT), bare);
}

#[test]
fn a_hook_in_front_is_switched_to_counting_like_a_patched_entry() {
    let mut target = Target::spawn("indirect", &[]);
    target.write_stdin("tiny 3000\n");
    let bare = target.expect_line("tiny calls 3000 ", LINE_TIMEOUT);
    // A threshold far above these calls' mean, even preempted: both are judged short
    // after their first 1,000 calls.
    let mut recording = Recording::start(
        target.pid(),
        &["--root", "tiny_root", "--min-time", "100000"],
    );
    target.write_stdin("tiny 3000\n");
    assert_eq!(target.expect_line("tiny calls 3000 ", LINE_TIMEOUT), bare);
    // The judge reads the calls some time after they are made (later on a busy
    // machine): wait until both are switched, then call them again, counted only.
    for tiny in ["tiny_get", "tiny_straddle"] {
        let named = |line: &str| line.contains(tiny);
        recording.wait_for_line_where("tendril: counting, not timing", named, LINE_TIMEOUT);
    }
    target.write_stdin("tiny 3000\n");
    assert_eq!(target.expect_line("tiny calls 3000 ", LINE_TIMEOUT), bare);
    let recorded = recording.finish();
    let merged = &recorded.profile.merged.roots;
    for tiny in ["tiny_get", "tiny_straddle"] {
        let node = node_at(merged, &["tiny_root", tiny]).expect(tiny);
        assert_eq!(node.calls, 3000, "{tiny}\n{}", recorded.stderr);
        assert_eq!(node.timing, Timing::InCaller, "{tiny}\n{}", recorded.stderr);
    }
    code_bytes_match_file(target.pid()).unwrap();
}

/// Records `table_root` with `args` while the fixture makes 30 calls through its table,
/// and checks that each of the three targets has its 10 calls below it.
fn record_thirty_table_calls(args: &[&str]) -> (Target, common::Recorded) {
    let mut target = Target::spawn("indirect", &[]);
    let mut all = vec!["--root", "table_root"];
    all.extend_from_slice(args);
    let recording = Recording::start(target.pid(), &all);
    target.write_stdin("table 30\n");
    target.expect_line("table calls 30 ", LINE_TIMEOUT);
    let recorded = recording.finish();
    let merged = &recorded.profile.merged.roots;
    for op in ["op_add", "op_mul", "op_xor"] {
        let calls = node_at(merged, &["table_root", op]).map(|n| n.calls);
        assert_eq!(calls, Some(10), "{op}\n{}", recorded.stderr);
    }
    (target, recorded)
}

#[test]
fn the_address_taken_candidates_still_follow_a_dispatch_table_when_asked_for() {
    let (target, recorded) = record_thirty_table_calls(&["--pointer-candidates"]);
    let stats = &recorded.profile.stats;
    assert!(stats.indirect_candidates >= 3, "{stats:?}");
    assert!(
        recorded.stderr.contains("address-taken functions in"),
        "the start says what was instrumented up front: {}",
        recorded.stderr
    );
    code_bytes_match_file(target.pid()).unwrap();
}

#[test]
fn scheme_a_instruments_the_address_taken_functions_up_front() {
    let (target, recorded) = record_thirty_table_calls(&["--scheme", "a"]);
    // Nothing was discovered: the graph, targets included, was patched before it ran.
    let discovery = recorded.profile.discovery.as_ref().unwrap();
    assert_eq!(discovery.refused_callees, 0);
    assert!(recorded.profile.stats.indirect_candidates >= 3);
    code_bytes_match_file(target.pid()).unwrap();
}

#[test]
fn virtual_calls_are_counted_under_their_caller_across_libraries_and_exceptions() {
    let mut target = Target::spawn("virtuals", &[]);
    let recording = Recording::start(
        target.pid(),
        &[
            "--root",
            "shapes_root",
            "--root",
            "codec_root",
            "--root",
            "throw_root",
        ],
    );
    target.write_stdin("shapes 100\n");
    target.expect_line("shapes passes 100 ", LINE_TIMEOUT);
    target.write_stdin("codec 50\n");
    target.expect_line("codec calls 50 ", LINE_TIMEOUT);
    target.write_stdin("throw 20\n");
    assert_eq!(
        target.expect_line("throw calls ", LINE_TIMEOUT),
        "throw calls 20 caught 20"
    );
    // The program goes on as before after exceptions passed through a recorded frame.
    target.write_stdin("shapes 1\n");
    target.expect_line("shapes passes 1 ", LINE_TIMEOUT);
    let recorded = recording.finish();
    let merged = &recorded.profile.merged.roots;
    // C++ names carry their parameters: `shapes_root(long)`.
    let root = |name: &str| merged.iter().find(|n| n.name == format!("{name}(long)"));
    let child_calls = |name: &str, callee: &str| {
        root(name)
            .into_iter()
            .flat_map(|n| n.children.iter())
            .filter(|n| n.name.contains(callee))
            .map(|n| (n.calls, n.module.clone()))
            .next()
    };
    let shapes = root("shapes_root").map(|n| n.calls);
    assert_eq!(shapes, Some(2), "{}", recorded.stderr);
    assert_eq!(child_calls("shapes_root", "Square::area").unwrap().0, 303);
    assert_eq!(child_calls("shapes_root", "Circle::area").unwrap().0, 202);
    assert_eq!(child_calls("shapes_root", "Triangle::area").unwrap().0, 101);
    let (encodes, module) = child_calls("codec_root", "RotateCodec::encode").unwrap();
    assert_eq!(encodes, 50);
    assert_eq!(module, "libvirtuals_codec.so");
    let checks = child_calls("throw_root", "Triangle::check").unwrap().0;
    assert_eq!(checks, 20, "{}", recorded.stderr);
    assert!(recorded.profile.stats.unwound_exits >= 20);
    assert_eq!(
        calls_of(&recorded.profile, |n| n.contains("Shape::check")),
        0
    );
    code_bytes_match_file(target.pid()).unwrap();
}

#[test]
fn rust_dyn_trait_calls_and_dyn_fn_closures_are_followed() {
    let mut target = Target::spawn("rust_dyn", &[]);
    let recording = Recording::start(
        target.pid(),
        &["--root", "animals_root", "--root", "closure_root"],
    );
    target.write_stdin("animals 100\n");
    target.expect_line("animals passes 100 ", LINE_TIMEOUT);
    target.write_stdin("closure 50\n");
    target.expect_line("closure calls 50 ", LINE_TIMEOUT);
    let recorded = recording.finish();
    let merged = &recorded.profile.merged.roots;
    let below = |path: &[&str], name: &str| {
        node_at(merged, path)
            .into_iter()
            .flat_map(|n| n.children.iter())
            .filter(|n| n.name.contains(name))
            .map(|n| n.calls)
            .sum::<u64>()
    };
    assert_eq!(
        below(&["animals_root"], "Dog as rust_dyn::Animal>::speak"),
        200,
        "{}",
        recorded.stderr
    );
    assert_eq!(
        below(&["animals_root"], "Cat as rust_dyn::Animal>::speak"),
        100
    );
    assert_eq!(
        below(&["closure_root", "apply_n"], "closure_root::{{closure}}"),
        50,
        "{}",
        recorded.stderr
    );
    code_bytes_match_file(target.pid()).unwrap();
}

#[test]
fn a_callback_in_a_library_loaded_after_the_recording_started_is_followed() {
    let plugin = fixture("indirect_plugin.so");
    let mut target = Target::spawn("indirect", &[]);
    let mut recording = Recording::start(target.pid(), &["--root", "plugin_root"]);
    target.write_stdin(&format!("load {}\n", plugin.display()));
    assert_eq!(target.expect_line("load ", LINE_TIMEOUT), "load ok");
    let followed = recording.wait_for_line("tendril: new module indirect_plugin.so", LINE_TIMEOUT);
    assert!(followed.contains("followed"), "{followed}");
    target.write_stdin("plugin 40\n");
    target.expect_line("plugin calls 40 ", LINE_TIMEOUT);
    let recorded = recording.finish();
    let merged = &recorded.profile.merged.roots;
    let count = |path: &[&str]| node_at(merged, path).map(|n| (n.calls, n.module.clone()));
    assert_eq!(
        count(&["plugin_root", "plugin_callback"]),
        Some((40, "indirect_plugin.so".to_string())),
        "{}",
        recorded.stderr
    );
    assert_eq!(
        count(&["plugin_root", "plugin_callback", "plugin_step"]).map(|c| c.0),
        Some(40)
    );
    code_bytes_match_file(target.pid()).unwrap();
}
