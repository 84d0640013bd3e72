//! Entry-patch planning, as pure functions over a function's bytes.
//!
//! The patch engine overwrites a function's first instructions with a 5-byte `jmp rel32`
//! to a trampoline, which calls the entry hook, runs a relocated copy of the overwritten
//! instructions (`relocate`) and jumps back to the first instruction that was not
//! overwritten. [`plan_entry_patch`] decides what gets overwritten and whether that is
//! safe.
//!
//! The one idea: once patched, no thread may ever *arrive* at an address strictly inside
//! the overwritten bytes — neither by a return (so only the last overwritten instruction
//! may call, make a system call or end the function) nor by a branch (so the body is
//! scanned for branch targets). Whatever could break that is refused, with the reason.

use super::branch_index::decode_branches;
use crate::sys::error::AgentError;
use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, Instruction};
use std::fmt;

/// Length of the `jmp rel32` written at the patch point.
pub const PATCH_LEN: usize = 5;
/// Length of the `jmp rel8` written instead where five bytes cannot be overwritten; it
/// jumps to a `jmp rel32` placed in dead padding nearby (see `padding`).
pub const SHORT_PATCH_LEN: usize = 2;

const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// Most one-byte `push`es skipped at an entry (see [`EntryPlan::lead_pushes`]).
pub const MAX_LEAD_PUSHES: usize = 4;
/// Cache-line size: a 2-byte store inside one line is atomic for instruction fetch.
const CACHE_LINE: u64 = 64;

/// What is written at the patch point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchStyle {
    /// A `jmp` to the hook; the trampoline's body runs the overwritten instructions.
    Jump,
    /// The entry *is* a `call` (`call rel32`, or `call [rip+x]`, 6 bytes): it is
    /// replaced by a `call` to the hook, which then jumps to the original callee. The
    /// callee so returns to the function through the return address a `call` in the
    /// function pushed, which keeps the cpu's return predictions right and leaves the
    /// frame exactly as the unwinder and the function's exception tables expect.
    CallThunk,
}

/// Where and how much of a function's entry gets overwritten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryPlan {
    pub style: PatchStyle,
    /// Where the patch starts: after an `endbr64` (kept, so indirect calls stay valid
    /// under IBT) and after [`lead_pushes`](Self::lead_pushes) one-byte pushes.
    pub patch_offset: usize,
    /// One-byte `push reg` instructions just before the patch, left in place. The
    /// patch's first two bytes are replaced in one store by a jump-to-self guard, which
    /// needs a first instruction of at least two bytes: a thread between a one-byte
    /// first instruction and the next would run into the guard's second byte. A thread
    /// that ran the pushes reaches the patch, whose trampoline pops them off again
    /// (`lea rsp,[rsp+8n]`: the registers still hold what was pushed) before the hook,
    /// and whose body runs them once more before the overwritten instructions.
    pub lead_pushes: usize,
    /// Length of what is written: [`PATCH_LEN`] or [`SHORT_PATCH_LEN`] for a jump, the
    /// whole call instruction (5 or 6 bytes) for a call thunk.
    pub jump_len: usize,
    /// Bytes of whole instructions overwritten from `patch_offset`; at least `jump_len`.
    pub overwritten_len: usize,
    /// Offset from the function start of each overwritten instruction.
    pub instruction_offsets: Vec<usize>,
    /// Offsets of instructions elsewhere in the body that branch to the entry (offset 0
    /// or `patch_offset`), e.g. tail recursion made a loop: each runs the entry hook
    /// again although no new call was made.
    pub entry_branch_sources: Vec<usize>,
}

/// Why a function entry cannot be patched safely. Addresses are absolute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Fewer bytes after the patch point (`size`) than the jump needs (`needed`).
    TooShort { size: u64, needed: usize },
    /// A `ret`, `jmp` or trap before the last overwritten instruction.
    FlowEndsInPatch { at: u64 },
    /// A direct branch lands strictly inside the overwritten bytes.
    BranchIntoPatch { from: u64, to: u64 },
    /// A call before the last overwritten instruction would return into the patch.
    CallNotLast { at: u64 },
    /// A system call or software interrupt that would return into the patch.
    SyscallNotLast { at: u64 },
    /// An `int3` in the overwritten bytes: someone else's breakpoint.
    Breakpoint { at: u64 },
    /// Bytes that do not decode, or an instruction running past the end of the function.
    Undecodable { at: u64 },
    /// A one-byte first instruction other than a `push`: the 2-byte guard would cut
    /// through the next instruction.
    OneByteEntry { at: u64 },
    /// The patch's first two bytes lie on two cache lines, so no single store can
    /// replace them for every core at once.
    GuardSplitsCacheLine { at: u64 },
    /// A RIP-relative memory operand out of reach of the trampoline's address.
    RipRelativeOutOfRange { at: u64 },
    /// iced-x86 could not encode the relocated block for another reason.
    Unencodable { at: u64, reason: String },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let into = "into the patched bytes";
        match self {
            Self::TooShort { size, needed } => {
                write!(f, "shorter than the {needed}-byte patch ({size} bytes)")
            }
            Self::FlowEndsInPatch { at } => {
                write!(f, "the function leaves at {at:#x}, inside the patch")
            }
            Self::BranchIntoPatch { from, to } => {
                write!(f, "a branch at {from:#x} jumps {into} ({to:#x})")
            }
            Self::CallNotLast { at } => write!(f, "the call at {at:#x} would return {into}"),
            Self::SyscallNotLast { at } => {
                write!(f, "the system call at {at:#x} would return {into}")
            }
            Self::Breakpoint { at } => write!(f, "a breakpoint is already set at {at:#x}"),
            Self::OneByteEntry { at } => write!(
                f,
                "its entry is a one-byte instruction ({at:#x}) that a two-byte guard would cut"
            ),
            Self::GuardSplitsCacheLine { at } => write!(
                f,
                "the entry's first two bytes ({at:#x}) straddle a cache line, so no single \
                 store can replace them"
            ),
            Self::Undecodable { at } => write!(f, "undecodable instruction at {at:#x}"),
            Self::RipRelativeOutOfRange { at } => {
                write!(f, "the RIP-relative operand at {at:#x} is out of reach")
            }
            Self::Unencodable { at, reason } => {
                write!(f, "cannot re-encode the entry at {at:#x}: {reason}")
            }
        }
    }
}

impl std::error::Error for Refusal {}

/// A refusal reaches the controller as the agent's error, with its reason.
impl From<Refusal> for AgentError {
    fn from(refusal: Refusal) -> AgentError {
        AgentError::Refused(refusal.to_string())
    }
}

/// Decides what to overwrite at the entry of the function at `function_address`, whose
/// whole body (symbol or FDE size) is `code`, for a 5-byte `jmp rel32`, or why nothing
/// may be.
pub fn plan_entry_patch(function_address: u64, code: &[u8]) -> Result<EntryPlan, Refusal> {
    plan_with_jump(function_address, code, PATCH_LEN)
}

/// Like [`plan_entry_patch`] for a 2-byte `jmp rel8`: it overwrites fewer instructions,
/// so it fits short functions and entries whose third byte onwards is a branch target.
pub fn plan_short_entry_patch(function_address: u64, code: &[u8]) -> Result<EntryPlan, Refusal> {
    plan_with_jump(function_address, code, SHORT_PATCH_LEN)
}

fn plan_with_jump(
    function_address: u64,
    code: &[u8],
    jump_len: usize,
) -> Result<EntryPlan, Refusal> {
    let entry_offset = if code.starts_with(&ENDBR64) { 4 } else { 0 };
    let lead_pushes = code[entry_offset.min(code.len())..]
        .iter()
        .take(MAX_LEAD_PUSHES)
        .take_while(|&&byte| is_one_byte_push(byte))
        .count();
    let patch_offset = entry_offset + lead_pushes;
    let size = code.len().saturating_sub(patch_offset) as u64;
    if size < jump_len as u64 {
        return Err(Refusal::TooShort {
            size,
            needed: jump_len,
        });
    }
    let start = function_address + patch_offset as u64;
    let mut decoder = Decoder::with_ip(64, &code[patch_offset..], start, DecoderOptions::NONE);
    let mut overwritten = Vec::new();
    // Cannot run dry: at least jump_len bytes remain; a truncated instruction is invalid.
    while decoder.position() < jump_len {
        let instruction = decoder.decode();
        let at = instruction.ip();
        if instruction.is_invalid() {
            return Err(Refusal::Undecodable { at });
        }
        overwritten.push(instruction);
    }
    for (index, instruction) in overwritten.iter().enumerate() {
        check_overwritten(instruction, index + 1 == overwritten.len())?;
    }
    check_guard(&overwritten[0])?;
    let offsets = overwritten
        .iter()
        .map(|i| (i.ip() - function_address) as usize);
    let mut plan = EntryPlan {
        style: PatchStyle::Jump,
        patch_offset,
        lead_pushes,
        jump_len,
        overwritten_len: decoder.position(),
        instruction_offsets: offsets.collect(),
        entry_branch_sources: Vec::new(),
    };
    plan.entry_branch_sources = scan_branches(function_address, code, function_address, &plan)?;
    Ok(plan)
}

/// Plans a [`PatchStyle::CallThunk`] patch for a function whose first instruction (after
/// an `endbr64`) is a direct call or a call through a RIP-relative pointer.
pub fn plan_call_thunk(function_address: u64, code: &[u8]) -> Result<EntryPlan, Refusal> {
    let patch_offset = if code.starts_with(&ENDBR64) { 4 } else { 0 };
    let start = function_address + patch_offset as u64;
    let first = Decoder::with_ip(
        64,
        code.get(patch_offset..).unwrap_or_default(),
        start,
        DecoderOptions::NONE,
    )
    .decode();
    let callable = match first.code() {
        Code::Call_rel32_64 => true,
        Code::Call_rm64 => first.is_ip_rel_memory_operand(),
        _ => false,
    };
    if first.is_invalid() || !callable {
        return Err(Refusal::Undecodable { at: start });
    }
    check_guard(&first)?;
    let mut plan = EntryPlan {
        style: PatchStyle::CallThunk,
        patch_offset,
        lead_pushes: 0,
        jump_len: first.len(),
        overwritten_len: first.len(),
        instruction_offsets: vec![patch_offset],
        entry_branch_sources: Vec::new(),
    };
    plan.entry_branch_sources = scan_branches(function_address, code, function_address, &plan)?;
    Ok(plan)
}

/// Whether relocating `plan` would emulate a `call` (its last overwritten instruction
/// is one): correct, but the callee's return then misses the cpu's return prediction.
pub fn emulates_a_call(function_address: u64, code: &[u8], plan: &EntryPlan) -> bool {
    if plan.style == PatchStyle::CallThunk {
        return false;
    }
    let Some(&last) = plan.instruction_offsets.last() else {
        return false;
    };
    let instruction = Decoder::with_ip(
        64,
        code.get(last..).unwrap_or_default(),
        function_address + last as u64,
        DecoderOptions::NONE,
    )
    .decode();
    matches!(instruction.code(), Code::Call_rel32_64 | Code::Call_rm64)
}

/// Whether a branch to `target` from outside the function at `function_address`
/// would land strictly inside the bytes `plan` overwrites (the patch start itself is
/// fine: the jump written there is a whole instruction). Code elsewhere can do that:
/// glibc's `__mempcpy_evex_unaligned_erms` ends with a `jmp` to the third byte of
/// `__memmove_evex_unaligned_erms`.
pub fn lands_inside_patch(plan: &EntryPlan, function_address: u64, target: u64) -> bool {
    let patch_start = function_address + plan.patch_offset as u64;
    let first_push = patch_start - plan.lead_pushes as u64;
    target > first_push && target < patch_start + plan.overwritten_len as u64
}

/// `push r64` of one of the eight legacy registers, which takes one byte.
fn is_one_byte_push(byte: u8) -> bool {
    (0x50..=0x57).contains(&byte)
}

/// The guard goes over the first two bytes of the first overwritten instruction: it
/// must have two, on one cache line.
fn check_guard(first: &Instruction) -> Result<(), Refusal> {
    let at = first.ip();
    if first.len() < 2 {
        return Err(Refusal::OneByteEntry { at });
    }
    if at % CACHE_LINE == CACHE_LINE - 1 {
        return Err(Refusal::GuardSplitsCacheLine { at });
    }
    Ok(())
}

/// Only the last overwritten instruction may end the function's flow or push a return
/// address: a return must land after the patch, not inside it.
fn check_overwritten(instruction: &Instruction, is_last: bool) -> Result<(), Refusal> {
    let (at, code) = (instruction.ip(), instruction.code());
    match instruction.flow_control() {
        FlowControl::Next | FlowControl::ConditionalBranch => Ok(()),
        FlowControl::XbeginXabortXend => Ok(()),
        _ if code == Code::Int3 => Err(Refusal::Breakpoint { at }),
        _ if is_last => Ok(()),
        FlowControl::Interrupt => Err(Refusal::SyscallNotLast { at }),
        FlowControl::Call if matches!(code, Code::Syscall | Code::Sysenter) => {
            Err(Refusal::SyscallNotLast { at })
        }
        FlowControl::Call | FlowControl::IndirectCall => Err(Refusal::CallNotLast { at }),
        // ret, jmp, ud2, ...: the bytes after it may be a jump target or another function.
        // As the last instruction it is copied as is: the body goes on past it (the patch
        // lies within `code`), so nothing outside the function gets overwritten.
        FlowControl::UnconditionalBranch
        | FlowControl::IndirectBranch
        | FlowControl::Return
        | FlowControl::Exception => Err(Refusal::FlowEndsInPatch { at }),
    }
}

/// Decodes `code` linearly, refuses a direct branch into the patch and returns the
/// offsets (from the function) of branches to the entry. Undecodable bytes (data,
/// padding) are skipped one at a time. Branches from one overwritten instruction to
/// another are fine: the block encoder retargets them to the relocated copy.
fn scan_branches(
    code_address: u64,
    code: &[u8],
    function_address: u64,
    plan: &EntryPlan,
) -> Result<Vec<usize>, Refusal> {
    let patch_start = function_address + plan.patch_offset as u64;
    let patch = patch_start..patch_start + plan.overwritten_len as u64;
    // A branch may go to the first lead push (the pushes run, then the patch), but not
    // past it: the trampoline would pop pushes that were never made.
    let first_push = patch_start - plan.lead_pushes as u64;
    let offset = |address: u64| address.wrapping_sub(function_address) as usize;
    let mut entry_sources = Vec::new();
    for (from, to) in decode_branches(code, code_address) {
        let internal = patch.contains(&from) && plan.instruction_offsets.contains(&offset(to));
        if to != patch_start && patch.contains(&to) && !internal {
            return Err(Refusal::BranchIntoPatch { from, to });
        }
        if plan.lead_pushes > 0 && to > first_push && to <= patch_start {
            return Err(Refusal::BranchIntoPatch { from, to });
        }
        if !patch.contains(&from) && (to == function_address || to == first_push) {
            entry_sources.push(offset(from));
        }
    }
    Ok(entry_sources)
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: u64 = 0x7f00_1234_5000;

    fn hex(text: &str) -> Vec<u8> {
        let byte = |b| u8::from_str_radix(b, 16).unwrap();
        text.split_whitespace().map(byte).collect()
    }

    #[test]
    fn one_byte_pushes_stay_before_the_patch() {
        // push rbp; push rbx; sub rsp,0x18; mov rbx,rdi; ...; ret
        let code = hex("55 53 48 83 ec 18 48 89 fb 48 83 c4 18 5b 5d c3");
        let plan = plan_entry_patch(F, &code).unwrap();
        assert_eq!((plan.lead_pushes, plan.patch_offset), (2, 2));
        assert_eq!(plan.instruction_offsets, [2, 6]);
        // A branch to the first push is an entry; to the second, or to the patch
        // itself, would meet a trampoline that pops pushes never made.
        let mut looped = code.clone();
        looped.extend(hex("eb f0")); // jmp back to offset 2 (the patch)
        assert!(matches!(
            plan_entry_patch(F, &looped),
            Err(Refusal::BranchIntoPatch { to, .. }) if to == F + 2
        ));
        let mut to_start = code.clone();
        to_start.extend(hex("eb ee")); // jmp back to offset 0 (the first push)
        let plan = plan_entry_patch(F, &to_start).unwrap();
        assert_eq!(plan.entry_branch_sources, [16]);
        assert!(lands_inside_patch(&plan, F, F + 1));
        assert!(lands_inside_patch(&plan, F, F + 2 + 4));
        assert!(!lands_inside_patch(&plan, F, F));
    }

    #[test]
    fn a_guard_needs_two_bytes_on_one_cache_line() {
        // cld; then a long instruction: a one-byte entry that is no push.
        let code = hex("fc 48 83 ec 18 c3 90 90");
        assert_eq!(
            plan_entry_patch(F, &code),
            Err(Refusal::OneByteEntry { at: F })
        );
        // Five pushes: the fifth is left as the patch's first instruction.
        let code = hex("50 51 52 53 55 48 83 ec 18 c3");
        assert_eq!(
            plan_entry_patch(F, &code),
            Err(Refusal::OneByteEntry { at: F + 4 })
        );
        // The last byte of a cache line.
        let at = F + 63;
        let code = hex("48 83 ec 18 48 89 fb c3");
        assert_eq!(
            plan_entry_patch(at, &code),
            Err(Refusal::GuardSplitsCacheLine { at })
        );
    }
}
