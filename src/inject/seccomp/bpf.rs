//! A classic-BPF interpreter for seccomp filters, and the kernel's way of combining
//! their results.
//!
//! A seccomp filter is a classic BPF program over `struct seccomp_data { int nr; u32
//! arch; u64 instruction_pointer; u64 args[6]; }` (64 bytes, little-endian here). The
//! kernel admits only a subset of classic BPF (`seccomp_check_filter`): 32-bit loads
//! of aligned words of the data, the data's length, immediates and the 16 scratch
//! words, the ALU, forward jumps, `RET K` and `RET A`. [`run`] executes exactly that
//! subset; anything else, a load outside the data, a jump past the end or a program
//! that does not end in a return is an [`BpfError`], which the caller treats as a
//! filter it cannot judge. Jumps only go forward, so every run ends.
//!
//! When several filters are installed, the kernel runs them all (newest first) and
//! keeps the result whose action comes first in its order — KILL_PROCESS, KILL_THREAD,
//! TRAP, ERRNO, USER_NOTIF, TRACE, LOG, ALLOW — which is the order of the action bits
//! read as a signed number ([`combine`]).

/// `AUDIT_ARCH_X86_64`: the `arch` of every system call tendril's agent makes.
pub const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
/// `sizeof(struct seccomp_data)`.
const DATA_BYTES: u32 = 64;
/// `BPF_MEMWORDS`: the scratch words a program may use.
const SCRATCH_WORDS: usize = 16;

/// The action part of a filter's result (`SECCOMP_RET_ACTION_FULL`).
const ACTION_MASK: u32 = 0xffff_0000;
/// The data part of a filter's result (`SECCOMP_RET_DATA`): an errno, a trace message.
const DATA_MASK: u32 = 0x0000_ffff;
/// The largest errno the kernel returns; larger data is cut to it.
const MAX_ERRNO: u32 = 4095;

// Instruction classes, and the fields of an opcode (linux/bpf_common.h).
const LD: u16 = 0x00;
const LDX: u16 = 0x01;
const ST: u16 = 0x02;
const STX: u16 = 0x03;
const ALU: u16 = 0x04;
const JMP: u16 = 0x05;
const RET: u16 = 0x06;
const MISC: u16 = 0x07;
const W: u16 = 0x00;
const IMM: u16 = 0x00;
const ABS: u16 = 0x20;
const MEM: u16 = 0x60;
const LEN: u16 = 0x80;
const SRC_X: u16 = 0x08;
const RET_A: u16 = 0x10;
const TXA: u16 = 0x80;

/// One instruction, as `struct sock_filter` holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Instruction {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

#[cfg(test)]
impl Instruction {
    /// `BPF_STMT(code, k)`.
    pub const fn statement(code: u16, k: u32) -> Instruction {
        Instruction {
            code,
            jt: 0,
            jf: 0,
            k,
        }
    }

    /// `BPF_JUMP(code, k, jt, jf)`.
    pub const fn jump(code: u16, k: u32, jt: u8, jf: u8) -> Instruction {
        Instruction { code, jt, jf, k }
    }
}

/// What a filter sees of a system call (`struct seccomp_data`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeccompData {
    pub nr: i32,
    pub arch: u32,
    pub instruction_pointer: u64,
    pub args: [u64; 6],
}

impl SeccompData {
    /// The aligned 32-bit word at byte `offset`, as a `BPF_LD|BPF_W|BPF_ABS` reads it.
    fn word(&self, offset: u32) -> Option<u32> {
        if !offset.is_multiple_of(4) || offset >= DATA_BYTES {
            return None;
        }
        let low_half = |value: u64| value as u32;
        let high_half = |value: u64| (value >> 32) as u32;
        let word = match offset {
            0 => self.nr as u32,
            4 => self.arch,
            8 => low_half(self.instruction_pointer),
            12 => high_half(self.instruction_pointer),
            _ => {
                let arg = self.args[(offset as usize - 16) / 8];
                if offset.is_multiple_of(8) {
                    low_half(arg)
                } else {
                    high_half(arg)
                }
            }
        };
        Some(word)
    }
}

/// Why a program could not be run to a result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BpfError {
    #[error("instruction {pc} loads byte {offset} of the 64 a system call has")]
    LoadOutOfRange { pc: usize, offset: u32 },
    #[error("instruction {pc} jumps past the program's end")]
    JumpOutOfRange { pc: usize },
    #[error("instruction {pc} uses scratch word {index} of the 16 there are")]
    ScratchOutOfRange { pc: usize, index: u32 },
    #[error("instruction {pc} divides by a constant 0")]
    DivisionByZero { pc: usize },
    #[error("instruction {pc} (opcode {code:#06x}) is not one a seccomp filter may use")]
    Unsupported { pc: usize, code: u16 },
    #[error("the program ends without returning")]
    NoReturn,
}

/// Runs `program` on `data` and returns its result (`SECCOMP_RET_…` action and data).
pub fn run(program: &[Instruction], data: &SeccompData) -> Result<u32, BpfError> {
    let mut a: u32 = 0;
    let mut x: u32 = 0;
    let mut scratch = [0u32; SCRATCH_WORDS];
    let mut pc = 0;
    while let Some(&instruction) = program.get(pc) {
        let Instruction { code, jt, jf, k } = instruction;
        let unsupported = BpfError::Unsupported { pc, code };
        let slot = |index: u32| match index as usize {
            slot if slot < SCRATCH_WORDS => Ok(slot),
            _ => Err(BpfError::ScratchOutOfRange { pc, index }),
        };
        let mut next = pc + 1;
        match code & 0x07 {
            LD => {
                a = match code & !0x07 {
                    mode if mode == W | ABS => data
                        .word(k)
                        .ok_or(BpfError::LoadOutOfRange { pc, offset: k })?,
                    mode if mode == W | LEN => DATA_BYTES,
                    mode if mode == W | IMM => k,
                    mode if mode == W | MEM => scratch[slot(k)?],
                    _ => return Err(unsupported),
                }
            }
            LDX => {
                x = match code & !0x07 {
                    mode if mode == W | LEN => DATA_BYTES,
                    mode if mode == W | IMM => k,
                    mode if mode == W | MEM => scratch[slot(k)?],
                    _ => return Err(unsupported),
                }
            }
            ST if code == ST => scratch[slot(k)?] = a,
            STX if code == STX => scratch[slot(k)?] = x,
            ALU => match alu(code, a, if code & SRC_X != 0 { x } else { k }) {
                Alu::Value(value) => a = value,
                // Classic BPF ends the program with 0 on a division by a zero X.
                Alu::DividedByZero if code & SRC_X != 0 => return Ok(0),
                Alu::DividedByZero => return Err(BpfError::DivisionByZero { pc }),
                Alu::Unsupported => return Err(unsupported),
            },
            JMP => {
                let operand = if code & SRC_X != 0 { x } else { k };
                let offset = match code & 0xf0 {
                    0x00 if code & SRC_X == 0 => k as usize,  // JA
                    0x10 => branch(a == operand, jt, jf),     // JEQ
                    0x20 => branch(a > operand, jt, jf),      // JGT
                    0x30 => branch(a >= operand, jt, jf),     // JGE
                    0x40 => branch(a & operand != 0, jt, jf), // JSET
                    _ => return Err(unsupported),
                };
                next = next
                    .checked_add(offset)
                    .filter(|&target| target < program.len())
                    .ok_or(BpfError::JumpOutOfRange { pc })?;
            }
            RET => {
                return match code & 0x18 {
                    0x00 => Ok(k),
                    RET_A => Ok(a),
                    _ => Err(unsupported),
                };
            }
            MISC => match code & 0xf8 {
                0x00 => x = a, // TAX
                TXA => a = x,
                _ => return Err(unsupported),
            },
            _ => return Err(unsupported),
        }
        pc = next;
    }
    Err(BpfError::NoReturn)
}

fn branch(taken: bool, jt: u8, jf: u8) -> usize {
    usize::from(if taken { jt } else { jf })
}

enum Alu {
    Value(u32),
    DividedByZero,
    Unsupported,
}

/// The ALU operation of `code` on `a` and `operand`, with 32-bit wrap-around.
fn alu(code: u16, a: u32, operand: u32) -> Alu {
    let value = match code & 0xf0 {
        0x00 => a.wrapping_add(operand),
        0x10 => a.wrapping_sub(operand),
        0x20 => a.wrapping_mul(operand),
        0x30 | 0x90 if operand == 0 => return Alu::DividedByZero,
        0x30 => a / operand,
        0x90 => a % operand,
        0x40 => a | operand,
        0x50 => a & operand,
        // A shift by 32 or more: the kernel refuses a constant one at install time;
        // one by X shifts by X mod 32, as the CPU does.
        0x60 => a.wrapping_shl(operand),
        0x70 => a.wrapping_shr(operand),
        0x80 if code & SRC_X == 0 => a.wrapping_neg(),
        0xa0 => a ^ operand,
        _ => return Alu::Unsupported,
    };
    Alu::Value(value)
}

/// What the kernel does with a system call, from a filter's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    KillProcess,
    KillThread,
    Trap,
    Errno(u32),
    UserNotif,
    Trace,
    Log,
    Allow,
    /// An action the kernel does not know; it kills the process for it.
    Unknown(u32),
}

impl Action {
    pub fn of(result: u32) -> Action {
        match result & ACTION_MASK {
            0x8000_0000 => Action::KillProcess,
            0x0000_0000 => Action::KillThread,
            0x0003_0000 => Action::Trap,
            0x0005_0000 => Action::Errno((result & DATA_MASK).min(MAX_ERRNO)),
            0x7fc0_0000 => Action::UserNotif,
            0x7ff0_0000 => Action::Trace,
            0x7ffc_0000 => Action::Log,
            0x7fff_0000 => Action::Allow,
            _ => Action::Unknown(result),
        }
    }

    /// The action's name in `linux/seccomp.h`.
    pub fn name(self) -> String {
        match self {
            Action::KillProcess => "SECCOMP_RET_KILL_PROCESS".into(),
            Action::KillThread => "SECCOMP_RET_KILL_THREAD".into(),
            Action::Trap => "SECCOMP_RET_TRAP".into(),
            Action::Errno(_) => "SECCOMP_RET_ERRNO".into(),
            Action::UserNotif => "SECCOMP_RET_USER_NOTIF".into(),
            Action::Trace => "SECCOMP_RET_TRACE".into(),
            Action::Log => "SECCOMP_RET_LOG".into(),
            Action::Allow => "SECCOMP_RET_ALLOW".into(),
            Action::Unknown(result) => format!("unknown action {result:#010x}"),
        }
    }
}

/// Where a result stands in the kernel's order: the lower, the more it takes precedence.
pub fn precedence(result: u32) -> i32 {
    (result & ACTION_MASK) as i32
}

/// The result the kernel acts on, from every filter's result, newest filter first: the
/// first of those whose action takes precedence over all others; ALLOW if none.
pub fn combine(results: impl IntoIterator<Item = u32>) -> u32 {
    let allow = 0x7fff_0000;
    results.into_iter().fold(allow, |kept, result| {
        if precedence(result) < precedence(kept) {
            result
        } else {
            kept
        }
    })
}

#[cfg(test)]
mod tests;
