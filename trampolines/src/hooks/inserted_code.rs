//! What the code inserted into a function's copy is built from (`edge_counters`,
//! `path_register`): the red zone it steps over, and a sequence of instructions with,
//! for each, how far it has moved the stack pointer (which the copy's unwind rows need).

use crate::code::function_copy::Inserted;
use iced_x86::Instruction;

/// Bytes inserted code steps over below the stack pointer: the System V red zone.
pub const RED_ZONE: u32 = 128;

/// Inserted code being written.
#[derive(Default)]
pub struct Sequence {
    pub inserted: Inserted,
}

impl Sequence {
    /// Appends `instruction`, which starts `extra_stack` bytes below the original stack
    /// pointer.
    pub fn push(&mut self, instruction: Instruction, extra_stack: u32) {
        self.inserted.instructions.push(instruction);
        self.inserted.extra_stack.push(extra_stack);
    }
}

/// An instruction whose operands are fixed, so building it cannot fail.
pub fn fixed(instruction: Result<Instruction, iced_x86::IcedError>) -> Instruction {
    instruction.expect("an inserted instruction's operands are valid")
}
