//! Rows written for copies, read back with gimli at every address of the copy; and each
//! refusal, on `.eh_frame` bytes written the way compilers write them.

use super::*;
use gimli::write::Expression;

/// Where the test sections pretend to be loaded.
const SECTION: u64 = 0x50_0000;
/// Where the original function pretends to be.
const FUNCTION: u64 = 0x40_1000;
const RBX: u16 = 3;
const RBP: u16 = 6;
const R12: u16 = 12;
const RA: u16 = 16;

/// A CIE as GCC writes it on x86-64: CFA = rsp + 8, return address at CFA - 8,
/// addresses `pcrel | sdata4`.
fn gcc_cie() -> CommonInformationEntry {
    let encoding = Encoding {
        format: Format::Dwarf32,
        version: 1,
        address_size: 8,
    };
    let mut cie = CommonInformationEntry::new(encoding, 1, -8, Register(RA));
    cie.fde_address_encoding = constants::DW_EH_PE_pcrel | constants::DW_EH_PE_sdata4;
    cie.add_instruction(CallFrameInstruction::Cfa(Register(RSP), 8));
    cie.add_instruction(CallFrameInstruction::Offset(Register(RA), -8));
    cie
}

/// An `.eh_frame` loaded at [`SECTION`] with one FDE of `cie` for `len` bytes at
/// [`FUNCTION`]; returns the bytes and the FDE's address.
fn section_with(
    cie: CommonInformationEntry,
    len: u32,
    lsda: Option<u64>,
    rows: &[(u32, CallFrameInstruction)],
) -> (Vec<u8>, u64) {
    // gimli writes `pcrel` pointers as if the section were loaded at 0.
    let mut fde =
        FrameDescriptionEntry::new(Address::Constant(FUNCTION.wrapping_sub(SECTION)), len);
    fde.lsda = lsda.map(Address::Constant);
    for (offset, instruction) in rows {
        fde.add_instruction(*offset, instruction.clone());
    }
    let mut table = FrameTable::default();
    let cie = table.add_cie(cie);
    table.add_fde(cie, fde);
    let mut section = EhFrame(EndianVec::new(LittleEndian));
    table.write_eh_frame(&mut section).unwrap();
    let bytes = section.0.into_vec();
    let fde = SECTION + fde_offset(&bytes);
    (bytes, fde)
}

/// Offset of the FDE after a section's first CIE.
fn fde_offset(bytes: &[u8]) -> u64 {
    4 + u64::from(u32::from_le_bytes(bytes[..4].try_into().unwrap()))
}

/// A function without frame pointer: `push rbx; push r12; sub rsp,8; (body); add rsp,8;
/// pop r12; pop rbx; ret`, with the rows GCC gives it. Its instructions as (offset,
/// length).
fn frameless() -> (OriginalUnwind, Vec<(u64, u64)>) {
    use CallFrameInstruction as I;
    let rows = [
        (1, I::CfaOffset(16)),
        (1, I::Offset(Register(RBX), -16)),
        (3, I::CfaOffset(24)),
        (3, I::Offset(Register(R12), -24)),
        (7, I::CfaOffset(32)),
        (0x24, I::CfaOffset(24)),
        (0x26, I::CfaOffset(16)),
        (0x26, I::Restore(Register(R12))),
        (0x27, I::CfaOffset(8)),
        (0x27, I::Restore(Register(RBX))),
    ];
    let (bytes, fde) = section_with(gcc_cie(), 0x28, None, &rows);
    let original = OriginalUnwind::parse(&bytes, SECTION, fde).unwrap();
    let instructions = vec![
        (0, 1),
        (1, 2),
        (3, 4),
        (7, 9),
        (0x10, 0x10),
        (0x20, 4),
        (0x24, 2),
        (0x26, 1),
        (0x27, 1),
    ];
    (original, instructions)
}

/// A function with a frame pointer: `push rbp; mov rbp,rsp; push rbx; sub rsp,8;
/// (body); mov rbx,[rbp-8]; leave; ret`.
fn with_frame_pointer() -> (OriginalUnwind, Vec<(u64, u64)>) {
    use CallFrameInstruction as I;
    let rows = [
        (1, I::CfaOffset(16)),
        (1, I::Offset(Register(RBP), -16)),
        (4, I::CfaRegister(Register(RBP))),
        (5, I::Offset(Register(RBX), -24)),
        (0x24, I::Restore(Register(RBX))),
        (0x25, I::Cfa(Register(RSP), 8)),
        (0x25, I::Restore(Register(RBP))),
    ];
    let (bytes, fde) = section_with(gcc_cie(), 0x26, None, &rows);
    let original = OriginalUnwind::parse(&bytes, SECTION, fde).unwrap();
    let instructions = vec![
        (0, 1),
        (1, 3),
        (4, 1),
        (5, 4),
        (9, 0x17),
        (0x20, 4),
        (0x24, 1),
        (0x25, 1),
    ];
    (original, instructions)
}

/// A copy at `copy_start` of a function whose instructions are `instructions`, with a
/// counter like the agent's (`lea rsp,[rsp-128]; push rcx; mov rcx,imm64; inc [rcx];
/// pop rcx; lea rsp,[rsp+128]`) before each instruction of `counted`. Returns the copy's
/// instructions and length.
fn copy_with_counters(
    instructions: &[(u64, u64)],
    counted: &[u64],
    copy_start: u64,
) -> (Vec<CopiedInstruction>, u64) {
    let counter: [(u64, u32); 6] = [(5, 0), (1, 128), (10, 136), (3, 136), (1, 136), (8, 128)];
    let mut copied = Vec::new();
    let mut at = copy_start;
    for &(offset, len) in instructions {
        let row_of = FUNCTION + offset;
        if counted.contains(&offset) {
            for (len, extra_stack) in counter {
                copied.push(CopiedInstruction {
                    copy: at,
                    row_of,
                    extra_stack,
                });
                at += len;
            }
        }
        copied.push(CopiedInstruction {
            copy: at,
            row_of,
            extra_stack: 0,
        });
        at += len;
    }
    (copied, at - copy_start)
}

/// The row the copy must have at each of its instructions: the original's, with the
/// inserted bytes added to an rsp-based CFA.
fn expected_row(
    original: &OriginalUnwind,
    copied: &CopiedInstruction,
) -> (u16, i64, Vec<(u16, Rule)>) {
    let row = original.row_at(copied.row_of).unwrap();
    let extra = if row.cfa_register == RSP {
        i64::from(copied.extra_stack)
    } else {
        0
    };
    (
        row.cfa_register,
        row.cfa_offset + extra,
        sorted(&row.registers),
    )
}

fn sorted(rules: &[(u16, Rule)]) -> Vec<(u16, Rule)> {
    let mut rules = rules.to_vec();
    rules.sort_by_key(|&(register, _)| register);
    rules
}

/// Writes the copy's section, reads it back, and checks the row at every byte of the
/// copy; returns the rows read back.
fn check_every_address(
    original: &OriginalUnwind,
    copied: &[CopiedInstruction],
    copy_start: u64,
    copy_len: u64,
) -> OriginalUnwind {
    let bytes = eh_frame_for_copy(original, copy_start, copy_len, copied, None).unwrap();
    assert_eq!(bytes[bytes.len() - 4..], [0; 4], "ended by a zero word");
    // Absolute addresses: the bytes read the same wherever they are loaded.
    let loaded_at = 0x7777_0000;
    let copy = OriginalUnwind::parse(&bytes, loaded_at, loaded_at + fde_offset(&bytes)).unwrap();
    assert_eq!((copy.start, copy.end), (copy_start, copy_start + copy_len));
    assert_eq!(copy.data_alignment_factor, original.data_alignment_factor);
    assert_eq!(copy.return_address_register, RA);
    for (k, instruction) in copied.iter().enumerate() {
        let end = copied
            .get(k + 1)
            .map_or(copy_start + copy_len, |next| next.copy);
        for address in instruction.copy..end {
            let row = copy.row_at(address).unwrap();
            assert_eq!(
                (row.cfa_register, row.cfa_offset, sorted(&row.registers)),
                expected_row(original, instruction),
                "at copy + {:#x}",
                address - copy_start
            );
        }
    }
    copy
}

#[test]
fn a_frameless_copy_has_the_originals_rows_with_the_counters_pushes_added_to_the_cfa() {
    let (original, instructions) = frameless();
    assert_eq!((original.start, original.end), (FUNCTION, FUNCTION + 0x28));
    // A counter at the entry, in the prologue, in the body and before the `ret`.
    let copy_start = 0x7000_0000;
    let (copied, len) = copy_with_counters(&instructions, &[0, 3, 0x10, 0x27], copy_start);
    let copy = check_every_address(&original, &copied, copy_start, len);
    // A row only where it changes: the original's 6 changes, and 4 per counter (at its
    // `push rcx`, at the `mov` after it, at its `lea` back, at the instruction it counts).
    assert_eq!(original.rows.len(), 7);
    let changes = copied
        .windows(2)
        .filter(|pair| expected_row(&original, &pair[0]) != expected_row(&original, &pair[1]))
        .count();
    assert_eq!(changes, 6 + 4 * 4);
    assert_eq!(copy.rows.len(), changes + 1);
}

#[test]
fn with_a_frame_pointer_the_counters_pushes_change_the_rows_only_before_it_is_set_up() {
    let (original, instructions) = with_frame_pointer();
    let copy_start = 0x7000_0000;
    let (copied, len) = copy_with_counters(&instructions, &[0, 1, 9, 0x24, 0x25], copy_start);
    let copy = check_every_address(&original, &copied, copy_start, len);
    // Inside the body the CFA is rbp-based: the counter there adds no row.
    let body_counter = copied.iter().find(|c| c.row_of == FUNCTION + 9).unwrap();
    let row = copy.row_at(body_counter.copy + 6).unwrap();
    assert_eq!((row.cfa_register, row.cfa_offset), (RBP, 16));
    assert!(row.registers.contains(&(RBX, Rule::Offset(-24))));
    // After `mov rbx,[rbp-8]` the copy, like the original, has no rule for rbx.
    let restored = copied.iter().find(|c| c.row_of == FUNCTION + 0x24).unwrap();
    let row = copy.row_at(restored.copy).unwrap();
    assert!(!row.registers.iter().any(|&(r, _)| r == RBX));
    assert!(row.registers.contains(&(RBP, Rule::Offset(-16))));
}

#[test]
fn a_one_to_one_copy_has_the_originals_rows_moved() {
    let (original, instructions) = frameless();
    let copy_start = 0x7100_0000;
    let (copied, len) = copy_with_counters(&instructions, &[], copy_start);
    assert_eq!(len, 0x28);
    let copy = check_every_address(&original, &copied, copy_start, len);
    let moved: Vec<Row> = original
        .rows
        .iter()
        .map(|row| Row {
            start: row.start - FUNCTION + copy_start,
            end: row.end - FUNCTION + copy_start,
            cfa_register: row.cfa_register,
            cfa_offset: row.cfa_offset,
            registers: sorted(&row.registers),
        })
        .collect();
    let read_back: Vec<Row> = copy
        .rows
        .iter()
        .map(|row| Row {
            registers: sorted(&row.registers),
            ..row.clone()
        })
        .collect();
    assert_eq!(read_back, moved);
}

#[test]
fn the_copy_builders_placed_instructions_are_taken_as_they_are() {
    let (original, instructions) = frameless();
    let copy_start = 0x7000_0000;
    let (copied, len) = copy_with_counters(&instructions, &[3], copy_start);
    let placed: Vec<PlacedInstruction> = copied
        .iter()
        .map(|c| PlacedInstruction {
            copy: c.copy,
            original: (c.extra_stack == 0).then_some(c.row_of),
            row_of: c.row_of,
            extra_stack: c.extra_stack,
        })
        .collect();
    assert_eq!(
        eh_frame_for_copy(&original, copy_start, len, &placed, None),
        eh_frame_for_copy(&original, copy_start, len, &copied, None)
    );
}

#[test]
fn an_lsda_is_read_with_its_personality_and_a_null_one_is_none_whatever_its_encoding() {
    use CallFrameInstruction as I;
    let rows = [(1, I::CfaOffset(16))];
    for lsda_encoding in [
        constants::DW_EH_PE_absptr,
        constants::DW_EH_PE_udata4,
        constants::DW_EH_PE_pcrel | constants::DW_EH_PE_sdata4,
    ] {
        let mut cie = gcc_cie();
        cie.personality = Some((constants::DW_EH_PE_absptr, Address::Constant(0x1234)));
        cie.lsda_encoding = Some(lsda_encoding);
        let (mut bytes, fde) = section_with(cie, 0x10, Some(0x40_2000), &rows);
        assert_eq!(
            OriginalUnwind::parse(&bytes, SECTION, fde)
                .unwrap()
                .exceptions,
            Some(Exceptions {
                // gimli wrote a `pcrel` field relative to the start of its buffer.
                lsda: 0x40_2000
                    + if lsda_encoding == constants::DW_EH_PE_pcrel | constants::DW_EH_PE_sdata4 {
                        SECTION
                    } else {
                        0
                    },
                personality: 0x1234,
                indirect: false
            }),
            "{lsda_encoding}"
        );
        // The LSDA field: after the length, the CIE pointer, the address and the length
        // of the code (`sdata4` each) and the augmentation data's length (one byte).
        let field = (fde - SECTION + 17) as usize;
        let size = if lsda_encoding == constants::DW_EH_PE_absptr {
            8
        } else {
            4
        };
        assert_eq!(
            usize::from(bytes[field - 1]),
            size,
            "the augmentation length"
        );
        bytes[field..field + size].fill(0);
        let original = OriginalUnwind::parse(&bytes, SECTION, fde).unwrap();
        assert_eq!(original.rows.len(), 2);
        assert_eq!(original.exceptions, None);
    }
}

#[test]
fn dwarf_expressions_are_refused() {
    let mut expression = Expression::new();
    expression.op_breg(Register(RSP), 8);
    let refused = [
        CallFrameInstruction::CfaExpression(expression.clone()),
        CallFrameInstruction::Expression(Register(RBX), expression.clone()),
        CallFrameInstruction::ValExpression(Register(RBX), expression),
    ];
    for instruction in refused {
        let (bytes, fde) = section_with(gcc_cie(), 0x10, None, &[(1, instruction)]);
        assert_eq!(
            OriginalUnwind::parse(&bytes, SECTION, fde),
            Err(UnwindRefusal::Expression)
        );
    }
}

#[test]
fn unreadable_unwind_information_is_refused_as_malformed() {
    let (bytes, fde) = section_with(gcc_cie(), 0x10, None, &[]);
    assert!(matches!(
        OriginalUnwind::parse(&bytes[..bytes.len() - 8], SECTION, fde),
        Err(UnwindRefusal::Malformed(_))
    ));
    assert!(matches!(
        OriginalUnwind::parse(&bytes, SECTION, SECTION - 8),
        Err(UnwindRefusal::Malformed(_))
    ));
}

#[test]
fn a_copy_that_names_code_outside_the_fde_or_does_not_tile_its_range_is_refused() {
    let (original, instructions) = frameless();
    let copy_start = 0x7000_0000;
    let (copied, len) = copy_with_counters(&instructions, &[], copy_start);
    let mut outside = copied.clone();
    outside[3].row_of = FUNCTION + 0x28;
    assert_eq!(
        eh_frame_for_copy(&original, copy_start, len, &outside, None),
        Err(UnwindRefusal::NotCovered(FUNCTION + 0x28))
    );
    let layout = |copied: &[CopiedInstruction], len: u64| {
        matches!(
            eh_frame_for_copy(&original, copy_start, len, copied, None),
            Err(UnwindRefusal::Layout(_))
        )
    };
    assert!(layout(&copied[1..], len), "the first is not at the start");
    assert!(layout(&copied, 3), "instructions past the end");
    assert!(layout(&[], len), "no instructions");
    let mut unsorted = copied.clone();
    unsorted.swap(2, 3);
    assert!(layout(&unsorted, len), "out of order");
}

#[test]
fn every_refusal_says_why_in_a_sentence() {
    let reasons = [
        (UnwindRefusal::Expression, "DWARF expression"),
        (
            UnwindRefusal::ExceptionTables("no LSDA".into()),
            "try/catch, destructors or noexcept) cannot be moved to a copy: no LSDA",
        ),
        (
            UnwindRefusal::Malformed("eof".into()),
            "does not parse (eof)",
        ),
        (UnwindRefusal::NotCovered(0x1234), "instruction at 0x1234"),
        (UnwindRefusal::Layout("x".into()), "instruction list"),
        (UnwindRefusal::Writing("x".into()), "unwind information"),
    ];
    for (refusal, words) in reasons {
        let sentence = refusal.to_string();
        assert!(sentence.contains(words), "{sentence}");
        assert!(sentence.starts_with("it"), "{sentence}");
    }
}
