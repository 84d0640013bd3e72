//! Unwind information for a function's copy (issue 18): the original's `.eh_frame` rows,
//! moved to the copy's addresses.
//!
//! The one idea: at every instruction of the copy, the row that applies is the row of
//! the original instruction it stands for (`CopiedInstruction::row_of`), with the CFA
//! further from the stack pointer by what inserted code has pushed (`extra_stack`) when
//! the CFA is based on `rsp`. Rules for saved registers are relative to the CFA and stay
//! as they are. The rows are written as a fresh CIE and FDE (gimli's writer) covering
//! the copy, ready for the unwinder's `__register_frame` (`sys::frame_registry`).
//!
//! A function with exception tables keeps its personality routine, and its copy's FDE
//! points at the copy's own LSDA (`code::lsda` writes it). Refused, with the reason:
//! DWARF expressions (rare outside hand-written code).

use super::function_copy::PlacedInstruction;
use gimli::write::{
    Address, CallFrameInstruction, CommonInformationEntry, EhFrame, EndianVec,
    FrameDescriptionEntry, FrameTable,
};
use gimli::{
    BaseAddresses, CfaRule, EhFrameOffset, Encoding, EndianSlice, Format, LittleEndian, Reader,
    Register, RegisterRule, UnwindContext, UnwindSection, constants,
};
use std::fmt;

/// DWARF's number for `rsp`.
pub const RSP: u16 = 7;

/// One instruction of the copy, in copy order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopiedInstruction {
    /// Its address in the copy.
    pub copy: u64,
    /// The original instruction whose unwind row applies here: the instruction itself for a
    /// relocated one; for inserted code (a counter), the original instruction it runs before.
    pub row_of: u64,
    /// Bytes the inserted code has pushed below the original stack pointer when this
    /// instruction starts (0 for relocated instructions; e.g. 128 after `lea rsp,[rsp-128]`,
    /// 136 after a following `push rcx`).
    pub extra_stack: u32,
}

impl From<PlacedInstruction> for CopiedInstruction {
    fn from(placed: PlacedInstruction) -> CopiedInstruction {
        CopiedInstruction {
            copy: placed.copy,
            row_of: placed.row_of,
            extra_stack: placed.extra_stack,
        }
    }
}

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

/// One row: from `start` to `end`, the CFA is `cfa_register` + `cfa_offset`, and the
/// registers listed have these rules (a register not listed has none: its caller's
/// value is still in it, for every unwinder tendril meets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub start: u64,
    pub end: u64,
    pub cfa_register: u16,
    pub cfa_offset: i64,
    pub registers: Vec<(u16, Rule)>,
}

impl Row {
    /// Whether `other` says the same from the CFA on (ignoring where the rows are).
    fn same_rules(&self, other: &Row) -> bool {
        (self.cfa_register, self.cfa_offset) == (other.cfa_register, other.cfa_offset)
            && self.registers.len() == other.registers.len()
            && self
                .registers
                .iter()
                .all(|rule| other.registers.contains(rule))
    }
}

/// The rows of the original function, from its FDE, and what of its CIE the copy's
/// needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginalUnwind {
    /// The code the FDE covers: `start..end`.
    pub start: u64,
    pub end: u64,
    /// The CIE's factor for register offsets: every offset in the rows is a multiple of
    /// it, so the copy's CIE uses it too.
    pub data_alignment_factor: i64,
    /// The column of the return address (16 on x86-64).
    pub return_address_register: u16,
    /// Covering `start..end`, in address order.
    pub rows: Vec<Row>,
    /// Its exception tables, if it has any.
    pub exceptions: Option<Exceptions>,
}

/// A function's exception tables, and the personality routine that reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exceptions {
    /// The LSDA's address.
    pub lsda: u64,
    /// The personality routine, or (when `indirect`) where its address is stored.
    pub personality: u64,
    pub indirect: bool,
}

/// Why a copy cannot get unwind information.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnwindRefusal {
    /// The original's unwind information does not parse.
    Malformed(String),
    /// It uses a DWARF expression.
    Expression,
    /// The function's exception tables cannot be given to the copy.
    ExceptionTables(String),
    /// The copy names an original instruction at this address, outside the FDE.
    NotCovered(u64),
    /// The copy's instruction list does not describe the copy.
    Layout(String),
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
            Self::ExceptionTables(why) => write!(
                f,
                "its exception-handling tables (a C++ try/catch, destructors or noexcept) \
                 cannot be moved to a copy: {why}"
            ),
            Self::NotCovered(address) => write!(
                f,
                "its unwind information does not cover its instruction at {address:#x}"
            ),
            Self::Layout(why) => write!(f, "its copy's instruction list is inconsistent ({why})"),
            Self::Writing(why) => write!(f, "its copy's unwind information: {why}"),
        }
    }
}

impl OriginalUnwind {
    /// The rows of the FDE at `fde_address`, from `section`: memory that starts at
    /// `section_address` and holds both the FDE and its CIE (a piece of a loaded
    /// `.eh_frame`, as `sys::frame_registry::FoundFde::section` gives).
    ///
    /// `pcrel` and absolute pointers are read; on x86-64 compilers use nothing else
    /// (libgcc's unwinder has no text or data base for this target either), so an FDE
    /// whose pointers are relative to those bases is refused as malformed.
    pub fn parse(
        section: &[u8],
        section_address: u64,
        fde_address: u64,
    ) -> Result<OriginalUnwind, UnwindRefusal> {
        let malformed = |e: gimli::Error| UnwindRefusal::Malformed(e.to_string());
        let eh_frame = gimli::EhFrame::new(section, LittleEndian);
        let bases = BaseAddresses::default().set_eh_frame(section_address);
        let fde_offset = fde_address
            .checked_sub(section_address)
            .ok_or_else(|| UnwindRefusal::Malformed("the FDE lies before the section".into()))?
            as usize;
        let fde = eh_frame
            .fde_from_offset(
                &bases,
                EhFrameOffset(fde_offset),
                gimli::EhFrame::cie_from_offset,
            )
            .map_err(malformed)?;
        let exceptions =
            if has_exception_tables(section, fde_offset, fde.cie()).map_err(malformed)? {
                let address = |pointer: gimli::Pointer| match pointer {
                    gimli::Pointer::Direct(address) => (address, false),
                    gimli::Pointer::Indirect(address) => (address, true),
                };
                let (Some(lsda), Some(personality)) = (fde.lsda(), fde.cie().personality()) else {
                    return Err(UnwindRefusal::ExceptionTables(
                        "an LSDA without a personality routine".into(),
                    ));
                };
                let (personality, indirect) = address(personality);
                Some(Exceptions {
                    lsda: address(lsda).0,
                    personality,
                    indirect,
                })
            } else {
                None
            };
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
            data_alignment_factor: fde.cie().data_alignment_factor(),
            return_address_register: fde.cie().return_address_register().0,
            rows,
            exceptions,
        })
    }

    /// Whether the rows of another part of the function (its `.cold` part) can join
    /// these: the same factor and return-address column, and, where both have exception
    /// tables, the same personality routine.
    pub fn joins(&self, part: &OriginalUnwind) -> bool {
        let personality = |unwind: &OriginalUnwind| {
            unwind
                .exceptions
                .map(|exceptions| (exceptions.personality, exceptions.indirect))
        };
        (self.data_alignment_factor, self.return_address_register)
            == (part.data_alignment_factor, part.return_address_register)
            && (personality(self).is_none()
                || personality(part).is_none()
                || personality(self) == personality(part))
    }

    /// Takes in the rows of `part` (see [`OriginalUnwind::joins`]), and its personality
    /// routine if these had none. `start..end` stay the main part's; `row_at` answers
    /// for every part's code, and for none between them.
    pub fn join(&mut self, part: OriginalUnwind) {
        self.rows.extend(part.rows);
        self.rows.sort_by_key(|row| row.start);
        if self.exceptions.is_none() {
            self.exceptions = part.exceptions;
        }
    }

    /// The row that applies at `address`, if the FDE covers it.
    pub fn row_at(&self, address: u64) -> Option<&Row> {
        let after = self.rows.partition_point(|row| row.start <= address);
        let row = self.rows.get(after.checked_sub(1)?)?;
        (address < row.end).then_some(row)
    }
}

/// Whether the FDE at `fde_offset` in `section` points at exception tables (an LSDA).
///
/// Every FDE of a CIE with an `L` augmentation has the field; zero there means the
/// function has none. The unwinder tests the field's raw value, before the encoding's
/// base is added, and so does this: gimli's `Fde::lsda` has the base added already, and
/// a null `pcrel` field would come back as the field's own address.
fn has_exception_tables(
    section: &[u8],
    fde_offset: usize,
    cie: &gimli::CommonInformationEntry<EndianSlice<'_, LittleEndian>>,
) -> gimli::Result<bool> {
    let Some(lsda_encoding) = cie.lsda_encoding() else {
        return Ok(false);
    };
    if lsda_encoding == constants::DW_EH_PE_omit {
        return Ok(false);
    }
    let mut input = EndianSlice::new(section, LittleEndian);
    input.skip(fde_offset)?;
    // The length (a 64-bit one after 0xffffffff), then the CIE pointer of that size.
    let offset_size = if input.read_u32()? == u32::MAX {
        input.skip(8)?;
        8
    } else {
        4
    };
    input.skip(offset_size)?;
    let address_format = cie
        .fde_address_encoding()
        .unwrap_or(constants::DW_EH_PE_absptr)
        .format();
    read_encoded(&mut input, address_format)?; // the first address
    read_encoded(&mut input, address_format)?; // the length of the code
    input.read_uleb128()?; // the augmentation data's length; the LSDA field comes first
    Ok(read_encoded(&mut input, lsda_encoding.format())? != 0)
}

/// The raw value of a field of pointer format `format` (its low 4 bits).
fn read_encoded(
    input: &mut EndianSlice<'_, LittleEndian>,
    format: constants::DwEhPe,
) -> gimli::Result<u64> {
    Ok(match format {
        constants::DW_EH_PE_absptr | constants::DW_EH_PE_udata8 | constants::DW_EH_PE_sdata8 => {
            input.read_u64()?
        }
        constants::DW_EH_PE_udata4 | constants::DW_EH_PE_sdata4 => input.read_u32()?.into(),
        constants::DW_EH_PE_udata2 | constants::DW_EH_PE_sdata2 => input.read_u16()?.into(),
        constants::DW_EH_PE_uleb128 => input.read_uleb128()?,
        constants::DW_EH_PE_sleb128 => input.read_sleb128()? as u64,
        _ => return Err(gimli::Error::UnknownPointerEncoding(format)),
    })
}

/// An `.eh_frame` section (one CIE, one FDE, a zero terminator) for the copy at
/// `copy_start..copy_start + copy_len`, whose instructions are `instructions`: sorted
/// by address, the first at `copy_start`, each ending where the next begins and the
/// last at the copy's end. The FDE's addresses are absolute, so the bytes may be
/// written anywhere. A function with exception tables needs `lsda`, its copy's LSDA
/// (see `code::lsda`), and keeps its personality routine.
///
/// Rows are written where the row changes, as the difference from the one before: the
/// CFA, the rules that are new or changed, and `DW_CFA_restore` for a register whose
/// rule is gone. The CIE has no initial rules, so a restore leaves the register with
/// none — what its absence in the original's row means — for gimli and libgcc alike
/// (libgcc reads every restore as "unsaved", whatever the CIE says).
pub fn eh_frame_for_copy<I: Copy + Into<CopiedInstruction>>(
    original: &OriginalUnwind,
    copy_start: u64,
    copy_len: u64,
    instructions: &[I],
    lsda: Option<u64>,
) -> Result<Vec<u8>, UnwindRefusal> {
    let instructions: Vec<CopiedInstruction> = instructions.iter().map(|&i| i.into()).collect();
    check_layout(copy_start, copy_len, &instructions)?;
    let data_alignment_factor = i8::try_from(original.data_alignment_factor)
        .map_err(|_| UnwindRefusal::Malformed("a data alignment factor out of range".into()))?;
    let encoding = Encoding {
        format: Format::Dwarf32,
        version: 1,
        address_size: 8,
    };
    let mut cie = CommonInformationEntry::new(
        encoding,
        1,
        data_alignment_factor,
        Register(original.return_address_register),
    );
    let mut fde = FrameDescriptionEntry::new(Address::Constant(copy_start), copy_len as u32);
    match (original.exceptions, lsda) {
        (None, _) => {}
        (Some(exceptions), Some(lsda)) => {
            let indirect = if exceptions.indirect {
                constants::DW_EH_PE_indirect
            } else {
                constants::DW_EH_PE_absptr
            };
            cie.personality = Some((
                constants::DwEhPe(indirect.0 | constants::DW_EH_PE_absptr.0),
                Address::Constant(exceptions.personality),
            ));
            cie.lsda_encoding = Some(constants::DW_EH_PE_absptr);
            fde.lsda = Some(Address::Constant(lsda));
        }
        (Some(_), None) => {
            return Err(UnwindRefusal::ExceptionTables(
                "the copy has no LSDA of its own".into(),
            ));
        }
    }
    let mut previous: Option<Row> = None;
    for copied in &instructions {
        let mut row = original
            .row_at(copied.row_of)
            .ok_or(UnwindRefusal::NotCovered(copied.row_of))?
            .clone();
        if row.cfa_register == RSP {
            row.cfa_offset += i64::from(copied.extra_stack);
        }
        if previous.as_ref().is_some_and(|p| p.same_rules(&row)) {
            continue;
        }
        let offset = (copied.copy - copy_start) as u32;
        for instruction in changes(previous.as_ref(), &row)? {
            fde.add_instruction(offset, instruction);
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

/// Refuses an instruction list that does not tile the copy as
/// [`eh_frame_for_copy`] requires.
fn check_layout(
    copy_start: u64,
    copy_len: u64,
    instructions: &[CopiedInstruction],
) -> Result<(), UnwindRefusal> {
    let layout = |why: &str| Err(UnwindRefusal::Layout(why.into()));
    if copy_len == 0 || copy_len > u64::from(u32::MAX) {
        return layout("the copy is empty or longer than 4 GiB");
    }
    if instructions.first().map(|i| i.copy) != Some(copy_start) {
        return layout("the first instruction is not at the copy's start");
    }
    if instructions
        .windows(2)
        .any(|pair| pair[1].copy < pair[0].copy)
    {
        return layout("the instructions are not in address order");
    }
    if instructions
        .last()
        .is_some_and(|i| i.copy >= copy_start + copy_len)
    {
        return layout("an instruction lies past the copy's end");
    }
    Ok(())
}

/// The instructions that turn `previous` (none: nothing defined yet) into `row`.
fn changes(previous: Option<&Row>, row: &Row) -> Result<Vec<CallFrameInstruction>, UnwindRefusal> {
    let cfa_offset = i32::try_from(row.cfa_offset)
        .map_err(|_| UnwindRefusal::Writing("a CFA offset out of range".into()))?;
    let mut instructions = Vec::new();
    match previous {
        Some(p) if (p.cfa_register, p.cfa_offset) == (row.cfa_register, row.cfa_offset) => {}
        Some(p) if p.cfa_register == row.cfa_register => {
            instructions.push(CallFrameInstruction::CfaOffset(cfa_offset));
        }
        _ => instructions.push(CallFrameInstruction::Cfa(
            Register(row.cfa_register),
            cfa_offset,
        )),
    }
    let before: &[(u16, Rule)] = previous.map_or(&[], |p| &p.registers);
    for &(register, rule) in &row.registers {
        if !before.contains(&(register, rule)) {
            instructions.push(write_rule(register, rule)?);
        }
    }
    for &(register, _) in before {
        if !row.registers.iter().any(|&(r, _)| r == register) {
            instructions.push(CallFrameInstruction::Restore(Register(register)));
        }
    }
    Ok(instructions)
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
mod tests;

// The whole chain in this process: the unwinder finds the original's FDE, the copy's
// section is registered, and a panic unwinds through a copy run for real.
#[cfg(all(test, not(miri)))]
mod process_tests;
