//! What the code inserted into a function's copy is built from (`edge_counters`,
//! `path_register`): a sequence of instructions with, for each, how far it has moved
//! the stack pointer (which the copy's unwind rows need), and the pieces every inserted
//! sequence shares — stepping over the red zone and saving registers, saving the
//! status flags where they are live, finding the thread's state, and undoing it all.

use crate::code::function_copy::Inserted;
use crate::hooks::thread_layout::{
    self as thread_state, FLAG_PASSTHROUGH, STATE_FLAGS, STATE_GRAPH_DEPTH,
};
use iced_x86::{Code, Instruction, MemoryOperand, Register};

/// Bytes inserted code steps over below the stack pointer: the System V red zone.
pub const RED_ZONE: u32 = 128;

/// Inserted code being written.
#[derive(Default)]
pub struct Sequence {
    pub inserted: Inserted,
    /// Act only for calls inside a recording's call graph (see [`Gate`]).
    pub gate: Gate,
}

/// Which calls the inserted code acts for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Gate {
    /// Every call of a thread that has a state (`tendril edges`).
    #[default]
    EveryCall,
    /// Only calls made inside a recording's call graph (`graph_depth` above 0): the
    /// calls the recording's tree counts, for a copy behind a recording hook.
    InCallGraph,
}

impl Sequence {
    /// Appends `instruction`, which starts `extra_stack` bytes below the original stack
    /// pointer.
    pub fn push(&mut self, instruction: Instruction, extra_stack: u32) {
        self.inserted.instructions.push(instruction);
        self.inserted.extra_stack.push(extra_stack);
    }

    /// [`Sequence::push`] for an instruction that label `label` names (a branch's
    /// target).
    pub fn push_at(&mut self, label: u64, mut instruction: Instruction, extra_stack: u32) {
        instruction.set_ip(label);
        self.push(instruction, extra_stack);
    }

    /// Steps over the red zone (`lea rsp,[rsp-128]`) and pushes `registers`; returns
    /// the bytes then below the original stack pointer.
    pub fn save(&mut self, registers: &[Register]) -> u32 {
        self.push(
            fixed(Instruction::with2(
                Code::Lea_r64_m,
                Register::RSP,
                below(-i64::from(RED_ZONE)),
            )),
            0,
        );
        let mut depth = RED_ZONE;
        for &register in registers {
            self.push(fixed(Instruction::with1(Code::Push_r64, register)), depth);
            depth += 8;
        }
        depth
    }

    /// Saves the status flags: `push rax; lahf; seto al` (`depth` grows by 8).
    pub fn save_flags(&mut self, depth: &mut u32) {
        self.push(
            fixed(Instruction::with1(Code::Push_r64, Register::RAX)),
            *depth,
        );
        *depth += 8;
        self.push(Instruction::with(Code::Lahf), *depth);
        self.push(
            fixed(Instruction::with1(Code::Seto_rm8, Register::AL)),
            *depth,
        );
    }

    /// `mov rcx,fs:[slot]`, the thread's state, and on to `done` for a thread that has
    /// none yet (moved into the copy mid-entry), that passes through, or, with
    /// [`Gate::InCallGraph`], that is outside the call graph.
    pub fn load_thread_state(&mut self, depth: u32, done: u64) {
        let slot = MemoryOperand::new(
            Register::None,
            Register::None,
            1,
            i64::from(thread_state::slot_offset()),
            // 8: a 64-bit address (the sign-extended displacement); 4 would mean `addr32`.
            8,
            false,
            Register::FS,
        );
        let state_flags = MemoryOperand::with_base_displ(Register::RCX, i64::from(STATE_FLAGS));
        let checks = [
            Instruction::with2(Code::Mov_r64_rm64, Register::RCX, slot),
            Instruction::with2(Code::Test_rm64_r64, Register::RCX, Register::RCX),
            Instruction::with_branch(Code::Je_rel32_64, done),
            Instruction::with2(Code::Test_rm8_imm8, state_flags, FLAG_PASSTHROUGH as u32),
            Instruction::with_branch(Code::Jne_rel32_64, done),
        ];
        for instruction in checks {
            self.push(fixed(instruction), depth);
        }
        if self.gate == Gate::InCallGraph {
            let graph_depth =
                MemoryOperand::with_base_displ(Register::RCX, i64::from(STATE_GRAPH_DEPTH));
            let outside = [
                Instruction::with2(Code::Cmp_rm64_imm8, graph_depth, 0),
                Instruction::with_branch(Code::Je_rel32_64, done),
            ];
            for instruction in outside {
                self.push(fixed(instruction), depth);
            }
        }
    }

    /// Undoes [`Sequence::save`] and [`Sequence::save_flags`] (when `flags_live`) from
    /// `depth`: restores the flags, pops `registers` in reverse, steps back over the red
    /// zone. Its first instruction takes the label `done`.
    pub fn restore(&mut self, registers: &[Register], flags_live: bool, depth: u32, done: u64) {
        let mut depth = depth;
        let mut undo = Vec::new();
        if flags_live {
            undo.push((
                fixed(Instruction::with2(Code::Add_rm8_imm8, Register::AL, 0x7f)),
                depth,
            ));
            undo.push((Instruction::with(Code::Sahf), depth));
            undo.push((
                fixed(Instruction::with1(Code::Pop_r64, Register::RAX)),
                depth,
            ));
            depth -= 8;
        }
        for &register in registers.iter().rev() {
            undo.push((fixed(Instruction::with1(Code::Pop_r64, register)), depth));
            depth -= 8;
        }
        undo[0].0.set_ip(done);
        for (instruction, extra_stack) in undo {
            self.push(instruction, extra_stack);
        }
        self.push(
            fixed(Instruction::with2(
                Code::Lea_r64_m,
                Register::RSP,
                below(i64::from(RED_ZONE)),
            )),
            RED_ZONE,
        );
    }
}

/// `[rsp + displacement]`.
fn below(displacement: i64) -> MemoryOperand {
    MemoryOperand::with_base_displ(Register::RSP, displacement)
}

/// An instruction whose operands are fixed, so building it cannot fail.
pub fn fixed(instruction: Result<Instruction, iced_x86::IcedError>) -> Instruction {
    instruction.expect("an inserted instruction's operands are valid")
}

/// `inserted` encoded at `address` and read back, one instruction a line (Intel
/// syntax): what the inserted code's tests compare.
#[cfg(all(test, not(miri)))]
pub fn disassembled(inserted: &Inserted, address: u64) -> Vec<String> {
    use iced_x86::{BlockEncoder, BlockEncoderOptions, Decoder, DecoderOptions, Formatter};
    use iced_x86::{InstructionBlock, IntelFormatter};
    assert_eq!(inserted.instructions.len(), inserted.extra_stack.len());
    let encoded = BlockEncoder::encode(
        64,
        InstructionBlock::new(&inserted.instructions, address),
        BlockEncoderOptions::NONE,
    )
    .unwrap();
    let mut formatter = IntelFormatter::new();
    Decoder::with_ip(64, &encoded.code_buffer, address, DecoderOptions::NONE)
        .into_iter()
        .map(|instruction| {
            let mut text = String::new();
            formatter.format(&instruction, &mut text);
            text
        })
        .collect()
}
