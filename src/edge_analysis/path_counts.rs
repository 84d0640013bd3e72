//! `tendril edges`' paths: the Ball–Larus path numbers the copy counted, decoded into
//! the blocks each path runs through, most frequent first.
//!
//! The one idea: the agent numbered the paths of the graph its layout describes, with
//! `tendril_callgraph::paths`; this side numbers the same successor lists
//! (`EdgeLayout::path_successors`) with the same code, so path `n` decodes to the very
//! blocks the agent's number meant. A path starts at the entry, at a loop head after
//! a back edge, or at a landing pad where an exception landed (the path it cut short is
//! not counted), and ends leaving the function or taking a back edge, so a loop's
//! iterations are paths of their own. The text output lists the hottest paths as
//! block offsets joined by arrows.

use crate::quantities::{amount, thousands};
use std::io::{self, Write};
use tendril_callgraph::paths::PathNumbering;
use tendril_wire::edges::EdgeLayout;

/// Paths the text output lists; `--json` has them all.
const PATHS_SHOWN: usize = 10;

/// The paths counted in one function's copy.
#[derive(Debug, Clone, PartialEq)]
pub struct PathCounts {
    /// The function's acyclic paths.
    pub paths: u64,
    /// The paths that ran, most frequent first (then by number).
    pub counted: Vec<PathCount>,
    /// Paths numbered beyond the ones with a counter of their own.
    pub beyond: u64,
    /// Paths whose number was lost: calls nested deeper than the agent's path stack.
    pub lost: u64,
    /// Every path run: the counted ones, `beyond` and `lost`.
    pub total: u64,
    /// Numbers below this have a counter of their own.
    pub itemized: u64,
}

/// One path and how often it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathCount {
    pub number: u64,
    pub count: u64,
    /// Starts at a loop head after a back edge, rather than at the entry.
    pub from_back_edge: bool,
    /// Starts at a landing pad, where an exception landed.
    pub from_landing_pad: bool,
    /// The start of each block it runs through, in order.
    pub blocks: Vec<u64>,
    /// Ends by taking a back edge, rather than by leaving the function.
    pub to_back_edge: bool,
}

impl PathCounts {
    /// The paths of `layout`, with `count(id)` the count of counter `id`; the reason
    /// the agent gave when it did not count paths.
    pub fn derive(layout: &EdgeLayout, count: impl Fn(u32) -> u64) -> Result<PathCounts, String> {
        let counters = layout.paths.as_ref().map_err(Clone::clone)?;
        let pads: Vec<usize> = (layout.landing_pads.iter())
            .filter_map(|&pad| layout.blocks.iter().position(|block| block.start == pad))
            .collect();
        let numbering = PathNumbering::with_landing_pads(&layout.path_successors(), &pads)
            .map_err(|too_many| too_many.to_string())?;
        if numbering.paths != counters.paths {
            return Err(format!(
                "the agent numbered {} paths and tendril {}; their counts cannot be decoded",
                counters.paths, numbering.paths
            ));
        }
        let mut counted = Vec::new();
        for number in 0..counters.itemized {
            let runs = count(counters.first_counter + number);
            if runs == 0 {
                continue;
            }
            let Some(path) = numbering.path(u64::from(number)) else {
                continue;
            };
            counted.push(PathCount {
                number: u64::from(number),
                count: runs,
                from_back_edge: path.from_back_edge,
                from_landing_pad: path.from_landing_pad,
                blocks: path
                    .blocks
                    .iter()
                    .map(|&block| layout.blocks[block].start)
                    .collect(),
                to_back_edge: path.to_back_edge,
            });
        }
        counted.sort_by(|a, b| b.count.cmp(&a.count).then(a.number.cmp(&b.number)));
        let beyond = count(counters.beyond_counter);
        let lost = count(counters.lost_counter);
        let total = counted.iter().map(|p| p.count).sum::<u64>() + beyond + lost;
        Ok(PathCounts {
            paths: counters.paths,
            counted,
            beyond,
            lost,
            total,
            itemized: u64::from(counters.itemized),
        })
    }
}

/// Writes the paths section of the text output, each block named by `offset_of` its
/// start (`+0x10`, `cold+0x4`).
pub fn write_text(
    out: &mut impl Write,
    paths: &Result<PathCounts, String>,
    offset_of: &dyn Fn(u64) -> String,
) -> io::Result<()> {
    let paths = match paths {
        Ok(paths) => paths,
        Err(why) => return writeln!(out, "paths: not counted: {why}"),
    };
    writeln!(
        out,
        "paths: {} of {} ran, {}",
        thousands(paths.counted.len() as u64),
        amount(paths.paths, "acyclic path", "acyclic paths"),
        amount(paths.total, "run", "runs"),
    )?;
    writeln!(
        out,
        "(a path ends at a return or at a loop's back edge; ↺ marks one starting or ending there)"
    )?;
    if paths.counted.iter().any(|path| path.from_landing_pad) {
        writeln!(
            out,
            "(⤷ marks one starting at a landing pad: the path an exception cut short is not counted)"
        )?;
    }
    let shown = &paths.counted[..paths.counted.len().min(PATHS_SHOWN)];
    let counts: Vec<String> = shown.iter().map(|p| thousands(p.count)).collect();
    let width = counts.iter().map(String::len).max().unwrap_or(0).max(5);
    if !shown.is_empty() {
        writeln!(out, "  {:>width$}   SHARE  PATH", "COUNT")?;
    }
    for (path, count) in shown.iter().zip(&counts) {
        let share = path.count as f64 * 100.0 / paths.total.max(1) as f64;
        let blocks: Vec<String> = path.blocks.iter().map(|&b| offset_of(b)).collect();
        let from = match (path.from_back_edge, path.from_landing_pad) {
            (true, _) => "↺ ",
            (_, true) => "⤷ ",
            _ => "",
        };
        let to = if path.to_back_edge { " ↺" } else { "" };
        writeln!(
            out,
            "  {count:>width$}  {share:>5.1}%  {from}{}{to}",
            blocks.join(" → ")
        )?;
    }
    let rest = &paths.counted[shown.len()..];
    if !rest.is_empty() {
        let runs: u64 = rest.iter().map(|p| p.count).sum();
        writeln!(
            out,
            "  … {} more ({}; --json lists every path)",
            amount(rest.len() as u64, "path", "paths"),
            amount(runs, "run", "runs")
        )?;
    }
    if paths.beyond > 0 {
        writeln!(
            out,
            "  {} of paths numbered {} and above, not told apart (the first {} have counters)",
            amount(paths.beyond, "run", "runs"),
            thousands(paths.itemized),
            thousands(paths.itemized)
        )?;
    }
    if paths.lost > 0 {
        writeln!(
            out,
            "  {} lost, counted under no number: calls nested over 127 deep in profiled",
            amount(paths.lost, "run", "runs")
        )?;
        writeln!(
            out,
            "  functions, or calls whose path register was displaced (a coroutine switching"
        )?;
        writeln!(
            out,
            "  stacks, a thread caught inside the function as its copy went in)"
        )?;
    }
    Ok(())
}
