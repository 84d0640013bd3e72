//! Where an indirect `jmp` inside a function can go: the entries of a compiler's jump
//! table, or out of the function through a code pointer (a tail call).
//!
//! The one idea: a `switch` compiles to a few fixed shapes, and each shape names its
//! table and its bound in the instructions just before the `jmp`. [`resolve`] walks
//! back through the straight-line run that leads to the jump and recognises:
//! - GCC/Clang position-independent tables: `lea B,[rip+T]` … `movsxd R,dword [B+I*4]`
//!   … `add R,B` … `jmp R`, entries being 32-bit offsets from `T`;
//! - absolute tables: `jmp qword [T+I*8]`, or `mov R,qword [T+I*8]` … `jmp R`;
//! - and for both, the bound: `cmp I,N` followed by `ja` (N + 1 entries) or `jae` (N),
//!   with only register copies of the index in between.
//!
//! A jump through a pointer loaded from memory without an index (`jmp [rip+X]`,
//! `mov rax,[rdi+8]; jmp rax`) leaves the function. Anything else is refused with the
//! reason: a guess would count the wrong edges, or relocate a function whose computed
//! jumps land where the copy has no code.

use iced_x86::{
    Code, ConditionCode, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess,
    OpKind, Register,
};

/// Most entries a jump table may have.
pub const MAX_TABLE_ENTRIES: u64 = 1 << 16;

/// What an indirect jump does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndirectJump {
    /// A jump table at `table`; `targets` in entry order (a target may repeat).
    /// `references` are the instructions whose memory operand names the table (the
    /// `lea` of its base, or the absolute load): a copy of the code that uses a copy of
    /// the table moves what they name by the same distance as the table.
    Table {
        table: u64,
        targets: Vec<u64>,
        entries: EntryKind,
        references: Vec<u64>,
    },
    /// A jump through a code pointer loaded from memory: it leaves the function.
    ThroughPointer,
}

/// How a table's entries give their targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// 32-bit signed offsets from the table's start.
    Relative32,
    /// 64-bit absolute addresses.
    Absolute64,
}

/// Why an indirect jump cannot be followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unresolved {
    /// The jump's target is computed in a way none of the known shapes matches.
    Unknown,
    /// A jump table whose number of entries the code does not bound.
    Unbounded,
    /// A jump table with more than [`MAX_TABLE_ENTRIES`] entries.
    TooLarge { entries: u64 },
    /// The table's bytes could not be read.
    Unreadable { table: u64 },
}

/// What `jump` (an indirect `jmp`) can do, from `run`, the instructions executed just
/// before it in straight-line order (oldest first). `read` fetches data bytes (the
/// table) and returns false for unreadable memory.
pub fn resolve(
    jump: &Instruction,
    run: &[Instruction],
    read: &dyn Fn(u64, &mut [u8]) -> bool,
) -> Result<IndirectJump, Unresolved> {
    match jump.op0_kind() {
        OpKind::Memory => resolve_memory(jump, run, run.len(), read),
        OpKind::Register => resolve_register(jump.op0_register(), run, read),
        _ => Err(Unresolved::Unknown),
    }
}

/// `jmp qword [..]`: through a pointer, or an absolute table.
fn resolve_memory(
    load: &Instruction,
    run: &[Instruction],
    before: usize,
    read: &dyn Fn(u64, &mut [u8]) -> bool,
) -> Result<IndirectJump, Unresolved> {
    if load.memory_index() == Register::None {
        return Ok(IndirectJump::ThroughPointer);
    }
    if load.memory_index_scale() != 8 {
        return Err(Unresolved::Unknown);
    }
    let (table, reference) = match load.memory_base() {
        Register::None => (load.memory_displacement64(), load.ip()),
        base => {
            let lea = defining(run, before, base).ok_or(Unresolved::Unknown)?;
            let table =
                rip_address(&run[lea]).ok_or(Unresolved::Unknown)? + load.memory_displacement64();
            (table, run[lea].ip())
        }
    };
    let entries = bound(run, before, load.memory_index())?;
    let mut targets = Vec::with_capacity(entries as usize);
    for entry in 0..entries {
        let mut bytes = [0u8; 8];
        let at = table + entry * 8;
        if !read(at, &mut bytes) {
            return Err(Unresolved::Unreadable { table });
        }
        targets.push(u64::from_le_bytes(bytes));
    }
    Ok(IndirectJump::Table {
        table,
        targets,
        entries: EntryKind::Absolute64,
        references: vec![reference],
    })
}

/// `jmp R`: R was loaded from a table (absolute, or relative and added to its base) or
/// from a pointer in memory.
fn resolve_register(
    register: Register,
    run: &[Instruction],
    read: &dyn Fn(u64, &mut [u8]) -> bool,
) -> Result<IndirectJump, Unresolved> {
    let (definition, register) = follow_copies(run, run.len(), register)?;
    let instruction = &run[definition];
    match instruction.mnemonic() {
        Mnemonic::Mov if instruction.op1_kind() == OpKind::Memory => {
            resolve_memory(instruction, run, definition, read)
        }
        Mnemonic::Add if instruction.op1_kind() == OpKind::Register => {
            // R = entry + base: one operand holds the sign-extended entry, the other
            // (or, for `add base,entry`, the same register before the add) the table.
            let other = instruction.op1_register();
            let before_add = |r: Register| follow_copies(run, definition, r);
            let (first, _) = before_add(register)?;
            let (second, _) = before_add(other)?;
            let (load_at, lea_at) = if is_entry_load(&run[first]) {
                (first, second)
            } else if is_entry_load(&run[second]) {
                (second, first)
            } else {
                return Err(Unresolved::Unknown);
            };
            let table = rip_address(&run[lea_at]).ok_or(Unresolved::Unknown)?;
            let load = &run[load_at];
            let base_at = defining(run, load_at, load.memory_base());
            let base = base_at.and_then(|at| rip_address(&run[at]));
            if base != Some(table) || load.memory_displacement64() != 0 {
                return Err(Unresolved::Unknown);
            }
            let mut references = vec![run[lea_at].ip()];
            references.extend(base_at.map(|at| run[at].ip()));
            references.sort_unstable();
            references.dedup();
            let entries = bound(run, load_at, load.memory_index())?;
            let mut targets = Vec::with_capacity(entries as usize);
            for entry in 0..entries {
                let mut bytes = [0u8; 4];
                if !read(table + entry * 4, &mut bytes) {
                    return Err(Unresolved::Unreadable { table });
                }
                targets.push(table.wrapping_add_signed(i32::from_le_bytes(bytes) as i64));
            }
            Ok(IndirectJump::Table {
                table,
                targets,
                entries: EntryKind::Relative32,
                references,
            })
        }
        _ => Err(Unresolved::Unknown),
    }
}

/// `movsxd R,dword [B+I*4]`: a relative table's entry.
fn is_entry_load(instruction: &Instruction) -> bool {
    instruction.code() == Code::Movsxd_r64_rm32
        && instruction.op1_kind() == OpKind::Memory
        && instruction.memory_index_scale() == 4
        && instruction.memory_index() != Register::None
        && instruction.memory_base() != Register::None
}

/// The address a `lea R,[rip+X]` puts in R.
fn rip_address(instruction: &Instruction) -> Option<u64> {
    (instruction.mnemonic() == Mnemonic::Lea && instruction.is_ip_rel_memory_operand())
        .then(|| instruction.ip_rel_memory_address())
}

/// The latest instruction of `run[..before]` that writes `register` (any size of it),
/// followed through plain register copies; with the register that instruction writes.
fn follow_copies(
    run: &[Instruction],
    before: usize,
    register: Register,
) -> Result<(usize, Register), Unresolved> {
    let mut register = register.full_register();
    let mut before = before;
    loop {
        let at = defining(run, before, register).ok_or(Unresolved::Unknown)?;
        match copy_source(&run[at]) {
            Some(source) => {
                register = source;
                before = at;
            }
            None => return Ok((at, register)),
        }
    }
}

/// The latest instruction of `run[..before]` that writes `register` (any size of it).
fn defining(run: &[Instruction], before: usize, register: Register) -> Option<usize> {
    let register = register.full_register();
    (0..before).rev().find(|&i| writes(&run[i], register))
}

/// Whether `instruction` writes `register` (a full register), explicitly or implicitly
/// (`div`, `rdtsc`, …). A call ends every search: the callee may change any register.
fn writes(instruction: &Instruction, register: Register) -> bool {
    if matches!(
        instruction.flow_control(),
        FlowControl::Call | FlowControl::IndirectCall
    ) {
        return true;
    }
    InstructionInfoFactory::new()
        .info(instruction)
        .used_registers()
        .iter()
        .any(|used| {
            used.register().full_register() == register
                && matches!(
                    used.access(),
                    OpAccess::Write
                        | OpAccess::ReadWrite
                        | OpAccess::CondWrite
                        | OpAccess::ReadCondWrite
                )
        })
}

/// The source register of a plain copy (`mov`, `movzx`/`movsxd` of a register, or
/// `mov eax,eax` zero-extension), if `instruction` is one.
fn copy_source(instruction: &Instruction) -> Option<Register> {
    let copies = matches!(
        instruction.mnemonic(),
        Mnemonic::Mov | Mnemonic::Movzx | Mnemonic::Movsxd | Mnemonic::Movsx
    );
    (copies && instruction.op1_kind() == OpKind::Register)
        .then(|| instruction.op1_register().full_register())
}

/// How many entries the table indexed by `index` has: the `cmp index,N` and `ja`/`jae`
/// that guard the load at `run[before]`, with only copies of the index in between.
fn bound(run: &[Instruction], before: usize, index: Register) -> Result<u64, Unresolved> {
    let mut index = [index.full_register()];
    for at in (0..before).rev() {
        let instruction = &run[at];
        let compares_index = instruction.mnemonic() == Mnemonic::Cmp
            && instruction.op0_kind() == OpKind::Register
            && index.contains(&instruction.op0_register().full_register())
            && is_immediate(instruction.op1_kind());
        if compares_index {
            let guard = run.get(at + 1).map(|jump| jump.condition_code());
            let limit = instruction.immediate(1);
            let entries = match guard {
                Some(ConditionCode::a) => limit.checked_add(1),
                Some(ConditionCode::ae) => Some(limit),
                _ => None,
            };
            let entries = entries.ok_or(Unresolved::Unbounded)?;
            if entries > MAX_TABLE_ENTRIES {
                return Err(Unresolved::TooLarge { entries });
            }
            return Ok(entries);
        }
        let written = index
            .iter()
            .position(|&register| writes(instruction, register));
        if let Some(position) = written {
            match copy_source(instruction) {
                // Before the copy, the source held the index.
                Some(source) => index[position] = source,
                None => return Err(Unresolved::Unbounded),
            }
        }
    }
    Err(Unresolved::Unbounded)
}

fn is_immediate(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::Immediate8
            | OpKind::Immediate8to32
            | OpKind::Immediate8to64
            | OpKind::Immediate32
            | OpKind::Immediate32to64
            | OpKind::Immediate16
            | OpKind::Immediate8to16
    )
}
