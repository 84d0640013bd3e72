//! A function's basic blocks and control-flow graph, built from its machine code.
//!
//! The one idea: decode only what can run. [`ControlFlowGraph::build`] follows the code
//! from the entry — fall-throughs, both sides of every conditional branch, the targets
//! of direct jumps and of resolved jump tables (`jump_table`) — so padding and data
//! between functions are never taken for code. Every place a branch lands starts a
//! block, and every block ends at a branch, a return, a call (whose callee may not come
//! back), or the start of the next block.
//!
//! What cannot be followed exactly is refused with the reason: bytes that do not decode,
//! a branch into the middle of an instruction, an indirect jump that is neither a jump
//! table nor a jump through a code pointer, a table without a bound, transactional
//! memory. A branch that leaves the function (a tail call, a jump to a `.cold` part the
//! caller did not give) is an edge out of it, as is a return. The `.cold` parts a
//! compiler split off (`FunctionBytes`) are followed like the rest: their blocks come
//! after the main part's.

use super::jump_table::{self, EntryKind, IndirectJump, Unresolved};
use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, Instruction};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Largest function read, in bytes.
pub const MAX_FUNCTION_BYTES: usize = 1 << 20;

/// A function's control-flow graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlFlowGraph {
    /// The entry address.
    pub start: u64,
    /// The blocks: the main part's in address order (`blocks[0]` starts at the entry),
    /// then each `.cold` part's.
    pub blocks: Vec<Block>,
}

/// A function's bytes: its main part, from its entry, then the `.cold` parts the
/// compiler split off it (code only a jump from the function reaches).
#[derive(Debug, Clone, Copy)]
pub struct FunctionBytes<'a> {
    parts: [(u64, &'a [u8]); MAX_PARTS],
    count: usize,
}

/// The main part and at most this many `.cold` parts less one.
pub const MAX_PARTS: usize = 4;

impl<'a> FunctionBytes<'a> {
    /// A function all in one part: `code` from `start`.
    pub fn new(start: u64, code: &'a [u8]) -> FunctionBytes<'a> {
        FunctionBytes {
            parts: [(start, code); MAX_PARTS],
            count: 1,
        }
    }

    /// With a `.cold` part too: `code` from `start` (past [`MAX_PARTS`], ignored).
    pub fn with_part(mut self, start: u64, code: &'a [u8]) -> FunctionBytes<'a> {
        if self.count < MAX_PARTS {
            self.parts[self.count] = (start, code);
            self.count += 1;
        }
        self
    }

    /// The parts, the main one first.
    pub fn parts(&self) -> &[(u64, &'a [u8])] {
        &self.parts[..self.count]
    }

    /// Which part holds `address`.
    pub fn part_of(&self, address: u64) -> Option<usize> {
        self.parts()
            .iter()
            .position(|&(start, code)| (start..start + code.len() as u64).contains(&address))
    }

    /// The bytes from `address` to the end of its part (empty outside the function).
    pub fn from(&self, address: u64) -> &'a [u8] {
        match self.part_of(address) {
            Some(part) => {
                let (start, code) = self.parts[part];
                &code[(address - start) as usize..]
            }
            None => &[],
        }
    }

    /// The bytes of `from..to`, cut at the end of `from`'s part.
    pub fn slice(&self, from: u64, to: u64) -> &'a [u8] {
        let bytes = self.from(from);
        &bytes[..(to.saturating_sub(from) as usize).min(bytes.len())]
    }

    fn len(&self) -> usize {
        self.parts().iter().map(|(_, code)| code.len()).sum()
    }
}

/// A basic block: straight-line code entered only at its start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// Address of its first instruction.
    pub start: u64,
    /// Address just past its last instruction.
    pub end: u64,
    /// Addresses of its instructions, in order.
    pub instructions: Vec<u64>,
    /// How it ends.
    pub exit: BlockExit,
}

/// Where control goes from a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Successor {
    /// Into the block with this index.
    Block(usize),
    /// Out of the function, to this address (a tail call, a `.cold` part, or past its
    /// end after a call that does not return).
    Leaves(u64),
}

/// How a block ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockExit {
    /// Runs on into the next instruction, where another block starts.
    FallThrough(Successor),
    /// An unconditional direct `jmp`.
    Jump(Successor),
    /// A conditional branch at `branch`: `taken` when its condition holds.
    Conditional {
        branch: u64,
        taken: Successor,
        not_taken: Successor,
    },
    /// An indirect jump at `jump` through the table at `table`: block per entry.
    /// `entries` and `references` as in [`IndirectJump::Table`].
    Table {
        jump: u64,
        table: u64,
        targets: Vec<usize>,
        entries: EntryKind,
        references: Vec<u64>,
    },
    /// An indirect jump through a code pointer: leaves the function.
    ThroughPointer { jump: u64 },
    /// A `ret`.
    Return,
    /// An instruction after which nothing runs (`ud2`, `int3`, `hlt`).
    Stops,
}

impl BlockExit {
    /// Every successor, in a fixed order (taken before not taken; table entries in
    /// order, without repeats); returns and stops have none.
    pub fn successors(&self) -> Vec<Successor> {
        match self {
            Self::FallThrough(next) | Self::Jump(next) => vec![*next],
            Self::Conditional {
                taken, not_taken, ..
            } => vec![*taken, *not_taken],
            Self::Table { targets, .. } => {
                let mut seen = BTreeSet::new();
                targets
                    .iter()
                    .filter(|&&target| seen.insert(target))
                    .map(|&target| Successor::Block(target))
                    .collect()
            }
            Self::ThroughPointer { .. } | Self::Return | Self::Stops => Vec::new(),
        }
    }
}

/// Why a function's control flow cannot be followed exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CfgRefusal {
    /// Bytes that do not decode, or an instruction running past the function's end.
    Undecodable { at: u64 },
    /// A branch at `from` lands inside the instruction that covers `to`.
    IntoInstruction { from: u64, to: u64 },
    /// The instructions at `first` and `second` overlap: code reached both ways jumps
    /// into the middle of an instruction.
    Overlapping { first: u64, second: u64 },
    /// An indirect jump whose targets tendril cannot work out.
    UnresolvedJump { at: u64, why: Unresolved },
    /// Transactional memory (`xbegin`), whose abort path is a hidden branch.
    Transactional { at: u64 },
    /// Larger than [`MAX_FUNCTION_BYTES`].
    TooLarge { size: usize },
}

impl fmt::Display for CfgRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Undecodable { at } => write!(f, "undecodable instruction at {at:#x}"),
            Self::IntoInstruction { from, to } => write!(
                f,
                "the branch at {from:#x} jumps into the middle of an instruction ({to:#x})"
            ),
            Self::Overlapping { first, second } => write!(
                f,
                "the instructions at {first:#x} and {second:#x} overlap (a jump into the \
                 middle of an instruction)"
            ),
            Self::UnresolvedJump { at, why } => {
                let why = match why {
                    Unresolved::Unknown => "not a jump table tendril recognises".to_string(),
                    Unresolved::Unbounded => "a jump table with no bound check".to_string(),
                    Unresolved::TooLarge { entries } => {
                        format!("a jump table of {entries} entries")
                    }
                    Unresolved::Unreadable { table } => {
                        format!("its jump table at {table:#x} cannot be read")
                    }
                };
                write!(f, "the indirect jump at {at:#x} is {why}")
            }
            Self::Transactional { at } => {
                write!(f, "transactional memory at {at:#x} hides a branch")
            }
            Self::TooLarge { size } => write!(
                f,
                "{size} bytes, more than the {MAX_FUNCTION_BYTES} tendril reads"
            ),
        }
    }
}

/// A decoded instruction and what it does to control flow.
struct Decoded {
    instruction: Instruction,
    /// Block-ending: what follows it.
    exit: Option<BlockExitAt>,
}

/// A block's end in terms of addresses, before blocks have indices.
enum BlockExitAt {
    Jump(u64),
    Conditional(u64),
    Table {
        table: u64,
        targets: Vec<u64>,
        entries: EntryKind,
        references: Vec<u64>,
    },
    ThroughPointer,
    Return,
    Stops,
}

impl ControlFlowGraph {
    /// Every block's edges, in [`BlockExit::successors`] order: `Some(block)` inside
    /// the function, `None` out of it (empty for a block with none), as
    /// `tendril_callgraph::paths::PathNumbering` takes them. An edge's index in the
    /// numbering is its position here, counting a block with none as having one.
    pub fn edge_lists(&self) -> Vec<Vec<Option<usize>>> {
        self.blocks
            .iter()
            .map(|block| {
                block
                    .exit
                    .successors()
                    .into_iter()
                    .map(|successor| match successor {
                        Successor::Block(index) => Some(index),
                        Successor::Leaves(_) => None,
                    })
                    .collect()
            })
            .collect()
    }

    /// The graph of the function at `start`, whose bytes are `code`. `read` fetches
    /// other memory (jump tables) and returns false where it cannot.
    #[cfg(test)]
    pub fn build(
        start: u64,
        code: &[u8],
        read: &dyn Fn(u64, &mut [u8]) -> bool,
    ) -> Result<ControlFlowGraph, CfgRefusal> {
        Self::build_with_entries(&FunctionBytes::new(start, code), read, &[])
    }

    /// The graph of the function `bytes` holds (its `.cold` parts included), followed
    /// from its entry and from `entries` too: code inside it that only the unwinder
    /// reaches (its landing pads), each a block.
    pub fn build_with_entries(
        bytes: &FunctionBytes,
        read: &dyn Fn(u64, &mut [u8]) -> bool,
        entries: &[u64],
    ) -> Result<ControlFlowGraph, CfgRefusal> {
        if bytes.len() > MAX_FUNCTION_BYTES {
            return Err(CfgRefusal::TooLarge { size: bytes.len() });
        }
        let start = bytes.parts[0].0;
        let inside = |address: u64| bytes.part_of(address).is_some();
        let mut decoded: BTreeMap<u64, Decoded> = BTreeMap::new();
        let mut leaders = BTreeSet::from([start]);
        // (where to decode from, the branch that leads there)
        let mut pending = vec![(start, start)];
        for &entry in entries.iter().filter(|&&entry| inside(entry)) {
            leaders.insert(entry);
            pending.push((entry, entry));
        }
        while let Some((mut ip, from)) = pending.pop() {
            // The instructions run in a straight line before `ip`, for jump tables.
            let mut run: Vec<Instruction> = Vec::new();
            while inside(ip) && !decoded.contains_key(&ip) {
                if let Some((&before, previous)) = decoded.range(..ip).next_back()
                    && before + previous.instruction.len() as u64 > ip
                {
                    return Err(CfgRefusal::IntoInstruction { from, to: ip });
                }
                let rest = bytes.from(ip);
                let mut decoder = Decoder::with_ip(64, rest, ip, DecoderOptions::NONE);
                let instruction = decoder.decode();
                let next = instruction.next_ip();
                if instruction.code() == Code::INVALID || next > ip + rest.len() as u64 {
                    return Err(CfgRefusal::Undecodable { at: ip });
                }
                if let Some((&after, _)) = decoded.range(ip + 1..).next()
                    && after < next
                {
                    return Err(CfgRefusal::Overlapping {
                        first: ip,
                        second: after,
                    });
                }
                let exit = block_exit(&instruction, &run, read)?;
                match &exit {
                    Some(BlockExitAt::Jump(target) | BlockExitAt::Conditional(target))
                        if inside(*target) =>
                    {
                        leaders.insert(*target);
                        pending.push((*target, ip));
                    }
                    Some(BlockExitAt::Table { targets, .. }) => {
                        for &target in targets {
                            if !inside(target) {
                                return Err(CfgRefusal::UnresolvedJump {
                                    at: ip,
                                    why: Unresolved::Unknown,
                                });
                            }
                            leaders.insert(target);
                            pending.push((target, ip));
                        }
                    }
                    _ => {}
                }
                let goes_on = matches!(exit, None | Some(BlockExitAt::Conditional(_)));
                // A call ends a block too: the callee may not come back (an exception,
                // `longjmp`, `exit`), so a block's count is of runs that reach its end.
                let calls = matches!(
                    instruction.flow_control(),
                    FlowControl::Call | FlowControl::IndirectCall
                );
                if exit.is_some() || calls {
                    leaders.insert(next);
                }
                decoded.insert(ip, Decoded { instruction, exit });
                run.push(instruction);
                if !goes_on {
                    break;
                }
                ip = next;
            }
        }
        Ok(Self::blocks(bytes, &decoded, &leaders))
    }

    /// Splits the decoded instructions into blocks at the leaders and block ends, the
    /// main part's first.
    fn blocks(
        bytes: &FunctionBytes,
        decoded: &BTreeMap<u64, Decoded>,
        leaders: &BTreeSet<u64>,
    ) -> ControlFlowGraph {
        let start = bytes.parts[0].0;
        // Block starts: decoded leaders, and instructions not reached by fall-through.
        let mut starts = Vec::new();
        let mut expected_next = None;
        for (&ip, instruction) in decoded {
            if leaders.contains(&ip) || expected_next != Some(ip) {
                starts.push(ip);
            }
            expected_next = instruction
                .exit
                .is_none()
                .then(|| instruction.instruction.next_ip());
        }
        // Blocks in order of part, then of address; each ends before the next start in
        // address order.
        let rank = |address: u64| (bytes.part_of(address).unwrap_or(usize::MAX), address);
        let mut order = starts.clone();
        order.sort_by_key(|&address| rank(address));
        let index_of = |address: u64| {
            order
                .binary_search_by_key(&rank(address), |&s| rank(s))
                .ok()
        };
        let successor = |address: u64| match index_of(address) {
            Some(index) => Successor::Block(index),
            None => Successor::Leaves(address),
        };
        let mut blocks = Vec::with_capacity(starts.len());
        for &block_start in &order {
            let next = starts.partition_point(|&s| s <= block_start);
            let block_end = starts.get(next).copied().unwrap_or(u64::MAX);
            let mut instructions = Vec::new();
            let mut exit = None;
            let mut end = block_start;
            for (&ip, instruction) in decoded.range(block_start..block_end) {
                instructions.push(ip);
                end = instruction.instruction.next_ip();
                let last = &instruction.instruction;
                exit = Some(match &instruction.exit {
                    None => BlockExit::FallThrough(successor(end)),
                    Some(BlockExitAt::Jump(target)) => BlockExit::Jump(successor(*target)),
                    Some(BlockExitAt::Conditional(target)) => BlockExit::Conditional {
                        branch: ip,
                        taken: successor(*target),
                        not_taken: successor(last.next_ip()),
                    },
                    Some(BlockExitAt::Table {
                        table,
                        targets,
                        entries,
                        references,
                    }) => BlockExit::Table {
                        jump: ip,
                        table: *table,
                        entries: *entries,
                        references: references.clone(),
                        targets: targets
                            .iter()
                            .map(|&target| index_of(target).expect("a table target is a leader"))
                            .collect(),
                    },
                    Some(BlockExitAt::ThroughPointer) => BlockExit::ThroughPointer { jump: ip },
                    Some(BlockExitAt::Return) => BlockExit::Return,
                    Some(BlockExitAt::Stops) => BlockExit::Stops,
                });
                if instruction.exit.is_some() || decoded.get(&end).is_none() {
                    break;
                }
            }
            blocks.push(Block {
                start: block_start,
                end,
                instructions,
                exit: exit.expect("a block has an instruction"),
            });
        }
        ControlFlowGraph { start, blocks }
    }

    /// The index of the block that starts at `address`.
    #[cfg(test)]
    pub fn block_at(&self, address: u64) -> Option<usize> {
        self.blocks
            .binary_search_by_key(&address, |block| block.start)
            .ok()
    }
}

/// What `instruction` does to control flow: `None` if it runs on into the next one.
fn block_exit(
    instruction: &Instruction,
    run: &[Instruction],
    read: &dyn Fn(u64, &mut [u8]) -> bool,
) -> Result<Option<BlockExitAt>, CfgRefusal> {
    let at = instruction.ip();
    Ok(Some(match instruction.flow_control() {
        FlowControl::Next | FlowControl::Call | FlowControl::IndirectCall => return Ok(None),
        FlowControl::Interrupt => match instruction.code() {
            Code::Int3 | Code::Int1 => BlockExitAt::Stops,
            // `syscall`, `int 0x80`: the kernel returns to the next instruction.
            _ => return Ok(None),
        },
        FlowControl::ConditionalBranch => {
            BlockExitAt::Conditional(instruction.near_branch_target())
        }
        FlowControl::UnconditionalBranch => BlockExitAt::Jump(instruction.near_branch_target()),
        FlowControl::IndirectBranch => match jump_table::resolve(instruction, run, read) {
            Ok(IndirectJump::Table {
                table,
                targets,
                entries,
                references,
            }) => BlockExitAt::Table {
                table,
                targets,
                entries,
                references,
            },
            Ok(IndirectJump::ThroughPointer) => BlockExitAt::ThroughPointer,
            Err(why) => return Err(CfgRefusal::UnresolvedJump { at, why }),
        },
        FlowControl::Return => BlockExitAt::Return,
        FlowControl::Exception => BlockExitAt::Stops,
        FlowControl::XbeginXabortXend => return Err(CfgRefusal::Transactional { at }),
    }))
}

// Safe code only: Miri (which CI runs over `code::`) would add nothing but hours.
#[cfg(all(test, not(miri)))]
mod tests;

// Safe code only: Miri (which CI runs over `code::`) would add nothing but hours.
#[cfg(all(test, not(miri)))]
mod real_code_tests;
