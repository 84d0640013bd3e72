//! `tendril report` output: a [`Profile`] as an indented call tree, a hot-spot list,
//! folded stacks (for flamegraph.pl and inferno) or JSON.
//!
//! The one idea: every format reads the merged tree (all threads merged by call path),
//! walks it with an explicit stack so any depth prints, and writes to any `Write`.
//! Shares are of the merged roots' total time, so a row's percentage says how much of
//! the profiled work happened in (or under) it.

use super::export;
pub use super::folded::{MAX_FOLDED_FRAMES, folded_stacks_elided, write_folded};
use super::model::{Node, Profile, Visit, walk};
use super::names::printable;
use std::collections::HashMap;
use std::fmt;
use std::io::{self, Write};
use std::str::FromStr;

/// Targets of calls through pointers that are not followed, listed by the header.
const NOT_FOLLOWED_SHOWN: usize = 5;
/// Rows deeper than this stop indenting and show their depth as a number instead.
pub const MAX_TREE_INDENT: usize = 40;

/// The output formats of `tendril report --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReportFormat {
    /// The merged calling context tree, indented, children by total time.
    #[default]
    Tree,
    /// Self time per function summed over all its contexts.
    Hot,
    /// One `a;b;c <self ns>` line per context with self time.
    Folded,
    /// The profile file itself.
    Json,
    /// gzip-compressed pprof `profile.proto` (binary).
    Pprof,
    /// speedscope's JSON file format.
    Speedscope,
    /// The Trace Event Format (Perfetto, chrome://tracing).
    Chrome,
    /// An SVG flame graph (inferno).
    Svg,
}

impl ReportFormat {
    pub const ALL: [ReportFormat; 8] = [
        ReportFormat::Tree,
        ReportFormat::Hot,
        ReportFormat::Folded,
        ReportFormat::Json,
        ReportFormat::Pprof,
        ReportFormat::Speedscope,
        ReportFormat::Chrome,
        ReportFormat::Svg,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ReportFormat::Tree => "tree",
            ReportFormat::Hot => "hot",
            ReportFormat::Folded => "folded",
            ReportFormat::Json => "json",
            ReportFormat::Pprof => "pprof",
            ReportFormat::Speedscope => "speedscope",
            ReportFormat::Chrome => "chrome",
            ReportFormat::Svg => "svg",
        }
    }

    /// Whether the output is binary (not for a terminal).
    pub fn is_binary(self) -> bool {
        self == ReportFormat::Pprof
    }
}

impl fmt::Display for ReportFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown report format '{0}' (expected tree, hot, folded, json, pprof, speedscope, chrome \
     or svg)"
)]
pub struct UnknownReportFormat(pub String);

impl FromStr for ReportFormat {
    type Err = UnknownReportFormat;

    fn from_str(text: &str) -> Result<ReportFormat, UnknownReportFormat> {
        ReportFormat::ALL
            .into_iter()
            .find(|format| format.name() == text)
            .ok_or_else(|| UnknownReportFormat(text.to_owned()))
    }
}

/// Writes `profile` in `format`.
pub fn write_report(
    profile: &Profile,
    format: ReportFormat,
    out: &mut impl Write,
) -> io::Result<()> {
    match format {
        ReportFormat::Tree => write_tree(profile, out),
        ReportFormat::Hot => write_hot(profile, out),
        ReportFormat::Folded => write_folded(profile, out),
        ReportFormat::Json => profile.write_json(out),
        ReportFormat::Pprof => export::pprof::write_pprof(profile, out),
        ReportFormat::Speedscope => export::speedscope::write_speedscope(profile, out),
        ReportFormat::Chrome => export::chrome::write_chrome(profile, out),
        ReportFormat::Svg => export::flamegraph::write_svg(profile, out),
    }
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

fn plural(count: u64, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

/// The warning a profile whose threads switched stacks must carry (`None` if none
/// did): how many switches and how many frames the trees cut short, per thread.
pub fn stack_switch_warning(profile: &Profile) -> Option<String> {
    let stats = &profile.stats;
    if stats.stack_switches == 0 && stats.dropped_frames == 0 {
        return None;
    }
    let threads: Vec<String> = profile
        .threads
        .iter()
        .filter(|t| t.stack_switches > 0 || t.dropped_frames > 0)
        .map(|t| {
            format!(
                "thread {}: {} switches, {} dropped",
                t.tid, t.stack_switches, t.dropped_frames
            )
        })
        .collect();
    Some(format!(
        "warning: threads switched stacks {} (coroutines?) and {} closed when their stack \
         was left returned later ({}); their times stop at the switch, and what they did \
         after it is charged to the frames open then",
        plural(stats.stack_switches, "time", "times"),
        plural(stats.dropped_frames, "frame", "frames"),
        threads.join("; ")
    ))
}

/// Who was profiled, how, and how complete the recording is.
fn write_header(profile: &Profile, out: &mut impl Write) -> io::Result<()> {
    let stats = &profile.stats;
    let calibration = &profile.calibration;
    writeln!(
        out,
        "tendril profile of pid {} ({}), scheme {}, roots: {}",
        profile.pid,
        printable(&profile.exe),
        printable(&profile.scheme),
        printable(&profile.roots.join(", "))
    )?;
    writeln!(
        out,
        "events: {} ({} lost, {} unmatched exits, {} unwound exits — frames ended by an \
         exception, longjmp, thread exit or the recording's end, not a return); functions: {} \
         instrumented, {} invoked; {} (calls through pointers), {} seen entering a \
         target, {} distinct targets of {} address-taken functions instrumented; pauses \
         removed: {:.3} ms (tendril's waits in the target, summed over threads)",
        stats.events,
        stats.lost_events,
        stats.unmatched_exits,
        stats.unwound_exits,
        stats.instrumented_functions,
        stats.invoked_functions,
        plural(
            stats.indirect_call_sites,
            "indirect call site",
            "indirect call sites"
        ),
        stats.indirect_sites_followed,
        stats.indirect_targets,
        stats.indirect_candidates,
        ms(stats.pause_ns)
    )?;
    let not_followed = profile
        .discovery
        .as_ref()
        .map_or(&[][..], |d| d.indirect_not_followed.as_slice());
    for item in not_followed.iter().take(NOT_FOLLOWED_SHOWN) {
        writeln!(
            out,
            "not followed through pointers: {} — {}",
            printable(&item.target),
            printable(&item.reason)
        )?;
    }
    if not_followed.len() > NOT_FOLLOWED_SHOWN {
        writeln!(
            out,
            "not followed through pointers: ... and {} more (the profile's \"discovery\" lists them all)",
            not_followed.len() - NOT_FOLLOWED_SHOWN
        )?;
    }
    if let Some(warning) = stack_switch_warning(profile) {
        writeln!(out, "{warning}")?;
    }
    if let Some(trace) = &profile.trace {
        writeln!(out, "{}", trace.summary())?;
    }
    writeln!(
        out,
        "calibration: TSC {:.3} GHz, {:.1} ns inner and {:.1} ns outer removed per call",
        calibration.tsc_hz as f64 / 1e9,
        calibration.inner_ns,
        calibration.outer_ns
    )
}

/// Children by total time, largest first (ties keep first-call order).
fn by_total(nodes: &[Node]) -> std::vec::IntoIter<&Node> {
    let mut sorted: Vec<&Node> = nodes.iter().collect();
    sorted.sort_by_key(|node| std::cmp::Reverse(node.total_ns));
    sorted.into_iter()
}

/// The merged calling context tree, one row per context.
pub fn write_tree(profile: &Profile, out: &mut impl Write) -> io::Result<()> {
    write_header(profile, out)?;
    writeln!(
        out,
        "merged call tree of {}; children by total time; % of all roots' total",
        plural(profile.threads.len() as u64, "thread", "threads")
    )?;
    writeln!(
        out,
        "{:>10} {:>11} {:>11} {:>7}  function (module)",
        "calls", "total ms", "self ms", "total"
    )?;
    let whole = profile.merged_total_ns();
    let mut open = vec![by_total(&profile.merged.roots)];
    while let Some(siblings) = open.last_mut() {
        let Some(node) = siblings.next() else {
            open.pop();
            continue;
        };
        let depth = open.len() - 1;
        write!(
            out,
            "{:>10} {:>11.3} {:>11.3} {:>6.1}%  {:indent$}",
            node.calls,
            ms(node.total_ns),
            ms(node.self_ns),
            percent(node.total_ns, whole),
            "",
            indent = 2 * depth.min(MAX_TREE_INDENT)
        )?;
        if depth > MAX_TREE_INDENT {
            write!(out, "[depth {depth}] ")?;
        }
        writeln!(
            out,
            "{} ({})",
            printable(&node.name),
            printable(&node.module)
        )?;
        open.push(by_total(&node.children));
    }
    Ok(())
}

/// Self time per function summed over every context it ran in.
pub fn write_hot(profile: &Profile, out: &mut impl Write) -> io::Result<()> {
    struct Hot<'a> {
        name: &'a str,
        module: &'a str,
        self_ns: u64,
        calls: u64,
    }
    let mut by_function: HashMap<(&str, &str), usize> = HashMap::new();
    let mut rows: Vec<Hot> = Vec::new();
    let _ = walk(&profile.merged.roots, |step| -> Result<(), ()> {
        if let Visit::Enter { node, .. } = step {
            let key = (node.name.as_str(), node.module.as_str());
            let index = *by_function.entry(key).or_insert_with(|| {
                rows.push(Hot {
                    name: key.0,
                    module: key.1,
                    self_ns: 0,
                    calls: 0,
                });
                rows.len() - 1
            });
            rows[index].self_ns += node.self_ns;
            rows[index].calls += node.calls;
        }
        Ok(())
    });
    rows.sort_by(|a, b| b.self_ns.cmp(&a.self_ns).then(a.name.cmp(b.name)));

    write_header(profile, out)?;
    writeln!(
        out,
        "hot spots: self time per function over all its contexts (all threads); % of all \
         roots' total"
    )?;
    writeln!(
        out,
        "{:>11} {:>7} {:>10}  function (module)",
        "self ms", "self", "calls"
    )?;
    let whole = profile.merged_total_ns();
    for row in rows {
        writeln!(
            out,
            "{:>11.3} {:>6.1}% {:>10}  {} ({})",
            ms(row.self_ns),
            percent(row.self_ns, whole),
            row.calls,
            printable(row.name),
            printable(row.module)
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::model::tests::chain;
    use crate::profile::model::{Calibration, MergedProfile, Stats, ThreadProfile};

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

    fn report(profile: &Profile, format: ReportFormat) -> String {
        let mut out = Vec::new();
        write_report(profile, format, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    const HEADER: &str = "\
tendril profile of pid 4242 (/usr/bin/app), scheme B, roots: main
events: 52 (0 lost, 0 unmatched exits, 2 unwound exits — frames ended by an exception, longjmp, thread exit or the recording's end, not a return); functions: 6 instrumented, 5 invoked; 1 indirect call site (calls through pointers), 0 seen entering a target, 0 distinct targets of 0 address-taken functions instrumented; pauses removed: 1.500 ms (tendril's waits in the target, summed over threads)
calibration: TSC 2.995 GHz, 12.2 ns inner and 20.5 ns outer removed per call
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
        let rows: Vec<&str> = text.lines().skip(5).collect();
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
        // Give self time to the deepest node only: one line, cut to its innermost
        // frames.
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
        let elided = 100_000 - MAX_FOLDED_FRAMES;
        let expected = format!(
            "[{elided} frames elided];{} 3\n",
            vec!["f"; MAX_FOLDED_FRAMES].join(";")
        );
        assert_eq!(text, expected);
        assert_eq!(folded_stacks_elided(&deep), 1);
    }

    #[test]
    fn folded_stacks_at_the_cap_are_whole() {
        let mut deep = profile();
        deep.merged.roots = vec![chain("g", MAX_FOLDED_FRAMES + 1)];
        // chain() gives every level self time: the last line alone is cut.
        let text = report(&deep, ReportFormat::Folded);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), MAX_FOLDED_FRAMES + 1);
        let at_cap = lines[MAX_FOLDED_FRAMES - 1];
        assert_eq!(at_cap.split(';').count(), MAX_FOLDED_FRAMES, "{at_cap:.40}");
        let cut = lines[MAX_FOLDED_FRAMES];
        assert!(cut.starts_with("[1 frames elided];g;g"), "{cut:.40}");
        assert_eq!(cut.split(';').count(), MAX_FOLDED_FRAMES + 1);
        assert_eq!(folded_stacks_elided(&deep), 1);
    }
}
