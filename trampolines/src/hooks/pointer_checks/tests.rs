//! The check's code, assembled and read back: the target read as the call reads it,
//! its slots in the table of targets compared, the slow path called with the site; and
//! the table's own rules.

use super::*;
use iced_x86::{Decoder, DecoderOptions};

const AT: u64 = 0x7f00_0000_1000;
const SLOW: SlowPath = SlowPath {
    handler: 0x1111_2222_3333,
    slow_call: 0x4444_5555_6666,
};

/// The original instruction `bytes`, decoded at `AT`.
fn original(bytes: &[u8]) -> Instruction {
    Decoder::with_ip(64, bytes, AT, DecoderOptions::NONE).decode()
}

fn disassemble(inserted: &Inserted) -> Vec<String> {
    crate::hooks::inserted_code::disassembled(inserted, AT + 0x100)
}

fn check_of(bytes: &[u8]) -> Vec<String> {
    let mut labels = Labels::new_for_tests();
    disassemble(&check_code(AT, &original(bytes), SLOW, &mut labels))
}

/// What the original instruction `bytes` becomes after its check.
fn replacement_of(bytes: &[u8]) -> String {
    let mut labels = Labels::new_for_tests();
    let check = check_code(AT, &original(bytes), SLOW, &mut labels);
    let replacement = check.replacement.expect("a checked call goes through r11");
    let alone = Inserted {
        instructions: vec![replacement],
        extra_stack: vec![0],
        replacement: None,
    };
    disassemble(&alone).join("\n")
}

/// The table's address, mapped (below 2 GiB here, as in a target).
fn table_address() -> u64 {
    let table = table().expect("the table maps").as_ptr() as u64;
    assert!(table < 1 << 31, "MAP_32BIT gave {table:#x}");
    table
}

#[test]
fn a_call_through_a_register_probes_the_table_and_asks_the_runtime_about_a_new_target() {
    // call rbx
    let code = check_of(&[0xff, 0xd3]);
    let text = code.join("\n");
    let table = table_address();
    assert_eq!(code[..2], ["push rcx", "mov r11,rbx"], "{text}");
    assert!(
        text.contains(&format!("cmp r11,[rcx*8+{table:X}h]")),
        "the home slot: {text}"
    );
    assert!(
        text.contains("inc ecx"),
        "the next slot, through the same operand: {text}"
    );
    assert!(
        text.contains("mov rax,r11"),
        "the target for the slow path: {text}"
    );
    assert!(
        text.contains("mov rcx,fs:["),
        "the call graph's gate: {text}"
    );
    assert!(
        text.contains(&format!("mov rdx,{AT:X}h")),
        "the site: {text}"
    );
    assert!(text.contains("mov r11,111122223333h"), "{text}");
    assert!(text.contains("mov rcx,444455556666h"), "{text}");
    assert!(text.contains("call rcx"), "{text}");
    assert!(
        text.contains("mov r11,rax"),
        "the slow path's answer, where the call goes: {text}"
    );
    let destinations = table + (HALF * 8) as u64;
    assert!(
        text.contains(&format!("mov rax,[rcx*8+{destinations:X}h]")),
        "the slot's destination: {text}"
    );
    assert!(
        text.contains("cmove r11,rax"),
        "taken only if the slot still holds the target: {text}"
    );
    assert_eq!(code.last().unwrap(), "pop rcx", "{text}");
    assert_eq!(replacement_of(&[0xff, 0xd3]), "call r11");
    assert!(
        !text.contains("lea rsp"),
        "a call's red zone is dead: {text}"
    );
    assert!(
        !text.contains("lahf"),
        "the flags are dead at a call: {text}"
    );
}

#[test]
fn an_operand_in_r11_gets_the_long_form_which_saves_what_it_uses() {
    // call qword ptr [r11+10h]
    let code = check_of(&[0x41, 0xff, 0x53, 0x10]);
    let text = code.join("\n");
    assert_eq!(code[0], "lea rsp,[rsp-80h]", "{text}");
    assert_eq!(code[1..4], ["push rax", "push rcx", "push rdx"], "{text}");
    assert_eq!(code[4], "mov rax,[r11+10h]", "{text}");
    let table = table_address();
    assert!(text.contains(&format!("mov rdx,{table:X}h")), "{text}");
    assert!(text.contains("cmp rax,[rdx+rcx*8]"), "{text}");
    assert!(text.contains("inc ecx"), "{text}");
    assert!(
        text.contains(&format!("mov r11,[rdx+rcx*8+{:X}h]", HALF * 8)),
        "the slot's destination: {text}"
    );
    assert!(text.contains("cmovne r11,rax"), "{text}");
    assert!(
        text.contains("mov r11,rax"),
        "the target, or the slow path's answer: {text}"
    );
    assert_eq!(
        code[code.len() - 4..],
        ["pop rdx", "pop rcx", "pop rax", "lea rsp,[rsp+80h]"],
        "{text}"
    );
    assert_eq!(replacement_of(&[0x41, 0xff, 0x53, 0x10]), "call r11");
    // A tail jump through a pointer stays a jump.
    assert_eq!(replacement_of(&[0xff, 0xe0]), "jmp r11");
}

#[test]
fn a_stack_operand_is_read_where_the_stack_pointer_has_moved_to() {
    // call qword ptr [rsp+8]
    let code = check_of(&[0xff, 0x54, 0x24, 0x08]);
    assert_eq!(code[1], "mov r11,[rsp+10h]", "{}", code.join("\n"));
    // call qword ptr [rax+18h]: registers are read as they were
    let code = check_of(&[0xff, 0x50, 0x18]);
    assert_eq!(code[1], "mov r11,[rax+18h]", "{}", code.join("\n"));
}

#[test]
fn a_rip_relative_operand_names_the_same_pointer_from_the_check() {
    // call qword ptr [rip+0x2000], at AT: the pointer is at AT + 6 + 0x2000
    let code = check_of(&[0xff, 0x15, 0x00, 0x20, 0x00, 0x00]);
    let pointer = AT + 6 + 0x2000;
    assert_eq!(
        code[1],
        format!("mov r11,[{pointer:X}h]"),
        "{}",
        code.join("\n")
    );
}

#[test]
fn an_operand_in_the_red_zone_or_the_stack_pointer_itself_is_not_checked() {
    let mut labels = Labels::new_for_tests();
    // call qword ptr [rsp-8]
    let below = check_code(AT, &original(&[0xff, 0x54, 0x24, 0xf8]), SLOW, &mut labels);
    assert!(below.instructions.is_empty());
    // call rsp
    let itself = check_code(AT, &original(&[0xff, 0xd4]), SLOW, &mut labels);
    assert!(itself.instructions.is_empty());
}

#[test]
fn a_target_is_found_past_its_home_slot_and_the_table_empties() {
    // Three targets with one home slot, the table's second last (no other test uses
    // it): that slot, the last and the guard slot after it.
    let base = 0x7f00_0000_0000 | ((TABLE_SLOTS as u64 - 2) << 4);
    table_address();
    let targets = [base, base + (1 << 36), base + (2 << 36)];
    assert!(targets.iter().all(|&t| home(t) == home(base)));
    for &target in &targets {
        assert_eq!(destination_of(target), None);
        assert!(follow_to(target, target));
    }
    assert!(targets.iter().all(|&t| destination_of(t) == Some(t)));
    // Only the guard slot is left past them: a fourth of that home finds no room.
    assert!(!follow_to(base + (3 << 36), 1));
    // A target already in is found, and its calls may be sent elsewhere.
    assert!(follow_to(targets[1], 0x1234));
    assert_eq!(destination_of(targets[1]), Some(0x1234));
    assert_eq!(destination_of(targets[2]), Some(targets[2]));
    // Calls sent to one place go to another (a hook in front switched).
    redirect(0x1234, 0x5678);
    assert_eq!(destination_of(targets[1]), Some(0x5678));
    assert_eq!(destination_of(targets[0]), Some(targets[0]));
    forget_all();
    assert!(targets.iter().all(|&t| destination_of(t).is_none()));
}
