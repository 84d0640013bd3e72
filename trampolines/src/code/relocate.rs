//! Entry-patch planning and relocation, as pure functions over a function's bytes.
//!
//! The patch engine overwrites a function's first instructions with a 5-byte `jmp rel32`
//! to a trampoline, which calls the entry hook, runs a relocated copy of the overwritten
//! instructions and jumps back to the first instruction that was not overwritten.
//! [`plan_entry_patch`] decides what gets overwritten and whether that is safe;
//! [`relocate`] builds the copy for one trampoline address.
//!
//! The one idea: once patched, no thread may ever *arrive* at an address strictly inside
//! the overwritten bytes — neither by a return (so only the last overwritten instruction
//! may call, make a system call or end the function) nor by a branch (so the body is
//! scanned for branch targets). Whatever could break that is refused, with the reason.

#![allow(dead_code, reason = "until the patch engine calls it")]

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, FlowControl, IcedError,
    Instruction, InstructionBlock, MemoryOperand, OpKind, Register,
};
use std::fmt;

/// Length of the `jmp rel32` written at the patch point.
pub const PATCH_LEN: usize = 5;
/// Length of the `jmp rel8` written instead where five bytes cannot be overwritten; it
/// jumps to a `jmp rel32` placed in dead padding nearby (see `padding`).
pub const SHORT_PATCH_LEN: usize = 2;

const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// What is written at the patch point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchStyle {
    /// A `jmp` to the hook; the trampoline's body runs the overwritten instructions.
    Jump,
    /// The entry *is* a `call` (`call rel32`, or `call [rip+x]`, 6 bytes): it is
    /// replaced by a `call` to the hook, which then jumps to the original callee. The
    /// callee so returns to the function through the return address a `call` in the
    /// function pushed, which keeps the cpu's return predictions right and leaves the
    /// frame exactly as the unwinder and the function's exception tables expect.
    CallThunk,
}

/// Where and how much of a function's entry gets overwritten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryPlan {
    pub style: PatchStyle,
    /// 4 if the function starts with `endbr64` (kept, so indirect calls stay valid under
    /// IBT; the patch follows it), else 0.
    pub patch_offset: usize,
    /// Length of what is written: [`PATCH_LEN`] or [`SHORT_PATCH_LEN`] for a jump, the
    /// whole call instruction (5 or 6 bytes) for a call thunk.
    pub jump_len: usize,
    /// Bytes of whole instructions overwritten from `patch_offset`; at least `jump_len`.
    pub overwritten_len: usize,
    /// Offset from the function start of each overwritten instruction.
    pub instruction_offsets: Vec<usize>,
    /// Offsets of instructions elsewhere in the body that branch to the entry (offset 0
    /// or `patch_offset`), e.g. tail recursion made a loop: each runs the entry hook
    /// again although no new call was made.
    pub entry_branch_sources: Vec<usize>,
}

/// Why a function entry cannot be patched safely. Addresses are absolute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Fewer bytes after the patch point (`size`) than the jump needs (`needed`).
    TooShort { size: u64, needed: usize },
    /// A `ret`, `jmp` or trap before the last overwritten instruction.
    FlowEndsInPatch { at: u64 },
    /// A direct branch lands strictly inside the overwritten bytes.
    BranchIntoPatch { from: u64, to: u64 },
    /// A call before the last overwritten instruction would return into the patch.
    CallNotLast { at: u64 },
    /// A system call or software interrupt that would return into the patch.
    SyscallNotLast { at: u64 },
    /// An `int3` in the overwritten bytes: someone else's breakpoint.
    Breakpoint { at: u64 },
    /// Bytes that do not decode, or an instruction running past the end of the function.
    Undecodable { at: u64 },
    /// A RIP-relative memory operand out of reach of the trampoline's address.
    RipRelativeOutOfRange { at: u64 },
    /// iced-x86 could not encode the relocated block for another reason.
    Unencodable { at: u64, reason: String },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let into = "into the patched bytes";
        match self {
            Self::TooShort { size, needed } => {
                write!(f, "shorter than the {needed}-byte patch ({size} bytes)")
            }
            Self::FlowEndsInPatch { at } => {
                write!(f, "the function leaves at {at:#x}, inside the patch")
            }
            Self::BranchIntoPatch { from, to } => {
                write!(f, "a branch at {from:#x} jumps {into} ({to:#x})")
            }
            Self::CallNotLast { at } => write!(f, "the call at {at:#x} would return {into}"),
            Self::SyscallNotLast { at } => {
                write!(f, "the system call at {at:#x} would return {into}")
            }
            Self::Breakpoint { at } => write!(f, "a breakpoint is already set at {at:#x}"),
            Self::Undecodable { at } => write!(f, "undecodable instruction at {at:#x}"),
            Self::RipRelativeOutOfRange { at } => {
                write!(f, "the RIP-relative operand at {at:#x} is out of reach")
            }
            Self::Unencodable { at, reason } => {
                write!(f, "cannot re-encode the entry at {at:#x}: {reason}")
            }
        }
    }
}

impl std::error::Error for Refusal {}

/// Decides what to overwrite at the entry of the function at `function_address`, whose
/// whole body (symbol or FDE size) is `code`, for a 5-byte `jmp rel32`, or why nothing
/// may be.
pub fn plan_entry_patch(function_address: u64, code: &[u8]) -> Result<EntryPlan, Refusal> {
    plan_with_jump(function_address, code, PATCH_LEN)
}

/// Like [`plan_entry_patch`] for a 2-byte `jmp rel8`: it overwrites fewer instructions,
/// so it fits short functions and entries whose third byte onwards is a branch target.
pub fn plan_short_entry_patch(function_address: u64, code: &[u8]) -> Result<EntryPlan, Refusal> {
    plan_with_jump(function_address, code, SHORT_PATCH_LEN)
}

fn plan_with_jump(
    function_address: u64,
    code: &[u8],
    jump_len: usize,
) -> Result<EntryPlan, Refusal> {
    let patch_offset = if code.starts_with(&ENDBR64) { 4 } else { 0 };
    let size = code.len().saturating_sub(patch_offset) as u64;
    if size < jump_len as u64 {
        return Err(Refusal::TooShort {
            size,
            needed: jump_len,
        });
    }
    let start = function_address + patch_offset as u64;
    let mut decoder = Decoder::with_ip(64, &code[patch_offset..], start, DecoderOptions::NONE);
    let mut overwritten = Vec::new();
    // Cannot run dry: at least jump_len bytes remain; a truncated instruction is invalid.
    while decoder.position() < jump_len {
        let instruction = decoder.decode();
        let at = instruction.ip();
        if instruction.is_invalid() {
            return Err(Refusal::Undecodable { at });
        }
        overwritten.push(instruction);
    }
    for (index, instruction) in overwritten.iter().enumerate() {
        check_overwritten(instruction, index + 1 == overwritten.len())?;
    }
    let offsets = overwritten
        .iter()
        .map(|i| (i.ip() - function_address) as usize);
    let mut plan = EntryPlan {
        style: PatchStyle::Jump,
        patch_offset,
        jump_len,
        overwritten_len: decoder.position(),
        instruction_offsets: offsets.collect(),
        entry_branch_sources: Vec::new(),
    };
    plan.entry_branch_sources = scan_branches(function_address, code, function_address, &plan)?;
    Ok(plan)
}

/// Plans a [`PatchStyle::CallThunk`] patch for a function whose first instruction (after
/// an `endbr64`) is a direct call or a call through a RIP-relative pointer.
pub fn plan_call_thunk(function_address: u64, code: &[u8]) -> Result<EntryPlan, Refusal> {
    let patch_offset = if code.starts_with(&ENDBR64) { 4 } else { 0 };
    let start = function_address + patch_offset as u64;
    let first = Decoder::with_ip(
        64,
        code.get(patch_offset..).unwrap_or_default(),
        start,
        DecoderOptions::NONE,
    )
    .decode();
    let callable = match first.code() {
        Code::Call_rel32_64 => true,
        Code::Call_rm64 => first.is_ip_rel_memory_operand(),
        _ => false,
    };
    if first.is_invalid() || !callable {
        return Err(Refusal::Undecodable { at: start });
    }
    let mut plan = EntryPlan {
        style: PatchStyle::CallThunk,
        patch_offset,
        jump_len: first.len(),
        overwritten_len: first.len(),
        instruction_offsets: vec![patch_offset],
        entry_branch_sources: Vec::new(),
    };
    plan.entry_branch_sources = scan_branches(function_address, code, function_address, &plan)?;
    Ok(plan)
}

/// Whether relocating `plan` would emulate a `call` (its last overwritten instruction
/// is one): correct, but the callee's return then misses the cpu's return prediction.
pub fn emulates_a_call(function_address: u64, code: &[u8], plan: &EntryPlan) -> bool {
    if plan.style == PatchStyle::CallThunk {
        return false;
    }
    let Some(&last) = plan.instruction_offsets.last() else {
        return false;
    };
    let instruction = Decoder::with_ip(
        64,
        code.get(last..).unwrap_or_default(),
        function_address + last as u64,
        DecoderOptions::NONE,
    )
    .decode();
    matches!(instruction.code(), Code::Call_rel32_64 | Code::Call_rm64)
}

/// Whether a branch to `target` from outside the function at `function_address`
/// would land strictly inside the bytes `plan` overwrites (the patch start itself is
/// fine: the jump written there is a whole instruction). Code elsewhere can do that:
/// glibc's `__mempcpy_evex_unaligned_erms` ends with a `jmp` to the third byte of
/// `__memmove_evex_unaligned_erms`.
pub fn lands_inside_patch(plan: &EntryPlan, function_address: u64, target: u64) -> bool {
    let patch_start = function_address + plan.patch_offset as u64;
    target > patch_start && target < patch_start + plan.overwritten_len as u64
}

/// Only the last overwritten instruction may end the function's flow or push a return
/// address: a return must land after the patch, not inside it.
fn check_overwritten(instruction: &Instruction, is_last: bool) -> Result<(), Refusal> {
    let (at, code) = (instruction.ip(), instruction.code());
    match instruction.flow_control() {
        FlowControl::Next | FlowControl::ConditionalBranch => Ok(()),
        FlowControl::XbeginXabortXend => Ok(()),
        _ if code == Code::Int3 => Err(Refusal::Breakpoint { at }),
        _ if is_last => Ok(()),
        FlowControl::Interrupt => Err(Refusal::SyscallNotLast { at }),
        FlowControl::Call if matches!(code, Code::Syscall | Code::Sysenter) => {
            Err(Refusal::SyscallNotLast { at })
        }
        FlowControl::Call | FlowControl::IndirectCall => Err(Refusal::CallNotLast { at }),
        // ret, jmp, ud2, ...: the bytes after it may be a jump target or another function.
        // As the last instruction it is copied as is: the body goes on past it (the patch
        // lies within `code`), so nothing outside the function gets overwritten.
        FlowControl::UnconditionalBranch
        | FlowControl::IndirectBranch
        | FlowControl::Return
        | FlowControl::Exception => Err(Refusal::FlowEndsInPatch { at }),
    }
}

/// Decodes `code` linearly, refuses a direct branch into the patch and returns the
/// offsets (from the function) of branches to the entry. Undecodable bytes (data,
/// padding) are skipped one at a time. Branches from one overwritten instruction to
/// another are fine: the block encoder retargets them to the relocated copy.
fn scan_branches(
    code_address: u64,
    code: &[u8],
    function_address: u64,
    plan: &EntryPlan,
) -> Result<Vec<usize>, Refusal> {
    let patch_start = function_address + plan.patch_offset as u64;
    let patch = patch_start..patch_start + plan.overwritten_len as u64;
    let offset = |address: u64| address.wrapping_sub(function_address) as usize;
    let mut entry_sources = Vec::new();
    let mut decoder = Decoder::with_ip(64, code, code_address, DecoderOptions::NONE);
    let mut instruction = Instruction::default();
    while decoder.can_decode() {
        let position = decoder.position();
        decoder.decode_out(&mut instruction);
        if instruction.is_invalid() {
            // Cannot fail: position + 1 <= code.len().
            let _ = decoder.set_position(position + 1);
            decoder.set_ip(code_address + position as u64 + 1);
            continue;
        }
        if instruction.op0_kind() != OpKind::NearBranch64 {
            continue;
        }
        let (from, to) = (instruction.ip(), instruction.near_branch_target());
        let internal = patch.contains(&from) && plan.instruction_offsets.contains(&offset(to));
        if to != patch_start && patch.contains(&to) && !internal {
            return Err(Refusal::BranchIntoPatch { from, to });
        }
        if !patch.contains(&from) && (to == function_address || to == patch_start) {
            entry_sources.push(offset(from));
        }
    }
    Ok(entry_sources)
}

/// The relocated copy of the overwritten instructions, followed by the jump back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relocated {
    /// Machine code valid only at the `destination` it was built for.
    pub bytes: Vec<u8>,
    /// (offset of an overwritten instruction in the function, offset of its copy in
    /// `bytes`): where to move a thread stopped at an overwritten instruction.
    pub instruction_map: Vec<(usize, usize)>,
}

/// Re-encodes the instructions `plan` overwrites to run at `destination` with the same
/// effect, then `jmp` back to the first instruction after the patch (dead code after a
/// `ret` or `jmp`). RIP-relative operands and branches keep their absolute targets, but
/// branches between overwritten instructions stay inside the copy.
///
/// The last overwritten instruction may be a `call`; it is emulated, not copied:
/// `lea rsp,[rsp-8]; mov dword [rsp],lo; mov dword [rsp+4],hi; jmp target` pushes the
/// *original* return address (the first instruction after the patch). A copied `call`
/// would return to the trampoline's jmp back, which works, but the unwinder finds no FDE
/// for a trampoline address: an exception or panic through the callee would abort.
pub fn relocate(
    function_address: u64,
    code: &[u8],
    plan: &EntryPlan,
    destination: u64,
) -> Result<Relocated, Refusal> {
    let resume = function_address + (plan.patch_offset + plan.overwritten_len) as u64;
    if plan.style == PatchStyle::CallThunk {
        return relocate_call_thunk(function_address, code, plan, destination);
    }
    let mut block = Vec::with_capacity(plan.instruction_offsets.len() + 4);
    let mut last = 0;
    for &offset in &plan.instruction_offsets {
        last = function_address + offset as u64;
        let bytes = code.get(offset..).unwrap_or_default();
        let instruction = Decoder::with_ip(64, bytes, last, DecoderOptions::NONE).decode();
        // A call through rsp (or a far call) is copied: it returns to the jmp back.
        let through_rsp = instruction.op0_register() == Register::RSP
            || instruction.memory_base() == Register::RSP;
        match instruction.code() {
            Code::INVALID => return Err(Refusal::Undecodable { at: last }),
            Code::Call_rel32_64 | Code::Call_rm64 if !through_rsp => {
                block.extend(emulate_call(&instruction).map_err(encode_error(last))?)
            }
            _ => block.push(instruction),
        }
    }
    block.push(Instruction::with_branch(Code::Jmp_rel32_64, resume).map_err(encode_error(resume))?);
    let options = BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS;
    let instructions = InstructionBlock::new(&block, destination);
    let encoded = BlockEncoder::encode(64, instructions, options).map_err(|error| {
        // iced-x86 reports errors as text: look for an operand that cannot reach.
        let reach = i32::MAX as u64 - 4096;
        let distance = |i: &Instruction| i.ip_rel_memory_address().abs_diff(destination);
        let out_of_reach = |i: &&Instruction| i.is_ip_rel_memory_operand() && distance(i) > reach;
        match block.iter().find(out_of_reach) {
            // ip 0: the emulated call's `jmp [rip+x]`.
            Some(i) if i.ip() == 0 => Refusal::RipRelativeOutOfRange { at: last },
            Some(i) => Refusal::RipRelativeOutOfRange { at: i.ip() },
            None => encode_error(function_address + plan.patch_offset as u64)(error),
        }
    })?;
    // Only the last instruction (a call) expands to several, so the indices line up.
    let pairs = std::iter::zip(&plan.instruction_offsets, &encoded.new_instruction_offsets);
    let instruction_map = pairs.map(|(&old, &new)| (old, new as usize)).collect();
    let bytes = encoded.code_buffer;
    Ok(Relocated {
        bytes,
        instruction_map,
    })
}

/// The body of a call thunk: a jump to where the entry's call went.
fn relocate_call_thunk(
    function_address: u64,
    code: &[u8],
    plan: &EntryPlan,
    destination: u64,
) -> Result<Relocated, Refusal> {
    let at = function_address + plan.patch_offset as u64;
    let mut call =
        Decoder::with_ip(64, &code[plan.patch_offset..], at, DecoderOptions::NONE).decode();
    call.set_code(match call.code() {
        Code::Call_rel32_64 => Code::Jmp_rel32_64,
        _ => Code::Jmp_rm64,
    });
    let block = [call];
    let encoded = BlockEncoder::encode(
        64,
        InstructionBlock::new(&block, destination),
        BlockEncoderOptions::NONE,
    )
    .map_err(|_| Refusal::RipRelativeOutOfRange { at })?;
    Ok(Relocated {
        bytes: encoded.code_buffer,
        instruction_map: Vec::new(),
    })
}

fn encode_error(at: u64) -> impl Fn(IcedError) -> Refusal {
    move |error| {
        let reason = error.to_string();
        Refusal::Unencodable { at, reason }
    }
}

/// `call target` as `lea rsp,[rsp-8]; mov dword [rsp],lo; mov dword [rsp+4],hi;
/// jmp target` (`lea`, not `sub`: a call leaves the flags alone).
fn emulate_call(call: &Instruction) -> Result<[Instruction; 4], IcedError> {
    let (rsp, return_address) = (Register::RSP, call.next_ip());
    let stack = |displacement| MemoryOperand::with_base_displ(rsp, displacement);
    let mut lea = Instruction::with2(Code::Lea_r64_m, rsp, stack(-8))?;
    // The call's own address, so branches to it from inside the patch find the copy.
    lea.set_ip(call.ip());
    let low = Instruction::with2(Code::Mov_rm32_imm32, stack(0), return_address as u32)?;
    let high_half = (return_address >> 32) as u32;
    let high = Instruction::with2(Code::Mov_rm32_imm32, stack(4), high_half)?;
    // iced-x86 keeps decoded branch targets and RIP-relative operands absolute, so a new
    // opcode keeps the target; the ip must differ from the lea's (0 may repeat).
    let mut jump = *call;
    let direct = call.code() == Code::Call_rel32_64;
    jump.set_code(if direct {
        Code::Jmp_rel32_64
    } else {
        Code::Jmp_rm64
    });
    jump.set_ip(0);
    Ok([lea, low, high, jump])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A high address, so the upper half of pushed return addresses is exercised.
    const F: u64 = 0x7f00_1234_5000;
    /// A trampoline 1 GiB above the function: in reach of rel32 and RIP-relative operands.
    const D: u64 = F + 0x4000_0000;

    /// Machine code as `objdump -d` prints it.
    fn hex(text: &str) -> Vec<u8> {
        let byte = |b| u8::from_str_radix(b, 16).unwrap();
        text.split_whitespace().map(byte).collect()
    }

    fn refused(code: &str) -> Refusal {
        plan_entry_patch(F, &hex(code)).unwrap_err()
    }

    /// Plans, relocates to `D` and decodes the copy; checks the jump back.
    fn plan_and_copy(code: &str) -> (EntryPlan, Relocated, Vec<Instruction>) {
        let plan = plan_entry_patch(F, &hex(code)).unwrap();
        let relocated = relocate(F, &hex(code), &plan, D).unwrap();
        let mut decoder = Decoder::with_ip(64, &relocated.bytes, D, DecoderOptions::NONE);
        let copy: Vec<_> = decoder.iter().collect();
        let resume = F + (plan.patch_offset + plan.overwritten_len) as u64;
        assert_eq!(copy.last().unwrap().code(), Code::Jmp_rel32_64);
        assert_eq!(copy.last().unwrap().near_branch_target(), resume);
        (plan, relocated, copy)
    }

    /// Plain instructions are copied byte for byte.
    fn assert_verbatim(code: &str, patch_offset: usize, offsets: &[usize]) {
        let (plan, relocated, _) = plan_and_copy(code);
        assert_eq!(
            (plan.patch_offset, &plan.instruction_offsets[..]),
            (patch_offset, offsets)
        );
        let end = patch_offset + plan.overwritten_len;
        assert_eq!(
            relocated.bytes[..end - patch_offset],
            hex(code)[patch_offset..end]
        );
        let map: Vec<_> = offsets.iter().map(|&o| (o, o - patch_offset)).collect();
        assert_eq!(relocated.instruction_map, map);
    }

    #[test]
    fn ordinary_prologues_are_copied_verbatim() {
        // push r15; push r14; push r13; push r12; push rbp; push rbx; sub rsp,0x28; ret
        assert_verbatim(
            "41 57 41 56 41 55 41 54 55 53 48 83 ec 28 c3",
            0,
            &[0, 2, 4],
        );
        // push rbp; mov rbp,rsp; sub rsp,0x10; leave; ret; then bytes invalid in 64-bit mode
        assert_verbatim("55 48 89 e5 48 83 ec 10 c9 c3 06 07 ff ff", 0, &[0, 1, 4]);
        // endbr64; push rbp; mov rbp,rsp; sub rsp,0x10; leave; ret
        assert_verbatim("f3 0f 1e fa 55 48 89 e5 48 83 ec 10 c9 c3", 4, &[4, 5, 8]);
        // glibc 2.36 malloc: push r12; push rbp; push rbx; mov rbx,rdi; sub rsp,0x10
        assert_verbatim("41 54 55 53 48 89 fb 48 83 ec 10", 0, &[0, 2, 3, 4]);
    }

    #[test]
    fn rip_relative_operand_keeps_its_absolute_address() {
        // mov rax,[rip+0x1234]; ret
        let code = "48 8b 05 34 12 00 00 c3";
        let (plan, relocated, copy) = plan_and_copy(code);
        assert_eq!(copy[0].code(), Code::Mov_r64_rm64);
        assert_eq!(copy[0].ip_rel_memory_address(), F + 7 + 0x1234);
        assert_ne!(relocated.bytes[..7], hex(code)[..7]);
        // 3 GiB away the displacement no longer fits.
        let far = relocate(F, &hex(code), &plan, F + 0xc000_0000);
        assert_eq!(far, Err(Refusal::RipRelativeOutOfRange { at: F }));
    }

    #[test]
    fn jcc_in_the_patch_keeps_its_absolute_target() {
        // test edi,edi; je .L (+6); mov eax,1; ret; .L: xor eax,eax; ret
        let (plan, _, copy) = plan_and_copy("85 ff 74 06 b8 01 00 00 00 c3 31 c0 c3");
        assert_eq!(plan.instruction_offsets, [0, 2, 4]);
        assert_eq!(copy[1].code(), Code::Je_rel32_64);
        assert_eq!(copy[1].near_branch_target(), F + 0xa);
        // glibc 2.36 free: test rdi,rdi; je +0xbf (rel32); push rbp; lea rsi,[rdi-0x10]
        let (plan, _, copy) = plan_and_copy("48 85 ff 0f 84 bf 00 00 00 55 48 8d 77 f0");
        assert_eq!(plan.overwritten_len, 9);
        assert_eq!(copy[1].near_branch_target(), F + 0xc8);
    }

    #[test]
    fn loop_inside_the_patch_stays_in_the_copy() {
        // xor eax,eax; 1: dec edi; jne 1b; ret
        let (plan, relocated, copy) = plan_and_copy("31 c0 ff cf 75 fc c3");
        assert_eq!(plan.instruction_offsets, [0, 2, 4]);
        let dec_copy = D + relocated.instruction_map[1].1 as u64;
        assert_eq!(copy[2].near_branch_target(), dec_copy);
    }

    #[test]
    fn call_as_last_instruction_pushes_the_original_return_address() {
        // sub rsp,8; call .+0x105; add rsp,8; ret
        let (plan, relocated, copy) = plan_and_copy("48 83 ec 08 e8 00 01 00 00 48 83 c4 08 c3");
        assert_eq!(plan.instruction_offsets, [0, 4]);
        assert_eq!(relocated.instruction_map, [(0, 0), (4, 4)]);
        // lea rsp,[rsp-8]; mov dword [rsp],lo; mov dword [rsp+4],hi; jmp target; jmp back
        let codes: Vec<_> = copy.iter().map(Instruction::code).collect();
        let movs = [Code::Lea_r64_m, Code::Mov_rm32_imm32, Code::Mov_rm32_imm32];
        assert_eq!(codes[1..5], [movs[0], movs[1], movs[2], Code::Jmp_rel32_64]);
        assert_eq!(copy[1].memory_displacement64() as i64, -8);
        let return_address = F + 9;
        assert_eq!(copy[2].immediate32(), return_address as u32);
        assert_eq!(copy[3].memory_displacement64(), 4);
        assert_eq!(copy[3].immediate32(), (return_address >> 32) as u32);
        assert_eq!(copy[4].near_branch_target(), F + 9 + 0x100);
    }

    #[test]
    fn call_or_syscall_before_the_last_instruction_is_refused() {
        // call rax; mov ebx,eax; mov eax,ebx; ret
        assert_eq!(
            refused("ff d0 89 c3 89 d8 c3"),
            Refusal::CallNotLast { at: F }
        );
        // syscall; mov rdi,rax; ret
        assert_eq!(
            refused("0f 05 48 89 c7 c3"),
            Refusal::SyscallNotLast { at: F }
        );
        // xor eax,eax; mov al,60; syscall; ret -- a syscall last returns to the jmp back
        let (plan, _, _) = plan_and_copy("31 c0 b0 3c 0f 05 c3");
        assert_eq!(plan.instruction_offsets, [0, 2, 4]);
    }

    #[test]
    fn too_short_or_ending_inside_the_patch_is_refused() {
        let too_short = Refusal::TooShort { size: 3, needed: 5 };
        assert_eq!(refused("c3"), Refusal::TooShort { size: 1, needed: 5 }); // ret
        assert_eq!(refused("31 c0 c3"), too_short); // xor eax,eax; ret
        assert_eq!(refused("f3 0f 1e fa 31 c0 c3"), too_short); // endbr64; xor eax,eax; ret
        assert_eq!(
            too_short.to_string(),
            "shorter than the 5-byte patch (3 bytes)"
        );
        // xor eax,eax; ret; nop; nop; nop (a symbol size that includes padding)
        let ends = Refusal::FlowEndsInPatch { at: F + 2 };
        assert_eq!(refused("31 c0 c3 90 90 90"), ends);
    }

    #[test]
    fn undecodable_or_breakpoint_entry_is_refused() {
        // (push es, invalid in 64-bit mode); nop x4
        assert_eq!(refused("06 90 90 90 90"), Refusal::Undecodable { at: F });
        // nop; mov eax,1 cut short by the end of the function
        assert_eq!(
            refused("90 b8 01 00 00"),
            Refusal::Undecodable { at: F + 1 }
        );
        // int3; nop x4; ret
        assert_eq!(refused("cc 90 90 90 90 c3"), Refusal::Breakpoint { at: F });
    }

    #[test]
    fn loop_back_into_the_patch_is_refused() {
        // xor eax,eax; 1: add eax,edi; dec edi; jne 1b; ret   (1b is offset 2)
        let into = Refusal::BranchIntoPatch {
            from: F + 6,
            to: F + 2,
        };
        assert_eq!(refused("31 c0 01 f8 ff cf 75 fa c3"), into);
    }

    #[test]
    fn loop_back_to_the_entry_is_allowed_and_reported() {
        // 1: add eax,edi; add eax,1; dec edi; jne 1b; ret   (1b is offset 0)
        let (plan, _, _) = plan_and_copy("01 f8 83 c0 01 ff cf 75 f7 c3");
        assert_eq!(plan.overwritten_len, 5);
        assert_eq!(plan.entry_branch_sources, [7]);
    }

    #[test]
    fn glibc_mempcpy_jumps_into_the_memmove_entry() {
        // glibc 2.36 __memmove_evex_unaligned_erms: mov rax,rdi; cmp rdx,0x40; jb +0x37
        let memmove = hex("48 89 f8 48 83 fa 40 72 37 c3");
        let plan = plan_entry_patch(F, &memmove).unwrap();
        assert_eq!(plan.overwritten_len, 7);
        // __mempcpy_evex_unaligned_erms, 0x40 bytes before: mov rax,rdi; add rax,rdx; jmp F+3
        let mempcpy = hex("48 89 f8 48 01 d0 eb 3b");
        let mut decoder = Decoder::with_ip(64, &mempcpy, F - 0x40, DecoderOptions::NONE);
        let jump = decoder.iter().last().unwrap();
        assert_eq!(jump.near_branch_target(), F + 3);
        assert!(lands_inside_patch(&plan, F, jump.near_branch_target()));
        // A 2-byte jump overwrites only `mov rax,rdi`: the branch lands just after it.
        let short = plan_short_entry_patch(F, &memmove).unwrap();
        assert_eq!((short.jump_len, short.overwritten_len), (2, 3));
        assert!(!lands_inside_patch(&short, F, jump.near_branch_target()));
    }

    #[test]
    fn a_function_that_starts_with_a_call_gets_a_call_thunk() {
        // call .+0x105; add rdi,1; ret   (tightcall's mid, built with -fipa-ra)
        let code = hex("e8 00 01 00 00 48 83 c7 01 c3");
        let plan = plan_entry_patch(F, &code).unwrap();
        assert!(emulates_a_call(F, &code, &plan));
        let thunk = plan_call_thunk(F, &code).unwrap();
        assert_eq!((thunk.style, thunk.jump_len), (PatchStyle::CallThunk, 5));
        assert!(!emulates_a_call(F, &code, &thunk));
        let body = relocate(F, &code, &thunk, D).unwrap();
        let jump = Decoder::with_ip(64, &body.bytes, D, DecoderOptions::NONE).decode();
        assert_eq!(jump.code(), Code::Jmp_rel32_64);
        assert_eq!(
            jump.near_branch_target(),
            F + 5 + 0x100,
            "it goes where the call went"
        );
        // endbr64; call [rip+0x2000] (-fno-plt): 6 bytes
        let code = hex("f3 0f 1e fa ff 15 00 20 00 00 c3");
        let thunk = plan_call_thunk(F, &code).unwrap();
        assert_eq!((thunk.patch_offset, thunk.jump_len), (4, 6));
        let body = relocate(F, &code, &thunk, D).unwrap();
        let jump = Decoder::with_ip(64, &body.bytes, D, DecoderOptions::NONE).decode();
        assert_eq!(jump.code(), Code::Jmp_rm64);
        assert_eq!(jump.ip_rel_memory_address(), F + 10 + 0x2000);
        // Not a call first: no thunk.
        assert!(plan_call_thunk(F, &hex("55 48 89 e5 c3")).is_err());
    }

    #[test]
    fn a_short_jump_fits_tiny_functions() {
        // xor eax,eax; ret
        let plan = plan_short_entry_patch(F, &hex("31 c0 c3")).unwrap();
        assert_eq!(
            (plan.overwritten_len, &plan.instruction_offsets[..]),
            (2, &[0][..])
        );
        // mov eax,[rdi+8]; ret -- a C++ getter
        let plan = plan_short_entry_patch(F, &hex("8b 47 08 c3")).unwrap();
        assert_eq!(plan.overwritten_len, 3);
        // ret alone cannot be patched at all
        assert_eq!(
            plan_short_entry_patch(F, &hex("c3")),
            Err(Refusal::TooShort { size: 1, needed: 2 })
        );
    }
}
