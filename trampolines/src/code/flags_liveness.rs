//! Where a function still needs its status flags: whether code inserted at the start of
//! a basic block may clobber them.
//!
//! The one idea: a backward data-flow over the control-flow graph. A flag is live at a
//! point when some path from there reads it before anything writes it. Calls clobber
//! every status flag (the System V ABI preserves none across a call), and nothing
//! outside the function reads the flags a function leaves behind: returns, tail calls
//! and jumps out of the function end liveness. A counter inserted where the flags are
//! dead is a plain `inc`; where they are live it saves and restores them.

use super::control_flow::{ControlFlowGraph, FunctionBytes};
use iced_x86::{Decoder, DecoderOptions, FlowControl, RflagsBits};

/// The flags an inserted counter may change: the six status flags.
const STATUS_FLAGS: u32 = RflagsBits::OF
    | RflagsBits::SF
    | RflagsBits::ZF
    | RflagsBits::AF
    | RflagsBits::CF
    | RflagsBits::PF;

/// For each block of `graph` (whose bytes are `code`), whether any status flag is live
/// when the block starts.
pub fn live_at_block_starts(graph: &ControlFlowGraph, code: &FunctionBytes) -> Vec<bool> {
    // Per block: flags read before written (`used`), and flags written (`killed`).
    let transfer: Vec<(u32, u32)> = graph
        .blocks
        .iter()
        .map(|block| {
            let bytes = code.slice(block.start, block.end);
            let decoder = Decoder::with_ip(64, bytes, block.start, DecoderOptions::NONE);
            let (mut used, mut killed) = (0u32, 0u32);
            for instruction in decoder {
                let (read, written) = if matches!(
                    instruction.flow_control(),
                    FlowControl::Call | FlowControl::IndirectCall
                ) {
                    (0, STATUS_FLAGS)
                } else {
                    (
                        instruction.rflags_read() & STATUS_FLAGS,
                        instruction.rflags_modified() & STATUS_FLAGS,
                    )
                };
                used |= read & !killed;
                killed |= written;
            }
            (used, killed)
        })
        .collect();
    // The successors inside the function.
    let successors: Vec<Vec<usize>> = graph
        .edge_lists()
        .into_iter()
        .map(|edges| edges.into_iter().flatten().collect())
        .collect();
    let mut live_in = vec![0u32; graph.blocks.len()];
    let mut changed = true;
    while changed {
        changed = false;
        for index in (0..graph.blocks.len()).rev() {
            let live_out = successors[index]
                .iter()
                .fold(0, |live, &next| live | live_in[next]);
            let (used, killed) = transfer[index];
            let live = used | (live_out & !killed);
            if live != live_in[index] {
                live_in[index] = live;
                changed = true;
            }
        }
    }
    live_in.into_iter().map(|live| live != 0).collect()
}

// Safe code only: Miri (which CI runs over `code::`) would add nothing but hours.
#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;
    use iced_x86::code_asm::*;

    const BASE: u64 = 0x40_1000;

    fn graph_of(build: impl FnOnce(&mut CodeAssembler)) -> (ControlFlowGraph, Vec<u8>) {
        let mut a = CodeAssembler::new(64).unwrap();
        build(&mut a);
        let bytes = a.assemble(BASE).unwrap();
        let read = |_: u64, _: &mut [u8]| false;
        let graph = ControlFlowGraph::build(BASE, &bytes, &read).unwrap();
        (graph, bytes)
    }

    #[test]
    fn flags_set_before_a_block_and_read_in_it_are_live_at_its_start() {
        // cmp; jl A; jg B (flags still live: the second block reads them); ...
        let (graph, code) = graph_of(|a| {
            let mut less = a.create_label();
            let mut greater = a.create_label();
            a.cmp(edi, esi).unwrap();
            a.jl(less).unwrap();
            a.jg(greater).unwrap();
            a.xor(eax, eax).unwrap();
            a.ret().unwrap();
            a.set_label(&mut less).unwrap();
            a.mov(eax, -1).unwrap();
            a.ret().unwrap();
            a.set_label(&mut greater).unwrap();
            a.mov(eax, 1).unwrap();
            a.ret().unwrap();
        });
        let live = live_at_block_starts(&graph, &FunctionBytes::new(BASE, &code));
        let at = |address: u64| live[graph.block_at(address).unwrap()];
        assert!(!at(BASE), "the entry sets the flags before reading them");
        let second = graph.blocks[1].start;
        assert!(at(second), "the jg reads the cmp's flags");
        for block in &graph.blocks[2..] {
            assert!(!at(block.start), "{:#x}", block.start);
        }
    }

    #[test]
    fn calls_and_returns_end_liveness_and_loops_carry_it() {
        // A loop whose head reads CF set at the end of the previous iteration.
        let (graph, code) = graph_of(|a| {
            let mut head = a.create_label();
            let mut out = a.create_label();
            a.clc().unwrap();
            a.set_label(&mut head).unwrap();
            a.adc(eax, 1).unwrap();
            a.dec(ecx).unwrap();
            a.jz(out).unwrap();
            a.jmp(head).unwrap();
            a.set_label(&mut out).unwrap();
            a.call(0x50_0000u64).unwrap();
            a.adc(eax, 0).unwrap();
            a.ret().unwrap();
        });
        let live = live_at_block_starts(&graph, &FunctionBytes::new(BASE, &code));
        let head = graph.block_at(BASE + 1).unwrap();
        assert!(live[head], "adc reads the CF the previous iteration left");
        let returns = graph
            .blocks
            .iter()
            .position(|b| b.exit == crate::code::control_flow::BlockExit::Return)
            .unwrap();
        // The call ends its block; before the call nothing reads the flags, and the
        // call clobbers them: dead where the call's block starts.
        assert!(!live[returns - 1]);
        // After the call, `adc` reads whatever CF the callee left: kept, to be safe.
        assert!(live[returns]);
    }
}
