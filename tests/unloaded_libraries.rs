//! A library tendril has patched is unloaded (`dlclose`) and another loaded at the same
//! address: tendril must never write the first library's bytes into the second, must
//! leave every mapping equal to its file, and must say what it could not count.
//!
//! The fixture `plug_host` loads `libplug_a.so` or `libplug_b.so` on command; both have
//! the same layout, so the second lands where the first was, with other code at the
//! addresses of the first's functions.

use crate::common;

use common::{RunningTendril, Target, code_bytes_match_file, fixture, number_after, tendril};
use std::process::Stdio;
use std::time::Duration;

const LINE_TIMEOUT: Duration = Duration::from_secs(60);

/// The plugin host, with both plugins built.
fn plug_host() -> Target {
    let a = fixture("libplug_a.so");
    let b = fixture("libplug_b.so");
    Target::spawn("plug_host", &[a.to_str().unwrap(), b.to_str().unwrap()])
}

/// Sends `command` and returns the host's answer, a line starting with `answer`.
fn ask(host: &mut Target, command: &str, answer: &str) -> String {
    host.write_stdin(&format!("{command}\n"));
    host.expect_line(answer, LINE_TIMEOUT)
}

/// Loads plugin `which`; returns its load address.
fn load(host: &mut Target, which: u32) -> u64 {
    number_after(&ask(host, &format!("load {which}"), "loaded "), "base")
}

/// Calls the loaded plugin `n` times; asserts every result was the plugin's own.
fn call(host: &mut Target, n: u64) {
    let line = ask(host, &format!("call {n}"), "called ");
    assert_eq!(number_after::<u64>(&line, "wrong"), 0, "{line}");
}

/// Starts `tendril ARGS...` and waits for its line saying the hooks are in.
fn started(args: &[&str], line: &str) -> RunningTendril {
    let mut command = tendril();
    command.args(args).stdout(Stdio::piped());
    RunningTendril::start(command, line, LINE_TIMEOUT)
}

#[test]
fn a_count_whose_library_is_replaced_at_its_address_writes_nothing_into_the_new_one() {
    let mut host = plug_host();
    let pid = host.pid().to_string();
    let base_a = load(&mut host, 0);
    let count = started(&["count", &pid, "plugfn", "inner_a"], "tendril: counting");
    call(&mut host, 1000);
    ask(&mut host, "unload", "unloaded");
    let base_b = load(&mut host, 1);
    assert_eq!(
        base_a, base_b,
        "the second plugin must land where the first was"
    );
    // While the count still runs: libplug_b is its file's bytes, and runs as its own.
    code_bytes_match_file(host.pid()).unwrap();
    call(&mut host, 1000);

    count.interrupt();
    let (status, stdout, stderr) = count.wait();
    assert!(status.success(), "{stderr}");
    // Nothing of libplug_a was written into libplug_b, at the restore or since.
    code_bytes_match_file(host.pid()).unwrap();
    let calls_of = |name: &str| -> u64 {
        stdout
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no row for {name}:\n{stdout}"))
    };
    assert_eq!(calls_of("plugfn"), 1000, "{stdout}");
    assert_eq!(calls_of("inner_a"), 1000, "{stdout}");
    assert!(
        stdout.contains("were unloaded with libplug_a.so during the count"),
        "{stdout}"
    );
    call(&mut host, 1000);
    ask(&mut host, "unload", "unloaded");
    // The first plugin loaded again runs as its own too.
    load(&mut host, 0);
    call(&mut host, 1000);
    code_bytes_match_file(host.pid()).unwrap();
}

#[test]
fn an_edge_count_whose_library_is_replaced_writes_nothing_into_the_new_one() {
    let mut host = plug_host();
    let pid = host.pid().to_string();
    load(&mut host, 0);
    let edges = started(&["edges", &pid, "inner_a"], "tendril: counting");
    call(&mut host, 500);
    ask(&mut host, "unload", "unloaded");
    load(&mut host, 1);
    code_bytes_match_file(host.pid()).unwrap();
    call(&mut host, 500);
    edges.interrupt();
    let (status, stdout, stderr) = edges.wait();
    assert!(status.success(), "{stderr}");
    code_bytes_match_file(host.pid()).unwrap();
    assert!(
        stderr.contains("inner_a was unloaded with libplug_a.so during the edge count"),
        "{stderr}"
    );
    assert!(stdout.contains("500 calls"), "{stdout}");
    call(&mut host, 500);
}

#[test]
fn a_recording_follows_a_library_loaded_again_and_says_what_came_and_went_unseen() {
    let mut host = plug_host();
    let pid = host.pid().to_string();
    load(&mut host, 0);
    let mut record = started(
        &["record", &pid, "--root", "round_root", "-o", "-"],
        "tendril: recording",
    );
    call(&mut host, 1000);
    ask(&mut host, "unload", "unloaded");
    load(&mut host, 1);
    record.wait_for_line("tendril: new module libplug_b.so", LINE_TIMEOUT);
    call(&mut host, 1000);
    ask(&mut host, "unload", "unloaded");
    load(&mut host, 0);
    // Where it was or elsewhere, after tendril saw libplug_b in its place: followed as
    // a new module (and instrumented again with `--pointer-candidates`).
    record.wait_for_line_where(
        "tendril: ",
        |line| {
            line.contains("libplug_a.so")
                && (line.contains("new module") || line.contains("loaded again"))
        },
        LINE_TIMEOUT,
    );
    call(&mut host, 1000);
    ask(&mut host, "unload", "unloaded");
    // Many more, faster than tendril looks at the process's libraries.
    let churned = ask(&mut host, "churn 200 100", "churned ");
    assert_eq!(number_after::<u64>(&churned, "wrong"), 0, "{churned}");
    record.interrupt();
    let (status, stdout, stderr) = record.wait();
    assert!(status.success(), "{stderr}");
    code_bytes_match_file(host.pid()).unwrap();
    load(&mut host, 1);
    call(&mut host, 1000);

    let profile: tendril::profile::Profile = serde_json::from_str(&stdout).unwrap();
    let root = common::node_at(&profile.merged.roots, &["round_root"]).expect("round_root");
    assert_eq!(root.calls, 3 + 200, "{stdout}");
    let calls_below = |module: &str, name: &str| -> u64 {
        root.children
            .iter()
            .filter(|n| n.name == "plugfn" && n.module == module)
            .flat_map(|n| n.children.iter())
            .filter(|n| n.name == name)
            .map(|n| n.calls)
            .sum()
    };
    // Both loads of libplug_a that tendril saw, and the one of libplug_b, in full.
    assert!(calls_below("libplug_a.so", "inner_a") >= 2000, "{stdout}");
    assert!(calls_below("libplug_b.so", "other_b") >= 1000, "{stdout}");
    let stats = &profile.stats;
    assert_eq!(stats.libraries_loaded, 2 + 200, "{stderr}");
    assert_eq!(stats.libraries_unloaded, 3 + 200, "{stderr}");
    assert!(stats.libraries_followed >= 2, "{stderr}");
    assert!(stats.unloaded_functions >= 1, "{stderr}");
    assert!(
        stderr.contains("are not recorded"),
        "the churn tendril could not follow must be said:\n{stderr}"
    );
}

#[test]
fn commands_ending_in_the_middle_of_a_churn_of_libraries_leave_every_library_its_own() {
    let mut host = plug_host();
    let pid = host.pid().to_string();
    for args in [
        vec!["count", &pid, "plugfn", "inner_a"],
        vec!["record", &pid, "--root", "round_root", "-o", "/dev/null"],
    ] {
        load(&mut host, 0);
        let line = if args[0] == "count" {
            "tendril: counting"
        } else {
            "tendril: recording"
        };
        let running = started(&args, line);
        ask(&mut host, "unload", "unloaded");
        // The command ends while the host loads and unloads, whichever is loaded then.
        host.write_stdin("churn 3000 20\n");
        running.interrupt();
        let (status, _, stderr) = running.wait();
        assert!(status.success(), "{stderr}");
        let churned = host.expect_line("churned ", LINE_TIMEOUT);
        assert_eq!(number_after::<u64>(&churned, "wrong"), 0, "{churned}");
        code_bytes_match_file(host.pid()).unwrap();
    }
}

#[test]
fn a_root_in_a_library_not_loaded_yet_is_recorded_once_it_is_loaded() {
    let mut host = plug_host();
    let pid = host.pid().to_string();
    // plugfn is in no module yet: named with its module, the recording waits for it.
    let mut record = started(
        &["record", &pid, "--root", "libplug_a*:plugfn", "-o", "-"],
        "tendril: recording libplug_a*:plugfn",
    );
    load(&mut host, 0);
    record.wait_for_line("tendril: libplug_a* loaded: recording plugfn", LINE_TIMEOUT);
    call(&mut host, 1000);
    record.interrupt();
    let (status, stdout, stderr) = record.wait();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("tendril: waiting for process"),
        "it says it waits: {stderr}"
    );
    let profile: tendril::profile::Profile = serde_json::from_str(&stdout).unwrap();
    let plugfn = common::node_at(&profile.merged.roots, &["plugfn"]).expect("plugfn");
    assert_eq!(plugfn.calls, 1000, "{stdout}");
    let inner = common::node_at(&profile.merged.roots, &["plugfn", "inner_a"]);
    assert_eq!(inner.map(|n| n.calls), Some(1000), "{stdout}");
    code_bytes_match_file(host.pid()).unwrap();
    call(&mut host, 10);
}

#[test]
fn the_live_view_says_it_waits_for_a_roots_library_then_shows_its_tree() {
    let mut host = plug_host();
    let pid = host.pid().to_string();
    let ui = common::Tmux::tendril(
        "waits_for_its_library",
        &["attach", &pid, "--root", "libplug_a*:plugfn"],
    );
    // The status bar and the message line both say what it waits for.
    ui.wait_for_all(&["(waiting for libplug_a*)", "to load libplug_a*"]);
    load(&mut host, 0);
    ui.wait_for_text("libplug_a* loaded: recording plugfn");
    call(&mut host, 1000);
    ui.wait_for("plugfn with its 1000 calls", |screen| {
        (common::calls_of(screen, "plugfn")? >= 1000.0).then_some(())
    });
    ui.press("q");
    assert_eq!(ui.wait_exit(), 0, "the screen:\n{}", ui.screen());
    code_bytes_match_file(host.pid()).unwrap();
    call(&mut host, 10);
}
