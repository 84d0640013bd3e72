//! `tendril edges`' text output: the function's disassembly (iced-x86, Intel syntax),
//! block by block, annotated with the counts.
//!
//! The one idea: the counts go where the eye reads the code. Each block's first
//! instruction carries the block's count and its share of the calls (a loop body runs
//! more often than the function is called: over 100%); a conditional branch says how
//! often it was taken and not; a jump through a table lists each target it reached
//! with its count; a loop head says how many times it runs per entry. Blocks run at
//! least a tenth as often as the hottest one are marked `▶`. Branch targets inside the
//! function read `+0xOFFSET`, as the offset column does. Bytes between blocks (alignment
//! padding) are not decoded, only counted. The hottest paths follow the code. Names —
//! the function's, its module's, its callees' — are escaped where they enter the text
//! (`terminal_text::printable`): the listing is for a terminal, here and in the live
//! view's `e`, and a name's newline must not start a line of its own.

use super::derived::{About, BlockCount, EdgeProfile, LoopCount};
use super::path_counts;
use crate::quantities::format_elapsed;
use crate::quantities::{amount, thousands};
use crate::terminal_text::printable;
use iced_x86::{
    Decoder, DecoderOptions, Formatter, Instruction, IntelFormatter, OpKind, SymbolResolver,
    SymbolResult,
};
use std::collections::HashMap;
use std::io::{self, Write};

/// Lines longer than this put a branch's counts on a line of their own.
const MAX_WIDTH: usize = 100;
/// Instructions longer than this push their counts further right rather than every
/// line's.
const INSTRUCTION_COLUMN: usize = 34;
/// A block is hot from this fraction of the hottest block's count.
const HOT_SHARE: u64 = 10;

/// What the listing shows besides the counts.
pub struct Listing<'a> {
    pub about: &'a About,
    /// The function's original bytes, from its entry.
    pub code: &'a [u8],
    /// Its `.cold` parts copied with it: (start, bytes).
    pub cold: &'a [(u64, Vec<u8>)],
    /// The name of an address outside the function (a `.cold` part, a tail call's
    /// target), when known.
    pub name_of: &'a dyn Fn(u64) -> Option<String>,
}

/// One line of the listing, before the columns are lined up.
#[derive(Default)]
struct Row {
    hot: bool,
    /// A block's first instruction: its count and share of the calls.
    count: Option<(String, String)>,
    offset: String,
    text: String,
    /// Counts after the instruction (a branch's).
    note: Option<String>,
}

/// Writes the annotated listing of `profile`.
pub fn write_text(
    out: &mut impl Write,
    listing: &Listing,
    profile: &EdgeProfile,
) -> io::Result<()> {
    let about = listing.about;
    writeln!(
        out,
        "{} ({}, process {}) at {:#x}, {} bytes, {}",
        printable(&about.function),
        printable(&about.module),
        about.pid,
        profile.address,
        about.size,
        amount(profile.blocks.len() as u64, "block", "blocks")
    )?;
    let elapsed = format_elapsed(about.elapsed);
    if profile.calls == 0 {
        writeln!(
            out,
            "{} was not called in the {elapsed} s its edges were counted",
            printable(&about.function)
        )?;
    } else {
        writeln!(
            out,
            "{} in {elapsed} s from {}; ▶ marks the blocks run at least 1/{HOT_SHARE} as \
             often as the hottest",
            amount(profile.calls, "call", "calls"),
            amount(about.threads as u64, "thread", "threads")
        )?;
    }
    writeln!(out)?;
    let rows = rows(listing, profile);
    print_rows(out, &rows)?;
    writeln!(out)?;
    let offset = |address: u64| offset_text(listing, profile.address, address);
    path_counts::write_text(out, &profile.paths, &offset)
}

/// The listing as lines, each with whether it starts a hot block (the `▶` mark), for
/// the live view, which colours those.
pub fn lines(listing: &Listing, profile: &EdgeProfile) -> Vec<(bool, String)> {
    let mut text = Vec::new();
    write_text(&mut text, listing, profile).expect("writing to memory cannot fail");
    String::from_utf8_lossy(&text)
        .lines()
        .map(|line| (line.starts_with('▶'), line.to_string()))
        .collect()
}

fn rows(listing: &Listing, profile: &EdgeProfile) -> Vec<Row> {
    let start = profile.address;
    let end = start + listing.code.len() as u64;
    let decoded: Vec<Vec<Instruction>> = profile
        .blocks
        .iter()
        .map(|block| match cold_part_of(listing, block.start) {
            Some((at, bytes)) => decode(bytes, *at, block.start, block.end),
            None => decode(listing.code, start, block.start, block.end),
        })
        .collect();
    let names = branch_names(listing, start, &decoded);
    let mut rows = Rows {
        listing,
        profile,
        start,
        end,
        formatter: intel_formatter(names.clone()),
        names,
        hottest: profile.hottest(),
        rows: Vec::new(),
        reached: start,
        cold_shown: false,
    };
    for (block, instructions) in profile.blocks.iter().zip(&decoded) {
        rows.before_block(block);
        rows.block(block, instructions);
    }
    if end > rows.reached {
        rows.rows.push(extra(format!(
            "… {} bytes no path reaches (padding)",
            end - rows.reached
        )));
    }
    rows.rows
}

/// The names branch targets read as: an offset inside the function (or a `.cold`
/// part), the name of an address outside it when known.
fn branch_names(
    listing: &Listing,
    start: u64,
    decoded: &[Vec<Instruction>],
) -> HashMap<u64, String> {
    let end = start + listing.code.len() as u64;
    let mut names: HashMap<u64, String> = HashMap::new();
    for instruction in decoded.iter().flatten() {
        let target = instruction.near_branch_target();
        if target == 0 || names.contains_key(&target) {
            continue;
        }
        if (start..end).contains(&target) || cold_part_of(listing, target).is_some() {
            names.insert(target, offset_text(listing, start, target));
        } else if let Some(name) = (listing.name_of)(target) {
            names.insert(target, printable(&name).into_owned());
        }
    }
    names
}

/// The rows as they are written, block by block: the function's code is `start..end`,
/// and the rows so far cover it up to `reached`.
struct Rows<'a, 'l> {
    listing: &'a Listing<'l>,
    profile: &'a EdgeProfile,
    start: u64,
    end: u64,
    formatter: IntelFormatter,
    names: HashMap<u64, String>,
    hottest: u64,
    rows: Vec<Row>,
    reached: u64,
    /// Whether the `.cold` part's heading is written.
    cold_shown: bool,
}

impl Rows<'_, '_> {
    /// The lines before `block`'s code: the `.cold` part's heading, padding before it,
    /// a loop head's count, a landing pad's mark.
    fn before_block(&mut self, block: &BlockCount) {
        let (end, profile) = (self.end, self.profile);
        let in_cold = !(self.start..end).contains(&block.start);
        if in_cold && !self.cold_shown {
            self.cold_shown = true;
            if end > self.reached {
                self.rows.push(extra(format!(
                    "… {} bytes no path reaches (padding)",
                    end - self.reached
                )));
            }
            self.reached = end;
            self.rows.push(extra(format!(
                "── its .cold part at {:#x}, the rarely run code the compiler moved out ──",
                block.start
            )));
        }
        if !in_cold && block.start > self.reached {
            self.rows.push(extra(format!(
                "… {} bytes no path reaches (padding)",
                block.start - self.reached
            )));
        }
        if !in_cold {
            self.reached = self.reached.max(block.end);
        }
        if let Some(head) = profile.loops.iter().find(|l| l.head == block.start) {
            self.rows.push(extra(loop_line(head)));
        }
        if profile.landing_pads.contains(&block.start) {
            self.rows.push(extra(
                "⤷ landing pad: exceptions thrown in the calls above land here".into(),
            ));
        }
    }

    /// `block`'s instructions, the first with the block's count, a branch with its
    /// edges' and a table jump followed by its targets'.
    fn block(&mut self, block: &BlockCount, instructions: &[Instruction]) {
        let profile = self.profile;
        for (i, instruction) in instructions.iter().enumerate() {
            let mut text = String::new();
            self.formatter.format(instruction, &mut text);
            let mut row = Row {
                offset: offset_text(self.listing, self.start, instruction.ip()),
                text,
                ..Row::default()
            };
            if i == 0 {
                row.hot = block.count > 0 && block.count * HOT_SHARE >= self.hottest;
                row.count = Some((thousands(block.count), self.share(block.count)));
            }
            let at = instruction.ip();
            if let Some(branch) = profile.branches.iter().find(|b| b.at == at) {
                let all = branch.taken + branch.not_taken;
                row.note = Some(format!(
                    "taken {}{} / not taken {}",
                    thousands(branch.taken),
                    percent_of(branch.taken, all),
                    thousands(branch.not_taken)
                ));
            }
            self.rows.push(row);
            if let Some(table) = profile.tables.iter().find(|t| t.at == at) {
                self.rows.extend(
                    table_lines(&table.entries, &self.names, self.start)
                        .into_iter()
                        .map(extra),
                );
            }
        }
        if instructions.is_empty() {
            self.rows.push(extra(format!(
                "… {} bytes that do not decode",
                block.end - block.start
            )));
        }
    }

    /// A count's share of the calls (nothing without calls).
    fn share(&self, count: u64) -> String {
        match self.profile.calls {
            0 => String::new(),
            calls => format!("{:.1}%", count as f64 * 100.0 / calls as f64),
        }
    }
}

/// The `.cold` part of `listing` that holds `address`: (start, bytes).
fn cold_part_of<'a>(listing: &Listing<'a>, address: u64) -> Option<&'a (u64, Vec<u8>)> {
    (listing.cold.iter()).find(|(at, bytes)| (*at..*at + bytes.len() as u64).contains(&address))
}

/// `+0x10` from the function's `start`, or `cold+0x4` from the start of a `.cold` part.
fn offset_text(listing: &Listing, start: u64, address: u64) -> String {
    let in_function = (start..start + listing.code.len() as u64).contains(&address);
    match cold_part_of(listing, address) {
        Some((at, _)) if !in_function => format!("cold+{:#x}", address - at),
        _ => format!("+{:#x}", address.wrapping_sub(start)),
    }
}

/// The instructions of `[from, to)`, decoded from `code` (the function's bytes from
/// `start`); what lies outside `code` is left out.
fn decode(code: &[u8], start: u64, from: u64, to: u64) -> Vec<Instruction> {
    let low = (from.saturating_sub(start) as usize).min(code.len());
    let high = (to.saturating_sub(start) as usize).clamp(low, code.len());
    let mut decoder = Decoder::with_ip(64, &code[low..high], from, DecoderOptions::NONE);
    let mut instructions = Vec::new();
    while decoder.can_decode() {
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            break;
        }
        instructions.push(instruction);
    }
    instructions
}

/// A row with text in the instruction column only.
fn extra(text: String) -> Row {
    Row {
        text,
        ..Row::default()
    }
}

fn loop_line(head: &LoopCount) -> String {
    match head.iterations_per_entry() {
        Some(per_entry) => format!(
            "↻ loop: {per_entry:.1} iterations per entry ({}, {})",
            amount(head.entries, "entry", "entries"),
            amount(head.back_edges, "back edge", "back edges")
        ),
        None => format!(
            "↻ loop head, never entered ({})",
            amount(head.back_edges, "back edge", "back edges")
        ),
    }
}

/// One line per distinct target of a table jump, in the order of their first entries:
/// `→ +0x30  entry 0: 10 (14.3%)`, `→ +0x50  entries 7-9, 12: 30 (...)`.
fn table_lines(entries: &[(u64, u64)], names: &HashMap<u64, String>, start: u64) -> Vec<String> {
    let total: u64 = entries.iter().map(|e| e.1).sum();
    let mut targets: Vec<(u64, Vec<usize>, u64)> = Vec::new();
    for (index, &(target, count)) in entries.iter().enumerate() {
        match targets.iter_mut().find(|t| t.0 == target) {
            Some(found) => {
                found.1.push(index);
                found.2 += count;
            }
            None => targets.push((target, vec![index], count)),
        }
    }
    targets
        .iter()
        .map(|(target, indexes, count)| {
            let name = names
                .get(target)
                .cloned()
                .unwrap_or_else(|| format!("+{:#x}", target.wrapping_sub(start)));
            let which = if indexes.len() == 1 {
                "entry"
            } else {
                "entries"
            };
            format!(
                "→ {name}  {which} {}: {}{}",
                index_ranges(indexes),
                thousands(*count),
                percent_of(*count, total)
            )
        })
        .collect()
}

/// `0-3, 7, 9-10` for sorted indexes.
fn index_ranges(indexes: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < indexes.len() {
        let mut j = i;
        while j + 1 < indexes.len() && indexes[j + 1] == indexes[j] + 1 {
            j += 1;
        }
        parts.push(if j == i {
            indexes[i].to_string()
        } else {
            format!("{}-{}", indexes[i], indexes[j])
        });
        i = j + 1;
    }
    parts.join(", ")
}

/// ` (66.7%)`, or nothing when `all` is 0.
fn percent_of(part: u64, all: u64) -> String {
    if all == 0 {
        String::new()
    } else {
        format!(" ({:.1}%)", part as f64 * 100.0 / all as f64)
    }
}

fn print_rows(out: &mut impl Write, rows: &[Row]) -> io::Result<()> {
    let width = |pick: fn(&Row) -> usize, header: &str| {
        rows.iter()
            .map(pick)
            .max()
            .unwrap_or(0)
            .max(header.chars().count())
    };
    let count_width = width(|r| r.count.as_ref().map_or(0, |c| c.0.len()), "COUNT");
    let share_width = width(|r| r.count.as_ref().map_or(0, |c| c.1.len()), "%CALLS");
    let offset_width = width(|r| r.offset.len(), "OFFSET");
    let text_width = rows
        .iter()
        .filter(|r| r.note.is_some())
        .map(|r| r.text.chars().count())
        .max()
        .unwrap_or(0)
        .min(INSTRUCTION_COLUMN);
    let indent = 2 + count_width + 2 + share_width + 2 + offset_width + 2;
    writeln!(
        out,
        "  {:>count_width$}  {:>share_width$}  {:<offset_width$}  INSTRUCTION",
        "COUNT", "%CALLS", "OFFSET"
    )?;
    for row in rows {
        let (count, share) = row.count.clone().unwrap_or_default();
        let marker = if row.hot { '▶' } else { ' ' };
        let mut line = format!(
            "{marker} {count:>count_width$}  {share:>share_width$}  {:<offset_width$}  {}",
            row.offset, row.text
        );
        if let Some(note) = &row.note {
            let padding = text_width.saturating_sub(row.text.chars().count());
            let joined = format!("{line}{}  {note}", " ".repeat(padding));
            if joined.chars().count() <= MAX_WIDTH {
                line = joined;
            } else {
                line = format!("{line}\n{}  {note}", " ".repeat(indent));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// An Intel-syntax formatter (lowercase, `0x` hex) that names branch targets by `names`.
fn intel_formatter(names: HashMap<u64, String>) -> IntelFormatter {
    let mut formatter = IntelFormatter::with_options(Some(Box::new(BranchNames(names))), None);
    let options = formatter.options_mut();
    options.set_hex_prefix("0x");
    options.set_hex_suffix("");
    options.set_uppercase_hex(false);
    options.set_branch_leading_zeros(false);
    options.set_show_branch_size(false);
    options.set_rip_relative_addresses(true);
    formatter
}

/// Names of branch targets; other addresses are printed as numbers.
struct BranchNames(HashMap<u64, String>);

impl SymbolResolver for BranchNames {
    fn symbol(
        &mut self,
        instruction: &Instruction,
        _operand: u32,
        instruction_operand: Option<u32>,
        address: u64,
        _address_size: u32,
    ) -> Option<SymbolResult<'_>> {
        let operand = instruction_operand?;
        let branch = matches!(
            instruction.op_kind(operand),
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
        );
        let name = self.0.get(&address).filter(|_| branch)?;
        Some(SymbolResult::with_str(address, name))
    }
}

#[cfg(test)]
mod tests;
