//! `tendril record`, `report` and `run` against real fixture processes: exact call
//! counts per context, per-thread trees, Scheme A against Scheme B, a thread already
//! inside the root, gross times, launching a program, report formats, and bad input.

use crate::common;
#[path = "record/errors.rs"]
mod errors;

use common::{
    Recording, Target, all_nodes, code_bytes_match_file, node_at, start_recorder, tendril,
};
use std::time::Duration;
use tendril::profile::Profile;
use tendril::symbols::ProcessSymbols;
use tendril::symbols::maps::read_memory;

const LINE_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn call_counts_per_context_are_the_fixtures_own() {
    let mut target = Target::spawn("calltree", &["2"]);
    let recording = Recording::start(target.pid(), &["--root", "counted_outer"]);
    target.signal(libc::SIGUSR1);
    assert_eq!(
        target.expect_line("counted ", LINE_TIMEOUT),
        "counted outer=1 inner=1000 leaf=2000"
    );
    let recorded = recording.finish();
    let merged = &recorded.profile.merged.roots;
    let count = |path: &[&str]| node_at(merged, path).map(|n| n.calls);
    assert_eq!(count(&["counted_outer"]), Some(1), "{}", recorded.stderr);
    assert_eq!(count(&["counted_outer", "counted_inner"]), Some(1000));
    assert_eq!(
        count(&["counted_outer", "counted_inner", "counted_leaf"]),
        Some(2000)
    );
    assert_eq!(recorded.profile.stats.lost_events, 0);
    assert_eq!(recorded.profile.stats.invoked_functions, 3);
    assert_eq!(recorded.profile.roots, ["counted_outer"]);
    code_bytes_match_file(target.pid()).unwrap();
}

#[test]
fn the_roots_callees_are_instrumented_before_the_root_first_runs() {
    // Scheme B's discovery of a root is made as the recording starts, before the root
    // is live: a thousand threads entering it at once must not queue behind its first
    // caller's discovery. So its callee is patched while the root has never run, and
    // the root's first call is still counted exactly, with everything below it.
    let mut target = Target::spawn("calltree", &["2"]);
    let pid = target.pid();
    let symbols = ProcessSymbols::load(pid).unwrap();
    let address = |name: &str| symbols.find(name).unwrap()[0].addr;
    let (outer, inner, leaf) = (
        address("counted_outer"),
        address("counted_inner"),
        address("counted_leaf"),
    );
    let entry = |address: u64| read_memory(pid, address, address + 5).unwrap();
    let unpatched = [entry(outer), entry(inner), entry(leaf)];
    let recording = Recording::start(pid, &["--root", "counted_outer"]);
    assert_ne!(entry(outer), unpatched[0], "the root is patched");
    assert_ne!(entry(inner), unpatched[1], "its callee, before it ever ran");
    assert_eq!(
        entry(leaf),
        unpatched[2],
        "the callee's own callees wait for it"
    );
    target.signal(libc::SIGUSR1);
    assert_eq!(
        target.expect_line("counted ", LINE_TIMEOUT),
        "counted outer=1 inner=1000 leaf=2000"
    );
    let recorded = recording.finish();
    let count = |path: &[&str]| node_at(&recorded.profile.merged.roots, path).map(|n| n.calls);
    assert_eq!(count(&["counted_outer"]), Some(1), "{}", recorded.stderr);
    assert_eq!(count(&["counted_outer", "counted_inner"]), Some(1000));
    assert_eq!(
        count(&["counted_outer", "counted_inner", "counted_leaf"]),
        Some(2000)
    );
    code_bytes_match_file(pid).unwrap();
}

#[test]
fn only_threads_that_enter_the_root_have_trees_one_each() {
    let mut target = Target::spawn("calltree", &["3"]);
    let before = target.checksum_lines(2, LINE_TIMEOUT);
    let recording = Recording::start(target.pid(), &["--root", "work_round"]);
    target.whole_rounds(1, LINE_TIMEOUT);
    let recorded = recording.finish();
    let profile = &recorded.profile;
    // Three workers run work_round; the main thread never does.
    assert_eq!(profile.threads.len(), 3, "{}", recorded.stderr);
    assert!(profile.threads.iter().all(|t| t.tid != target.pid() as u32));
    for thread in &profile.threads {
        assert_eq!(thread.roots.len(), 1);
        assert_eq!(thread.roots[0].name, "work_round");
        // Every completed round called compute_block 128 times.
        let round = &thread.roots[0];
        let blocks = node_at(&thread.roots, &["work_round", "compute_block"]).unwrap();
        assert!(
            blocks.calls >= 128 * (round.calls - 1),
            "{} {}",
            blocks.calls,
            round.calls
        );
        // 1024 leaf_add calls per block, but for the block the recording ended in (which
        // may have begun just before the end).
        let leaf_adds = node_at(&thread.roots, &["work_round", "compute_block", "leaf_add"]);
        let leaf_adds = leaf_adds.unwrap().calls;
        assert!(
            leaf_adds <= blocks.calls * 1024,
            "{leaf_adds} {}",
            blocks.calls
        );
        assert!(
            leaf_adds >= (blocks.calls - 1) * 1024,
            "{leaf_adds} {}",
            blocks.calls
        );
    }
    let merged_rounds = node_at(&profile.merged.roots, &["work_round"])
        .unwrap()
        .calls;
    let per_thread: u64 = profile.threads.iter().map(|t| t.roots[0].calls).sum();
    assert_eq!(merged_rounds, per_thread);
    // fib_rec keeps its recursion as nesting, 22 levels deep below work_round.
    let mut path = vec!["work_round"];
    path.extend(std::iter::repeat_n("fib_rec", 22));
    assert!(node_at(&profile.merged.roots, &path).is_some());
    code_bytes_match_file(target.pid()).unwrap();
    let after = target.checksum_lines(2, LINE_TIMEOUT);
    assert_eq!(after[0], before[0], "the target computes the same");
}

#[test]
fn scheme_b_finds_callees_under_patched_entries_and_through_loaded_pointers() {
    // shape_entry_call's only call is the instruction its entry patch overwrites, and
    // shape_pointer_tail tail-jumps through a pointer (`jmp [rip+x]`) whose tail the
    // entry jump leaves behind: both must be read from the original code.
    let mut target = Target::spawn("tightcall", &[]);
    target.write_stdin("shapes 10\n");
    let bare = target.expect_line("shapes calls ", LINE_TIMEOUT);
    let recording = Recording::start(target.pid(), &["--root", "shape_root"]);
    target.write_stdin("shapes 10\n");
    assert_eq!(target.expect_line("shapes calls ", LINE_TIMEOUT), bare);
    let recorded = recording.finish();
    let merged = &recorded.profile.merged.roots;
    let count = |path: &[&str]| node_at(merged, path).map(|n| n.calls);
    assert_eq!(count(&["shape_root"]), Some(1), "{}", recorded.stderr);
    assert_eq!(
        count(&["shape_root", "shape_entry_call", "shape_leaf_a"]),
        Some(10),
        "{}",
        recorded.stderr
    );
    assert_eq!(
        count(&["shape_root", "shape_pointer_tail", "shape_leaf_b"]),
        Some(10),
        "{}",
        recorded.stderr
    );
    code_bytes_match_file(target.pid()).unwrap();
}

#[test]
fn scheme_a_instruments_the_static_graph_scheme_b_only_what_runs() {
    let mut target = Target::spawn("calltree", &["1"]);
    let record = |scheme: &str, target: &mut Target| {
        let recording =
            Recording::start(target.pid(), &["--root", "work_round", "--scheme", scheme]);
        // Two whole rounds under instrumentation, however long load makes them take: a
        // fixed time would let a slow machine end the recording before `fib_rec` and
        // `format_digest`, which close each round, ever ran.
        target.whole_rounds(2, LINE_TIMEOUT);
        recording.finish().profile
    };
    let b = record("b", &mut target);
    let a = record("a", &mut target);
    assert_eq!((a.scheme.as_str(), b.scheme.as_str()), ("A", "B"));
    let (a_stats, b_stats) = (a.stats.clone(), b.stats.clone());
    // The fixture's own functions run the same way under either scheme; which rare
    // paths of libc run (malloc's slow paths, a lazy binding) depends on timing and
    // load, so only the fixture's own calls are compared.
    let own = |p: &Profile| {
        let mut names: Vec<String> = all_nodes(&p.merged.roots)
            .iter()
            .filter(|n| n.module == "calltree")
            .map(|n| n.name.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    };
    assert_eq!(own(&a), own(&b));
    assert!(own(&b).len() >= 4, "{:?}", own(&b));
    for stats in [&a_stats, &b_stats] {
        assert!(
            stats.invoked_functions as usize >= own(&b).len(),
            "{stats:?}"
        );
        assert!(
            stats.instrumented_functions >= stats.invoked_functions,
            "{stats:?}"
        );
    }
    // Scheme A also instruments every function that could run and did not (error
    // paths of snprintf and memcpy's callees, among others): far more than run.
    assert!(
        a_stats.instrumented_functions > b_stats.instrumented_functions,
        "A {a_stats:?} B {b_stats:?}"
    );
    code_bytes_match_file(target.pid()).unwrap();
}

#[test]
fn a_thread_already_inside_the_root_is_not_charged_for_it() {
    let mut target = Target::spawn("timed", &[]);
    target.write_stdin("hold 3000\n");
    std::thread::sleep(Duration::from_millis(300));
    // held() is running on the main thread when its hook goes in.
    let recording = Recording::start(target.pid(), &["--root", "held"]);
    target.expect_line("hold 3000 done", LINE_TIMEOUT);
    target.write_stdin("hold 20\n");
    target.expect_line("hold 20 done", LINE_TIMEOUT);
    let recorded = recording.finish();
    let held = node_at(&recorded.profile.merged.roots, &["held"]).expect("held recorded");
    assert_eq!(
        held.calls, 1,
        "only the call that began after the hook went in"
    );
    let ms = held.total_ns as f64 / 1e6;
    assert!((15.0..200.0).contains(&ms), "held took {ms} ms");
}

#[test]
fn gross_only_times_the_roots_and_nothing_below() {
    let mut target = Target::spawn("timed", &[]);
    let recording = Recording::start(target.pid(), &["--root", "parent", "--gross-only"]);
    target.write_stdin("run 50\n");
    target.expect_line("run 50 ", LINE_TIMEOUT);
    let recorded = recording.finish();
    let profile = &recorded.profile;
    assert_eq!(profile.gross.len(), 1, "{}", recorded.stderr);
    let gross = &profile.gross[0];
    assert_eq!((gross.root.as_str(), gross.calls), ("parent", 50));
    assert!(gross.min_ns <= gross.median_ns && gross.median_ns <= gross.p99_ns);
    assert!(gross.p99_ns <= gross.max_ns);
    assert!(
        gross.median_ns > 100_000,
        "a parent call is about 155 us: {gross:?}"
    );
    let parent = node_at(&profile.merged.roots, &["parent"]).unwrap();
    assert_eq!(parent.calls, 50);
    assert!(
        parent.children.is_empty(),
        "nothing below the root is instrumented"
    );
    assert_eq!(profile.stats.instrumented_functions, 1);
}

#[test]
fn run_records_a_program_from_its_start_and_returns_its_status() {
    let output = std::env::temp_dir().join(format!("tendril-run-{}.json", std::process::id()));
    let mut child = tendril()
        .args(["run", "--root", "parent", "-o"])
        .arg(&output)
        .arg("--")
        .arg(common::fixture("timed"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"run 7\nexit 3\n")
        .unwrap();
    let result = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(
        result.status.code(),
        Some(3),
        "the program's status: {stderr}"
    );
    let profile = Profile::load(&output).unwrap_or_else(|e| panic!("{e}\n{stderr}"));
    let _ = std::fs::remove_file(&output);
    common::check_profile(&profile);
    let parent = node_at(&profile.merged.roots, &["parent"]).unwrap();
    assert_eq!(parent.calls, 7, "every call, from the first: {stderr}");
    let leaf = |name| node_at(&profile.merged.roots, &["parent", name]).map(|n| n.calls);
    assert_eq!(leaf("leaf_short"), Some(350));
    assert_eq!(leaf("leaf_medium"), Some(140));
    assert_eq!(leaf("leaf_long"), Some(35));
}

#[test]
fn roots_never_called_are_noted_and_many_roots_are_summarised() {
    let target = Target::spawn("calltree", &["1"]);
    // calltree never sorts: the profile is empty, and tendril says why.
    let recording = Recording::start(target.pid(), &["--root", "qsort"]);
    std::thread::sleep(Duration::from_millis(300));
    let recorded = recording.finish();
    assert!(recorded.profile.merged.roots.is_empty());
    assert!(
        recorded.stderr.contains(
            "tendril: qsort was never called during the recording, so the profile is empty"
        ),
        "{}",
        recorded.stderr
    );
    // With another root that runs, only the one that did not is named.
    let recording = Recording::start(target.pid(), &["--root", "qsort", "--root", "work_round"]);
    std::thread::sleep(Duration::from_millis(300));
    let recorded = recording.finish();
    assert!(
        recorded
            .stderr
            .lines()
            .any(|line| line == "tendril: qsort was never called during the recording"),
        "{}",
        recorded.stderr
    );
    // A hundred roots: the first few are named, the rest counted, on short lines.
    let recording = Recording::start(target.pid(), &["--root", "libc.so.6:str*"]);
    std::thread::sleep(Duration::from_millis(300));
    let recorded = recording.finish();
    let stderr = &recorded.stderr;
    assert!(recorded.profile.roots.len() > 20, "{stderr}");
    assert!(stderr.lines().all(|line| line.len() < 400), "{stderr}");
    let started = stderr
        .lines()
        .find(|l| l.starts_with("tendril: recording "))
        .unwrap();
    assert!(
        started.contains(&format!("{} roots: ", recorded.profile.roots.len()))
            && started.contains(" more in process "),
        "{started}"
    );
    code_bytes_match_file(target.pid()).unwrap();
    drop(target);

    // `run` says the same when the program ends without calling the root.
    let output = tendril()
        .args(["run", "--root", "qsort", "-o", "/dev/null", "--"])
        .arg(common::fixture("calltree"))
        .args(["1", "2"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("qsort was never called during the recording"),
        "{stderr}"
    );
}

#[test]
fn reports_print_the_tree_hot_spots_folded_stacks_and_json() {
    let mut target = Target::spawn("calltree", &["1"]);
    let recording = Recording::start(target.pid(), &["--root", "counted_outer"]);
    target.signal(libc::SIGUSR1);
    target.expect_line("counted ", LINE_TIMEOUT);
    let profile = recording.finish().profile;
    let file = std::env::temp_dir().join(format!("tendril-report-{}.json", std::process::id()));
    profile.save(&file).unwrap();
    let report = |format: &str| {
        let output = tendril()
            .arg("report")
            .arg(&file)
            .args(["--format", format])
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    let tree = report("tree");
    assert!(tree.contains("counted_outer (calltree)"), "{tree}");
    assert!(
        tree.lines()
            .any(|l| l.contains("1000") && l.contains("counted_inner"))
    );
    let hot = report("hot");
    assert!(hot.contains("counted_leaf"), "{hot}");
    let folded = report("folded");
    for line in folded.lines() {
        let (stack, value) = line.rsplit_once(' ').unwrap();
        assert!(stack.starts_with("counted_outer"), "{line}");
        value.parse::<u64>().unwrap();
    }
    let json = report("json");
    assert_eq!(Profile::from_json(&json, "stdout").unwrap(), profile);
    let _ = std::fs::remove_file(&file);
}

#[test]
fn roots_change_without_detaching_and_a_refused_root_keeps_the_old_ones() {
    use tendril::recording::Recorder;
    let mut target = Target::spawn("calltree", &["2"]);
    let expected = target.checksum_lines(2, LINE_TIMEOUT)[1];
    let calls_of = |recorder: &mut Recorder, root: &str| {
        std::thread::sleep(Duration::from_millis(300));
        recorder.poll();
        let profile = recorder.snapshot();
        common::check_profile(&profile);
        node_at(&profile.merged.roots, &[root]).map_or(0, |node| node.calls)
    };
    let mut recorder = start_recorder(target.pid(), "counted_outer");

    recorder.set_roots(&["work_round".into()]).unwrap();
    assert!(recorder.is_recording());
    assert_eq!(recorder.roots(), ["work_round"]);
    let rounds = calls_of(&mut recorder, "work_round");
    assert!(rounds > 0, "work_round not recorded");

    // `_fini` has no size to patch by: the recorder keeps work_round and its data,
    // paused with the code restored.
    let refused = recorder.set_roots(&["calltree:_fini".into()]).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("no root could be instrumented"),
        "{refused}"
    );
    assert!(!recorder.is_recording());
    assert_eq!(recorder.roots(), ["work_round"]);
    // Every patch is out, but the unwinder's hooks may stay in for a moment while a
    // thread is inside tendril's code: the recorder says so, and they come out alone.
    if recorder.hooks_left_in().is_some() {
        common::wait_until_no_hook_is_left_in(target.pid(), LINE_TIMEOUT);
    }
    code_bytes_match_file(target.pid()).unwrap();
    assert!(calls_of(&mut recorder, "work_round") >= rounds);

    recorder.resume().unwrap();
    assert!(recorder.is_recording());
    assert!(calls_of(&mut recorder, "work_round") > rounds);
    let finished = recorder.finish(false).unwrap();
    assert_eq!(finished.profile.roots, ["work_round"]);
    // As above: the unwinder's hooks come out by themselves once no thread is inside
    // tendril's code (libc's bytes differed right after the finish in one run of many).
    common::wait_until_no_hook_is_left_in(target.pid(), LINE_TIMEOUT);
    code_bytes_match_file(target.pid()).unwrap();
    let after = target.checksum_lines(2, LINE_TIMEOUT);
    assert!(
        after.iter().all(|&c| c == expected),
        "checksums changed: {expected} then {after:?}"
    );
}

#[test]
fn report_cuts_by_threshold_depth_and_thread() {
    let mut target = Target::spawn("calltree", &["1"]);
    let recording = Recording::start(target.pid(), &["--root", "work_round"]);
    target.drain();
    target.checksum_lines(2, LINE_TIMEOUT);
    let recorded = recording.finish();
    let file = std::env::temp_dir().join(format!("tendril-report-cut-{}.json", target.pid()));
    recorded.profile.save(&file).unwrap();
    let report = |args: &[&str]| {
        let output = tendril()
            .arg("report")
            .arg(&file)
            .args(["--format", "json"])
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        let profile: Option<Profile> = serde_json::from_slice(&output.stdout).ok();
        (output.status.success(), profile, stderr)
    };
    let depth = |roots: &[tendril::profile::Node]| {
        let mut deepest = 0;
        let mut pending: Vec<(&tendril::profile::Node, usize)> =
            roots.iter().map(|n| (n, 1)).collect();
        while let Some((node, level)) = pending.pop() {
            deepest = deepest.max(level);
            pending.extend(node.children.iter().map(|c| (c, level + 1)));
        }
        deepest
    };
    assert!(depth(&recorded.profile.merged.roots) > 2);
    let (ok, cut, stderr) = report(&["--depth", "2"]);
    assert!(ok, "{stderr}");
    assert_eq!(depth(&cut.unwrap().merged.roots), 2);

    let whole = recorded.profile.merged_total_ns();
    let (ok, cut, stderr) = report(&["--threshold", "20"]);
    assert!(ok, "{stderr}");
    let cut = cut.unwrap();
    assert!(!cut.merged.roots.is_empty());
    assert!(
        all_nodes(&cut.merged.roots)
            .iter()
            .all(|n| n.total_ns as f64 >= whole as f64 * 0.2)
    );
    assert!(all_nodes(&cut.merged.roots).len() < all_nodes(&recorded.profile.merged.roots).len());

    let tid = recorded.profile.threads[0].tid.to_string();
    let (ok, cut, stderr) = report(&["--thread", &tid]);
    assert!(ok, "{stderr}");
    assert_eq!(cut.unwrap().threads.len(), 1);
    let (ok, _, stderr) = report(&["--thread", "1"]);
    assert!(!ok);
    assert!(
        stderr.contains("has no thread 1 — its threads are: "),
        "{stderr}"
    );
    let (ok, _, stderr) = report(&["--threshold", "150"]);
    assert!(!ok && stderr.contains("not a percentage"), "{stderr}");
    let _ = std::fs::remove_file(&file);
}
