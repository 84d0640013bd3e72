//! The Ball–Larus path register inside a function copied for `tendril edges`: which
//! acyclic path each call took, counted per thread.
//!
//! The one idea: the numbering (`tendril_callgraph::paths`) gives every edge an action on
//! one register `r`: add a constant, or count path `r + k` (at a way out, or at a back
//! edge, which then restarts `r`). A native function has no register to spare and may
//! recurse, so `r` lives in the thread's state, on a small stack with one entry per
//! open call of a function whose paths are counted (`thread_layout::PathEntry`):
//! - the entry code pushes `(!rsp, 0)`, the key being the call's `rsp` at its entry;
//! - every action computes its own call's key from the frame's unwind row (the CFA
//!   less 8 is the entry's `rsp`, whatever the code has pushed or allocated since; at
//!   a `ret` or tail jump, `rsp` itself), drops the entries above its own that are
//!   deeper (calls an exception or a `longjmp` passed, as stacks grow down), and acts
//!   only on its own entry. An entry it cannot find — lost to the full stack, dropped
//!   while a coroutine on another stack ran, or never pushed by a thread moved into
//!   the copy mid-call when it went in — makes its paths *lost*, never wrong numbers;
//! - the way-out action counts and pops its own entry.
//!
//! So a function needs unwind rows for its paths to be counted; almost every compiled
//! function has them (`.eh_frame`).
//!
//! Path `n` below `itemized` is counter `first_id + n` (a function id of the counter
//! tables, like every edge counter); larger numbers share `beyond_id`. A call nested
//! deeper than the stack holds gets no entry, so its paths are lost. The stored
//! register is `r ^ REGISTER_MASK`, whose bit 63 is set for every real number, so a
//! register that is not one (the zeroed sentinel's) would count under `lost_id`,
//! never under a wrong number; the mask is `imm32` 0x8000_0000 sign-extended, so one
//! `mov` starts a register and one `xor` reads it.
//!
//! The code follows the edge counters' rules (`edge_counters`): it steps over the red
//! zone, saves what it uses, keeps the flags where they are live, and does nothing on a
//! thread without a state or one that passes through.

mod prologue;

use crate::code::copy_unwind::OriginalUnwind;
use crate::code::function_copy::{Inserted, Labels};
use crate::hooks::inserted_code::Gate;
use crate::hooks::thread_layout::{
    self as thread_state, PATH_ENTRY_REGISTER, PATH_ENTRY_SIZE, PATH_STACK_ENTRIES,
    STATE_PATH_DEPTH,
};
use iced_x86::{Code, Instruction, MemoryOperand, Register};
use prologue::{Check, KeySource, PathCode, Plan};
use tendril_callgraph::paths::EdgeAction;

/// The largest number an action adds or counts: it is an `imm32`.
pub const MAX_PATH_NUMBER: u64 = i32::MAX as u64;

/// A register is stored xor this: `0x8000_0000` as a sign-extended `imm32`. For a
/// number below 2^31 the result has bits 31..64 set, and adding an increment that
/// keeps the number below 2^31 leaves them set.
const REGISTER_MASK: i32 = i32::MIN;

/// The path code of one copy.
pub struct PathRegister<'a> {
    /// Each edge's action, in the numbering's edge order.
    pub actions: &'a [EdgeAction],
    pub first_id: u32,
    /// Path numbers with a counter of their own: `0..itemized`.
    pub itemized: u32,
    pub beyond_id: u32,
    pub lost_id: u32,
    /// The function's unwind rows, which say where each action's frame began (the
    /// caller checks them with [`PathRegister::frames_suffice`]).
    pub frames: &'a OriginalUnwind,
    /// Which calls' paths are counted.
    pub gate: Gate,
    /// Each landing pad's block and the number a path starting there begins with.
    pub landing_pads: &'a [(usize, u64)],
}

impl PathRegister<'_> {
    /// Whether the code can tell its own calls apart: with unwind rows whose CFA is a
    /// register plus an offset.
    pub fn frames_suffice(frames: &OriginalUnwind) -> bool {
        frames
            .rows
            .iter()
            .all(|row| prologue::gpr(row.cfa_register).is_some())
    }

    /// The code each call runs first: drop the entries of calls gone at or below this
    /// call's `rsp`, then push a fresh register.
    pub fn entry(&self, labels: &mut Labels) -> Inserted {
        let plan = Plan {
            key: Some(KeySource::StackPointer(0)),
            check: Check::NewCall,
            scratch: false,
            gate: self.gate,
        };
        let mut code = PathCode::begin(false, plan, labels);
        let depth = memory(Register::RCX, STATE_PATH_DEPTH);
        let last = ((PATH_STACK_ENTRIES - 1) as i32 * PATH_ENTRY_SIZE) as u32;
        code.push(Instruction::with2(Code::Cmp_rm64_imm32, depth, last));
        // No room: no entry, so this call's actions never find one and its paths are
        // lost; every call outside it keeps its own.
        code.push(Instruction::with_branch(Code::Jae_rel32_64, code.done()));
        // The entry is filled before `path_depth` covers it: a signal handler that
        // runs path code in between sees the stack as it was.
        let key = memory(Register::RDX, PATH_ENTRY_SIZE);
        code.push(Instruction::with2(Code::Mov_rm64_r64, key, Register::RSI));
        // r = 0.
        code.push(Instruction::with2(
            Code::Mov_rm64_imm32,
            memory(Register::RDX, PATH_ENTRY_SIZE + PATH_ENTRY_REGISTER),
            REGISTER_MASK,
        ));
        code.push(Instruction::with2(
            Code::Add_rm64_imm8,
            depth,
            PATH_ENTRY_SIZE,
        ));
        code.finish()
    }

    /// The code on edge `edge`, where the unwind row of the original instruction
    /// `row_of` applies; nothing for an edge that adds 0.
    pub fn edge(
        &self,
        edge: usize,
        flags_live: bool,
        row_of: u64,
        labels: &mut Labels,
    ) -> Inserted {
        let action = self.actions[edge];
        if action == (EdgeAction::Add { increment: 0 }) {
            return Inserted::default();
        }
        let ends_a_path = !matches!(action, EdgeAction::Add { .. });
        let exits = matches!(action, EdgeAction::Exit { .. });
        // Where the call's frame began: from the unwind row, or, at a way out, the
        // stack pointer itself (a `ret` or tail jump runs where the entry did).
        let key = self
            .key_at(row_of)
            .or_else(|| exits.then_some(KeySource::StackPointer(0)));
        // Its own entry, found by its key; not found (or, where no row says where its
        // frame is, never), its paths are lost.
        let plan = Plan {
            key,
            check: Check::Exact {
                lost_id: ends_a_path.then_some(self.lost_id),
            },
            scratch: ends_a_path,
            gate: self.gate,
        };
        let mut code = PathCode::begin(flags_live, plan, labels);
        match action {
            EdgeAction::Add { increment } => {
                code.push(Instruction::with2(
                    Code::Add_rm64_imm32,
                    register_of_top(),
                    imm32(increment),
                ));
            }
            EdgeAction::Exit { increment } => {
                // The top entry is the call's own (`Check::Exact`): count and pop it.
                self.count(&mut code, increment, labels);
                code.push(Instruction::with2(
                    Code::Sub_rm64_imm8,
                    memory(Register::RCX, STATE_PATH_DEPTH),
                    PATH_ENTRY_SIZE,
                ));
            }
            EdgeAction::Back { end, restart } => {
                self.count(&mut code, end, labels);
                // r = restart, keeping a poisoned register poisoned.
                code.push(Instruction::with2(
                    Code::Mov_r64_rm64,
                    Register::RDI,
                    register_of_top(),
                ));
                // All ones for a real number, zero for a poisoned one; then the mask
                // or nothing.
                code.push(Instruction::with2(Code::Sar_rm64_imm8, Register::RDI, 63));
                code.push(Instruction::with2(
                    Code::And_rm64_imm32,
                    Register::RDI,
                    REGISTER_MASK,
                ));
                code.push(Instruction::with2(
                    Code::Or_rm64_imm32,
                    Register::RDI,
                    imm32(restart),
                ));
                code.push(Instruction::with2(
                    Code::Mov_rm64_r64,
                    register_of_top(),
                    Register::RDI,
                ));
            }
        }
        code.finish()
    }

    /// The code the unwinder's entry into landing pad `block` runs, where `row_of`'s
    /// unwind row applies: the call's path so far was cut by the exception and is not
    /// counted; a new one starts here (its register set to the pad's number). Only its
    /// own entry is touched, found by its key; deeper ones (the calls the exception
    /// left) are dropped.
    pub fn landing_pad(
        &self,
        block: usize,
        flags_live: bool,
        row_of: u64,
        labels: &mut Labels,
    ) -> Inserted {
        let Some(&(_, start)) = self.landing_pads.iter().find(|&&(pad, _)| pad == block) else {
            return Inserted::default();
        };
        let plan = Plan {
            key: self.key_at(row_of),
            check: Check::Exact { lost_id: None },
            scratch: false,
            gate: self.gate,
        };
        let mut code = PathCode::begin(flags_live, plan, labels);
        // The start, with bits 31..64 set: sign-extended from the 32-bit immediate.
        code.push(Instruction::with2(
            Code::Mov_rm64_imm32,
            register_of_top(),
            REGISTER_MASK | imm32(start),
        ));
        code.finish()
    }

    /// Where the call's entry `rsp` is, at a point where `row_of`'s unwind row applies:
    /// the CFA less the return address.
    fn key_at(&self, row_of: u64) -> Option<KeySource> {
        let row = self.frames.row_at(row_of)?;
        let register = prologue::gpr(row.cfa_register)?;
        let offset = row.cfa_offset - 8;
        Some(if register == Register::RSP {
            KeySource::StackPointer(offset)
        } else {
            KeySource::Register(register, offset)
        })
    }

    /// Counts path `r + increment` of the top entry (`rdx`) in the thread's counters
    /// (`rcx`), with `rdi` as scratch.
    fn count(&self, code: &mut PathCode, increment: u64, labels: &mut Labels) {
        let other = labels.create();
        let lost = labels.create();
        let counted = labels.create();
        code.push(Instruction::with2(
            Code::Mov_r64_rm64,
            Register::RDI,
            register_of_top(),
        ));
        if increment != 0 {
            code.push(Instruction::with2(
                Code::Add_rm64_imm32,
                Register::RDI,
                imm32(increment),
            ));
        }
        code.push(Instruction::with2(
            Code::Xor_rm64_imm32,
            Register::RDI,
            REGISTER_MASK,
        ));
        code.push(Instruction::with2(
            Code::Cmp_rm64_imm32,
            Register::RDI,
            self.itemized,
        ));
        code.push(Instruction::with_branch(Code::Jae_rel32_64, other));
        let path = MemoryOperand::with_base_index_scale_displ_size(
            Register::RCX,
            Register::RDI,
            8,
            i64::from(thread_state::calls_displacement(self.first_id)),
            1,
        );
        code.push(Instruction::with1(Code::Inc_rm64, path));
        code.push(Instruction::with_branch(Code::Jmp_rel32_64, counted));
        code.label_next(other);
        code.push(Instruction::with2(
            Code::Test_rm64_r64,
            Register::RDI,
            Register::RDI,
        ));
        code.push(Instruction::with_branch(Code::Js_rel32_64, lost));
        let beyond = memory(
            Register::RCX,
            thread_state::calls_displacement(self.beyond_id),
        );
        code.push(Instruction::with1(Code::Inc_rm64, beyond));
        code.push(Instruction::with_branch(Code::Jmp_rel32_64, counted));
        code.label_next(lost);
        let lost_counter = memory(
            Register::RCX,
            thread_state::calls_displacement(self.lost_id),
        );
        code.push(Instruction::with1(Code::Inc_rm64, lost_counter));
        code.label_next(counted);
    }
}

/// `[base + displacement]`.
fn memory(base: Register, displacement: i32) -> MemoryOperand {
    MemoryOperand::with_base_displ(base, i64::from(displacement))
}

/// The top entry's register: `[rdx + 8]`.
fn register_of_top() -> MemoryOperand {
    memory(Register::RDX, PATH_ENTRY_REGISTER)
}

fn imm32(value: u64) -> i32 {
    i32::try_from(value).expect("path numbers are checked against MAX_PATH_NUMBER")
}

#[cfg(all(test, not(miri)))]
mod tests;
