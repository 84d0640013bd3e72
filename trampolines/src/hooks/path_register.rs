//! The Ball–Larus path register inside a function copied for `tendril edges`: which
//! acyclic path each call took, counted per thread.
//!
//! The one idea: the numbering (`tendril_wire::paths`) gives every edge an action on
//! one register `r`: add a constant, or count path `r + k` (at a way out, or at a back
//! edge, which then restarts `r`). A native function has no register to spare and may
//! recurse, so `r` lives in the thread's state, on a small stack with one entry per
//! open call of a function whose paths are counted (`thread_layout::PathEntry`):
//! - the entry code pushes `(!rsp, 0)`;
//! - every action first drops entries whose call is gone: an entry whose `rsp` is
//!   below the current one belongs to a deeper call that never returned (an exception
//!   or a `longjmp` passed it), as stacks grow down;
//! - the way-out action counts and pops its own entry, recognised by its key (at a
//!   `ret` or tail jump the stack pointer is the entry's again).
//!
//! Path `n` below `itemized` is counter `first_id + n` (a function id of the counter
//! tables, like every edge counter); larger numbers share `beyond_id`. A call nested
//! deeper than the stack holds gets no entry: it poisons the innermost entry instead
//! (the stored register is `r ^ REGISTER_MASK`, whose bit 63 is set for every real
//! number; the zeroed sentinel and a poisoned register have it clear), and every path
//! a poisoned register ends is counted under `lost_id`, never under a wrong number.
//! The mask is `imm32` 0x8000_0000 sign-extended, so one `mov` starts a register and
//! one `xor` reads it.
//!
//! The code follows the edge counters' rules (`edge_counters`): it steps over the red
//! zone, saves what it uses, keeps the flags where they are live, and does nothing on a
//! thread without a state or one that passes through.

use super::inserted_code::{RED_ZONE, Sequence, fixed};
use crate::code::function_copy::{Inserted, Labels};
use crate::hooks::thread_layout::{
    self as thread_state, FLAG_PASSTHROUGH, PATH_ENTRY_REGISTER, PATH_ENTRY_SIZE,
    PATH_STACK_ENTRIES, STATE_FLAGS, STATE_PATH_DEPTH, STATE_PATH_STACK,
};
use iced_x86::{Code, Instruction, MemoryOperand, Register};
use tendril_wire::paths::EdgeAction;

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
    /// Whether the function calls anything: only then can a deeper call be gone
    /// without returning while this one runs, so only then must every action look
    /// for such calls' entries (the entry code always does).
    pub makes_calls: bool,
}

/// What a piece of path code needs besides `rcx` (the state) and `rdx` (the top
/// entry).
#[derive(Clone, Copy)]
struct Needs {
    /// This frame's key, `!rsp`, in `rsi`: to drop gone calls' entries, or to know
    /// one's own entry.
    key: bool,
    /// A scratch register, `rdi`.
    scratch: bool,
    /// Drop the entries of calls that are gone, first.
    drop_gone: bool,
    /// A new call: its own `rsp` makes an entry gone too.
    entry: bool,
}

impl PathRegister<'_> {
    /// The code each call runs first: push a fresh register.
    pub fn entry(&self, labels: &mut Labels) -> Inserted {
        let needs = Needs {
            key: true,
            scratch: false,
            drop_gone: true,
            entry: true,
        };
        let mut code = PathCode::begin(false, needs, labels);
        let full = labels.create();
        let depth = memory(Register::RCX, STATE_PATH_DEPTH);
        let last = ((PATH_STACK_ENTRIES - 1) as i32 * PATH_ENTRY_SIZE) as u32;
        code.push(Instruction::with2(Code::Cmp_rm64_imm32, depth, last));
        code.push(Instruction::with_branch(Code::Jae_rel32_64, full));
        code.push(Instruction::with2(
            Code::Add_rm64_imm8,
            Register::RDX,
            PATH_ENTRY_SIZE,
        ));
        code.push(Instruction::with2(
            Code::Add_rm64_imm8,
            depth,
            PATH_ENTRY_SIZE,
        ));
        let key = memory(Register::RDX, 0);
        code.push(Instruction::with2(Code::Mov_rm64_r64, key, Register::RSI));
        // r = 0.
        code.push(Instruction::with2(
            Code::Mov_rm64_imm32,
            register_of_top(),
            REGISTER_MASK,
        ));
        code.push(Instruction::with_branch(Code::Jmp_rel32_64, code.done));
        code.label_next(full);
        // No room: the innermost open call's path is lost, and so is every path this
        // call's actions end while they act on that entry.
        code.push(Instruction::with2(
            Code::Mov_rm64_imm32,
            register_of_top(),
            0,
        ));
        code.finish()
    }

    /// The code on edge `edge`; nothing for an edge that adds 0.
    pub fn edge(&self, edge: usize, flags_live: bool, labels: &mut Labels) -> Inserted {
        let needs = |key: bool, scratch: bool| Needs {
            key: key || self.makes_calls,
            scratch,
            drop_gone: self.makes_calls,
            entry: false,
        };
        match self.actions[edge] {
            EdgeAction::Add { increment: 0 } => Inserted::default(),
            EdgeAction::Add { increment } => {
                let mut code = PathCode::begin(flags_live, needs(false, false), labels);
                code.push(Instruction::with2(
                    Code::Add_rm64_imm32,
                    register_of_top(),
                    imm32(increment),
                ));
                code.finish()
            }
            EdgeAction::Exit { increment } => {
                let mut code = PathCode::begin(flags_live, needs(true, true), labels);
                self.count(&mut code, increment, labels);
                // Pop the entry if it is this call's own (it is not when this call had
                // no room for one).
                let key = memory(Register::RDX, 0);
                code.push(Instruction::with2(Code::Cmp_rm64_r64, key, Register::RSI));
                code.push(Instruction::with_branch(Code::Jne_rel32_64, code.done));
                let depth = memory(Register::RCX, STATE_PATH_DEPTH);
                code.push(Instruction::with2(
                    Code::Sub_rm64_imm8,
                    depth,
                    PATH_ENTRY_SIZE,
                ));
                code.finish()
            }
            EdgeAction::Back { end, restart } => {
                let mut code = PathCode::begin(flags_live, needs(false, true), labels);
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
                code.finish()
            }
        }
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

/// One piece of path code being written: the prologue has run, `rcx` holds the
/// thread's state, `rdx` its top path entry (the current call's), `rsi` `!rsp` of the
/// code's own frame; `done` labels the epilogue.
struct PathCode {
    code: Sequence,
    /// The registers saved, in push order (`rax` too when the flags are live).
    saved: Vec<Register>,
    flags_live: bool,
    /// Bytes pushed below the original stack pointer, after the prologue.
    depth: u32,
    done: u64,
    /// The label the next instruction takes.
    next_label: Option<u64>,
}

impl PathCode {
    /// Saves registers (and the flags when live), finds the thread's state and its top
    /// entry, and drops, when asked, the entries of calls that are gone: those whose
    /// `rsp` is below this frame's, or, for a new call, at or below it.
    fn begin(flags_live: bool, needs: Needs, labels: &mut Labels) -> PathCode {
        let mut saved = vec![Register::RCX, Register::RDX];
        if needs.key {
            saved.push(Register::RSI);
        }
        if needs.scratch {
            saved.push(Register::RDI);
        }
        let mut code = Sequence::default();
        code.push(
            fixed(Instruction::with2(
                Code::Lea_r64_m,
                Register::RSP,
                memory(Register::RSP, -(RED_ZONE as i32)),
            )),
            0,
        );
        let mut depth = RED_ZONE;
        for &register in &saved {
            code.push(fixed(Instruction::with1(Code::Push_r64, register)), depth);
            depth += 8;
        }
        if flags_live {
            code.push(
                fixed(Instruction::with1(Code::Push_r64, Register::RAX)),
                depth,
            );
            depth += 8;
            code.push(Instruction::with(Code::Lahf), depth);
            code.push(
                fixed(Instruction::with1(Code::Seto_rm8, Register::AL)),
                depth,
            );
        }
        let mut path = PathCode {
            code,
            saved,
            flags_live,
            depth,
            done: labels.create(),
            next_label: None,
        };
        let slot = MemoryOperand::new(
            Register::None,
            Register::None,
            1,
            i64::from(thread_state::slot_offset()),
            8,
            false,
            Register::FS,
        );
        path.push(Instruction::with2(Code::Mov_r64_rm64, Register::RCX, slot));
        path.push(Instruction::with2(
            Code::Test_rm64_r64,
            Register::RCX,
            Register::RCX,
        ));
        path.push(Instruction::with_branch(Code::Je_rel32_64, path.done));
        path.push(Instruction::with2(
            Code::Test_rm8_imm8,
            memory(Register::RCX, STATE_FLAGS),
            FLAG_PASSTHROUGH as u32,
        ));
        path.push(Instruction::with_branch(Code::Jne_rel32_64, path.done));
        path.push(Instruction::with2(
            Code::Mov_r64_rm64,
            Register::RDX,
            memory(Register::RCX, STATE_PATH_DEPTH),
        ));
        path.push(Instruction::with2(
            Code::Lea_r64_m,
            Register::RDX,
            MemoryOperand::with_base_index_scale_displ_size(
                Register::RCX,
                Register::RDX,
                1,
                i64::from(STATE_PATH_STACK),
                1,
            ),
        ));
        if needs.key {
            path.push(Instruction::with2(
                Code::Lea_r64_m,
                Register::RSI,
                memory(Register::RSP, depth as i32),
            ));
            path.push(Instruction::with1(Code::Not_rm64, Register::RSI));
        }
        if needs.drop_gone {
            // Drop the gone: a deeper call's key (`!rsp`) is larger.
            let check = labels.create();
            let live = labels.create();
            path.label_next(check);
            path.push(Instruction::with2(
                Code::Cmp_rm64_r64,
                memory(Register::RDX, 0),
                Register::RSI,
            ));
            let stays = if needs.entry {
                Code::Jb_rel32_64
            } else {
                Code::Jbe_rel32_64
            };
            path.push(Instruction::with_branch(stays, live));
            path.push(Instruction::with2(
                Code::Sub_rm64_imm8,
                Register::RDX,
                PATH_ENTRY_SIZE,
            ));
            path.push(Instruction::with2(
                Code::Sub_rm64_imm8,
                memory(Register::RCX, STATE_PATH_DEPTH),
                PATH_ENTRY_SIZE,
            ));
            path.push(Instruction::with_branch(Code::Jmp_rel32_64, check));
            path.label_next(live);
        }
        path
    }

    /// Appends an instruction whose operands are fixed (so building it cannot fail).
    fn push(&mut self, instruction: Result<Instruction, iced_x86::IcedError>) {
        let mut instruction = fixed(instruction);
        if let Some(label) = self.next_label.take() {
            instruction.set_ip(label);
        }
        self.code.push(instruction, self.depth);
    }

    /// The next instruction appended takes `label`.
    fn label_next(&mut self, label: u64) {
        debug_assert!(self.next_label.is_none(), "two labels on one instruction");
        self.next_label = Some(label);
    }

    /// Restores the flags and registers, and steps back over the red zone.
    fn finish(mut self) -> Inserted {
        // Every label names one of the instructions pushed since (`counted` is followed
        // by an exit's pop or a back edge's restart).
        let pending = self.next_label.take();
        let mut first = true;
        let mut labelled = |mut instruction: Instruction, done: u64| {
            if first {
                instruction.set_ip(done);
                first = false;
            }
            instruction
        };
        assert!(pending.is_none(), "a label left without its instruction");
        let mut depth = self.depth;
        if self.flags_live {
            self.code.push(
                labelled(
                    fixed(Instruction::with2(Code::Add_rm8_imm8, Register::AL, 0x7f)),
                    self.done,
                ),
                depth,
            );
            self.code.push(Instruction::with(Code::Sahf), depth);
            self.code.push(
                fixed(Instruction::with1(Code::Pop_r64, Register::RAX)),
                depth,
            );
            depth -= 8;
        }
        for &register in self.saved.iter().rev() {
            self.code.push(
                labelled(
                    fixed(Instruction::with1(Code::Pop_r64, register)),
                    self.done,
                ),
                depth,
            );
            depth -= 8;
        }
        self.code.push(
            fixed(Instruction::with2(
                Code::Lea_r64_m,
                Register::RSP,
                memory(Register::RSP, RED_ZONE as i32),
            )),
            RED_ZONE,
        );
        self.code.inserted
    }
}

#[cfg(all(test, not(miri)))]
mod tests;
