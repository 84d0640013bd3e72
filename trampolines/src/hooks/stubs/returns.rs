//! The count-returns hook: counts the call, takes the return address into the thread's
//! shadow stack and calls the body, so the function returns to the hook's exit, which
//! counts the return and goes back to the real caller. The shadow-stack push and pop
//! here are shared with the recording hook.

use super::{
    Layout, RETURN_HOOK_PUSHES, call_slow, handlers, load_state, pop_registers, push_registers,
    restore_flags, return_to_caller, save_flags, slow_call_pointer,
};
use crate::hooks::slow_call::Handler;
use crate::hooks::thread_layout::{
    self as thread_state, ENTRY_EXIT, ENTRY_FUNCTION, ENTRY_RETURN_ADDRESS, ENTRY_SIZE, ENTRY_SLOT,
    FLAG_PASSTHROUGH, FLAG_RECONCILE, STATE_FLAGS, STATE_SHADOW_BASE, STATE_SHADOW_LIMIT,
    STATE_SHADOW_OVERFLOWS, STATE_SHADOW_TOP,
};
use iced_x86::code_asm::*;

/// Labels of a return-hooking stub's entry that the shadow-stack code branches to.
pub(super) struct ShadowLabels {
    /// The shadow stack is full: run the function without a return hook.
    pub(super) overflow: CodeLabel,
    /// The top entry's frame may be gone: let the agent prune (and reconcile).
    pub(super) prune: CodeLabel,
    /// The top entry has our slot: a tail call from it if the slot holds its exit
    /// (checked by the stub when it has a spare register, else by the agent).
    pub(super) same_slot: Option<CodeLabel>,
    /// Where the entry is written (the prune path comes back here).
    pub(super) push_entry: CodeLabel,
}

/// Checks that the shadow stack has room and that the top entry's frame lies above
/// the new one (rcx: state; leaves rdx: top, r11: the new return slot).
pub(super) fn check_shadow_top(
    a: &mut CodeAssembler,
    entry_slot: i32,
    labels: &mut ShadowLabels,
) -> Result<(), IcedError> {
    a.mov(rdx, qword_ptr(rcx + STATE_SHADOW_TOP))?;
    a.cmp(rdx, qword_ptr(rcx + STATE_SHADOW_LIMIT))?;
    a.jae(labels.overflow)?;
    a.lea(r11, qword_ptr(rsp + entry_slot))?;
    a.cmp(rdx, qword_ptr(rcx + STATE_SHADOW_BASE))?;
    a.je(labels.push_entry)?;
    // The top entry's slot must lie above ours, or its frame is gone.
    a.cmp(qword_ptr(rdx + (ENTRY_SLOT - ENTRY_SIZE)), r11)?;
    match labels.same_slot {
        Some(same_slot) => {
            a.jb(labels.prune)?;
            a.je(same_slot)?;
        }
        None => a.jbe(labels.prune)?,
    }
    Ok(())
}

/// A per-function value in a hook: an immediate, or a data word of the trampoline.
#[derive(Debug, Clone, Copy)]
pub(super) enum Word {
    Immediate(u64),
    Data(CodeLabel),
}

/// Pushes the shadow entry (rdx: top, r11: the return slot) for `function_word`, with
/// `exit` as the exit; leaves r11 holding the exit's address.
pub(super) fn push_shadow_entry(
    a: &mut CodeAssembler,
    entry_slot: i32,
    function_word: Word,
    exit: CodeLabel,
    push_entry: &mut CodeLabel,
) -> Result<(), IcedError> {
    a.set_label(push_entry)?;
    // Slot first, then the new top, then every field: a signal handler that runs hooks
    // between two of these stores sees a consistent stack and never takes our entry.
    a.mov(qword_ptr(rdx + ENTRY_SLOT), r11)?;
    a.lea(r11, qword_ptr(rdx + ENTRY_SIZE))?;
    a.mov(qword_ptr(rcx + STATE_SHADOW_TOP), r11)?;
    a.lea(r11, qword_ptr(rsp + entry_slot))?;
    a.mov(qword_ptr(rdx + ENTRY_SLOT), r11)?;
    a.mov(r11, qword_ptr(rsp + entry_slot))?;
    a.mov(qword_ptr(rdx + ENTRY_RETURN_ADDRESS), r11)?;
    match function_word {
        Word::Immediate(word) => a.mov(qword_ptr(rdx + ENTRY_FUNCTION), word as i32)?,
        Word::Data(label) => {
            a.mov(r11, qword_ptr(label))?;
            a.mov(qword_ptr(rdx + ENTRY_FUNCTION), r11)?;
        }
    }
    a.lea(r11, qword_ptr(exit))?;
    a.mov(qword_ptr(rdx + ENTRY_EXIT), r11)
}

/// At an exit (rcx: state), checks that the top shadow entry is this frame's, then
/// writes its return address into the reserved slot and pops it (rdx: the new top).
pub(super) fn pop_shadow_entry(
    a: &mut CodeAssembler,
    slot: i32,
    mismatch: CodeLabel,
) -> Result<(), IcedError> {
    a.mov(rdx, qword_ptr(rcx + STATE_SHADOW_TOP))?;
    a.lea(r11, qword_ptr(rsp + slot))?;
    a.cmp(rdx, qword_ptr(rcx + STATE_SHADOW_BASE))?;
    a.je(mismatch)?;
    a.cmp(qword_ptr(rdx + (ENTRY_SLOT - ENTRY_SIZE)), r11)?;
    a.jne(mismatch)?;
    // Read the entry before the pop commits: a signal handler may reuse it afterwards.
    a.mov(r11, qword_ptr(rdx + (ENTRY_RETURN_ADDRESS - ENTRY_SIZE)))?;
    a.mov(qword_ptr(rsp + slot), r11)?;
    a.lea(rdx, qword_ptr(rdx - ENTRY_SIZE))?;
    a.mov(qword_ptr(rcx + STATE_SHADOW_TOP), rdx)
}

/// The registers the return hook saves ([`RETURN_HOOK_PUSHES`] of them).
const RETURN_HOOK_REGISTERS: [AsmRegister64; RETURN_HOOK_PUSHES as usize] = [rax, rcx, rdx, r11];

fn push_return_hook_registers(a: &mut CodeAssembler) -> Result<(), IcedError> {
    push_registers(a, &RETURN_HOOK_REGISTERS)
}

fn pop_return_hook_registers(a: &mut CodeAssembler) -> Result<(), IcedError> {
    pop_registers(a, &RETURN_HOOK_REGISTERS)
}

/// `after_call`: the hook runs from a call thunk, so the thunk's own return address is
/// on the stack above the function's return slot.
pub(super) fn count_returns_hook(
    mut layout: Layout,
    id: u32,
    after_call: bool,
) -> Result<Layout, IcedError> {
    // Stack offsets while the four registers are pushed: the return-address slot S at
    // entry (above the thunk's return address for a thunk), and at exit.
    let slot = (RETURN_HOOK_PUSHES * 8) as i32;
    let entry_slot = slot + if after_call { 8 } else { 0 };
    let handlers = handlers();
    let before_push: Handler = if after_call {
        handlers.returns_before_push_after_call
    } else {
        handlers.returns_before_push
    };
    let body = layout.body;
    let a = &mut layout.assembler;
    let mut have_state = a.create_label();
    let mut register = a.create_label();
    let mut special = a.create_label();
    let mut counted = a.create_label();
    let mut prune = a.create_label();
    let mut passthrough = a.create_label();
    let mut overflow = a.create_label();
    let push_entry = a.create_label();
    let mut exit = a.create_label();
    let mut mismatch = a.create_label();
    let mut slow_call = a.create_label();

    // Entry: [rsp] is the caller's return address.
    a.set_label(&mut layout.entry)?;
    push_return_hook_registers(a)?;
    save_flags(a)?;
    load_state(a, rcx)?;
    a.test(rcx, rcx)?;
    a.jz(register)?;
    a.set_label(&mut have_state)?;
    a.test(
        byte_ptr(rcx + STATE_FLAGS),
        (FLAG_PASSTHROUGH | FLAG_RECONCILE) as i32,
    )?;
    a.jnz(special)?;
    a.set_label(&mut counted)?;
    a.inc(qword_ptr(rcx + thread_state::calls_displacement(id)))?;
    let mut labels = ShadowLabels {
        overflow,
        prune,
        same_slot: None,
        push_entry,
    };
    check_shadow_top(a, entry_slot, &mut labels)?;
    push_shadow_entry(
        a,
        entry_slot,
        Word::Immediate(id as u64),
        exit,
        &mut labels.push_entry,
    )?;
    restore_flags(a)?;
    if after_call {
        // The return address lives in the shadow entry; the exit takes its place, and
        // the thunk goes on to the callee.
        a.mov(qword_ptr(rsp + entry_slot), r11)?;
        pop_return_hook_registers(a)?;
        a.jmp(body)?;
    } else {
        pop_return_hook_registers(a)?;
        // The return address lives in the shadow entry; `call` puts the exit in its slot.
        a.lea(rsp, qword_ptr(rsp + 8))?;
        a.call(body)?;
    }

    // Exit: the function returned here; rsp is S + 8.
    a.set_label(&mut exit)?;
    a.lea(rsp, qword_ptr(rsp - 8))?;
    push_return_hook_registers(a)?;
    save_flags(a)?;
    load_state(a, rcx)?;
    pop_shadow_entry(a, slot, mismatch)?;
    a.inc(qword_ptr(rcx + thread_state::returns_displacement(id)))?;
    restore_flags(a)?;
    pop_return_hook_registers(a)?;
    return_to_caller(a, after_call)?;
    a.set_label(&mut mismatch)?;
    call_slow(a, handlers.returns_mismatched_return, slow_call)?;
    restore_flags(a)?;
    pop_return_hook_registers(a)?;
    return_to_caller(a, after_call)?;

    // Entry slow paths.
    a.set_label(&mut special)?;
    a.test(byte_ptr(rcx + STATE_FLAGS), FLAG_PASSTHROUGH as i32)?;
    a.jnz(passthrough)?;
    // Re-install return hooks an unwinder took out, then count and push as usual.
    call_slow(a, before_push, slow_call)?;
    a.jmp(counted)?;
    a.set_label(&mut prune)?;
    // Drop the entries of frames that are gone (or keep them, on a signal stack).
    call_slow(a, before_push, slow_call)?;
    a.mov(rdx, qword_ptr(rcx + STATE_SHADOW_TOP))?;
    a.lea(r11, qword_ptr(rsp + entry_slot))?;
    a.jmp(labels.push_entry)?;
    a.set_label(&mut overflow)?;
    a.inc(qword_ptr(rcx + STATE_SHADOW_OVERFLOWS))?;
    a.set_label(&mut passthrough)?;
    restore_flags(a)?;
    pop_return_hook_registers(a)?;
    a.jmp(body)?;
    a.set_label(&mut register)?;
    call_slow(a, handlers.register_thread, slow_call)?;
    a.jmp(have_state)?;
    slow_call_pointer(a, &mut slow_call)?;
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use crate::hooks::stubs::test_code::{body, disassemble};
    use crate::hooks::stubs::{TRAMPOLINE_BYTES, build};
    use tendril_wire::Hook;

    #[test]
    fn return_hook_calls_the_body_and_reports_its_exit() {
        let address = 0x7f00_0000_1000;
        let code = build(address, 7, Hook::CountReturns, None, body(20)).unwrap();
        let hook_offset = (code.hook - address) as usize;
        let body_offset = (code.body - address) as usize;
        let text = disassemble(&code.bytes[hook_offset..body_offset], code.hook);
        let call = text
            .iter()
            .position(|t| t == &format!("call {:016X}h", code.body))
            .unwrap_or_else(|| panic!("{text:#?}"));
        assert_eq!(text[call - 1], "lea rsp,[rsp+8]");
        assert_eq!(
            text[call + 1],
            "lea rsp,[rsp-8]",
            "the exit follows the call"
        );
        assert!(code.bytes.len() as u64 <= TRAMPOLINE_BYTES);
    }
}
