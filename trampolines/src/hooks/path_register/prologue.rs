//! What every piece of path code starts and ends with: saving what it uses, finding
//! the thread's state and its call's entry, and putting everything back.

use crate::code::function_copy::Inserted;
use crate::hooks::inserted_code::{Gate, Sequence, fixed};
use crate::hooks::thread_layout::{
    self as thread_state, PATH_ENTRY_SIZE, STATE_PATH_DEPTH, STATE_PATH_STACK,
};
use iced_x86::{Code, Instruction, MemoryOperand, Register};

/// Where a call's entry `rsp` is, at the point the code runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    /// The function's `rsp` there plus this.
    StackPointer(i64),
    /// This register plus this.
    Register(Register, i64),
}

/// How the code finds its call's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// A new call: entries at or below its `rsp` are of calls that are gone.
    NewCall,
    /// The entry whose key is the call's own, dropping deeper ones (gone) on the way;
    /// when there is none, count `lost_id` (if given) and do nothing else.
    Exact { lost_id: Option<u32> },
}

/// What a piece of path code needs.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// The call's key, `!(entry rsp)`, wanted in `rsi`; `None` when not needed (or,
    /// with `Check::Exact`, when unknown: the entry is then never found).
    pub key: Option<KeySource>,
    pub check: Check,
    /// A scratch register, `rdi`.
    pub scratch: bool,
    /// Which calls the code acts for.
    pub gate: Gate,
}

/// The general-purpose register of DWARF register number `number` (x86-64).
pub fn gpr(number: u16) -> Option<Register> {
    use Register::*;
    const BY_NUMBER: [Register; 16] = [
        RAX, RDX, RCX, RBX, RSI, RDI, RBP, RSP, R8, R9, R10, R11, R12, R13, R14, R15,
    ];
    BY_NUMBER.get(usize::from(number)).copied()
}

/// `[base + displacement]`.
fn memory(base: Register, displacement: i64) -> MemoryOperand {
    MemoryOperand::with_base_displ(base, displacement)
}

/// `rsi` = the call's key, `!(entry rsp)`, from `source`, with `depth` bytes pushed so far.
fn push_key(code: &mut Sequence, source: KeySource, depth: u32) {
    let (base, displacement) = match source {
        KeySource::StackPointer(offset) => (Register::RSP, offset + i64::from(depth)),
        KeySource::Register(register, offset) => (register, offset),
    };
    code.push(
        fixed(Instruction::with2(
            Code::Lea_r64_m,
            Register::RSI,
            memory(base, displacement),
        )),
        depth,
    );
    code.push(
        fixed(Instruction::with1(Code::Not_rm64, Register::RSI)),
        depth,
    );
}

/// One piece of path code being written: after `begin`, `rcx` holds the thread's
/// state, `rdx` the call's entry, and `rsi` the call's key when the plan asked for it.
pub struct PathCode {
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
    /// Saves what the plan uses (and the flags when live), computes the key, finds the
    /// thread's state and its call's entry as `plan.check` says. A thread without a
    /// state, or one passing through, goes straight to the epilogue.
    pub fn begin(flags_live: bool, plan: Plan, labels: &mut super::Labels) -> PathCode {
        let mut saved = vec![Register::RCX, Register::RDX, Register::RSI];
        if plan.scratch {
            saved.push(Register::RDI);
        }
        let mut code = Sequence {
            gate: plan.gate,
            ..Sequence::default()
        };
        let mut depth = code.save(&saved);
        // The key first, while every register but `rsp` holds the function's value.
        if let Some(source) = plan.key {
            push_key(&mut code, source, depth);
        }
        if flags_live {
            code.save_flags(&mut depth);
        }
        let mut path = PathCode {
            code,
            saved,
            flags_live,
            depth,
            done: labels.create(),
            next_label: None,
        };
        path.load_top_entry();
        match plan.check {
            Check::NewCall => path.drop_gone_calls(labels),
            Check::Exact { lost_id } => path.find_exact(plan.key.is_some(), lost_id, labels),
        }
        path
    }

    /// Finds the thread's state (`rcx`) and the top entry of its path stack (`rdx`).
    fn load_top_entry(&mut self) {
        self.code.load_thread_state(self.depth, self.done);
        let stack_depth = memory(Register::RCX, i64::from(STATE_PATH_DEPTH));
        self.push(Instruction::with2(
            Code::Mov_r64_rm64,
            Register::RDX,
            stack_depth,
        ));
        self.push(Instruction::with2(
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
    }

    /// [`Check::NewCall`]: drops the entries of calls that are gone.
    fn drop_gone_calls(&mut self, labels: &mut super::Labels) {
        // An entry whose key is at least this call's (`rsp` at or below it)
        // is of a call that is gone.
        let check = labels.create();
        let keep = labels.create();
        self.label_next(check);
        self.push(Instruction::with2(
            Code::Cmp_rm64_r64,
            memory(Register::RDX, 0),
            Register::RSI,
        ));
        self.push(Instruction::with_branch(Code::Jb_rel32_64, keep));
        self.drop_top(check);
        self.label_next(keep);
    }

    /// [`Check::Exact`]: finds the entry whose key is the call's (`has_key`: the key is
    /// in `rsi`), dropping deeper ones; without one, counts `lost_id` and goes to the
    /// epilogue.
    fn find_exact(&mut self, has_key: bool, lost_id: Option<u32>, labels: &mut super::Labels) {
        let check = labels.create();
        let mine = labels.create();
        let deeper = labels.create();
        if has_key {
            self.label_next(check);
            self.push(Instruction::with2(
                Code::Cmp_rm64_r64,
                memory(Register::RDX, 0),
                Register::RSI,
            ));
            self.push(Instruction::with_branch(Code::Je_rel32_64, mine));
            self.push(Instruction::with_branch(Code::Ja_rel32_64, deeper));
        }
        // Not found: an outer call's entry is on top (or the sentinel).
        if let Some(lost_id) = lost_id {
            let lost = memory(
                Register::RCX,
                i64::from(thread_state::calls_displacement(lost_id)),
            );
            self.push(Instruction::with1(Code::Inc_rm64, lost));
        }
        self.push(Instruction::with_branch(Code::Jmp_rel32_64, self.done));
        if has_key {
            self.label_next(deeper);
            self.drop_top(check);
            self.label_next(mine);
        }
    }

    /// Pops the top entry (a call that is gone) and goes back to `check`.
    fn drop_top(&mut self, check: u64) {
        self.push(Instruction::with2(
            Code::Sub_rm64_imm8,
            Register::RDX,
            PATH_ENTRY_SIZE,
        ));
        self.push(Instruction::with2(
            Code::Sub_rm64_imm8,
            memory(Register::RCX, i64::from(STATE_PATH_DEPTH)),
            PATH_ENTRY_SIZE,
        ));
        self.push(Instruction::with_branch(Code::Jmp_rel32_64, check));
    }

    /// The epilogue's label.
    pub fn done(&self) -> u64 {
        self.done
    }

    /// Appends an instruction whose operands are fixed (so building it cannot fail).
    pub fn push(&mut self, instruction: Result<Instruction, iced_x86::IcedError>) {
        let mut instruction = fixed(instruction);
        if let Some(label) = self.next_label.take() {
            instruction.set_ip(label);
        }
        self.code.push(instruction, self.depth);
    }

    /// The next instruction appended takes `label`.
    pub fn label_next(&mut self, label: u64) {
        debug_assert!(self.next_label.is_none(), "two labels on one instruction");
        self.next_label = Some(label);
    }

    /// Restores the flags and registers, and steps back over the red zone.
    pub fn finish(mut self) -> Inserted {
        // Every label names one of the instructions pushed since (`counted` is followed
        // by an exit's pop or a back edge's restart).
        assert!(
            self.next_label.is_none(),
            "a label left without its instruction"
        );
        self.code
            .restore(&self.saved, self.flags_live, self.depth, self.done);
        self.code.inserted
    }
}
