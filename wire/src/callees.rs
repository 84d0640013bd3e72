//! Where a function's machine code calls: the decoding Scheme A (in the controller) and
//! Scheme B (in the agent) share.
//!
//! The one idea: a function's direct callees can be read off its code — `call rel32`
//! targets, `jmp`/`jcc` targets outside its body (tail calls), and the pointers that
//! `call [rip+x]` / `jmp [rip+x]` go through (GOT slots, read by whoever has the
//! memory). Calls through registers or computed addresses cannot; they are counted.

use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, Instruction, OpKind};

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
    while decoder.can_decode() {
        decoder.decode_out(&mut instruction);
        if instruction.is_invalid() {
            continue;
        }
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
}
