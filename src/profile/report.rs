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
use super::model::{Node, Profile, Timing};
use super::names::{fit_middle, function_label};
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

/// How the text formats (tree, hot spots) lay themselves out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TextOptions {
    /// A terminal's width: function names are cut in the middle to fit it (see
    /// `names`).
    pub columns: Option<usize>,
    /// Every header notice's details (`report -v`), not only its summary line.
    pub details: bool,
}

/// Writes `profile` in `format`.
pub fn write_report(
    profile: &Profile,
    format: ReportFormat,
    out: &mut impl Write,
) -> io::Result<()> {
    write_report_with(profile, format, TextOptions::default(), out)
}

/// Writes `profile` in `format`, the text formats laid out as `options` say.
pub fn write_report_with(
    profile: &Profile,
    format: ReportFormat,
    options: TextOptions,
    out: &mut impl Write,
) -> io::Result<()> {
    match format {
        ReportFormat::Tree => write_tree(profile, options, out),
        ReportFormat::Hot => write_hot(profile, options, out),
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
pub fn write_tree(profile: &Profile, options: TextOptions, out: &mut impl Write) -> io::Result<()> {
    let columns = options.columns;
    header::write_header(profile, options.details, out)?;
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
pub fn write_hot(profile: &Profile, options: TextOptions, out: &mut impl Write) -> io::Result<()> {
    let columns = options.columns;
    let rows = hot_spots(&profile.merged.roots);
    header::write_header(profile, options.details, out)?;
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

mod header;
mod notes;
#[cfg(test)]
mod tests;
mod timing_marks;
