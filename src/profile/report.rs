//! `tendril report` output: a [`Profile`] as an indented call tree, a hot-spot list,
//! folded stacks (for flamegraph.pl and inferno) or JSON.
//!
//! The one idea: every format reads the merged tree (all threads merged by call path),
//! walks it with an explicit stack so any depth prints, and writes to any `Write`.
//! Shares are of the merged roots' total time, so a row's percentage says how much of
//! the profiled work happened in (or under) it.

pub use super::depth_cut::{MAX_STACK_DEPTH, subtrees_cut};
use super::export;
pub use super::folded::write_folded;
use super::hot::hot_spots;
use super::model::{Calibration, Node, NotFollowed, Profile, Timing};
use super::names::{fit_middle, function_label, printable};
use notes::ring_pauses_line;
pub use notes::{library_churn_note, stack_switch_warning};
use std::fmt;
use std::io::{self, Write};
use std::str::FromStr;

/// Targets of calls through pointers that are not followed, listed by the header.
const NOT_FOLLOWED_SHOWN: usize = 3;
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
    write_report_fitted(profile, format, None, out)
}

/// Writes `profile` in `format`; with `columns` (a terminal's width), the tree's and
/// the hot spots' function names are cut in the middle to fit it (see `names`).
pub fn write_report_fitted(
    profile: &Profile,
    format: ReportFormat,
    columns: Option<usize>,
    out: &mut impl Write,
) -> io::Result<()> {
    match format {
        ReportFormat::Tree => write_tree(profile, columns, out),
        ReportFormat::Hot => write_hot(profile, columns, out),
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

/// What a self-time column shows where the self time is below the measurement's
/// resolution (the hook cost removed exceeded it), instead of a measured-looking 0.
pub const BELOW_RESOLUTION: &str = "<res";

/// A self time in milliseconds, `width` wide, or [`BELOW_RESOLUTION`].
fn self_ms(self_ns: u64, below_resolution: bool, width: usize) -> String {
    self_cell(self_ns, below_resolution, Timing::Timed, width)
}

/// [`self_ms`], or [`timing_marks::IN_CALLER`] for a node counted, not timed.
fn self_cell(self_ns: u64, below_resolution: bool, timing: Timing, width: usize) -> String {
    if timing == Timing::InCaller {
        format!("{:>width$}", timing_marks::IN_CALLER)
    } else if below_resolution {
        format!("{BELOW_RESOLUTION:>width$}")
    } else {
        format!("{:>width$.3}", ms(self_ns))
    }
}

/// The label of a row whose name starts at column `used`, cut to `columns` if given.
fn row_label(name: &str, module: &str, columns: Option<usize>, used: usize) -> String {
    let label = function_label(name, module);
    match columns {
        Some(columns) => fit_middle(&label, columns.saturating_sub(used)).into_owned(),
        None => label,
    }
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

/// Who was profiled, how, and how complete the recording is.
fn write_header(profile: &Profile, out: &mut impl Write) -> io::Result<()> {
    if let Some(sampling) = &profile.sampling {
        return write_sampled_header(profile, sampling, out);
    }
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
        "events: {} ({} lost, {} unmatched exits, {} unwound by an exception, longjmp, \
         thread exit or the end)",
        stats.events, stats.lost_events, stats.unmatched_exits, stats.unwound_exits,
    )?;
    writeln!(
        out,
        "functions: {} instrumented, {} invoked\ncalls through pointers: {}, {} seen taken, \
         reaching {} of the {} address-taken functions instrumented",
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
    )?;
    writeln!(
        out,
        "pauses removed: {:.3} ms (tendril's waits in the target, summed over threads)",
        ms(stats.pause_ns)
    )?;
    if stats.core_wait_ns > 0 {
        writeln!(
            out,
            "of those pauses, {:.3} ms were the target's threads waiting for a core that \
             tendril's draining held",
            ms(stats.core_wait_ns)
        )?;
    }
    if let Some(line) = ring_pauses_line(stats) {
        writeln!(out, "{line}")?;
    }
    if let Some(note) = library_churn_note(stats) {
        writeln!(out, "{note}")?;
    }
    if let Some(line) = timing_marks::policy_line(stats) {
        writeln!(out, "{line}")?;
    }
    write_not_followed(profile, out)?;
    if let Some(warning) = stack_switch_warning(profile) {
        writeln!(out, "{warning}")?;
    }
    if let Some(trace) = &profile.trace {
        writeln!(out, "{}", trace.summary())?;
    }
    write_calibration(calibration, out)?;
    write_clock_line(profile, out)
}

/// The hooks' cost removed, a line each: per timed call (and its spread, from which each
/// node's `error_ns` follows), per counted call, and where it was measured.
fn write_calibration(calibration: &Calibration, out: &mut impl Write) -> io::Result<()> {
    write!(
        out,
        "calibration: TSC {:.3} GHz; removed per call: {:.1} ns inner, {:.1} ns outer",
        calibration.tsc_hz as f64 / 1e9,
        calibration.inner_ns,
        calibration.outer_ns
    )?;
    if calibration.inner_spread_ns > 0.0 || calibration.outer_spread_ns > 0.0 {
        write!(
            out,
            ", give or take {:.1} and {:.1} ns",
            calibration.inner_spread_ns, calibration.outer_spread_ns
        )?;
    }
    writeln!(out)?;
    if calibration.untimed_ns > 0.0 {
        writeln!(
            out,
            "  per counted call: {:.1} ns, give or take {:.1} ns",
            calibration.untimed_ns, calibration.untimed_spread_ns
        )?;
    }
    if calibration.in_situ_batches > 0 {
        writeln!(
            out,
            "  measured in situ: the median of {} batches on the target's threads (at the \
             start, on tendril's: {:.1} and {:.1} ns)",
            calibration.in_situ_batches, calibration.start_inner_ns, calibration.start_outer_ns
        )?;
    }
    let shapes: Vec<String> = [
        ("pad-jump", calibration.pad_jump),
        ("call-thunk", calibration.call_thunk),
    ]
    .into_iter()
    .filter_map(|(name, shape)| {
        let shape = shape?;
        Some(format!(
            "{name} hooks: {:.1} and {:.1} ns ({} batches)",
            shape.inner_ns, shape.outer_ns, shape.in_situ_batches
        ))
    })
    .collect();
    if !shapes.is_empty() {
        writeln!(out, "  {}", shapes.join("; "))?;
    }
    Ok(())
}

/// Which time the report shows, and whether the other is there.
/// The lines that say what a recording did not follow: targets of calls through
/// pointers, and callees discovery skipped (Go code), one line each, by reason, with
/// a few names per reason (the profile's `discovery` lists them all).
fn write_not_followed(profile: &Profile, out: &mut impl Write) -> io::Result<()> {
    let Some(discovery) = profile.discovery.as_ref() else {
        return Ok(());
    };
    for (label, items) in [
        (
            "not followed through pointers",
            &discovery.indirect_not_followed,
        ),
        ("not followed", &discovery.not_followed),
    ] {
        if let Some(line) = not_followed_line(label, items) {
            writeln!(out, "{line}")?;
        }
    }
    Ok(())
}

/// "LABEL: 15 functions (the profile's "discovery" lists them all)", then a line per
/// reason, most frequent first: "  shorter than the 5-byte patch: 15 (a, b, c, …)"; or
/// nothing for no function.
fn not_followed_line(label: &str, items: &[NotFollowed]) -> Option<String> {
    if items.is_empty() {
        return None;
    }
    // By reason, the details in parentheses (byte counts) left out, most frequent first.
    let mut by_reason: Vec<(&str, Vec<&str>)> = Vec::new();
    for item in items {
        let reason = item.reason.split(" (").next().unwrap_or(&item.reason);
        match by_reason.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, names)) => names.push(&item.target),
            None => by_reason.push((reason, vec![&item.target])),
        }
    }
    by_reason.sort_by_key(|(_, names)| std::cmp::Reverse(names.len()));
    let mut text = format!(
        "{label}: {} function{} (the profile's \"discovery\" lists them all)",
        items.len(),
        if items.len() == 1 { "" } else { "s" },
    );
    for (reason, names) in &by_reason {
        let shown: Vec<&str> = names.iter().take(NOT_FOLLOWED_SHOWN).copied().collect();
        let more = if names.len() > shown.len() {
            ", …"
        } else {
            ""
        };
        text += &format!(
            "\n  {}: {} ({}{more})",
            printable(reason),
            names.len(),
            printable(&shown.join(", "))
        );
    }
    Some(text)
}

fn write_clock_line(profile: &Profile, out: &mut impl Write) -> io::Result<()> {
    if profile.stats.off_cpu_lost > 0 {
        writeln!(
            out,
            "{} context-switch records lost (a full ring): those waits count as on-CPU",
            profile.stats.off_cpu_lost
        )?;
    }
    if profile.stats.shows_cpu_time {
        return writeln!(
            out,
            "times: on-CPU (--clock cpu): waiting in system calls, on locks and for a CPU \
             left out"
        );
    }
    match &profile.stats.cpu_unmeasured {
        Some(why) => writeln!(out, "times: wall-clock; {}", printable(why)),
        None if profile.has_cpu_time() => writeln!(
            out,
            "times: wall-clock, waiting included (--clock cpu shows on-CPU time)"
        ),
        None => Ok(()),
    }
}

/// The header of a sampled profile (`tendril sample`): how it was sampled, and that
/// its times are estimates.
fn write_sampled_header(
    profile: &Profile,
    sampling: &super::model::SamplingInfo,
    out: &mut impl Write,
) -> io::Result<()> {
    writeln!(
        out,
        "tendril profile of pid {} ({}), sampled: {} samples at {} Hz of {} time over {:.3} s",
        profile.pid,
        printable(&profile.exe),
        sampling.samples,
        sampling.rate_hz,
        printable(&sampling.clock),
        profile.duration_ns as f64 / 1e9
    )?;
    writeln!(
        out,
        "{} lost (the buffer was full), {} stacks truncated (under [truncated stack]); times are \
         estimates: samples × {:.3} ms",
        sampling.lost_samples,
        sampling.truncated_stacks,
        1e3 / sampling.rate_hz.max(1) as f64
    )
}

/// The count column of a tree or hot-spot row: calls, or samples in a sampled profile.
fn count_column(profile: &Profile) -> (&'static str, fn(&Node) -> u64) {
    if profile.sampling.is_some() {
        ("samples", |node| node.samples.unwrap_or(0))
    } else {
        ("calls", |node| node.calls)
    }
}

/// Children by total time, largest first (ties keep first-call order).
fn by_total(nodes: &[Node]) -> std::vec::IntoIter<&Node> {
    let mut sorted: Vec<&Node> = nodes.iter().collect();
    sorted.sort_by_key(|node| std::cmp::Reverse(node.total_ns));
    sorted.into_iter()
}

/// Columns before a tree row's indentation.
const TREE_COLUMNS: usize = 44;
/// Columns before a hot-spot row's name.
const HOT_COLUMNS: usize = 32;

/// The merged calling context tree, one row per context.
pub fn write_tree(
    profile: &Profile,
    columns: Option<usize>,
    out: &mut impl Write,
) -> io::Result<()> {
    write_header(profile, out)?;
    writeln!(
        out,
        "merged call tree of {}; children by total time; % of all roots' total{}{}{}",
        plural(profile.threads.len() as u64, "thread", "threads"),
        below_resolution_note(&profile.merged.roots),
        jit_note(profile),
        timing_marks::uncertain_note(&profile.merged.roots)
    )?;
    let (count_title, count) = count_column(profile);
    writeln!(
        out,
        "{:>10} {:>11} {:>11} {:>7}  function (module)",
        count_title, "total ms", "self ms", "total"
    )?;
    let whole = profile.merged_total_ns();
    let mut open = vec![by_total(&profile.merged.roots)];
    while let Some(siblings) = open.last_mut() {
        let Some(node) = siblings.next() else {
            open.pop();
            continue;
        };
        let depth = open.len() - 1;
        let indent = 2 * depth.min(MAX_TREE_INDENT);
        // A call into JIT code in an instrumented tree is not measured: say so.
        let counted = if node.jit && node.samples.is_none() {
            JIT_MARK.to_string()
        } else {
            count(node).to_string()
        };
        write!(
            out,
            "{:>10} {} {} {:>6.1}%  {:indent$}",
            counted,
            timing_marks::total_cell(node, 11),
            self_cell(node.self_ns, node.below_resolution, node.timing, 11),
            percent(node.total_ns, whole),
            "",
        )?;
        let mut used = TREE_COLUMNS + indent;
        if depth > MAX_TREE_INDENT {
            let marker = format!("[depth {depth}] ");
            used += marker.len();
            out.write_all(marker.as_bytes())?;
        }
        writeln!(
            out,
            "{}",
            row_label(&node.name, &node.module, columns, used)
        )?;
        open.push(by_total(&node.children));
    }
    Ok(())
}

/// Self time per function summed over every context it ran in.
pub fn write_hot(
    profile: &Profile,
    columns: Option<usize>,
    out: &mut impl Write,
) -> io::Result<()> {
    let rows = hot_spots(&profile.merged.roots);
    write_header(profile, out)?;
    writeln!(
        out,
        "hot spots: self time per function over all its contexts (all threads); % of all \
         roots' total{}{}",
        below_resolution_note(&profile.merged.roots),
        jit_note(profile)
    )?;
    writeln!(
        out,
        "{:>11} {:>7} {:>10}  function (module)",
        "self ms",
        "self",
        if profile.sampling.is_some() {
            "samples"
        } else {
            "calls"
        }
    )?;
    let whole = profile.merged_total_ns();
    for row in rows {
        writeln!(
            out,
            "{} {:>6.1}% {:>10}  {}",
            self_ms(row.self_ns, row.below_resolution, 11),
            percent(row.self_ns, whole),
            if row.jit {
                JIT_MARK.to_string()
            } else {
                row.calls.to_string()
            },
            row_label(row.name, &row.location(), columns, HOT_COLUMNS)
        )?;
    }
    Ok(())
}

/// What the calls column shows for a call into JIT code in an instrumented tree.
pub const JIT_MARK: &str = "jit";

/// Explains [`JIT_MARK`] in the tree's title line, when some row shows it.
fn jit_note(profile: &Profile) -> &'static str {
    let any = super::model::walk(&profile.merged.roots, |step| match step {
        super::model::Visit::Enter { node, .. } if node.jit => Err(()),
        _ => Ok(()),
    });
    if profile.sampling.is_none() && any.is_err() {
        "; jit: a call into code generated at run time, never patched (not counted; its \
         time is its caller's self time)"
    } else {
        ""
    }
}

/// Explains [`BELOW_RESOLUTION`] in a title line, when some row shows it.
fn below_resolution_note(roots: &[Node]) -> &'static str {
    let mut any = false;
    let _ = super::model::walk(roots, |step| {
        if let super::model::Visit::Enter { node, .. } = step
            && node.below_resolution
        {
            any = true;
            return Err(());
        }
        Ok(())
    });
    if any {
        "; <res: self time below what tendril can measure (the hook cost removed exceeded it)"
    } else {
        ""
    }
}

mod notes;
#[cfg(test)]
mod tests;
mod timing_marks;
