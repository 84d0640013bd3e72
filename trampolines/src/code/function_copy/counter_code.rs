//! What a function's copy asks of the code it inserts (`hooks::edge_counters`,
//! `hooks::path_register`, `hooks::pointer_checks`): a counter per site, the code each
//! call runs first, the code on each edge, a landing pad's own entry, and the code
//! before each call or tail jump through a pointer.

use super::{Inserted, Labels};
use iced_x86::Instruction;

/// The machine code of counters, and of the path register.
///
/// Every piece of code may clobber the status flags only when `flags_live` is false;
/// any other state it changes it must restore, and it must not touch the 128 bytes
/// below the stack pointer (the red zone, which leaf functions use). Branches inside
/// it use `labels`.
pub trait CounterCode {
    /// The code that adds one to counter `index` (of [`counter_sites`]).
    fn counter(&mut self, index: usize, flags_live: bool, labels: &mut Labels) -> Inserted;

    /// The code each call runs once, first: where the flags are not live.
    fn entry(&mut self, _labels: &mut Labels) -> Inserted {
        Inserted::default()
    }

    /// Whether block `block` has code of its own for when the unwinder enters it (a
    /// landing pad): see [`CounterCode::landing_pad`].
    fn is_landing_pad(&self, _block: usize) -> bool {
        false
    }

    /// The code the unwinder's entry into landing pad `block` runs, before the block's
    /// counter; a jump or fall-through into the block skips it. `row_of` as for
    /// [`CounterCode::edge`].
    fn landing_pad(
        &mut self,
        _block: usize,
        _flags_live: bool,
        _row_of: u64,
        _labels: &mut Labels,
    ) -> Inserted {
        Inserted::default()
    }

    /// The code on edge `edge` of the graph's [`ControlFlowGraph::edge_lists`] (blocks
    /// in order, each block's edges in order, a block with none having one out of the
    /// function), where the unwind row of original instruction `row_of` applies. An
    /// edge out of the function runs where the stack pointer is the entry's (before
    /// the `ret` or the tail jump), and the flags are not live there.
    fn edge(
        &mut self,
        _edge: usize,
        _flags_live: bool,
        _row_of: u64,
        _labels: &mut Labels,
    ) -> Inserted {
        Inserted::default()
    }

    /// The code that runs just before `instruction`, the call or tail jump through a
    /// pointer at original address `site` (`call rax`, `call [rax+0x18]`, a `jmp` of
    /// the same kinds that leaves the function). The flags are not live there (a
    /// callee gets them undefined), and the row of `site` applies. The code may read
    /// the instruction's operand: every register still holds what the instruction
    /// will use.
    fn through_pointer(
        &mut self,
        _site: u64,
        _instruction: &Instruction,
        _labels: &mut Labels,
    ) -> Inserted {
        Inserted::default()
    }
}
