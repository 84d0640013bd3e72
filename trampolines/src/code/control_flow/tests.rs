//! Control-flow graphs of functions assembled here: branches, loops, tail calls, both
//! kinds of jump table, and the shapes that must be refused.

use super::*;
use iced_x86::code_asm::*;
use iced_x86::{BlockEncoderOptions, ConditionCode};

const BASE: u64 = 0x40_1000;

/// Machine code at `BASE`, with the addresses of labels.
struct Assembled {
    bytes: Vec<u8>,
    labels: Vec<u64>,
}

fn assemble(
    build: impl FnOnce(&mut CodeAssembler, &mut Vec<CodeLabel>) -> Result<(), IcedError>,
) -> Assembled {
    let mut a = CodeAssembler::new(64).unwrap();
    let mut labels = Vec::new();
    build(&mut a, &mut labels).unwrap();
    let result = a
        .assemble_options(BASE, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)
        .unwrap();
    let labels = labels.iter().map(|l| result.label_ip(l).unwrap()).collect();
    Assembled {
        bytes: result.inner.code_buffer,
        labels,
    }
}

fn no_memory(_: u64, _: &mut [u8]) -> bool {
    false
}

fn build(bytes: &[u8]) -> Result<ControlFlowGraph, CfgRefusal> {
    ControlFlowGraph::build(BASE, bytes, &no_memory)
}

#[test]
fn an_if_else_is_four_blocks() {
    let code = assemble(|a, labels| {
        let mut other = a.create_label();
        let mut join = a.create_label();
        a.test(edi, edi)?;
        a.je(other)?;
        a.mov(eax, 1)?;
        a.jmp(join)?;
        a.set_label(&mut other)?;
        a.mov(eax, 2)?;
        a.set_label(&mut join)?;
        a.ret()?;
        labels.extend([other, join]);
        Ok(())
    });
    let graph = build(&code.bytes).unwrap();
    let starts: Vec<u64> = graph.blocks.iter().map(|b| b.start).collect();
    let [other, join] = code.labels[..] else {
        panic!()
    };
    assert_eq!(starts, [BASE, BASE + 4, other, join]);
    assert_eq!(
        graph.blocks[0].exit,
        BlockExit::Conditional {
            branch: BASE + 2,
            taken: Successor::Block(2),
            not_taken: Successor::Block(1),
        }
    );
    assert_eq!(graph.blocks[1].exit, BlockExit::Jump(Successor::Block(3)));
    assert_eq!(
        graph.blocks[2].exit,
        BlockExit::FallThrough(Successor::Block(3))
    );
    assert_eq!(graph.blocks[3].exit, BlockExit::Return);
    assert_eq!(graph.blocks[0].instructions, [BASE, BASE + 2]);
}

#[test]
fn a_loop_branches_back_to_its_head_and_padding_is_not_code() {
    let code = assemble(|a, labels| {
        let mut head = a.create_label();
        a.xor(eax, eax)?;
        a.set_label(&mut head)?;
        a.add(eax, edi)?;
        a.dec(edi)?;
        a.jne(head)?;
        a.ret()?;
        // Padding and data that no path reaches.
        a.db(&[0xcc, 0xcc, 0xff, 0xff])?;
        labels.push(head);
        Ok(())
    });
    let graph = build(&code.bytes).unwrap();
    assert_eq!(graph.blocks.len(), 3);
    let head = code.labels[0];
    assert_eq!(graph.blocks[1].start, head);
    assert_eq!(
        graph.blocks[1].exit,
        BlockExit::Conditional {
            branch: graph.blocks[1].instructions[2],
            taken: Successor::Block(1),
            not_taken: Successor::Block(2),
        }
    );
    assert_eq!(graph.blocks[2].exit, BlockExit::Return);
    assert_eq!(graph.blocks[2].end, graph.blocks[2].start + 1);
}

#[test]
fn tail_calls_and_cold_parts_leave_the_function() {
    let code = assemble(|a, _| {
        a.test(edi, edi)?;
        a.js(BASE + 0x1000)?; // a .cold part elsewhere
        a.cmp(edi, 5)?;
        a.jne(BASE + 0x2000)?; // a tail call
        let mut got = a.create_label();
        a.jmp(qword_ptr(got))?; // a tail call through the GOT
        a.set_label(&mut got)?;
        a.dq(&[0])?;
        Ok(())
    });
    let graph = build(&code.bytes).unwrap();
    assert_eq!(graph.blocks.len(), 3);
    assert!(matches!(
        graph.blocks[0].exit,
        BlockExit::Conditional {
            taken: Successor::Leaves(0x40_2000),
            not_taken: Successor::Block(1),
            ..
        }
    ));
    assert!(matches!(
        graph.blocks[1].exit,
        BlockExit::Conditional {
            taken: Successor::Leaves(0x40_3000),
            ..
        }
    ));
    assert!(matches!(
        graph.blocks[2].exit,
        BlockExit::ThroughPointer { .. }
    ));
}

#[test]
fn a_call_that_never_returns_at_the_end_leaves_past_it() {
    let code = assemble(|a, _| {
        a.call(BASE + 0x5000)?;
        Ok(())
    });
    let graph = build(&code.bytes).unwrap();
    let end = BASE + code.bytes.len() as u64;
    assert_eq!(
        graph.blocks[0].exit,
        BlockExit::FallThrough(Successor::Leaves(end))
    );
}

/// A `switch` on edi of `cases` cases compiled as GCC does for PIC code, with its table
/// of 32-bit offsets after the code; returns the code, the table, and the full image.
fn pic_switch(cases: u32, guard: ConditionCode) -> (Assembled, u64, usize) {
    let mut code = assemble(|a, labels| {
        let mut table = a.create_label();
        let mut default = a.create_label();
        a.cmp(
            edi,
            if guard == ConditionCode::a {
                cases - 1
            } else {
                cases
            },
        )?;
        if guard == ConditionCode::a {
            a.ja(default)?;
        } else {
            a.jae(default)?;
        }
        a.mov(edi, edi)?;
        a.lea(rdx, ptr(table))?;
        a.movsxd(rax, dword_ptr(rdx + rdi * 4))?;
        a.add(rax, rdx)?;
        a.jmp(rax)?;
        for case in 0..cases {
            let mut label = a.create_label();
            a.set_label(&mut label)?;
            a.mov(eax, 100 + case)?;
            a.ret()?;
            labels.push(label);
        }
        a.set_label(&mut default)?;
        a.xor(eax, eax)?;
        a.ret()?;
        a.set_label(&mut table)?;
        a.dd(&vec![0; cases as usize])?;
        labels.push(default);
        labels.push(table);
        Ok(())
    });
    let table = *code.labels.last().unwrap();
    let code_len = (table - BASE) as usize;
    for case in 0..cases as usize {
        let offset = (code.labels[case] as i64 - table as i64) as i32;
        let at = code_len + case * 4;
        code.bytes[at..at + 4].copy_from_slice(&offset.to_le_bytes());
    }
    (code, table, code_len)
}

fn reader(image: &[u8]) -> impl Fn(u64, &mut [u8]) -> bool + '_ {
    move |address, out| {
        let Some(offset) = address.checked_sub(BASE) else {
            return false;
        };
        match image.get(offset as usize..offset as usize + out.len()) {
            Some(bytes) => {
                out.copy_from_slice(bytes);
                true
            }
            None => false,
        }
    }
}

#[test]
fn a_position_independent_jump_table_gives_one_edge_per_case() {
    for guard in [ConditionCode::a, ConditionCode::ae] {
        let (code, table, code_len) = pic_switch(4, guard);
        let read = reader(&code.bytes);
        let graph = ControlFlowGraph::build(BASE, &code.bytes[..code_len], &read).unwrap();
        let dispatch = graph
            .blocks
            .iter()
            .find(|b| matches!(b.exit, BlockExit::Table { .. }))
            .unwrap();
        let BlockExit::Table {
            table: at,
            targets,
            entries,
            references,
            ..
        } = &dispatch.exit
        else {
            unreachable!()
        };
        assert_eq!(*at, table);
        assert_eq!(*entries, EntryKind::Relative32);
        assert_eq!(references.len(), 1, "the one `lea` of the table");
        let starts: Vec<u64> = targets.iter().map(|&t| graph.blocks[t].start).collect();
        assert_eq!(starts, code.labels[..4], "{guard:?}");
        // entry, dispatch, four cases, default.
        assert_eq!(graph.blocks.len(), 7);
    }
}

#[test]
fn an_absolute_jump_table_is_followed_too() {
    let mut code = assemble(|a, labels| {
        let mut default = a.create_label();
        let mut one = a.create_label();
        let mut two = a.create_label();
        a.cmp(esi, 1)?;
        a.ja(default)?;
        a.mov(eax, esi)?;
        a.jmp(qword_ptr(rax * 8 + (BASE + 0x100)))?;
        a.set_label(&mut one)?;
        a.mov(eax, 1)?;
        a.ret()?;
        a.set_label(&mut two)?;
        a.mov(eax, 2)?;
        a.set_label(&mut default)?;
        a.ret()?;
        labels.extend([one, two]);
        Ok(())
    });
    let code_len = code.bytes.len();
    code.bytes.resize(0x110, 0);
    code.bytes[0x100..0x108].copy_from_slice(&code.labels[1].to_le_bytes());
    code.bytes[0x108..0x110].copy_from_slice(&code.labels[0].to_le_bytes());
    let read = reader(&code.bytes);
    let graph = ControlFlowGraph::build(BASE, &code.bytes[..code_len], &read).unwrap();
    let table = graph.blocks[1].exit.clone();
    let BlockExit::Table { targets, .. } = table else {
        panic!("{table:?}")
    };
    let starts: Vec<u64> = targets.iter().map(|&t| graph.blocks[t].start).collect();
    assert_eq!(starts, [code.labels[1], code.labels[0]]);
    // `two` falls through into the default's `ret`.
    let two = graph.block_at(code.labels[1]).unwrap();
    assert_eq!(
        graph.blocks[two].exit,
        BlockExit::FallThrough(Successor::Block(two + 1))
    );
}

#[test]
fn a_table_without_a_bound_check_is_refused() {
    let (mut code, _, code_len) = pic_switch(4, ConditionCode::a);
    // Replace the `ja` (2 bytes after the 3-byte cmp) by two nops.
    code.bytes[3..5].copy_from_slice(&[0x90, 0x90]);
    let read = reader(&code.bytes);
    let refusal = ControlFlowGraph::build(BASE, &code.bytes[..code_len], &read).unwrap_err();
    assert!(
        matches!(
            refusal,
            CfgRefusal::UnresolvedJump {
                why: Unresolved::Unbounded,
                ..
            }
        ),
        "{refusal:?}"
    );
}

#[test]
fn an_unreadable_table_is_refused() {
    let (code, table, code_len) = pic_switch(3, ConditionCode::a);
    let refusal = build(&code.bytes[..code_len]).unwrap_err();
    assert_eq!(
        refusal.to_string(),
        format!(
            "the indirect jump at {:#x} is its jump table at {table:#x} cannot be read",
            BASE + 3 + 2 + 2 + 7 + 4 + 3
        )
    );
}

#[test]
fn a_jump_to_a_computed_address_is_refused() {
    let code = assemble(|a, _| {
        a.call(BASE + 0x5000)?;
        a.jmp(rax)?;
        Ok(())
    });
    let refusal = build(&code.bytes).unwrap_err();
    assert_eq!(
        refusal,
        CfgRefusal::UnresolvedJump {
            at: BASE + 5,
            why: Unresolved::Unknown
        }
    );
}

#[test]
fn a_jump_through_a_loaded_pointer_leaves_the_function() {
    let code = assemble(|a, _| {
        a.mov(rax, qword_ptr(rdi + 8))?;
        a.jmp(rax)?;
        Ok(())
    });
    let graph = build(&code.bytes).unwrap();
    assert_eq!(
        graph.blocks[0].exit,
        BlockExit::ThroughPointer { jump: BASE + 4 }
    );
}

#[test]
fn a_branch_into_the_middle_of_an_instruction_is_refused() {
    // A jump over a byte is fine: nothing reaches the byte.
    let bytes = [0xeb, 0x01, 0xb8, 0x90, 0xc3];
    assert_eq!(build(&bytes).unwrap().blocks.len(), 2);
    // je +1 → into the immediate of `mov eax, 0x90c3c390`, which fall-through reaches.
    let bytes = [0x74, 0x01, 0xb8, 0x90, 0xc3, 0xc3, 0x90, 0xc3];
    assert_eq!(
        build(&bytes).unwrap_err(),
        CfgRefusal::IntoInstruction {
            from: BASE,
            to: BASE + 3
        }
    );
    // Reached first by the branch, then by fall-through.
    let bytes = [0x74, 0x04, 0x90, 0xb8, 0x90, 0xc3, 0xc3, 0x90, 0xc3];
    let refusal = build(&bytes).unwrap_err();
    assert!(
        matches!(
            refusal,
            CfgRefusal::IntoInstruction { .. } | CfgRefusal::Overlapping { .. }
        ),
        "{refusal:?}"
    );
    // Reached first by fall-through, then by a branch into its middle.
    let bytes = [0xb8, 0x90, 0xc3, 0xc3, 0x90, 0x74, 0xfa, 0xc3];
    assert_eq!(
        build(&bytes).unwrap_err(),
        CfgRefusal::IntoInstruction {
            from: BASE + 5,
            to: BASE + 1
        }
    );
}

#[test]
fn undecodable_bytes_and_transactions_are_refused() {
    assert_eq!(
        build(&[0x90, 0x0f, 0xff]).unwrap_err(),
        CfgRefusal::Undecodable { at: BASE + 1 }
    );
    // An instruction cut by the end of the function.
    assert_eq!(
        build(&[0xb8, 0x01]).unwrap_err(),
        CfgRefusal::Undecodable { at: BASE }
    );
    let code = assemble(|a, _| {
        a.xbegin(BASE + 0x40)?;
        a.ret()?;
        Ok(())
    });
    assert_eq!(
        build(&code.bytes).unwrap_err(),
        CfgRefusal::Transactional { at: BASE }
    );
}

#[test]
fn a_cold_part_given_with_the_function_is_followed_there_and_back() {
    // The cold part first (as GCC places `.text.unlikely`), then the function.
    let code = assemble(|a, labels| {
        let mut cold = a.create_label();
        let mut main = a.create_label();
        let mut back = a.create_label();
        a.set_label(&mut cold)?;
        a.mov(eax, 5)?;
        a.jmp(back)?;
        a.set_label(&mut main)?;
        a.xor(eax, eax)?;
        a.test(edi, edi)?;
        a.jne(cold)?;
        a.set_label(&mut back)?;
        a.add(eax, 1)?;
        a.ret()?;
        labels.extend([main, back]);
        Ok(())
    });
    let [main, back] = code.labels[..] else {
        panic!()
    };
    let split = (main - BASE) as usize;
    let alone = ControlFlowGraph::build(main, &code.bytes[split..], &no_memory).unwrap();
    let exits: Vec<&BlockExit> = alone.blocks.iter().map(|b| &b.exit).collect();
    assert!(
        matches!(exits[0], BlockExit::Conditional { taken: Successor::Leaves(to), .. } if *to == BASE),
        "without its cold part, the jump there leaves: {exits:?}"
    );
    let bytes =
        FunctionBytes::new(main, &code.bytes[split..]).with_part(BASE, &code.bytes[..split]);
    let graph = ControlFlowGraph::build_with_entries(&bytes, &no_memory, &[]).unwrap();
    let starts: Vec<u64> = graph.blocks.iter().map(|b| b.start).collect();
    // The main part's blocks first (the entry is block 0), then the cold part's.
    assert_eq!(starts, [main, back, BASE]);
    assert_eq!(
        graph.blocks[0].exit,
        BlockExit::Conditional {
            branch: main + 4,
            taken: Successor::Block(2),
            not_taken: Successor::Block(1),
        }
    );
    assert_eq!(graph.blocks[2].exit, BlockExit::Jump(Successor::Block(1)));
    assert_eq!(graph.blocks[1].exit, BlockExit::Return);
}
