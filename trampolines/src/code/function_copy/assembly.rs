//! The copy's instructions before encoding: what is planned once per copy (labels,
//! counter sites, where the flags are live, the tables' copies) and the list each
//! encoding pass assembles from it: every block behind its counter, then the stubs of
//! taken edges and of table entries.

use super::{
    CopyRefusal, CounterCode, CounterSite, Inserted, Labels, Pending, TableCopy, counter_sites,
    encoding,
};
use crate::code::control_flow::{Block, BlockExit, ControlFlowGraph, FunctionBytes, Successor};
use crate::code::flags_liveness;
use crate::code::jump_table::EntryKind;
use iced_x86::{Code, Decoder, DecoderOptions, Instruction};
use std::collections::BTreeMap;

/// What every pass of a copy's assembly uses, decided once.
pub(super) struct Plan<'a> {
    graph: &'a ControlFlowGraph,
    code: &'a FunctionBytes<'a>,
    /// Each counter site's index among [`counter_sites`].
    site_index: BTreeMap<CounterSite, usize>,
    /// Whether the flags are live at each block's start.
    live: Vec<bool>,
    edge_lists: Vec<Vec<Option<usize>>>,
    /// The path numbering's index of each block's first edge.
    first_edge: Vec<usize>,
    pub(super) block_labels: Vec<u64>,
    /// Landing pads with code of their own get an entry before their label.
    pub(super) pad_labels: Vec<Option<u64>>,
    pub(super) tables: Vec<TableCopy>,
    /// Each instruction that names a jump table, with the table it names.
    references: BTreeMap<u64, u64>,
}

impl<'a> Plan<'a> {
    pub(super) fn new(
        graph: &'a ControlFlowGraph,
        code: &'a FunctionBytes<'a>,
        labels: &mut Labels,
        counters: &dyn CounterCode,
    ) -> Result<Plan<'a>, CopyRefusal> {
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
        let block_labels: Vec<u64> = graph.blocks.iter().map(|_| labels.create()).collect();
        // Landing pads with code of their own get an entry before their label.
        let pad_labels: Vec<Option<u64>> = (0..graph.blocks.len())
            .map(|index| counters.is_landing_pad(index).then(|| labels.create()))
            .collect();
        let tables = plan_tables(graph, labels)?;
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
        Ok(Plan {
            graph,
            code,
            site_index,
            live,
            edge_lists,
            first_edge,
            block_labels,
            pad_labels,
            tables,
            references,
        })
    }

    /// The copy's instructions, with the tables' copies at `tables_at`.
    pub(super) fn assemble(
        &self,
        tables_at: u64,
        labels: &mut Labels,
        counters: &mut dyn CounterCode,
    ) -> Result<Vec<Pending>, CopyRefusal> {
        let mut assembly = Assembly {
            plan: self,
            tables_at,
            labels,
            counters,
            pending: Vec::new(),
            taken_stubs: Vec::new(),
            carried_label: None,
        };
        // Each call's first code, before block 0's label (which loops may jump to).
        let entry = assembly.counters.entry(assembly.labels);
        assembly.emit(entry, None, self.graph.start);
        for (index, block) in self.graph.blocks.iter().enumerate() {
            assembly.copy_block(index, block)?;
        }
        assembly.taken_edge_stubs()?;
        assembly.table_entry_stubs()?;
        Ok(assembly.pending)
    }

    fn target(&self, successor: Successor) -> u64 {
        match successor {
            Successor::Block(index) => self.block_labels[index],
            Successor::Leaves(address) => address,
        }
    }

    /// Rows for code that runs "between" instructions: the row of where control goes.
    fn row_at(&self, successor: Successor, otherwise: u64) -> u64 {
        match successor {
            Successor::Block(index) => self.graph.blocks[index].start,
            Successor::Leaves(_) => otherwise,
        }
    }

    fn table_base(&self, tables_at: u64, original: u64) -> Option<u64> {
        self.tables
            .iter()
            .find(|t| t.original == original)
            .map(|t| tables_at + t.offset)
    }
}

/// A conditional branch's taken edge, whose stub follows the blocks.
struct TakenStub {
    block: usize,
    stub: u64,
    taken: Successor,
    branch: u64,
}

/// One pass's instructions as they are assembled.
struct Assembly<'p, 'a, 'c> {
    plan: &'p Plan<'a>,
    tables_at: u64,
    labels: &'c mut Labels,
    counters: &'c mut dyn CounterCode,
    pending: Vec<Pending>,
    taken_stubs: Vec<TakenStub>,
    /// A label whose code was empty, for the next instruction.
    carried_label: Option<u64>,
}

impl Assembly<'_, '_, '_> {
    /// Inserted code; its first instruction takes `first_label` when there is one. When
    /// there is no code (a copy without counters), the label goes to whatever
    /// instruction comes next.
    fn emit(&mut self, inserted: Inserted, first_label: Option<u64>, row_of: u64) {
        if inserted.instructions.is_empty() {
            if let Some(label) = first_label {
                self.carry_label(label, row_of);
            }
            return;
        }
        let first_label = match (first_label, self.carried_label.take()) {
            (Some(label), Some(kept)) => {
                self.carried_label = Some(kept);
                self.carry_label(label, row_of);
                self.carried_label.take()
            }
            (label, kept) => label.or(kept),
        };
        for (k, (mut instruction, extra)) in inserted
            .instructions
            .into_iter()
            .zip(inserted.extra_stack)
            .enumerate()
        {
            match first_label {
                Some(label) if k == 0 => instruction.set_ip(label),
                _ if instruction.ip() == 0 => instruction.set_ip(self.labels.create()),
                _ => {}
            }
            self.pending.push(Pending {
                instruction,
                original: None,
                row_of,
                extra_stack: extra,
            });
        }
    }

    /// Keeps `label` for the next instruction. A label already kept goes on a `nop` of
    /// its own first (two empty pieces of code in a row).
    fn carry_label(&mut self, label: u64, row_of: u64) {
        if let Some(kept) = self.carried_label.replace(label) {
            let mut nop = Instruction::with(Code::Nopd);
            nop.set_ip(kept);
            self.pending.push(Pending {
                instruction: nop,
                original: None,
                row_of,
                extra_stack: 0,
            });
        }
    }

    /// The label of the next instruction: the one kept for it, or a fresh one.
    fn next_label(&mut self) -> u64 {
        self.carried_label
            .take()
            .unwrap_or_else(|| self.labels.create())
    }

    fn jump(&mut self, to: u64, row_of: u64) -> Result<(), CopyRefusal> {
        let mut instruction = Instruction::with_branch(Code::Jmp_rel32_64, to).map_err(encoding)?;
        instruction.set_ip(self.next_label());
        self.pending.push(Pending {
            instruction,
            original: None,
            row_of,
            extra_stack: 0,
        });
        Ok(())
    }

    /// Block `index`: its landing-pad code, its counter, its instructions, and the code
    /// of the edge it runs on by.
    fn copy_block(&mut self, index: usize, block: &Block) -> Result<(), CopyRefusal> {
        let plan = self.plan;
        if let Some(pad_label) = plan.pad_labels[index] {
            let pad = self
                .counters
                .landing_pad(index, plan.live[index], block.start, self.labels);
            self.emit(pad, Some(pad_label), block.start);
        }
        let counter = self.counters.counter(
            plan.site_index[&CounterSite::Block(index)],
            plan.live[index],
            self.labels,
        );
        self.emit(counter, Some(plan.block_labels[index]), block.start);
        let bytes = plan.code.slice(block.start, block.end);
        let decoder = Decoder::with_ip(64, bytes, block.start, DecoderOptions::NONE);
        let mut last = block.start;
        for instruction in decoder {
            last = instruction.ip();
            self.copy_instruction(index, block, instruction)?;
        }
        self.run_on(index, block, last)
    }

    /// One original instruction of block `index`, naming the copy of any table it
    /// names, and the block's exit retargeted.
    fn copy_instruction(
        &mut self,
        index: usize,
        block: &Block,
        mut instruction: Instruction,
    ) -> Result<(), CopyRefusal> {
        let original = instruction.ip();
        if let Some(&table) = self.plan.references.get(&original) {
            self.name_table_copy(&mut instruction, table)?;
        }
        if original == last_instruction(block) {
            self.exit(index, block, &mut instruction);
        }
        if is_through_pointer(&instruction, block, original) {
            let mut check = self
                .counters
                .through_pointer(original, &instruction, self.labels);
            let replacement = check.replacement.take();
            self.emit(check, None, original);
            if let Some(replacement) = replacement {
                instruction = replacement;
            }
        }
        instruction.set_ip(self.next_label());
        self.pending.push(Pending {
            instruction,
            original: Some(original),
            row_of: original,
            extra_stack: 0,
        });
        Ok(())
    }

    /// Points `instruction`, which names the jump table at `table`, at the table's copy.
    fn name_table_copy(
        &self,
        instruction: &mut Instruction,
        table: u64,
    ) -> Result<(), CopyRefusal> {
        let copy = self
            .plan
            .table_base(self.tables_at, table)
            .expect("every table is planned");
        let named = instruction.memory_displacement64();
        let moved = named.wrapping_add(copy).wrapping_sub(table);
        if !instruction.is_ip_rel_memory_operand() && i32::try_from(moved as i64).is_err() {
            return Err(CopyRefusal::TableOutOfReach { table });
        }
        instruction.set_memory_displacement64(moved);
        Ok(())
    }

    /// The last instruction of block `index`, at `instruction`'s original address.
    fn exit(&mut self, index: usize, block: &Block, instruction: &mut Instruction) {
        let plan = self.plan;
        let original = instruction.ip();
        // The edge code of a jump or a way out runs before it.
        let edge_before = match &block.exit {
            BlockExit::Jump(to) => Some(taken_live(*to, &plan.live)),
            BlockExit::Return | BlockExit::ThroughPointer { .. } => Some(false),
            _ => None,
        };
        if let Some(flags_live) = edge_before {
            let code =
                self.counters
                    .edge(plan.first_edge[index], flags_live, original, self.labels);
            self.emit(code, None, original);
        }
        match &block.exit {
            BlockExit::Jump(to) => instruction.set_near_branch64(plan.target(*to)),
            BlockExit::Conditional { taken, .. } => {
                let stub = self.labels.create();
                instruction.set_near_branch64(stub);
                self.taken_stubs.push(TakenStub {
                    block: index,
                    stub,
                    taken: *taken,
                    branch: original,
                });
            }
            _ => {}
        }
    }

    /// After block `index`, whose last instruction is at `last`.
    fn run_on(&mut self, index: usize, block: &Block, last: u64) -> Result<(), CopyRefusal> {
        let plan = self.plan;
        // A fall-through edge (or a not-taken one, the second of its block's) runs
        // its code before the next block's label.
        let runs_on_to = match &block.exit {
            BlockExit::FallThrough(next) => Some((*next, plan.first_edge[index])),
            BlockExit::Conditional { not_taken, .. } => {
                Some((*not_taken, plan.first_edge[index] + 1))
            }
            _ => None,
        };
        if let Some((next, edge)) = runs_on_to {
            let row_of = plan.row_at(next, last);
            let code = self
                .counters
                .edge(edge, taken_live(next, &plan.live), row_of, self.labels);
            self.emit(code, None, row_of);
            // Into the next block over its landing-pad code, or elsewhere: a jump.
            let over_pad = plan.pad_labels.get(index + 1).is_some_and(Option::is_some);
            if next != Successor::Block(index + 1) || over_pad {
                self.jump(plan.target(next), row_of)?;
            }
        }
        Ok(())
    }

    /// Each conditional branch's taken edge: its counter and edge code, then a jump on.
    fn taken_edge_stubs(&mut self) -> Result<(), CopyRefusal> {
        let plan = self.plan;
        for TakenStub {
            block: index,
            stub,
            taken,
            branch,
        } in std::mem::take(&mut self.taken_stubs)
        {
            let row_of = plan.row_at(taken, branch);
            let flags_live = taken_live(taken, &plan.live);
            let counter = self.counters.counter(
                plan.site_index[&CounterSite::Taken(index)],
                flags_live,
                self.labels,
            );
            self.emit(counter, Some(stub), row_of);
            let code = self
                .counters
                .edge(plan.first_edge[index], flags_live, row_of, self.labels);
            self.emit(code, None, row_of);
            self.jump(plan.target(taken), row_of)?;
        }
        Ok(())
    }

    /// Each table entry's stub: its counter and edge code, then a jump to its block.
    fn table_entry_stubs(&mut self) -> Result<(), CopyRefusal> {
        let plan = self.plan;
        for (index, block) in plan.graph.blocks.iter().enumerate() {
            let BlockExit::Table { table, targets, .. } = &block.exit else {
                continue;
            };
            let stubs = &plan
                .tables
                .iter()
                .find(|t| t.original == *table)
                .expect("every table is planned")
                .stubs;
            let distinct = &plan.edge_lists[index];
            for (entry, (&to, &stub)) in targets.iter().zip(stubs).enumerate() {
                let row_of = plan.graph.blocks[to].start;
                let site = CounterSite::TableEntry {
                    block: index,
                    entry,
                };
                let counter =
                    self.counters
                        .counter(plan.site_index[&site], plan.live[to], self.labels);
                self.emit(counter, Some(stub), row_of);
                let position = distinct
                    .iter()
                    .position(|&target| target == Some(to))
                    .expect("every table target is one of its block's edges");
                let code = self.counters.edge(
                    plan.first_edge[index] + position,
                    plan.live[to],
                    row_of,
                    self.labels,
                );
                self.emit(code, None, row_of);
                self.jump(plan.block_labels[to], row_of)?;
            }
        }
        Ok(())
    }
}

/// Whether the flags are live where a taken edge lands.
fn taken_live(taken: Successor, live: &[bool]) -> bool {
    match taken {
        Successor::Block(index) => live[index],
        Successor::Leaves(_) => false,
    }
}

/// The original addresses of `graph`'s calls and tail jumps through pointers (those
/// [`CounterCode::through_pointer`] is asked about), in address order.
pub(super) fn pointer_sites(graph: &ControlFlowGraph, code: &FunctionBytes) -> Vec<u64> {
    let mut sites = Vec::new();
    for block in &graph.blocks {
        let bytes = code.slice(block.start, block.end);
        for instruction in Decoder::with_ip(64, bytes, block.start, DecoderOptions::NONE) {
            if is_through_pointer(&instruction, block, instruction.ip()) {
                sites.push(instruction.ip());
            }
        }
    }
    sites.sort_unstable();
    sites
}

/// Whether `instruction` (at `original` in `block`) calls through a pointer, or leaves
/// the function by a jump through one (a jump through a switch's table stays inside).
fn is_through_pointer(instruction: &Instruction, block: &Block, original: u64) -> bool {
    match instruction.code() {
        Code::Call_rm64 => true,
        Code::Jmp_rm64 => {
            original == last_instruction(block)
                && matches!(block.exit, BlockExit::ThroughPointer { .. })
        }
        _ => false,
    }
}

fn last_instruction(block: &Block) -> u64 {
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
