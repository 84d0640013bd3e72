//! The check before a call through a pointer, inside a recorded function's copy: the
//! way a recording follows calls through pointers from the call graph itself (issue 33).
//!
//! The one idea: the target of `call rax` or `call [rax+0x18]` is known only when the
//! call is made, so the copy reads it just before, and asks the runtime about a target
//! the recording has not followed yet; the runtime instruments it (Scheme B, for a
//! callee found by running instead of by decoding) before the call goes on, so even
//! that first call is recorded, under its real caller. The targets followed are kept
//! in one open-addressed table of the process ([`TABLE_SLOTS`] words, a target's home
//! slot its address shifted right by 4), which the check probes at the home slot and
//! the next one, so a site that calls one function or many costs the same. Beside each
//! target the table holds where its calls go: the target itself, or a hook in front of
//! its untouched entry when its entry could not be patched (`patching::entry_stubs`).
//! The call is made through `r11` (free at a call: no argument travels in it, and a
//! callee may clobber it), which holds the target or that destination. The table is
//! mapped in the first 2 GiB when it can be, so a probe names it with a 32-bit
//! displacement, and the check needs only `r11` and `rcx`:
//!
//! ```text
//! push rcx
//! mov r11, <the operand>       ; the target (an rsp-based operand is moved by 8)
//! mov ecx,r11d / shr ecx,4 / and ecx, TABLE_SLOTS-1
//! cmp r11,[rcx*8+targets] / je hit / inc ecx / cmp r11,[rcx*8+targets] / je hit
//! push rax / push rdx / mov rax,r11
//! mov rcx,fs:[slot] ...        ; the thread's state; outside the call graph → skip
//! mov rdx, site; mov r11, handler; mov rcx, tendril_slow_call; call rcx
//! skip: mov r11,rax            ; the slow path's answer: where the call goes
//! pop rdx / pop rax / jmp done
//! hit: push rax / mov rax,[rcx*8+destinations]
//! cmp r11,[rcx*8+targets] / cmove r11,rax / pop rax   ; still the slot's target?
//! done: pop rcx
//! call r11                     ; the original instruction, through r11
//! ```
//!
//! A table mapped higher, or an operand that uses `r11` itself, gets the long form:
//! the red zone stepped over and `rax`, `rcx` and `rdx` saved, the table's address in
//! `rdx`. The flags are not live before a call or a tail jump (a callee gets them
//! undefined), so neither form saves them. The runtime writes the table (one writer at
//! a time, under its discovery lock); the checks only read it. A slot's destination is
//! written before its target, and read before the target is compared again: a slot
//! emptied and taken by another target meanwhile fails the second comparison, and the
//! call goes to the target itself.

use super::inserted_code::{Gate, Sequence, fixed};
use super::state::STATE;
use crate::code::function_copy::{Inserted, Labels};
use iced_x86::{Code, Instruction, MemoryOperand, OpKind, Register};
use std::sync::atomic::{AtomicU64, Ordering};

pub use super::state::POINTER_TABLE_SLOTS as TABLE_SLOTS;

/// Bytes below the original stack pointer while the long form reads the target: the
/// red zone and the three saved registers.
const LONG_READ_DEPTH: u32 = super::inserted_code::RED_ZONE + 24;

/// Where the check's slow path goes: the runtime's handler (target in `rax`, the
/// site's address in `rdx`; it answers in `rax` where the call goes) and
/// `tendril_slow_call`, which saves and restores everything around it.
#[derive(Debug, Clone, Copy)]
pub struct SlowPath {
    pub handler: u64,
    pub slow_call: u64,
}

/// The home slot of `target`.
fn home(target: u64) -> usize {
    (target as u32 >> 4) as usize & (TABLE_SLOTS - 1)
}

/// Words of each half of the table: its slots and one guard slot past them.
const HALF: usize = TABLE_SLOTS + 1;

/// The table, mapped on first use: [`HALF`] targets, then as many destinations (a
/// target's at its slot plus [`HALF`]). In the first 2 GiB if it can be, else anywhere;
/// `None` if no memory could be had.
fn table() -> Option<&'static [AtomicU64]> {
    let address = *STATE.pointer_table.get_or_init(map_table);
    // SAFETY: a private anonymous mapping of 2 * HALF words made by `map_table` and
    // never unmapped; zeroed words are valid `AtomicU64`s.
    (address != 0)
        .then(|| unsafe { std::slice::from_raw_parts(address as *const AtomicU64, 2 * HALF) })
}

fn map_table() -> u64 {
    let bytes = 2 * HALF * 8;
    for low in [libc::MAP_32BIT, 0] {
        // SAFETY: an anonymous private mapping with no address hint has no
        // preconditions; the result is checked against MAP_FAILED.
        let mapped = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | low,
                -1,
                0,
            )
        };
        if mapped != libc::MAP_FAILED {
            return mapped as u64;
        }
    }
    0
}

/// Where the checks send a call to `target`, if it is in the table.
pub fn destination_of(target: u64) -> Option<u64> {
    let table = table()?;
    for slot in home(target)..HALF {
        match table[slot].load(Ordering::Acquire) {
            0 => return None,
            held if held == target => return Some(table[HALF + slot].load(Ordering::Acquire)),
            _ => {}
        }
    }
    None
}

/// Puts `target` in the table, its calls going to `destination` (the target itself, or
/// a hook in front of it), at the first free slot from its home (or its own slot);
/// false if the table is full from there. One writer at a time (the caller's lock).
pub fn follow_to(target: u64, destination: u64) -> bool {
    let Some(table) = table() else { return false };
    for slot in home(target)..HALF {
        match table[slot].load(Ordering::Acquire) {
            0 => {
                // The destination first: a check that finds the target reads it after.
                table[HALF + slot].store(destination, Ordering::Release);
                table[slot].store(target, Ordering::Release);
                return true;
            }
            held if held == target => {
                table[HALF + slot].store(destination, Ordering::Release);
                return true;
            }
            _ => {}
        }
    }
    false
}

/// Sends the calls of every target whose calls go to `from` to `to` instead (a hook in
/// front of a function, switched between timed and untimed). One writer at a time.
pub fn redirect(from: u64, to: u64) {
    let Some(table) = table() else { return };
    for slot in 0..HALF {
        if table[slot].load(Ordering::Acquire) != 0
            && table[HALF + slot].load(Ordering::Acquire) == from
        {
            table[HALF + slot].store(to, Ordering::Release);
        }
    }
}

/// Empties the table: every target is met again (a new recording, or a library loaded
/// where another was). One writer at a time (the caller's lock). The destinations
/// stay: a check reads one only for the target it found, and compares it again after.
pub fn forget_all() {
    for slot in table().unwrap_or_default().iter().take(HALF) {
        if slot.load(Ordering::Relaxed) != 0 {
            slot.store(0, Ordering::Release);
        }
    }
}

/// The check before `instruction`, a call or tail jump through a pointer at original
/// address `site`, with the instruction it becomes (the same through `r11`). Empty, the
/// instruction kept, for an operand the check cannot read (`call rsp`, an operand in
/// the red zone below the stack pointer) or when there is no table.
pub fn check_code(
    site: u64,
    instruction: &Instruction,
    slow: SlowPath,
    labels: &mut Labels,
) -> Inserted {
    let Some(table) = table() else {
        return Inserted::default();
    };
    let table = table.as_ptr() as u64;
    let uses_r11 = [
        instruction.op0_register(),
        instruction.memory_base(),
        instruction.memory_index(),
    ]
    .contains(&Register::R11);
    let through_r11 = match instruction.code() {
        Code::Call_rm64 => Instruction::with1(Code::Call_rm64, Register::R11),
        _ => Instruction::with1(Code::Jmp_rm64, Register::R11),
    };
    let inserted = match i32::try_from(table + (2 * HALF * 8) as u64) {
        Ok(_) if !uses_r11 => short_check(site, instruction, table, slow, labels),
        _ => long_check(site, instruction, table, slow, labels),
    };
    match inserted {
        Some(mut inserted) => {
            inserted.replacement = Some(fixed(through_r11));
            inserted
        }
        None => Inserted::default(),
    }
}

/// The check with the table below 2 GiB (see the module comment).
fn short_check(
    site: u64,
    instruction: &Instruction,
    table: u64,
    slow: SlowPath,
    labels: &mut Labels,
) -> Option<Inserted> {
    let read_target = target_read(instruction, Register::R11, 8)?;
    let mut code = Sequence {
        gate: Gate::InCallGraph,
        ..Sequence::default()
    };
    code.push(fixed(Instruction::with1(Code::Push_r64, Register::RCX)), 0);
    code.push(read_target, 8);
    let (hit, done) = (labels.create(), labels.create());
    // [rcx*8 + table + extra]: the table's address as a 32-bit displacement.
    let slot = |extra: u64| {
        MemoryOperand::new(
            Register::None,
            Register::RCX,
            8,
            (table + extra) as i64,
            4,
            false,
            Register::None,
        )
    };
    for instruction in probe(Register::R11, slot(0), hit) {
        code.push(fixed(instruction), 8);
    }
    code.push(fixed(Instruction::with1(Code::Push_r64, Register::RAX)), 8);
    code.push(fixed(Instruction::with1(Code::Push_r64, Register::RDX)), 16);
    code.push(
        fixed(Instruction::with2(
            Code::Mov_r64_rm64,
            Register::RAX,
            Register::R11,
        )),
        24,
    );
    let skip = labels.create();
    code.load_thread_state(24, skip);
    slow_call(&mut code, site, slow, 24);
    // The slow path answers in rax where the call goes (its first call too); skipped,
    // rax is the target.
    let answer_in_r11 = Instruction::with2(Code::Mov_r64_rm64, Register::R11, Register::RAX);
    code.push_at(skip, fixed(answer_in_r11), 24);
    code.push(fixed(Instruction::with1(Code::Pop_r64, Register::RDX)), 24);
    code.push(fixed(Instruction::with1(Code::Pop_r64, Register::RAX)), 16);
    code.push(fixed(Instruction::with_branch(Code::Jmp_rel32_64, done)), 8);
    let push_rax = Instruction::with1(Code::Push_r64, Register::RAX);
    code.push_at(hit, fixed(push_rax), 8);
    let destination = (HALF * 8) as u64;
    let take_destination = [
        Instruction::with2(Code::Mov_r64_rm64, Register::RAX, slot(destination)),
        Instruction::with2(Code::Cmp_r64_rm64, Register::R11, slot(0)),
        Instruction::with2(Code::Cmove_r64_rm64, Register::R11, Register::RAX),
    ];
    for instruction in take_destination {
        code.push(fixed(instruction), 16);
    }
    code.push(fixed(Instruction::with1(Code::Pop_r64, Register::RAX)), 16);
    let pop_rcx = Instruction::with1(Code::Pop_r64, Register::RCX);
    code.push_at(done, fixed(pop_rcx), 8);
    Some(code.inserted)
}

/// The check with the table anywhere, or an operand that uses `r11`: the red zone
/// stepped over, `rax`, `rcx` and `rdx` saved, the table's address in `rdx`; `r11`
/// takes the target or its destination at the end.
fn long_check(
    site: u64,
    instruction: &Instruction,
    table: u64,
    slow: SlowPath,
    labels: &mut Labels,
) -> Option<Inserted> {
    let read_target = target_read(instruction, Register::RAX, LONG_READ_DEPTH)?;
    let mut code = Sequence {
        gate: Gate::InCallGraph,
        ..Sequence::default()
    };
    let saved = [Register::RAX, Register::RCX, Register::RDX];
    let depth = code.save(&saved);
    debug_assert_eq!(depth, LONG_READ_DEPTH);
    code.push(read_target, depth);
    let (hit, to_target, done) = (labels.create(), labels.create(), labels.create());
    code.load_thread_state(depth, to_target);
    // [rdx + rcx*8 + extra]: the table's address in rdx.
    let slot = |extra: u64| {
        MemoryOperand::new(
            Register::RDX,
            Register::RCX,
            8,
            extra as i64,
            1,
            false,
            Register::None,
        )
    };
    let mut probe = probe(Register::RAX, slot(0), hit).to_vec();
    probe.insert(
        3,
        Instruction::with2(Code::Mov_r64_imm64, Register::RDX, table),
    );
    for instruction in probe {
        code.push(fixed(instruction), depth);
    }
    slow_call(&mut code, site, slow, depth);
    // The slow path answers in rax where the call goes (its first call too); skipped,
    // rax is the target.
    let target_in_r11 = Instruction::with2(Code::Mov_r64_rm64, Register::R11, Register::RAX);
    code.push_at(to_target, fixed(target_in_r11), depth);
    code.push(
        fixed(Instruction::with_branch(Code::Jmp_rel32_64, done)),
        depth,
    );
    let destination = (HALF * 8) as u64;
    let take_destination = Instruction::with2(Code::Mov_r64_rm64, Register::R11, slot(destination));
    code.push_at(hit, fixed(take_destination), depth);
    let still_the_target = [
        Instruction::with2(Code::Cmp_r64_rm64, Register::RAX, slot(0)),
        Instruction::with2(Code::Cmovne_r64_rm64, Register::R11, Register::RAX),
    ];
    for instruction in still_the_target {
        code.push(fixed(instruction), depth);
    }
    code.restore(&saved, false, depth, done);
    Some(code.inserted)
}

/// The probe of the table for the target in `target`: its home slot into `ecx`, then
/// that slot and the next compared (`slot`, indexed by `rcx`), on to `hit` when one
/// holds it, with `rcx` on that slot.
fn probe(
    target: Register,
    slot: MemoryOperand,
    hit: u64,
) -> [Result<Instruction, iced_x86::IcedError>; 8] {
    let low = match target {
        Register::R11 => Register::R11D,
        _ => Register::EAX,
    };
    [
        Instruction::with2(Code::Mov_r32_rm32, Register::ECX, low),
        Instruction::with2(Code::Shr_rm32_imm8, Register::ECX, 4),
        Instruction::with2(
            Code::And_rm32_imm32,
            Register::ECX,
            (TABLE_SLOTS - 1) as u32,
        ),
        Instruction::with2(Code::Cmp_r64_rm64, target, slot),
        Instruction::with_branch(Code::Je_rel32_64, hit),
        Instruction::with1(Code::Inc_rm32, Register::ECX),
        Instruction::with2(Code::Cmp_r64_rm64, target, slot),
        Instruction::with_branch(Code::Je_rel32_64, hit),
    ]
}

/// The call of the slow path, with the target in `rax`, `depth` bytes below the
/// original stack pointer: `r11` saved around it (the long form's operand may be in it).
fn slow_call(code: &mut Sequence, site: u64, slow: SlowPath, depth: u32) {
    code.push(
        fixed(Instruction::with1(Code::Push_r64, Register::R11)),
        depth,
    );
    let calls = [
        Instruction::with2(Code::Mov_r64_imm64, Register::RDX, site),
        Instruction::with2(Code::Mov_r64_imm64, Register::R11, slow.handler),
        Instruction::with2(Code::Mov_r64_imm64, Register::RCX, slow.slow_call),
        Instruction::with1(Code::Call_rm64, Register::RCX),
        Instruction::with1(Code::Pop_r64, Register::R11),
    ];
    for instruction in calls {
        code.push(fixed(instruction), depth + 8);
    }
}

/// `mov into, <operand of instruction>`, read `depth` bytes below the original stack
/// pointer; `None` when the operand cannot be read there.
fn target_read(instruction: &Instruction, into: Register, depth: u32) -> Option<Instruction> {
    match instruction.op0_kind() {
        OpKind::Register => {
            let register = instruction.op0_register();
            (register != Register::RSP)
                .then(|| fixed(Instruction::with2(Code::Mov_r64_rm64, into, register)))
        }
        OpKind::Memory => {
            let base = instruction.memory_base();
            let mut displacement = instruction.memory_displacement64() as i64;
            if base == Register::RSP {
                // A pointer kept below the stack pointer is in the red zone the check
                // steps over and saves registers into: not readable there.
                if displacement < 0 {
                    return None;
                }
                displacement += i64::from(depth);
            }
            let index = instruction.memory_index();
            // An absolute or RIP-relative operand names a 64-bit address (4 would mean
            // `addr32`); otherwise 1 lets the encoder pick the displacement's size.
            let absolute =
                base == Register::RIP || (base == Register::None && index == Register::None);
            let operand = MemoryOperand::new(
                base,
                index,
                instruction.memory_index_scale(),
                displacement,
                if absolute { 8 } else { 1 },
                false,
                instruction.segment_prefix(),
            );
            Some(fixed(Instruction::with2(Code::Mov_r64_rm64, into, operand)))
        }
        _ => None,
    }
}

#[cfg(all(test, not(miri)))]
mod tests;
