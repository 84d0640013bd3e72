//! A whole function copied to new memory with counters inserted on its control flow:
//! the code behind `tendril edges` (issue 18).
//!
//! The one idea: re-encode every instruction with iced's `BlockEncoder`, giving every
//! instruction a synthetic address (a label) and pointing every branch inside the
//! function at the label it must reach in the copy. The copy then runs on its own:
//! - each basic block starts with a counter of its starts;
//! - a conditional branch goes to an out-of-line stub that counts the taken edge and
//!   jumps on, so the not-taken path stays a straight fall-through;
//! - each jump table is copied, its entries pointing at one stub per entry (counting
//!   that entry, then jumping to the entry's block), and the instructions that name
//!   the table (its `lea` or absolute load) name the copy instead;
//! - calls, tail calls and jumps out of the function, and RIP-relative data, keep their
//!   original absolute targets (the copy lies within ±2 GiB, as trampolines do). A call
//!   of the function itself (recursion) goes through the patched entry again, so it is
//!   counted as a call.
//!
//! The counters' machine code is the caller's (`CounterCode`): this layer knows where
//! counters go and whether the flags are live there (`flags_liveness`), not how a
//! thread finds its counters. For each instruction of the copy it says which original
//! instruction's unwind row applies and how far inserted code has moved the stack
//! pointer, so the copy's unwind information can be written (`copy_unwind`).

use super::control_flow::{BlockExit, ControlFlowGraph, FunctionBytes, Successor};
use super::flags_liveness;
use super::jump_table::EntryKind;
use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, Instruction, InstructionBlock,
};
use std::collections::BTreeMap;
use std::fmt;

mod counter_code;
pub use counter_code::CounterCode;

/// What a counter counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CounterSite {
    /// Every start of the block with this index.
    Block(usize),
    /// The taken edge of this block's conditional branch.
    Taken(usize),
    /// Jumps through entry `entry` of this block's jump table.
    TableEntry { block: usize, entry: usize },
}

/// Every counter a copy of `graph` has, in index order: per block, its start, then its
/// taken edge or its table's entries.
pub fn counter_sites(graph: &ControlFlowGraph) -> Vec<CounterSite> {
    let mut sites = Vec::new();
    for (index, block) in graph.blocks.iter().enumerate() {
        sites.push(CounterSite::Block(index));
        match &block.exit {
            BlockExit::Conditional { .. } => sites.push(CounterSite::Taken(index)),
            BlockExit::Table { targets, .. } => {
                sites.extend((0..targets.len()).map(|entry| CounterSite::TableEntry {
                    block: index,
                    entry,
                }))
            }
            _ => {}
        }
    }
    sites
}

/// Synthetic addresses that name instructions of the copy while it is encoded. They
/// are non-canonical, so no real branch target can be one of them.
pub struct Labels {
    next: u64,
}

impl Labels {
    fn new() -> Labels {
        Labels {
            next: 0xffff_f000_0000_0000,
        }
    }

    /// Labels for a test of code made with them.
    #[cfg(test)]
    pub fn new_for_tests() -> Labels {
        Labels::new()
    }

    /// A fresh label.
    pub fn create(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

/// Code inserted into the copy: instructions with, for each, the bytes it has pushed
/// below the original stack pointer when that instruction starts.
#[derive(Debug, Clone, Default)]
pub struct Inserted {
    pub instructions: Vec<Instruction>,
    pub extra_stack: Vec<u32>,
}

/// One instruction of the copy, in copy order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacedInstruction {
    /// Its address in the copy.
    pub copy: u64,
    /// The original instruction it is a copy of; `None` for inserted code.
    pub original: Option<u64>,
    /// The original instruction whose unwind row applies here.
    pub row_of: u64,
    /// Bytes inserted code has pushed below the original stack pointer here.
    pub extra_stack: u32,
}

/// A function's copy, ready to be written at `address`.
#[derive(Debug, Clone)]
pub struct FunctionCopy {
    pub address: u64,
    /// The code (its entry at `address`), then the copied jump tables.
    pub bytes: Vec<u8>,
    /// Length of the code part of `bytes`: the range the copy's unwind information
    /// covers.
    pub code_len: u64,
    /// Every instruction of the code part, in address order.
    pub instructions: Vec<PlacedInstruction>,
    /// Where each block of the graph starts in the copy (at its counter), or for a
    /// landing pad with code of its own, where the unwinder is to enter it.
    pub block_starts: Vec<u64>,
}

impl FunctionCopy {
    /// Where the copy of the original instruction at `original` is.
    pub fn copy_of(&self, original: u64) -> Option<u64> {
        self.instructions
            .iter()
            .find(|placed| placed.original == Some(original))
            .map(|placed| placed.copy)
    }

    /// The copy's pieces of the original instructions in `start..end`: each
    /// instruction's bytes, contiguous ones joined.
    pub fn pieces_of(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let code_end = self.address + self.code_len;
        let mut pieces: Vec<(u64, u64)> = Vec::new();
        for (index, placed) in self.instructions.iter().enumerate() {
            if !placed.original.is_some_and(|o| (start..end).contains(&o)) {
                continue;
            }
            let next = self
                .instructions
                .get(index + 1)
                .map_or(code_end, |p| p.copy);
            match pieces.last_mut() {
                Some(last) if last.1 == placed.copy => last.1 = next,
                _ => pieces.push((placed.copy, next)),
            }
        }
        pieces
    }
}

/// Why a function cannot be copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyRefusal {
    /// Two indirect jumps use the jump table at `table`.
    SharedTable { table: u64 },
    /// An absolute table's copy would lie beyond what a 32-bit displacement reaches.
    TableOutOfReach { table: u64 },
    /// iced-x86 could not encode the copy (e.g. data out of reach).
    Encoding(String),
}

impl fmt::Display for CopyRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SharedTable { table } => write!(
                f,
                "two indirect jumps share the jump table at {table:#x}, which tendril does \
                 not copy yet"
            ),
            Self::TableOutOfReach { table } => write!(
                f,
                "the jump table at {table:#x} is addressed absolutely and its copy cannot \
                 be placed within 2 GiB of address 0"
            ),
            Self::Encoding(why) => write!(f, "its copy cannot be encoded: {why}"),
        }
    }
}

/// An instruction of the copy before encoding, with what [`PlacedInstruction`] says.
struct Pending {
    instruction: Instruction,
    original: Option<u64>,
    row_of: u64,
    extra_stack: u32,
}

/// A table's copy: where it is in `bytes`, and the labels of its entries' stubs.
struct TableCopy {
    original: u64,
    entries: EntryKind,
    offset: u64,
    stubs: Vec<u64>,
}

/// Copies the function `graph` describes (its bytes `code` start at `graph.start`) to
/// `address`, with the counters of [`counter_sites`] written by `counters`.
pub fn build(
    graph: &ControlFlowGraph,
    code: &FunctionBytes,
    address: u64,
    counters: &mut dyn CounterCode,
) -> Result<FunctionCopy, CopyRefusal> {
    let sites = counter_sites(graph);
    let site_index: BTreeMap<CounterSite, usize> =
        sites.iter().enumerate().map(|(i, &s)| (s, i)).collect();
    let live = flags_liveness::live_at_block_starts(graph, code);
    // The path numbering's index of each block's first edge.
    let edge_lists = graph.edge_lists();
    let first_edge: Vec<usize> = edge_lists
        .iter()
        .scan(0, |next, edges| {
            let first = *next;
            *next += edges.len().max(1);
            Some(first)
        })
        .collect();
    let mut labels = Labels::new();
    let block_labels: Vec<u64> = graph.blocks.iter().map(|_| labels.create()).collect();
    // Landing pads with code of their own get an entry before their label.
    let pad_labels: Vec<Option<u64>> = (0..graph.blocks.len())
        .map(|index| counters.is_landing_pad(index).then(|| labels.create()))
        .collect();
    let target = |successor: Successor| match successor {
        Successor::Block(index) => block_labels[index],
        Successor::Leaves(address) => address,
    };
    // Rows for code that runs "between" instructions: the row of where control goes.
    let row_at = |successor: Successor, otherwise: u64| match successor {
        Successor::Block(index) => graph.blocks[index].start,
        Successor::Leaves(_) => otherwise,
    };
    let tables = plan_tables(graph, &mut labels)?;
    let table_base = |tables_at: u64, original: u64| {
        tables
            .iter()
            .find(|t| t.original == original)
            .map(|t| tables_at + t.offset)
    };
    let references: BTreeMap<u64, u64> = graph
        .blocks
        .iter()
        .filter_map(|block| match &block.exit {
            BlockExit::Table {
                table, references, ..
            } => Some(references.iter().map(move |&at| (at, *table))),
            _ => None,
        })
        .flatten()
        .collect();

    let assemble = |tables_at: u64, labels: &mut Labels, counters: &mut dyn CounterCode| {
        let mut pending: Vec<Pending> = Vec::new();
        // Inserted code; its first instruction takes `first_label` when there is one.
        let emit = |pending: &mut Vec<Pending>,
                    inserted: Inserted,
                    first_label: Option<u64>,
                    row_of: u64,
                    labels: &mut Labels| {
            for (k, (mut instruction, extra)) in inserted
                .instructions
                .into_iter()
                .zip(inserted.extra_stack)
                .enumerate()
            {
                match first_label {
                    Some(label) if k == 0 => instruction.set_ip(label),
                    _ if instruction.ip() == 0 => instruction.set_ip(labels.create()),
                    _ => {}
                }
                pending.push(Pending {
                    instruction,
                    original: None,
                    row_of,
                    extra_stack: extra,
                });
            }
        };
        let jump = |to: u64, row_of: u64, labels: &mut Labels| -> Result<Pending, CopyRefusal> {
            let mut instruction =
                Instruction::with_branch(Code::Jmp_rel32_64, to).map_err(encoding)?;
            instruction.set_ip(labels.create());
            Ok(Pending {
                instruction,
                original: None,
                row_of,
                extra_stack: 0,
            })
        };
        let mut taken_stubs: Vec<(usize, u64, Successor, u64)> = Vec::new();
        // Each call's first code, before block 0's label (which loops may jump to).
        let entry = counters.entry(labels);
        emit(&mut pending, entry, None, graph.start, labels);
        for (index, block) in graph.blocks.iter().enumerate() {
            if let Some(pad_label) = pad_labels[index] {
                let pad = counters.landing_pad(index, live[index], block.start, labels);
                emit(&mut pending, pad, Some(pad_label), block.start, labels);
            }
            let counter =
                counters.counter(site_index[&CounterSite::Block(index)], live[index], labels);
            emit(
                &mut pending,
                counter,
                Some(block_labels[index]),
                block.start,
                labels,
            );
            let bytes = code.slice(block.start, block.end);
            let decoder = Decoder::with_ip(64, bytes, block.start, DecoderOptions::NONE);
            let mut last = block.start;
            for mut instruction in decoder {
                let original = instruction.ip();
                last = original;
                if let Some(&table) = references.get(&original) {
                    let copy = table_base(tables_at, table).expect("every table is planned");
                    let named = instruction.memory_displacement64();
                    let moved = named.wrapping_add(copy).wrapping_sub(table);
                    if !instruction.is_ip_rel_memory_operand()
                        && i32::try_from(moved as i64).is_err()
                    {
                        return Err(CopyRefusal::TableOutOfReach { table });
                    }
                    instruction.set_memory_displacement64(moved);
                }
                if original == last_instruction(block) {
                    // The edge code of a jump or a way out runs before it.
                    let edge_before = match &block.exit {
                        BlockExit::Jump(to) => Some(taken_live(*to, &live)),
                        BlockExit::Return | BlockExit::ThroughPointer { .. } => Some(false),
                        _ => None,
                    };
                    if let Some(flags_live) = edge_before {
                        let code = counters.edge(first_edge[index], flags_live, original, labels);
                        emit(&mut pending, code, None, original, labels);
                    }
                    match &block.exit {
                        BlockExit::Jump(to) => instruction.set_near_branch64(target(*to)),
                        BlockExit::Conditional { taken, .. } => {
                            let stub = labels.create();
                            instruction.set_near_branch64(stub);
                            taken_stubs.push((index, stub, *taken, original));
                        }
                        _ => {}
                    }
                }
                instruction.set_ip(labels.create());
                pending.push(Pending {
                    instruction,
                    original: Some(original),
                    row_of: original,
                    extra_stack: 0,
                });
            }
            // A fall-through edge (or a not-taken one, the second of its block's) runs
            // its code before the next block's label.
            let runs_on_to = match &block.exit {
                BlockExit::FallThrough(next) => Some((*next, first_edge[index])),
                BlockExit::Conditional { not_taken, .. } => {
                    Some((*not_taken, first_edge[index] + 1))
                }
                _ => None,
            };
            if let Some((next, edge)) = runs_on_to {
                let row_of = row_at(next, last);
                let code = counters.edge(edge, taken_live(next, &live), row_of, labels);
                emit(&mut pending, code, None, row_of, labels);
                // Into the next block over its landing-pad code, or elsewhere: a jump.
                let over_pad = pad_labels.get(index + 1).is_some_and(Option::is_some);
                if next != Successor::Block(index + 1) || over_pad {
                    pending.push(jump(target(next), row_of, labels)?);
                }
            }
        }
        for (index, stub, taken, branch) in taken_stubs {
            let row_of = row_at(taken, branch);
            let flags_live = taken_live(taken, &live);
            let counter =
                counters.counter(site_index[&CounterSite::Taken(index)], flags_live, labels);
            emit(&mut pending, counter, Some(stub), row_of, labels);
            let code = counters.edge(first_edge[index], flags_live, row_of, labels);
            emit(&mut pending, code, None, row_of, labels);
            pending.push(jump(target(taken), row_of, labels)?);
        }
        for (index, block) in graph.blocks.iter().enumerate() {
            let BlockExit::Table { table, targets, .. } = &block.exit else {
                continue;
            };
            let stubs = &tables
                .iter()
                .find(|t| t.original == *table)
                .expect("every table is planned")
                .stubs;
            let distinct = &edge_lists[index];
            for (entry, (&to, &stub)) in targets.iter().zip(stubs).enumerate() {
                let row_of = graph.blocks[to].start;
                let site = CounterSite::TableEntry {
                    block: index,
                    entry,
                };
                let counter = counters.counter(site_index[&site], live[to], labels);
                emit(&mut pending, counter, Some(stub), row_of, labels);
                let position = distinct
                    .iter()
                    .position(|&target| target == Some(to))
                    .expect("every table target is one of its block's edges");
                let code = counters.edge(first_edge[index] + position, live[to], row_of, labels);
                emit(&mut pending, code, None, row_of, labels);
                pending.push(jump(block_labels[to], row_of, labels)?);
            }
        }
        Ok(pending)
    };

    // The tables follow the code, whose length depends on nothing the tables' place
    // changes (RIP-relative displacements are always 32 bits): encode once to learn
    // it, then again with the tables' real place.
    let first = assemble(address, &mut labels, counters)?;
    let first_len = encode(&first, address)?.code_buffer.len() as u64;
    let tables_at = (address + first_len + 7) & !7;
    let pending = assemble(tables_at, &mut labels, counters)?;
    let encoded = encode(&pending, address)?;
    let code_len = encoded.code_buffer.len() as u64;
    if code_len != first_len {
        return Err(CopyRefusal::Encoding(format!(
            "its length changed from {first_len} to {code_len} bytes between passes"
        )));
    }
    let copy_at = |label: u64| -> u64 {
        let index = pending
            .iter()
            .position(|p| p.instruction.ip() == label)
            .expect("a stub label names an instruction");
        address + u64::from(encoded.new_instruction_offsets[index])
    };
    let mut bytes = encoded.code_buffer.clone();
    bytes.resize((tables_at - address) as usize, 0xcc);
    for table in &tables {
        let base = tables_at + table.offset;
        bytes.resize((base - address) as usize, 0);
        for &stub in &table.stubs {
            let stub = copy_at(stub);
            match table.entries {
                EntryKind::Relative32 => {
                    let relative = i32::try_from(stub as i64 - base as i64)
                        .map_err(|_| CopyRefusal::Encoding("a table entry out of reach".into()))?;
                    bytes.extend_from_slice(&relative.to_le_bytes());
                }
                EntryKind::Absolute64 => bytes.extend_from_slice(&stub.to_le_bytes()),
            }
        }
    }
    let instructions = pending
        .iter()
        .zip(&encoded.new_instruction_offsets)
        // An instruction iced rewrote into several (a far branch) keeps no offset; its
        // bytes belong to the instruction before it, which has the same row.
        .filter(|(_, offset)| **offset != u32::MAX)
        .map(|(p, &offset)| PlacedInstruction {
            copy: address + u64::from(offset),
            original: p.original,
            row_of: p.row_of,
            extra_stack: p.extra_stack,
        })
        .collect();
    // A block's label is its counter's first instruction (or, with no counter code,
    // its own first instruction's).
    let block_starts = block_labels
        .iter()
        .zip(&pad_labels)
        .map(|(&label, pad)| pad.unwrap_or(label))
        .zip(&graph.blocks)
        .map(|(label, block)| {
            let first = pending
                .iter()
                .position(|p| p.instruction.ip() == label)
                .or_else(|| pending.iter().position(|p| p.original == Some(block.start)))
                .expect("every block is copied");
            address + u64::from(encoded.new_instruction_offsets[first])
        })
        .collect();
    Ok(FunctionCopy {
        address,
        bytes,
        code_len,
        instructions,
        block_starts,
    })
}

/// Whether the flags are live where a taken edge lands.
fn taken_live(taken: Successor, live: &[bool]) -> bool {
    match taken {
        Successor::Block(index) => live[index],
        Successor::Leaves(_) => false,
    }
}

fn last_instruction(block: &crate::code::control_flow::Block) -> u64 {
    *block
        .instructions
        .last()
        .expect("a block has an instruction")
}

/// Where each table's copy goes, relative to the start of the tables, and the labels of
/// its entries' stubs.
fn plan_tables(
    graph: &ControlFlowGraph,
    labels: &mut Labels,
) -> Result<Vec<TableCopy>, CopyRefusal> {
    let mut tables: Vec<TableCopy> = Vec::new();
    let mut offset = 0;
    for block in &graph.blocks {
        let BlockExit::Table {
            table,
            targets,
            entries,
            ..
        } = &block.exit
        else {
            continue;
        };
        if tables.iter().any(|t| t.original == *table) {
            return Err(CopyRefusal::SharedTable { table: *table });
        }
        let size = match entries {
            EntryKind::Relative32 => 4,
            EntryKind::Absolute64 => 8,
        };
        tables.push(TableCopy {
            original: *table,
            entries: *entries,
            offset,
            stubs: targets.iter().map(|_| labels.create()).collect(),
        });
        offset = (offset + size * targets.len() as u64 + 7) & !7;
    }
    Ok(tables)
}

fn encode(pending: &[Pending], address: u64) -> Result<iced_x86::BlockEncoderResult, CopyRefusal> {
    let instructions: Vec<Instruction> = pending.iter().map(|p| p.instruction).collect();
    BlockEncoder::encode(
        64,
        InstructionBlock::new(&instructions, address),
        BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS,
    )
    .map_err(encoding)
}

fn encoding(error: iced_x86::IcedError) -> CopyRefusal {
    CopyRefusal::Encoding(error.to_string())
}

#[cfg(all(test, not(miri)))]
mod tests;
