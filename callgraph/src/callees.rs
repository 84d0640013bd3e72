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
//! addresses cannot be read off the code; they are listed as indirect sites, and so are
//! tail jumps through a pointer (`jmp reg`, `jmp [reg+x]`) — but not the jumps of a
//! switch's jump table (`notrack jmp`, an indexed operand, or a register just computed
//! from the table), which stay inside the function.

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
    /// `call reg` / `call [reg+...]` sites and tail jumps through a pointer: callees
    /// unknown until run time (`indirect_sites.len()`).
    pub indirect_call_sites: u64,
    /// Where those sites are (the address of each call or jump instruction).
    pub indirect_sites: Vec<u64>,
    /// The part of `direct` reached only by jumps (tail calls), never by a `call`.
    pub tail_only: Vec<u64>,
    /// The part of `through_pointers` only jumped through, never called through.
    pub tail_only_pointers: Vec<u64>,
}

/// A callee found, and whether a `call` or a jump (a tail call) reaches it.
#[derive(Debug, Default)]
struct Reached {
    called: Vec<u64>,
    jumped: Vec<u64>,
}

impl Reached {
    fn add(&mut self, instruction: &Instruction, target: u64) {
        match instruction.flow_control() {
            FlowControl::Call | FlowControl::IndirectCall => self.called.push(target),
            _ => self.jumped.push(target),
        }
    }

    /// Every target, and those only jumped to; both sorted, without repeats.
    fn into_sets(mut self) -> (Vec<u64>, Vec<u64>) {
        for list in [&mut self.called, &mut self.jumped] {
            list.sort_unstable();
            list.dedup();
        }
        let only_jumped: Vec<u64> = (self.jumped.iter())
            .filter(|target| self.called.binary_search(target).is_err())
            .copied()
            .collect();
        let mut all = self.called;
        all.extend(self.jumped);
        all.sort_unstable();
        all.dedup();
        (all, only_jumped)
    }
}

/// Scans the body `code` of the function at `start`.
pub fn scan(code: &[u8], start: u64) -> Callees {
    let mut callees = Callees::default();
    let (mut direct, mut through_pointers) = (Reached::default(), Reached::default());
    let body = start..start + code.len() as u64;
    let mut decoder = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    let mut instruction = Instruction::default();
    let mut loaded = LoadedRegisters::default();
    // The register the previous instruction wrote by arithmetic (a jump table's target
    // is computed just before its `jmp reg`).
    let mut computed = Register::None;
    while decoder.can_decode() {
        decoder.decode_out(&mut instruction);
        if instruction.is_invalid() {
            continue;
        }
        let just_computed = std::mem::replace(&mut computed, computed_register(&instruction));
        if let Some(known) = loaded.branch_through_register(&instruction) {
            match known {
                Loaded::Pointer(slot) => through_pointers.add(&instruction, slot),
                Loaded::Address(target) => direct.add(&instruction, target),
            }
            loaded.after(&instruction);
            continue;
        }
        loaded.after(&instruction);
        match instruction.flow_control() {
            FlowControl::Call if instruction.op0_kind() == OpKind::NearBranch64 => {
                direct.add(&instruction, instruction.near_branch_target());
            }
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
                if instruction.op0_kind() == OpKind::NearBranch64
                    && !body.contains(&instruction.near_branch_target()) =>
            {
                direct.add(&instruction, instruction.near_branch_target());
            }
            FlowControl::IndirectCall | FlowControl::IndirectBranch
                if instruction.is_ip_rel_memory_operand() =>
            {
                through_pointers.add(&instruction, instruction.ip_rel_memory_address());
            }
            FlowControl::IndirectCall => callees.indirect_sites.push(instruction.ip()),
            FlowControl::IndirectBranch if is_tail_jump(&instruction, just_computed) => {
                callees.indirect_sites.push(instruction.ip())
            }
            _ => {}
        }
    }
    callees.indirect_call_sites = callees.indirect_sites.len() as u64;
    (callees.direct, callees.tail_only) = direct.into_sets();
    (callees.through_pointers, callees.tail_only_pointers) = through_pointers.into_sets();
    callees
}

/// Whether an indirect `jmp` (not ip-relative) leaves the function through a pointer,
/// rather than dispatching through a switch's jump table: a table jump is marked
/// `notrack` (CET builds), indexes its table (`jmp [reg*8+table]`), or jumps through
/// the register the instruction before computed (`movsxd`/`add` of a table entry).
fn is_tail_jump(instruction: &Instruction, just_computed: Register) -> bool {
    if instruction.segment_prefix() == Register::DS {
        return false; // `notrack`
    }
    match instruction.op0_kind() {
        OpKind::Register => instruction.op0_register().full_register() != just_computed,
        OpKind::Memory => instruction.memory_index() == Register::None,
        _ => false,
    }
}

/// The full register `instruction` writes by arithmetic on a table entry, if any.
fn computed_register(instruction: &Instruction) -> Register {
    let arithmetic = matches!(
        instruction.mnemonic(),
        Mnemonic::Add | Mnemonic::Movsxd | Mnemonic::Sub | Mnemonic::Mov
    ) && instruction.op_count() == 2
        && instruction.op0_kind() == OpKind::Register
        && (instruction.op1_kind() == OpKind::Register
            || instruction.memory_index() != Register::None);
    if arithmetic {
        instruction.op0_register().full_register()
    } else {
        Register::None
    }
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

/// The indirect call that returns to `return_address`, given the `code` that precedes it
/// (`code` ends at `return_address`): the address of a `call reg` / `call [reg+x]`
/// ending exactly there, if one does. Calls through an ip-relative pointer (a GOT slot)
/// are direct calls to [`scan`], so they are not answered. The longest such call is 9
/// bytes (`notrack`, REX, opcode, ModRM, SIB, disp32); the shortest encoding that
/// decodes to a call ending at the return address wins.
pub fn indirect_call_ending_at(code: &[u8], return_address: u64) -> Option<u64> {
    (2..=9usize.min(code.len())).find_map(|length| {
        let start = return_address - length as u64;
        let bytes = &code[code.len() - length..];
        let instruction = Decoder::with_ip(64, bytes, start, DecoderOptions::NONE).decode();
        (!instruction.is_invalid()
            && instruction.len() == length
            && instruction.flow_control() == FlowControl::IndirectCall
            && !instruction.is_ip_rel_memory_operand())
        .then_some(start)
    })
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
    fn the_indirect_call_before_a_return_address_is_found() {
        // mov rax, [rdi]; call [rax+0x10]: returns to 0x4005
        let code = [0x48, 0x8b, 0x07, 0xff, 0x50, 0x10];
        assert_eq!(indirect_call_ending_at(&code[..6], 0x4006), Some(0x4003));
        // call rax
        assert_eq!(
            indirect_call_ending_at(&[0x90, 0xff, 0xd0], 0x5003),
            Some(0x5001)
        );
        // call rel32 is not indirect; call [rip+x] goes through a GOT slot
        let direct = [0xe8, 0x00, 0x01, 0x00, 0x00];
        assert_eq!(indirect_call_ending_at(&direct, 0x6005), None);
        let got = [0xff, 0x15, 0x00, 0x02, 0x00, 0x00];
        assert_eq!(indirect_call_ending_at(&got, 0x6006), None);
    }

    #[test]
    fn tail_jumps_through_pointers_are_sites_and_jump_table_dispatch_is_not() {
        let start = 0x3000;
        let code = [
            0x48, 0x8b, 0x47, 0x10, // mov rax, [rdi+0x10]
            0xff, 0x60, 0x18, // jmp [rax+0x18]: a tail call through a vtable slot
            0x48, 0x63, 0x04, 0x82, // movsxd rax, [rdx+rax*4]
            0x48, 0x01, 0xd0, // add rax, rdx
            0xff, 0xe0, // jmp rax: the switch's dispatch
            0x3e, 0xff, 0xe1, // notrack jmp rcx: a switch's dispatch (CET)
            0xff, 0x24, 0xc5, 0x00, 0x10, 0x00, 0x00, // jmp [rax*8+0x1000]: a table
            0x48, 0x8b, 0x06, // mov rax, [rsi]
            0xff, 0xe0, // jmp rax: a tail call through a loaded pointer
        ];
        let callees = scan(&code, start);
        assert_eq!(callees.indirect_sites, [0x3004, 0x301d]);
    }

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
        assert_eq!(callees.indirect_sites, [0x100b]);
        assert_eq!(callees.indirect_call_sites, 1);
        // Only the jmp's target is reached by tail calls alone.
        assert_eq!(callees.tail_only, [0x1404]);
        assert!(callees.tail_only_pointers.is_empty());
        // endbr64; bnd jmp [rip+0x2ff2]
        let stub = [
            0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25, 0xf2, 0x2f, 0x00, 0x00,
        ];
        assert_eq!(plt_slot(&stub, 0x5000), Some(0x5000 + 11 + 0x2ff2));
    }

    #[test]
    fn a_callee_both_called_and_jumped_to_is_not_tail_only() {
        let start = 0x1000;
        let code = [
            0xe8, 0xfb, 0x00, 0x00, 0x00, // call 0x1100
            0xff, 0x25, 0x00, 0x02, 0x00, 0x00, // jmp [rip+0x200] -> [0x120b]
            0xe9, 0xf0, 0x00, 0x00, 0x00, // jmp 0x1100
            0x75, 0x10, // jne 0x1022 (outside the 18 bytes)
        ];
        let callees = scan(&code, start);
        assert_eq!(callees.direct, [0x1022, 0x1100]);
        assert_eq!(callees.tail_only, [0x1022]);
        assert_eq!(callees.tail_only_pointers, [0x120b]);
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
        // The second `call rax`, and `jmp r12`: a tail jump through an unknown pointer.
        assert_eq!(callees.indirect_sites, [0x2010, 0x2018]);
        assert_eq!(callees.indirect_call_sites, 2);
    }
}
