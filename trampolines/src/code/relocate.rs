//! Relocation, as a pure function: the copy of a function's overwritten first
//! instructions that a trampoline runs, re-encoded for the trampoline's address.
//!
//! [`relocate`] builds the copy of what an [`EntryPlan`] overwrites for one trampoline
//! address; the plan itself comes from `entry_plan`.

use super::entry_plan::{EntryPlan, PatchStyle, Refusal};
use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, IcedError, Instruction,
    InstructionBlock, MemoryOperand, Register,
};

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
    // The lead pushes, popped again by the trampoline's entry, run first (one byte
    // each, position-independent); the overwritten instructions follow them.
    let pushes = code
        .get(plan.patch_offset - plan.lead_pushes..plan.patch_offset)
        .ok_or(Refusal::Undecodable {
            at: function_address,
        })?;
    let destination = destination + pushes.len() as u64;
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
    let instruction_map = pairs
        .map(|(&old, &new)| (old, new as usize + pushes.len()))
        .collect();
    let mut bytes = pushes.to_vec();
    bytes.extend_from_slice(&encoded.code_buffer);
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
    use crate::code::entry_plan::*;

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
        // The lead pushes come first in the copy, then the overwritten instructions.
        let copied_from = patch_offset - plan.lead_pushes;
        let end = patch_offset + plan.overwritten_len;
        assert_eq!(
            relocated.bytes[..end - copied_from],
            hex(code)[copied_from..end]
        );
        let map: Vec<_> = offsets.iter().map(|&o| (o, o - copied_from)).collect();
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
        // push rbp; mov rbp,rsp; sub rsp,0x10; leave; ret; then bytes invalid in 64-bit
        // mode. The one-byte push stays in place: the patch starts after it.
        assert_verbatim("55 48 89 e5 48 83 ec 10 c9 c3 06 07 ff ff", 1, &[1, 4]);
        // endbr64; push rbp; mov rbp,rsp; sub rsp,0x10; leave; ret
        assert_verbatim("f3 0f 1e fa 55 48 89 e5 48 83 ec 10 c9 c3", 5, &[5, 8]);
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
