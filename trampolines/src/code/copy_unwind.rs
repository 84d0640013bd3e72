//! Unwind information for a function's copy (issue 18): the original's `.eh_frame` rows,
//! moved to the copy's addresses.
//!
//! The one idea: at every instruction of the copy, the row that applies is the row of
//! the original instruction it stands for (`PlacedInstruction::row_of`), with the CFA
//! further from the stack pointer by what inserted code has pushed (`extra_stack`) when
//! the CFA is based on `rsp`. Rules for saved registers are relative to the CFA and stay
//! as they are. The rows are written as a fresh CIE and FDE (gimli's writer) covering
//! the copy, ready for the unwinder's `__register_frame`.
//!
//! Refused, with the reason: DWARF expressions (rare outside hand-written code), and
//! functions with exception tables (an LSDA), whose landing pads are offsets into the
//! original and would need tables of their own.

use super::function_copy::PlacedInstruction;
use gimli::write::{
    Address, CallFrameInstruction, CommonInformationEntry, EhFrame, EndianVec,
    FrameDescriptionEntry, FrameTable,
};
use gimli::{
    BaseAddresses, CfaRule, EhFrameOffset, Encoding, Format, LittleEndian, Register, RegisterRule,
    UnwindContext, UnwindSection,
};
use std::fmt;

/// DWARF's number for `rsp`.
const RSP: u16 = 7;
/// DWARF's number for the return address column on x86-64.
const RETURN_ADDRESS: u16 = 16;

/// How a register is recovered, in the forms a copy can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    Undefined,
    SameValue,
    /// Saved at CFA + n.
    Offset(i64),
    /// Its value is CFA + n.
    ValOffset(i64),
    /// In another register.
    Register(u16),
}

/// One row: the CFA as register + offset, and the registers' rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub start: u64,
    pub end: u64,
    pub cfa_register: u16,
    pub cfa_offset: i64,
    pub registers: Vec<(u16, Rule)>,
}

/// The rows of the original function, from its FDE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginalUnwind {
    pub start: u64,
    pub end: u64,
    pub rows: Vec<Row>,
}

/// Why a copy cannot get unwind information.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnwindRefusal {
    /// The original's unwind information does not parse.
    Malformed(String),
    /// It uses a DWARF expression.
    Expression,
    /// The function has exception tables.
    ExceptionTables,
    /// gimli could not write the copy's.
    Writing(String),
}

impl fmt::Display for UnwindRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed(why) => write!(f, "its unwind information does not parse ({why})"),
            Self::Expression => write!(
                f,
                "its unwind information uses a DWARF expression, which tendril cannot yet \
                 rewrite for a copy"
            ),
            Self::ExceptionTables => write!(
                f,
                "it has exception-handling tables (a C++ try/catch, destructors or noexcept), \
                 which tendril cannot yet move to a copy"
            ),
            Self::Writing(why) => write!(f, "its copy's unwind information: {why}"),
        }
    }
}

impl OriginalUnwind {
    /// The rows of the FDE at `fde_address`, from `section`: memory that starts at
    /// `section_address` and holds both the FDE and its CIE.
    pub fn parse(
        section: &[u8],
        section_address: u64,
        fde_address: u64,
    ) -> Result<OriginalUnwind, UnwindRefusal> {
        let malformed = |e: gimli::Error| UnwindRefusal::Malformed(e.to_string());
        let eh_frame = gimli::EhFrame::new(section, LittleEndian);
        let bases = BaseAddresses::default().set_eh_frame(section_address);
        let offset = EhFrameOffset((fde_address - section_address) as usize);
        let fde = eh_frame
            .fde_from_offset(&bases, offset, gimli::EhFrame::cie_from_offset)
            .map_err(malformed)?;
        // An FDE of a CIE with an LSDA encoding always has the field; a null one means
        // the function has no tables.
        if fde
            .lsda()
            .is_some_and(|lsda| lsda != gimli::Pointer::Direct(0))
        {
            return Err(UnwindRefusal::ExceptionTables);
        }
        let mut context = UnwindContext::new();
        let mut table = fde
            .rows(&eh_frame, &bases, &mut context)
            .map_err(malformed)?;
        let mut rows = Vec::new();
        while let Some(row) = table.next_row().map_err(malformed)? {
            let CfaRule::RegisterAndOffset { register, offset } = row.cfa() else {
                return Err(UnwindRefusal::Expression);
            };
            let registers = row
                .registers()
                .map(|(register, rule)| {
                    let rule = match rule {
                        RegisterRule::Undefined => Rule::Undefined,
                        RegisterRule::SameValue => Rule::SameValue,
                        RegisterRule::Offset(n) => Rule::Offset(*n),
                        RegisterRule::ValOffset(n) => Rule::ValOffset(*n),
                        RegisterRule::Register(other) => Rule::Register(other.0),
                        _ => return Err(UnwindRefusal::Expression),
                    };
                    Ok((register.0, rule))
                })
                .collect::<Result<Vec<_>, _>>()?;
            rows.push(Row {
                start: row.start_address(),
                end: row.end_address(),
                cfa_register: register.0,
                cfa_offset: *offset,
                registers,
            });
        }
        Ok(OriginalUnwind {
            start: fde.initial_address(),
            end: fde.end_address(),
            rows,
        })
    }

    /// The row at `address`; before the first row or past the last, the nearest.
    fn row_at(&self, address: u64) -> Option<&Row> {
        self.rows
            .iter()
            .find(|row| (row.start..row.end).contains(&address))
            .or_else(|| {
                if address < self.start {
                    self.rows.first()
                } else {
                    self.rows.last()
                }
            })
    }
}

/// An `.eh_frame` section (one CIE, one FDE, a zero terminator) for the copy at
/// `copy_start..copy_start + copy_len`, whose instructions are `instructions`.
pub fn eh_frame_for_copy(
    original: &OriginalUnwind,
    copy_start: u64,
    copy_len: u64,
    instructions: &[PlacedInstruction],
) -> Result<Vec<u8>, UnwindRefusal> {
    let encoding = Encoding {
        format: Format::Dwarf32,
        version: 1,
        address_size: 8,
    };
    let mut cie = CommonInformationEntry::new(encoding, 1, -8, Register(RETURN_ADDRESS));
    cie.add_instruction(CallFrameInstruction::Cfa(Register(RSP), 8));
    cie.add_instruction(CallFrameInstruction::Offset(Register(RETURN_ADDRESS), -8));
    let mut fde = FrameDescriptionEntry::new(Address::Constant(copy_start), copy_len as u32);
    let mut previous: Option<Row> = None;
    for placed in instructions {
        let Some(row) = original.row_at(placed.row_of) else {
            continue;
        };
        let mut row = row.clone();
        if row.cfa_register == RSP {
            row.cfa_offset += i64::from(placed.extra_stack);
        }
        let offset = (placed.copy - copy_start) as u32;
        let changed_cfa = previous
            .as_ref()
            .is_none_or(|p| (p.cfa_register, p.cfa_offset) != (row.cfa_register, row.cfa_offset));
        if changed_cfa {
            let offset_i32 = i32::try_from(row.cfa_offset)
                .map_err(|_| UnwindRefusal::Writing("a CFA offset out of range".into()))?;
            fde.add_instruction(
                offset,
                CallFrameInstruction::Cfa(Register(row.cfa_register), offset_i32),
            );
        }
        let before: &[(u16, Rule)] = previous.as_ref().map_or(&[], |p| &p.registers);
        for &(register, rule) in &row.registers {
            if before.contains(&(register, rule)) {
                continue;
            }
            fde.add_instruction(offset, write_rule(register, rule)?);
        }
        for &(register, _) in before {
            if !row.registers.iter().any(|&(r, _)| r == register) {
                fde.add_instruction(offset, CallFrameInstruction::Restore(Register(register)));
            }
        }
        previous = Some(row);
    }
    let mut table = FrameTable::default();
    let cie = table.add_cie(cie);
    table.add_fde(cie, fde);
    let mut section = EhFrame(EndianVec::new(LittleEndian));
    table
        .write_eh_frame(&mut section)
        .map_err(|e| UnwindRefusal::Writing(e.to_string()))?;
    let mut bytes = section.0.into_vec();
    bytes.extend_from_slice(&[0; 4]);
    Ok(bytes)
}

fn write_rule(register: u16, rule: Rule) -> Result<CallFrameInstruction, UnwindRefusal> {
    let small = |n: i64| {
        i32::try_from(n)
            .map_err(|_| UnwindRefusal::Writing("a register offset out of range".into()))
    };
    let register = Register(register);
    Ok(match rule {
        Rule::Undefined => CallFrameInstruction::Undefined(register),
        Rule::SameValue => CallFrameInstruction::SameValue(register),
        Rule::Offset(n) => CallFrameInstruction::Offset(register, small(n)?),
        Rule::ValOffset(n) => CallFrameInstruction::ValOffset(register, small(n)?),
        Rule::Register(other) => CallFrameInstruction::Register(register, Register(other)),
    })
}

// Safe code only: Miri (which CI runs over `code::`) would add nothing but hours.
#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;

    /// A typical prologue's rows: entry, after `push rbp`, after `mov rbp,rsp`.
    fn original() -> OriginalUnwind {
        let ra = (RETURN_ADDRESS, Rule::Offset(-8));
        OriginalUnwind {
            start: 0x1000,
            end: 0x1020,
            rows: vec![
                Row {
                    start: 0x1000,
                    end: 0x1001,
                    cfa_register: RSP,
                    cfa_offset: 8,
                    registers: vec![ra],
                },
                Row {
                    start: 0x1001,
                    end: 0x1004,
                    cfa_register: RSP,
                    cfa_offset: 16,
                    registers: vec![ra, (6, Rule::Offset(-16))],
                },
                Row {
                    start: 0x1004,
                    end: 0x1020,
                    cfa_register: 6,
                    cfa_offset: 16,
                    registers: vec![ra, (6, Rule::Offset(-16))],
                },
            ],
        }
    }

    fn placed(copy: u64, row_of: u64, extra_stack: u32) -> PlacedInstruction {
        PlacedInstruction {
            copy,
            original: None,
            row_of,
            extra_stack,
        }
    }

    #[test]
    fn the_copy_has_the_originals_rows_with_inserted_pushes_added_to_an_rsp_cfa() {
        let copy = 0x7000_0000;
        let instructions = [
            placed(copy, 0x1000, 0),       // counter: lea rsp,[rsp-128]
            placed(copy + 5, 0x1000, 128), // push rcx
            placed(copy + 6, 0x1000, 136), // ... pop rcx
            placed(copy + 7, 0x1000, 128), // lea rsp,[rsp+128]
            placed(copy + 12, 0x1000, 0),  // push rbp (relocated)
            placed(copy + 13, 0x1001, 0),  // mov rbp,rsp
            placed(copy + 16, 0x1004, 0),  // a counter after the frame is set up
            placed(copy + 21, 0x1004, 136),
            placed(copy + 30, 0x1004, 0), // the rest
        ];
        let bytes = eh_frame_for_copy(&original(), copy, 40, &instructions).unwrap();
        let parsed = OriginalUnwind::parse(&bytes, 0x5000, 0x5000 + first_fde(&bytes)).unwrap();
        assert_eq!((parsed.start, parsed.end), (copy, copy + 40));
        let at = |address: u64| {
            let row = parsed.row_at(address).unwrap();
            (row.cfa_register, row.cfa_offset)
        };
        assert_eq!(at(copy), (RSP, 8));
        assert_eq!(at(copy + 5), (RSP, 136));
        assert_eq!(at(copy + 6), (RSP, 144));
        assert_eq!(at(copy + 7), (RSP, 136));
        assert_eq!(at(copy + 12), (RSP, 8));
        assert_eq!(at(copy + 13), (RSP, 16));
        // rbp-based: the counter's pushes change nothing.
        assert_eq!(at(copy + 21), (6, 16));
        assert_eq!(at(copy + 39), (6, 16));
        let saved = |address: u64| parsed.row_at(address).unwrap().registers.clone();
        assert!(saved(copy + 13).contains(&(6, Rule::Offset(-16))));
        assert!(!saved(copy + 12).iter().any(|&(r, _)| r == 6));
    }

    /// Offset of the first FDE in a section written by [`eh_frame_for_copy`] (after
    /// its one CIE).
    fn first_fde(bytes: &[u8]) -> u64 {
        let cie_length = u32::from_le_bytes(bytes[..4].try_into().unwrap());
        4 + u64::from(cie_length)
    }

    #[test]
    fn expressions_and_exception_tables_are_refused_with_the_reason() {
        assert!(
            UnwindRefusal::ExceptionTables
                .to_string()
                .contains("try/catch")
        );
        assert!(
            UnwindRefusal::Expression
                .to_string()
                .contains("DWARF expression")
        );
    }
}
