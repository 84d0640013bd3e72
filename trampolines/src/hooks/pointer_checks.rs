//! The check before a call through a pointer, inside a recorded function's copy: the
//! way a recording follows calls through pointers from the call graph itself (issue 33).
//!
//! The one idea: the target of `call rax` or `call [rax+0x18]` is known only when the
//! call is made, so the copy reads it just before, and asks the runtime about a target
//! the recording has not followed yet; the runtime instruments it (Scheme B, for a
//! callee found by running instead of by decoding) before the call goes on, so even
//! that first call is recorded, under its real caller. The targets followed are kept
//! in one open-addressed table of the process ([`TABLE_SLOTS`] words, a target's home
//! slot its address shifted right by 4), which the check probes at the home slot and
//! the next one, so a site that calls one function or many costs the same:
//!
//! ```text
//! lea rsp,[rsp-128]            ; step over the red zone
//! push rax / push rcx / push rdx
//! mov rax, <the operand>       ; the target (an rsp-based operand is moved by 152)
//! mov rcx,fs:[slot] ...        ; the thread's state; outside the call graph → done
//! mov ecx, eax / shr ecx,4 / and ecx, TABLE_SLOTS-1
//! mov rdx, table
//! cmp rax,[rdx+rcx*8] / je done / cmp rax,[rdx+rcx*8+8] / je done
//! push r11; mov rdx, site; mov r11, handler; mov rcx, tendril_slow_call; call rcx; pop r11
//! done: pop rdx / pop rcx / pop rax / lea rsp,[rsp+128]
//! call <the operand>           ; the original instruction
//! ```
//!
//! The flags are not live before a call or a tail jump (a callee gets them undefined),
//! so the check does not save them. The runtime writes the table (one writer at a
//! time, under its discovery lock); the checks only read it.

use super::inserted_code::{Gate, Sequence, fixed};
use super::state::STATE;
use crate::code::function_copy::{Inserted, Labels};
use iced_x86::{Code, Instruction, MemoryOperand, OpKind, Register};
use std::sync::atomic::Ordering;

pub use super::state::POINTER_TABLE_SLOTS as TABLE_SLOTS;

/// Bytes below the original stack pointer while the target is read: the red zone and
/// the three saved registers.
const READ_DEPTH: u32 = super::inserted_code::RED_ZONE + 24;

/// Where the check's slow path goes: the runtime's handler (target in `rax`, the
/// site's address in `rdx`) and `tendril_slow_call`, which saves and restores
/// everything around it.
#[derive(Debug, Clone, Copy)]
pub struct SlowPath {
    pub handler: u64,
    pub slow_call: u64,
}

/// The home slot of `target`.
fn home(target: u64) -> usize {
    (target as u32 >> 4) as usize & (TABLE_SLOTS - 1)
}

/// Whether `target` is in the table (at any slot of its run, not only where the checks
/// look).
pub fn is_followed(target: u64) -> bool {
    let table = &STATE.pointer_targets;
    (home(target)..table.len())
        .map(|slot| table[slot].load(Ordering::Acquire))
        .take_while(|&held| held != 0)
        .any(|held| held == target)
}

/// Puts `target` in the table, at the first free slot from its home; false if the
/// table is full from there. One writer at a time (the caller's lock).
pub fn follow(target: u64) -> bool {
    let table = &STATE.pointer_targets;
    for slot in &table[home(target)..] {
        match slot.load(Ordering::Acquire) {
            0 => {
                slot.store(target, Ordering::Release);
                return true;
            }
            held if held == target => return true,
            _ => {}
        }
    }
    false
}

/// Empties the table: every target is met again (a new recording, or a library loaded
/// where another was). One writer at a time (the caller's lock).
pub fn forget_all() {
    for slot in &STATE.pointer_targets {
        if slot.load(Ordering::Relaxed) != 0 {
            slot.store(0, Ordering::Release);
        }
    }
}

/// The check before `instruction`, a call or tail jump through a pointer at original
/// address `site`. Empty for an operand the check cannot read (`call rsp`, an operand
/// in the red zone below the stack pointer).
pub fn check_code(
    site: u64,
    instruction: &Instruction,
    slow: SlowPath,
    labels: &mut Labels,
) -> Inserted {
    let Some(read_target) = target_read(instruction, READ_DEPTH) else {
        return Inserted::default();
    };
    let mut code = Sequence {
        gate: Gate::InCallGraph,
        ..Sequence::default()
    };
    let saved = [Register::RAX, Register::RCX, Register::RDX];
    let depth = code.save(&saved);
    debug_assert_eq!(depth, READ_DEPTH);
    code.push(read_target, depth);
    let done = labels.create();
    code.load_thread_state(depth, done);
    let table = STATE.pointer_targets.as_ptr() as u64;
    let slot = |extra: i64| {
        MemoryOperand::new(
            Register::RDX,
            Register::RCX,
            8,
            extra,
            1,
            false,
            Register::None,
        )
    };
    let probe = [
        Instruction::with2(Code::Mov_r32_rm32, Register::ECX, Register::EAX),
        Instruction::with2(Code::Shr_rm32_imm8, Register::ECX, 4),
        Instruction::with2(
            Code::And_rm32_imm32,
            Register::ECX,
            (TABLE_SLOTS - 1) as u32,
        ),
        Instruction::with2(Code::Mov_r64_imm64, Register::RDX, table),
        Instruction::with2(Code::Cmp_r64_rm64, Register::RAX, slot(0)),
        Instruction::with_branch(Code::Je_rel32_64, done),
        Instruction::with2(Code::Cmp_r64_rm64, Register::RAX, slot(8)),
        Instruction::with_branch(Code::Je_rel32_64, done),
        Instruction::with1(Code::Push_r64, Register::R11),
    ];
    for instruction in probe {
        code.push(fixed(instruction), depth);
    }
    let slow_depth = depth + 8;
    let calls = [
        Instruction::with2(Code::Mov_r64_imm64, Register::RDX, site),
        Instruction::with2(Code::Mov_r64_imm64, Register::R11, slow.handler),
        Instruction::with2(Code::Mov_r64_imm64, Register::RCX, slow.slow_call),
        Instruction::with1(Code::Call_rm64, Register::RCX),
        Instruction::with1(Code::Pop_r64, Register::R11),
    ];
    for instruction in calls {
        code.push(fixed(instruction), slow_depth);
    }
    code.restore(&saved, false, depth, done);
    code.inserted
}

/// `mov rax, <operand of instruction>`, read `depth` bytes below the original stack
/// pointer; `None` when the operand cannot be read there.
fn target_read(instruction: &Instruction, depth: u32) -> Option<Instruction> {
    match instruction.op0_kind() {
        OpKind::Register => {
            let register = instruction.op0_register();
            (register != Register::RSP).then(|| {
                fixed(Instruction::with2(
                    Code::Mov_r64_rm64,
                    Register::RAX,
                    register,
                ))
            })
        }
        OpKind::Memory => {
            let base = instruction.memory_base();
            let mut displacement = instruction.memory_displacement64() as i64;
            if base == Register::RSP {
                // A pointer kept below the stack pointer is in the red zone the check
                // steps over and saves registers into: not readable there.
                if displacement < 0 {
                    return None;
                }
                displacement += i64::from(depth);
            }
            let index = instruction.memory_index();
            // An absolute or RIP-relative operand names a 64-bit address (4 would mean
            // `addr32`); otherwise 1 lets the encoder pick the displacement's size.
            let absolute =
                base == Register::RIP || (base == Register::None && index == Register::None);
            let operand = MemoryOperand::new(
                base,
                index,
                instruction.memory_index_scale(),
                displacement,
                if absolute { 8 } else { 1 },
                false,
                instruction.segment_prefix(),
            );
            Some(fixed(Instruction::with2(
                Code::Mov_r64_rm64,
                Register::RAX,
                operand,
            )))
        }
        _ => None,
    }
}

#[cfg(all(test, not(miri)))]
mod tests;
