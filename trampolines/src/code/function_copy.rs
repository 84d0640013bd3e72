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

use super::control_flow::{BlockExit, ControlFlowGraph, FunctionBytes};
use super::jump_table::EntryKind;
use assembly::Plan;
use iced_x86::{BlockEncoder, BlockEncoderOptions, Instruction, InstructionBlock};
use std::fmt;

mod assembly;
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

/// The calls and tail jumps through pointers of `graph` (original addresses, sorted):
/// where a copy asks [`CounterCode::through_pointer`] for code.
pub fn pointer_sites(graph: &ControlFlowGraph, code: &FunctionBytes) -> Vec<u64> {
    assembly::pointer_sites(graph, code)
}

/// Whether the code at `start` may call or jump through a pointer (`call`/`jmp` with a
/// register or memory operand, a switch's table jump included): a linear decode, much
/// cheaper than the graph, that rules out most functions before [`pointer_sites`].
pub fn may_branch_through_pointers(code: &[u8], start: u64) -> bool {
    iced_x86::Decoder::with_ip(64, code, start, iced_x86::DecoderOptions::NONE)
        .into_iter()
        .any(|instruction| {
            matches!(
                instruction.code(),
                iced_x86::Code::Call_rm64 | iced_x86::Code::Jmp_rm64
            )
        })
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
    /// What the original instruction after this code becomes, if not itself (a call
    /// through a pointer made through `r11`, which the check before it loaded).
    pub replacement: Option<Instruction>,
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
    let mut labels = Labels::new();
    let plan = Plan::new(graph, code, &mut labels, counters)?;
    // The tables follow the code, whose length depends on nothing the tables' place
    // changes (RIP-relative displacements are always 32 bits): encode once to learn
    // it, then again with the tables' real place.
    let first = plan.assemble(address, &mut labels, counters)?;
    let first_len = encode(&first, address)?.code_buffer.len() as u64;
    let tables_at = (address + first_len + 7) & !7;
    let pending = plan.assemble(tables_at, &mut labels, counters)?;
    let encoded = encode(&pending, address)?;
    let code_len = encoded.code_buffer.len() as u64;
    if code_len != first_len {
        return Err(CopyRefusal::Encoding(format!(
            "its length changed from {first_len} to {code_len} bytes between passes"
        )));
    }
    let placed = Placed {
        pending: &pending,
        offsets: &encoded.new_instruction_offsets,
        address,
    };
    let bytes = placed.with_tables(&encoded.code_buffer, &plan.tables, tables_at)?;
    Ok(FunctionCopy {
        address,
        bytes,
        code_len,
        instructions: placed.instructions(),
        block_starts: placed.block_starts(&plan, graph),
    })
}

/// The copy's instructions, encoded: each at `address` plus its offset.
struct Placed<'a> {
    pending: &'a [Pending],
    offsets: &'a [u32],
    address: u64,
}

impl Placed<'_> {
    /// Where the instruction named `label` is in the copy.
    fn copy_at(&self, label: u64) -> u64 {
        let index = self
            .pending
            .iter()
            .position(|p| p.instruction.ip() == label)
            .expect("a stub label names an instruction");
        self.address + u64::from(self.offsets[index])
    }

    /// The copy's bytes: its `code`, then from `tables_at` on the copied tables, their
    /// entries naming their stubs.
    fn with_tables(
        &self,
        code: &[u8],
        tables: &[TableCopy],
        tables_at: u64,
    ) -> Result<Vec<u8>, CopyRefusal> {
        let address = self.address;
        let mut bytes = code.to_vec();
        bytes.resize((tables_at - address) as usize, 0xcc);
        for table in tables {
            let base = tables_at + table.offset;
            bytes.resize((base - address) as usize, 0);
            for &stub in &table.stubs {
                let stub = self.copy_at(stub);
                match table.entries {
                    EntryKind::Relative32 => {
                        let relative = i32::try_from(stub as i64 - base as i64).map_err(|_| {
                            CopyRefusal::Encoding("a table entry out of reach".into())
                        })?;
                        bytes.extend_from_slice(&relative.to_le_bytes());
                    }
                    EntryKind::Absolute64 => bytes.extend_from_slice(&stub.to_le_bytes()),
                }
            }
        }
        Ok(bytes)
    }

    fn instructions(&self) -> Vec<PlacedInstruction> {
        self.pending
            .iter()
            .zip(self.offsets)
            // An instruction iced rewrote into several (a far branch) keeps no offset; its
            // bytes belong to the instruction before it, which has the same row.
            .filter(|(_, offset)| **offset != u32::MAX)
            .map(|(p, &offset)| PlacedInstruction {
                copy: self.address + u64::from(offset),
                original: p.original,
                row_of: p.row_of,
                extra_stack: p.extra_stack,
            })
            .collect()
    }

    /// Where each block of `graph` starts in the copy.
    fn block_starts(&self, plan: &Plan, graph: &ControlFlowGraph) -> Vec<u64> {
        let pending = self.pending;
        // A block's label is its counter's first instruction (or, with no counter code,
        // its own first instruction's).
        plan.block_labels
            .iter()
            .zip(&plan.pad_labels)
            .map(|(&label, pad)| pad.unwrap_or(label))
            .zip(&graph.blocks)
            .map(|(label, block)| {
                let first = pending
                    .iter()
                    .position(|p| p.instruction.ip() == label)
                    .or_else(|| pending.iter().position(|p| p.original == Some(block.start)))
                    .expect("every block is copied");
                self.address + u64::from(self.offsets[first])
            })
            .collect()
    }
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
