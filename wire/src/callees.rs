//! Where a function's machine code calls: the decoding Scheme A (in the controller) and
//! Scheme B (in the agent) share.
//!
//! The one idea: a function's direct callees can be read off its code — `call rel32`
//! targets, `jmp`/`jcc` targets outside its body (tail calls), and the pointers that
//! `call [rip+x]` / `jmp [rip+x]` go through (GOT slots, read by whoever has the
//! memory). A call through a register that the function loaded from such a pointer
//! (`mov r12, [rip+x]` ... `call r12`, how compilers hoist a GOT load out of a loop) or
//! with a code address (`lea rax, [rip+f]` ... `call rax`) counts as a call through
//! that pointer or to that address. Other calls through registers or computed
//! addresses cannot be read off the code; they are counted.

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register,
};

/// What a function's code says about its callees.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Callees {
    /// Addresses called or tail-jumped to.
    pub direct: Vec<u64>,
    /// Addresses of pointers called or jumped through (read them for the callee).
    pub through_pointers: Vec<u64>,
    /// `call reg` / `call [reg+...]` sites: callees unknown until run time.
    pub indirect_call_sites: u64,
}

/// Scans the body `code` of the function at `start`.
pub fn scan(code: &[u8], start: u64) -> Callees {
    let mut callees = Callees::default();
    let body = start..start + code.len() as u64;
    let mut decoder = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    let mut instruction = Instruction::default();
    let mut loaded = LoadedRegisters::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut instruction);
        if instruction.is_invalid() {
            continue;
        }
        if let Some(known) = loaded.branch_through_register(&instruction) {
            match known {
                Loaded::Pointer(slot) => callees.through_pointers.push(slot),
                Loaded::Address(target) => callees.direct.push(target),
            }
            loaded.after(&instruction);
            continue;
        }
        loaded.after(&instruction);
        match instruction.flow_control() {
            FlowControl::Call if instruction.op0_kind() == OpKind::NearBranch64 => {
                callees.direct.push(instruction.near_branch_target());
            }
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
                if instruction.op0_kind() == OpKind::NearBranch64
                    && !body.contains(&instruction.near_branch_target()) =>
            {
                callees.direct.push(instruction.near_branch_target());
            }
            FlowControl::IndirectCall | FlowControl::IndirectBranch
                if instruction.is_ip_rel_memory_operand() =>
            {
                callees
                    .through_pointers
                    .push(instruction.ip_rel_memory_address());
            }
            FlowControl::IndirectCall => callees.indirect_call_sites += 1,
            _ => {}
        }
    }
    callees.direct.sort_unstable();
    callees.direct.dedup();
    callees.through_pointers.sort_unstable();
    callees.through_pointers.dedup();
    callees
}

/// What a register holds, as far as a straight read of the code can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loaded {
    /// The pointer stored at this address (`mov reg, [rip+x]`).
    Pointer(u64),
    /// This address (`lea reg, [rip+x]`).
    Address(u64),
}

/// Registers loaded from ip-relative operands and not written since, read in address
/// order (control flow is ignored: a load hoisted above a loop precedes the loop's call).
#[derive(Debug, Default)]
struct LoadedRegisters {
    entries: Vec<(Register, Loaded)>,
}

/// Registers a call may change (the System V ABI's caller-saved ones).
const CALLER_SAVED: [Register; 9] = [
    Register::RAX,
    Register::RCX,
    Register::RDX,
    Register::RSI,
    Register::RDI,
    Register::R8,
    Register::R9,
    Register::R10,
    Register::R11,
];

impl LoadedRegisters {
    /// What a `call reg` / `jmp reg` goes through, if the register was loaded here.
    fn branch_through_register(&self, instruction: &Instruction) -> Option<Loaded> {
        let through_register = matches!(
            instruction.flow_control(),
            FlowControl::IndirectCall | FlowControl::IndirectBranch
        ) && instruction.op0_kind() == OpKind::Register;
        if !through_register {
            return None;
        }
        let register = instruction.op0_register().full_register();
        self.entries
            .iter()
            .find(|(r, _)| *r == register)
            .map(|&(_, loaded)| loaded)
    }

    /// Updates the registers for what `instruction` writes.
    fn after(&mut self, instruction: &Instruction) {
        if instruction.flow_control() == FlowControl::Call
            || instruction.flow_control() == FlowControl::IndirectCall
        {
            self.entries.retain(|(r, _)| !CALLER_SAVED.contains(r));
        }
        if instruction.op_count() == 0 || instruction.op0_kind() != OpKind::Register {
            return;
        }
        let register = instruction.op0_register().full_register();
        if !matches!(
            instruction.mnemonic(),
            Mnemonic::Cmp | Mnemonic::Test | Mnemonic::Push | Mnemonic::Bt
        ) {
            self.entries.retain(|(r, _)| *r != register);
        }
        if !register.is_gpr64() || !instruction.is_ip_rel_memory_operand() {
            return;
        }
        let address = instruction.ip_rel_memory_address();
        let loaded = match instruction.code() {
            Code::Mov_r64_rm64 => Loaded::Pointer(address),
            Code::Lea_r64_m => Loaded::Address(address),
            _ => return,
        };
        self.entries.push((register, loaded));
    }
}

/// The GOT slot a PLT stub (code at `start`) jumps through.
pub fn plt_slot(code: &[u8], start: u64) -> Option<u64> {
    Decoder::with_ip(64, code, start, DecoderOptions::NONE)
        .iter()
        .find(|i| i.code() == Code::Jmp_rm64 && i.is_ip_rel_memory_operand())
        .map(|jump| jump.ip_rel_memory_address())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_calls_tail_calls_got_calls_and_counts_indirect_ones() {
        let start = 0x1000;
        // call +0x100; call [rip+0x200]; call rax; je -> inside; jmp +0x400 (outside)
        let code = [
            0xe8, 0xfb, 0x00, 0x00, 0x00, // call 0x1100
            0xff, 0x15, 0x00, 0x02, 0x00, 0x00, // call [rip+0x200] -> [0x120b]
            0xff, 0xd0, // call rax
            0x74, 0x00, // je 0x100f (inside)
            0xe9, 0xf0, 0x03, 0x00, 0x00, // jmp 0x1404
        ];
        let callees = scan(&code, start);
        assert_eq!(callees.direct, [0x1100, 0x1404]);
        assert_eq!(callees.through_pointers, [0x120b]);
        assert_eq!(callees.indirect_call_sites, 1);
        // endbr64; bnd jmp [rip+0x2ff2]
        let stub = [
            0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25, 0xf2, 0x2f, 0x00, 0x00,
        ];
        assert_eq!(plt_slot(&stub, 0x5000), Some(0x5000 + 11 + 0x2ff2));
    }

    #[test]
    fn follows_registers_loaded_from_the_got_or_with_a_code_address() {
        let start = 0x2000;
        let code = [
            0x4c, 0x8b, 0x25, 0xf9, 0x0f, 0x00, 0x00, // mov r12, [rip+0xff9] -> [0x3000]
            0x48, 0x8d, 0x05, 0xf2, 0x1f, 0x00, 0x00, // lea rax, [rip+0x1ff2] -> 0x4000
            0xff, 0xd0, // call rax (to 0x4000)
            0xff, 0xd0, // call rax (rax clobbered by the call: unknown)
            0x41, 0xff, 0xd4, // call r12 (callee-saved: still the GOT pointer)
            0x4d, 0x31, 0xe4, // xor r12, r12
            0x41, 0xff, 0xe4, // jmp r12 (overwritten: unknown)
        ];
        let callees = scan(&code, start);
        assert_eq!(callees.direct, [0x4000]);
        assert_eq!(callees.through_pointers, [0x3000]);
        assert_eq!(callees.indirect_call_sites, 1, "the second call rax");
    }
}
