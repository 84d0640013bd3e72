//! Tests of `report`: every text format on one small profile.

use super::*;
use crate::profile::model::tests::chain;
use crate::profile::model::{Calibration, MergedProfile, NotFollowed, Stats, ThreadProfile};

fn node(name: &str, module: &str, calls: u64, total: u64, self_ns: u64) -> Node {
    Node::leaf(name, module, calls, total, self_ns)
}

/// main 100 ms: parse 30 ms (→ read 20 ms), compute 60 ms (→ fib 50 ms → fib 20
/// ms, and read 5 ms), and 10 ms of its own.
fn profile() -> Profile {
    let mut fib_inner = node("fib", "app", 8, 20_000_000, 20_000_000);
    fib_inner.children.clear();
    let mut fib = node("fib", "app", 4, 50_000_000, 30_000_000);
    fib.children.push(fib_inner);
    let mut compute = node("compute", "app", 1, 60_000_000, 5_000_000);
    compute
        .children
        .push(node("read", "libc.so.6", 2, 5_000_000, 5_000_000));
    compute.children.push(fib);
    let mut parse = node("parse;v2", "app", 1, 30_000_000, 10_000_000);
    parse
        .children
        .push(node("read", "libc.so.6", 10, 20_000_000, 20_000_000));
    let mut main = node("main", "app", 1, 100_000_000, 10_000_000);
    main.children.push(parse);
    main.children.push(compute);
    Profile {
        duration_ns: 0,
        sampling: None,
        discovery: None,
        gross: Vec::new(),
        modules: Vec::new(),
        trace: None,
        format: Profile::FORMAT.to_owned(),
        version: Profile::VERSION,
        pid: 4242,
        exe: "/usr/bin/app".to_owned(),
        roots: vec!["main".to_owned()],
        scheme: "B".to_owned(),
        calibration: Calibration {
            tsc_hz: 2_995_000_000,
            inner_ns: 12.25,
            outer_ns: 20.5,
            inner_spread_ns: 0.0,
            outer_spread_ns: 0.0,
            ..Default::default()
        },
        stats: Stats {
            instrumented_functions: 6,
            invoked_functions: 5,
            events: 52,
            lost_events: 0,
            indirect_call_sites: 1,
            pause_ns: 1_500_000,
            unwound_exits: 2,
            unmatched_exits: 0,
            ..Stats::default()
        },
        threads: vec![ThreadProfile {
            tid: 4243,
            name: "worker".to_owned(),
            roots: vec![main.clone()],
            ..ThreadProfile::default()
        }],
        merged: MergedProfile { roots: vec![main] },
    }
}

/// The rows of a tree report, below its column headings.
fn tree_rows(text: &str) -> Vec<&str> {
    let mut lines = text.lines();
    lines
        .by_ref()
        .find(|line| line.contains("calls    total ms"));
    lines.collect()
}

fn report(profile: &Profile, format: ReportFormat) -> String {
    let mut out = Vec::new();
    write_report(profile, format, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

/// The tree report with the header's details (`report -v`).
fn verbose_tree(profile: &Profile) -> String {
    let mut out = Vec::new();
    let options = TextOptions {
        columns: None,
        details: true,
    };
    write_report_with(profile, ReportFormat::Tree, options, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

const HEADER: &str = "\
tendril profile of pid 4242 (/usr/bin/app), scheme B, roots: main
events: 52 (0 lost, 0 unmatched exits, 2 unwound by an exception, longjmp, thread exit or the end)
functions: 6 instrumented, 5 invoked
calls through pointers: 1 indirect call site, 0 seen taken, reaching 0 functions
pauses removed: 1.500 ms (tendril's waits in the target, summed over threads)
calibration: TSC 2.995 GHz; removed per call: 12.2 ns inner, 20.5 ns outer
";

#[test]
fn tree_indents_the_merged_tree_children_by_total() {
    let expected = HEADER.to_owned()
        + "\
merged call tree of 1 thread; children by total time; % of all roots' total
     calls    total ms     self ms   total  function (module)
         1     100.000      10.000  100.0%  main (app)
         1      60.000       5.000   60.0%    compute (app)
         4      50.000      30.000   50.0%      fib (app)
         8      20.000      20.000   20.0%        fib (app)
         2       5.000       5.000    5.0%      read (libc.so.6)
         1      30.000      10.000   30.0%    parse;v2 (app)
        10      20.000      20.000   20.0%      read (libc.so.6)
";
    assert_eq!(report(&profile(), ReportFormat::Tree), expected);
}

#[test]
fn tree_stops_indenting_deep_rows_and_shows_their_depth() {
    let mut deep = profile();
    deep.merged.roots = vec![chain("f", 43)];
    let text = report(&deep, ReportFormat::Tree);
    let rows = tree_rows(&text);
    assert_eq!(rows.len(), 43);
    // The columns before the function take 44 characters.
    let function = |row: &str| row[44..].to_owned();
    assert_eq!(function(rows[0]), "f (m)");
    assert_eq!(function(rows[1]), "  f (m)");
    assert_eq!(function(rows[40]), format!("{}f (m)", " ".repeat(80)));
    assert_eq!(
        function(rows[41]),
        format!("{}[depth 41] f (m)", " ".repeat(80))
    );
    assert_eq!(
        function(rows[42]),
        format!("{}[depth 42] f (m)", " ".repeat(80))
    );
    assert_eq!(
        &rows[42][..44],
        "         1       0.000       0.000    2.3%  "
    );
}

#[test]
fn stripped_names_show_their_module_once_and_below_resolution_is_said() {
    let mut stripped = profile();
    let root = &mut stripped.merged.roots[0];
    root.children.clear();
    root.self_ns = 0;
    root.below_resolution = true;
    for offset in ["1a2b30", "1a2b90", "1a2c10"] {
        let name = format!("libpython3.12.so.1.0+0x{offset}");
        root.children.push(node(
            &name,
            "libpython3.12.so.1.0",
            1,
            30_000_000,
            30_000_000,
        ));
    }
    root.total_ns = 90_000_000;
    let tree = report(&stripped, ReportFormat::Tree);
    let rows = tree_rows(&tree);
    assert_eq!(
        rows[0],
        "         1      90.000        <res  100.0%  main (app)"
    );
    assert_eq!(
        rows[1],
        "         1      30.000      30.000   33.3%    libpython3.12.so.1.0+0x1a2b30"
    );
    assert!(
        tree.contains("<res: self time below what tendril can measure"),
        "{tree}"
    );
    let hot = report(&stripped, ReportFormat::Hot);
    assert!(
        hot.contains("       <res    0.0%          1  main (app)\n"),
        "{hot}"
    );
    // At 64 columns, each row fits and the three offsets stay apart.
    for format in [ReportFormat::Tree, ReportFormat::Hot] {
        let mut out = Vec::new();
        let options = TextOptions {
            columns: Some(64),
            details: false,
        };
        write_report_with(&stripped, format, options, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let rows: Vec<&str> = text.lines().filter(|l| l.contains("+0x")).collect();
        assert_eq!(rows.len(), 3, "{text}");
        for (row, offset) in rows.iter().zip(["1a2b30", "1a2b90", "1a2c10"]) {
            assert!(row.chars().count() <= 64, "{row}");
            assert!(row.ends_with(&format!("+0x{offset}")), "{row}");
        }
        assert!(
            format == ReportFormat::Hot || rows[0].contains('…'),
            "{text}"
        );
    }
}

#[test]
fn hot_sums_self_time_per_function_over_contexts() {
    let expected = HEADER.to_owned()
        + "\
hot spots: self time per function over all its contexts (all threads); % of all roots' total
    self ms    self      calls  function (module)
     50.000   50.0%         12  fib (app)
     25.000   25.0%         12  read (libc.so.6)
     10.000   10.0%          1  main (app)
     10.000   10.0%          1  parse;v2 (app)
      5.000    5.0%          1  compute (app)
";
    assert_eq!(report(&profile(), ReportFormat::Hot), expected);
}

#[test]
fn folded_has_one_line_per_context_with_self_time() {
    let mut with_idle = profile();
    with_idle.merged.roots[0]
        .children
        .push(node("idle\nline", "app", 1, 0, 0));
    with_idle.merged.roots[0]
        .children
        .push(node("odd\nname", "app", 1, 7, 7));
    let expected = "\
main 10000000
main;parse:v2 10000000
main;parse:v2;read 20000000
main;compute 5000000
main;compute;read 5000000
main;compute;fib 30000000
main;compute;fib;fib 20000000
main;odd\\x0aname 7
";
    assert_eq!(report(&with_idle, ReportFormat::Folded), expected);
}

#[test]
fn json_is_the_profile_file() {
    let profile = profile();
    let text = report(&profile, ReportFormat::Json);
    assert_eq!(text, serde_json::to_string_pretty(&profile).unwrap() + "\n");
    assert_eq!(Profile::from_json(&text, "-").unwrap(), profile);
}

#[test]
fn formats_parse_from_their_names() {
    for format in ReportFormat::ALL {
        assert_eq!(format.to_string().parse::<ReportFormat>(), Ok(format));
    }
    assert_eq!(
        "flame".parse::<ReportFormat>().unwrap_err().to_string(),
        "unknown report format 'flame' (expected tree, hot, folded, json, pprof, \
             speedscope, chrome or svg)"
    );
}

#[test]
fn an_empty_profile_reports_without_dividing_by_zero() {
    let mut empty = profile();
    empty.merged.roots.clear();
    empty.threads.clear();
    assert!(report(&empty, ReportFormat::Tree).ends_with("function (module)\n"));
    assert!(report(&empty, ReportFormat::Hot).ends_with("function (module)\n"));
    assert_eq!(report(&empty, ReportFormat::Folded), "");
}

#[test]
fn a_100_000_deep_tree_reports_in_every_format() {
    let mut deep = profile();
    deep.merged.roots = vec![chain("f", 100_000)];
    for format in [ReportFormat::Tree, ReportFormat::Hot, ReportFormat::Json] {
        write_report(&deep, format, &mut io::sink()).unwrap();
    }
    // Give self time to the deepest node only: one line, whose time the cut frame
    // carries, at the last level drawn.
    let mut node = &mut deep.merged.roots[0];
    loop {
        node.self_ns = 0;
        match node.children.first_mut() {
            Some(child) => node = child,
            None => break,
        }
    }
    node.self_ns = 3;
    let text = report(&deep, ReportFormat::Folded);
    let cut = 100_000 - (MAX_STACK_DEPTH - 1);
    let expected = format!(
        "{};[{cut} levels cut] 3\n",
        vec!["f"; MAX_STACK_DEPTH - 1].join(";")
    );
    assert_eq!(text, expected);
    assert_eq!(subtrees_cut(&deep.merged.roots), 1);
}

#[test]
fn folded_stacks_at_the_cap_are_whole_and_one_level_more_is_cut() {
    let mut deep = profile();
    deep.merged.roots = vec![chain("g", MAX_STACK_DEPTH)];
    // chain() gives every level self time: one line per level, the last whole.
    let text = report(&deep, ReportFormat::Folded);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), MAX_STACK_DEPTH);
    let last = lines[MAX_STACK_DEPTH - 1];
    assert_eq!(last.split(';').count(), MAX_STACK_DEPTH, "{last:.40}");
    assert_eq!(subtrees_cut(&deep.merged.roots), 0);
    deep.merged.roots = vec![chain("g", MAX_STACK_DEPTH + 1)];
    let text = report(&deep, ReportFormat::Folded);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), MAX_STACK_DEPTH);
    let last = lines[MAX_STACK_DEPTH - 1];
    assert!(last.ends_with(";g;[2 levels cut] 2"), "{last}");
    assert_eq!(last.split(';').count(), MAX_STACK_DEPTH);
}

#[test]
fn waits_for_a_core_tendrils_draining_held_are_said_under_the_pauses() {
    let mut waited = profile();
    waited.stats.core_wait_ns = 400_000;
    let text = verbose_tree(&waited);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[4],
        "pauses removed: 1.500 ms (tendril's waits in the target, summed over threads)"
    );
    assert_eq!(
        lines[5],
        "  of those pauses, 0.400 ms were the target's threads waiting for a core that tendril's draining held"
    );
    assert!(!report(&profile(), ReportFormat::Tree).contains("waiting for a core"));
}

#[test]
fn waits_for_room_in_a_full_ring_and_ring_faults_are_said_under_the_pauses() {
    let mut waited = profile();
    waited.stats.ring_wait_ns = 1_000_000;
    let text = verbose_tree(&waited);
    assert!(text.lines().any(|line| line
        == "  of those pauses, threads spent 1.000 ms waiting for room in a full ring \
            (tendril's reading fell behind)"));
    waited.stats.ring_fault_ns = 250_000;
    let text = verbose_tree(&waited);
    assert!(
        text.lines().any(
            |line| line.ends_with("fell behind), and 0.250 ms faulting their ring's memory in")
        )
    );
    assert!(!report(&profile(), ReportFormat::Tree).contains("full ring"));
}

#[test]
fn a_call_into_jit_code_shows_the_jit_mark_instead_of_a_count_and_the_title_says_why() {
    let mut marked = profile();
    let mut leaf = node("JS:*leafy app.js:1", "[jit]", 0, 0, 0);
    leaf.jit = true;
    marked.merged.roots[0].children.push(leaf);
    let tree = report(&marked, ReportFormat::Tree);
    assert!(
        tree.contains("       jit       0.000       0.000    0.0%    JS:*leafy app.js:1 ([jit])"),
        "{tree}"
    );
    assert!(
        tree.contains("; jit: a call into code generated at run time"),
        "{tree}"
    );
    assert!(!report(&profile(), ReportFormat::Tree).contains("jit"));
    let hot = report(&marked, ReportFormat::Hot);
    assert!(
        hot.contains("      0.000    0.0%        jit  JS:*leafy app.js:1 ([jit])"),
        "{hot}"
    );
    assert!(
        hot.contains("; jit: a call into code generated at run time"),
        "{hot}"
    );
}

#[test]
fn each_notice_is_one_line_and_its_details_come_with_verbose() {
    let item = |target: &str, reason: &str| NotFollowed {
        target: target.into(),
        reason: reason.into(),
    };
    let mut profile = profile();
    profile.discovery = Some(crate::profile::model::DiscoveryStats {
        indirect_not_followed: vec![
            item("a (libc.so.6)", "shorter than the 5-byte patch (1 bytes)"),
            item("b (libc.so.6)", "shorter than the 5-byte patch (3 bytes)"),
            item("c (libc.so.6)", "shorter than the 5-byte patch (1 bytes)"),
            item("d (libc.so.6)", "shorter than the 5-byte patch (2 bytes)"),
            item("g (app)", "Go code"),
        ],
        ..Default::default()
    });
    profile.stats.ring_wait_ns = 500_000;
    profile.calibration.untimed_ns = 2.5;
    let text = |details: bool| {
        let mut out = Vec::new();
        let options = TextOptions {
            columns: None,
            details,
        };
        write_report_with(&profile, ReportFormat::Tree, options, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    };
    let notice = "not followed through pointers: 5 functions, for 2 reasons (the profile's \
                  \"discovery\" lists them all)\n";
    let (short, long) = (text(false), text(true));
    assert!(short.contains(notice), "{short}");
    assert!(
        short.contains("(4 lines of details left out: `tendril report -v` shows them)\n"),
        "{short}"
    );
    assert!(!short.contains("  shorter than"), "{short}");
    let details = [
        "pauses removed: 1.500 ms (tendril's waits in the target, summed over threads)\n  of \
         those pauses, threads spent 0.500 ms waiting for room in a full ring (tendril's \
         reading fell behind)\n",
        "\n  shorter than the 5-byte patch: 4 (a (libc.so.6), b (libc.so.6), c (libc.so.6), \
         …)\n  Go code: 1 (g (app))\n",
        "ns outer\n  per counted call: 2.5 ns, give or take 0.0 ns\n",
    ];
    for detail in details {
        assert!(long.contains(detail), "{detail} in {long}");
    }
    assert!(
        long.contains(notice) && !long.contains("left out"),
        "{long}"
    );
    // The header without notices has nothing to leave out.
    assert!(!report(&self::profile(), ReportFormat::Tree).contains("left out"));
}
