//! Stepping out of a frame that no unwind table describes: code generated at run time
//! (a JavaScript function, a Python perf trampoline, any JIT's output), which lives in
//! anonymous memory, outside every module's `.eh_frame`.
//!
//! The one idea: where the runtime's perf map or jitdump says where the function starts,
//! its first instructions are read from the target (never written) and simulated up to
//! the frame's address — `push`es, `sub rsp`/`add rsp`, calls that return, anything that
//! leaves `rsp` and `rbp` alone — which gives the exact distance from the stack pointer
//! to the return address, and where `rbp` was saved. Python 3.12's trampolines (`sub
//! rsp, 8; call rcx`) keep no frame pointer and step this way. Once the code has set up
//! a frame pointer (`push rbp; mov rbp, rsp`, as V8's code always does), or wherever
//! the simulation cannot say (an unknown start, a jump, an instruction that writes `rsp`
//! or `rbp` otherwise), the frame steps by frame pointer: return address at `rbp + 8`,
//! the caller's `rbp` at `rbp`. Rules are kept per address until the runtime's names
//! change.

use std::collections::HashMap;
use std::ops::Range;

use framehop::FrameAddress;
use framehop::x86_64::UnwindRegsX86_64;
use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register,
};

use crate::symbols::jit::JitSymbols;
use crate::symbols::maps;

/// The most bytes of a function simulated: prologues are short; past this, the frame
/// pointer is used.
const MAX_SIMULATED: u64 = 256;

/// How to find a JIT frame's caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The return address is at `sp + return_at`; the caller's `rbp` at `sp + bp_at`,
    /// or unchanged.
    Offset { return_at: u64, bp_at: Option<u64> },
    /// By frame pointer: the return address at `rbp + 8`, the caller's `rbp` at `rbp`.
    FramePointer,
}

/// A JIT frame whose caller could not be found (a stack word not in the copy, a frame
/// pointer that is none): the walk ends there, truncated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotUnwound;

/// The JIT frames' unwinder of one process.
pub struct JitUnwinder {
    pid: i32,
    /// The modules' executable mappings, sorted: frames there are framehop's (or Go's).
    module_code: Vec<Range<u64>>,
    /// Rules by (lookup address, whether it is a return address).
    rules: HashMap<(u64, bool), Rule>,
    /// The JIT names' generation the rules were made with.
    generation: u64,
}

impl JitUnwinder {
    /// For process `pid`, whose modules' code is `module_code`.
    pub fn new(pid: i32, mut module_code: Vec<Range<u64>>) -> JitUnwinder {
        module_code.sort_unstable_by_key(|r| r.start);
        JitUnwinder {
            pid,
            module_code,
            rules: HashMap::new(),
            generation: 0,
        }
    }

    /// Whether a frame at `lookup` is outside every module's code: one to step here.
    pub fn covers(&self, lookup: u64) -> bool {
        let i = self.module_code.partition_point(|r| r.start <= lookup);
        !(i > 0 && lookup < self.module_code[i - 1].end)
    }

    /// Steps out of the frame at `address`: like framehop's `unwind_frame`, the caller's
    /// return address (`None` at the outermost frame), `regs` moved to the caller.
    pub fn step(
        &mut self,
        address: FrameAddress,
        jit: Option<&JitSymbols>,
        regs: &mut UnwindRegsX86_64,
        read_stack: &mut impl FnMut(u64) -> Result<u64, ()>,
    ) -> Result<Option<u64>, NotUnwound> {
        let generation = jit.map_or(0, JitSymbols::generation);
        if generation != self.generation {
            self.rules.clear();
            self.generation = generation;
        }
        let is_return = address.is_return_address();
        let pc = match address {
            FrameAddress::InstructionPointer(ip) => ip,
            FrameAddress::ReturnAddress(ra) => ra.get(),
        };
        let key = (address.address_for_lookup(), is_return);
        let rule = match self.rules.get(&key) {
            Some(&rule) => rule,
            None => {
                let rule = self.rule_for(pc, is_return, jit);
                self.rules.insert(key, rule);
                rule
            }
        };
        execute(rule, regs, read_stack).map_err(|()| NotUnwound)
    }

    /// The rule for the frame at `pc`, from its function's first instructions.
    fn rule_for(&self, pc: u64, is_return: bool, jit: Option<&JitSymbols>) -> Rule {
        let lookup = if is_return { pc - 1 } else { pc };
        let Some((start, _)) = jit.and_then(|jit| jit.lookup(lookup)) else {
            return Rule::FramePointer;
        };
        let end = pc.min(start + MAX_SIMULATED);
        match maps::read_memory(self.pid, start, end) {
            Ok(code) => simulate(&code, start, pc, is_return),
            Err(_) => Rule::FramePointer,
        }
    }
}

/// Simulates `code` (a function's first bytes, from `start`) up to `pc`: the
/// instruction pointer of the innermost frame, or a return address (then the call
/// that ends there is not simulated: its callee has returned).
pub fn simulate(code: &[u8], start: u64, pc: u64, is_return: bool) -> Rule {
    let mut decoder = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    let mut instruction = Instruction::default();
    // Bytes pushed below the return address, and that depth when `rbp` was pushed.
    let mut depth: u64 = 0;
    let mut bp_pushed_at: Option<u64> = None;
    loop {
        let ip = decoder.ip();
        if ip == pc {
            break;
        }
        if !decoder.can_decode() {
            return Rule::FramePointer; // ran out of the bytes simulated
        }
        decoder.decode_out(&mut instruction);
        let next = instruction.next_ip();
        if instruction.is_invalid() || next > pc {
            return Rule::FramePointer;
        }
        let is_call = matches!(
            instruction.flow_control(),
            FlowControl::Call | FlowControl::IndirectCall
        );
        if is_return && next == pc && is_call {
            break;
        }
        match effect(&instruction) {
            Effect::None => {}
            Effect::Push { is_bp } => {
                depth += 8;
                if is_bp && bp_pushed_at.is_none() {
                    bp_pushed_at = Some(depth);
                }
            }
            Effect::Grow(bytes) => depth += bytes,
            Effect::Shrink(bytes) => match depth.checked_sub(bytes) {
                Some(less) => depth = less,
                None => return Rule::FramePointer,
            },
            Effect::Unknown => return Rule::FramePointer,
        }
    }
    Rule::Offset {
        return_at: depth,
        bp_at: bp_pushed_at.map(|at| depth - at),
    }
}

/// What one instruction does to the frame.
enum Effect {
    None,
    Push {
        is_bp: bool,
    },
    Grow(u64),
    Shrink(u64),
    /// Moves `rsp` or `rbp` in a way not followed (or leaves the straight line).
    Unknown,
}

fn effect(instruction: &Instruction) -> Effect {
    let register = |n: u32| match instruction.op_kind(n) {
        OpKind::Register => instruction.op_register(n).full_register(),
        _ => Register::None,
    };
    match instruction.code() {
        Code::Push_r64 => {
            return Effect::Push {
                is_bp: register(0) == Register::RBP,
            };
        }
        Code::Pushq_imm8 | Code::Pushq_imm32 => return Effect::Push { is_bp: false },
        Code::Sub_rm64_imm8 | Code::Sub_rm64_imm32 if register(0) == Register::RSP => {
            return Effect::Grow(instruction.immediate(1));
        }
        Code::Add_rm64_imm8 | Code::Add_rm64_imm32 if register(0) == Register::RSP => {
            return Effect::Shrink(instruction.immediate(1));
        }
        // `mov rbp, rsp`: a frame pointer from here on.
        Code::Mov_r64_rm64 | Code::Mov_rm64_r64
            if register(0) == Register::RBP && register(1) == Register::RSP =>
        {
            return Effect::Unknown;
        }
        _ => {}
    }
    if matches!(instruction.mnemonic(), Mnemonic::Nop | Mnemonic::Endbr64) {
        return Effect::None;
    }
    match instruction.flow_control() {
        // A call that returns leaves the stack as it was; a conditional branch is
        // passed over (prologues check and go on).
        FlowControl::Call | FlowControl::IndirectCall | FlowControl::ConditionalBranch => {
            return Effect::None;
        }
        FlowControl::Next => {}
        _ => return Effect::Unknown,
    }
    let writes_frame = matches!(register(0), Register::RSP | Register::RBP)
        || instruction.stack_pointer_increment() != 0;
    match writes_frame {
        true => Effect::Unknown,
        false => Effect::None,
    }
}

/// Runs `rule` on `regs` (see [`Rule`]); `None` at the outermost frame.
fn execute(
    rule: Rule,
    regs: &mut UnwindRegsX86_64,
    read_stack: &mut impl FnMut(u64) -> Result<u64, ()>,
) -> Result<Option<u64>, ()> {
    let (sp, bp) = (regs.sp(), regs.bp());
    let (return_slot, new_bp) = match rule {
        Rule::Offset { return_at, bp_at } => {
            let new_bp = match bp_at {
                Some(at) => read_stack(sp.checked_add(at).ok_or(())?)?,
                None => bp,
            };
            (sp.checked_add(return_at).ok_or(())?, new_bp)
        }
        Rule::FramePointer => {
            if bp == 0 {
                return Ok(None);
            }
            if bp.checked_add(16).ok_or(())? <= sp {
                return Err(()); // a frame pointer below the stack pointer: not one
            }
            (bp + 8, read_stack(bp)?)
        }
    };
    let return_address = read_stack(return_slot)?;
    if return_address == 0 {
        return Ok(None);
    }
    regs.set_ip(return_address);
    regs.set_sp(return_slot + 8);
    regs.set_bp(new_bp);
    Ok(Some(return_address))
}

#[cfg(test)]
mod tests;
