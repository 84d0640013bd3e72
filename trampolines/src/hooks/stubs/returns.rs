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

/// The return slot's offsets while `pushes` registers are pushed: at the exit, and at
/// the entry (above the thunk's own return address when `after_call`).
pub(super) fn return_slots(pushes: u64, after_call: bool) -> (i32, i32) {
    let slot = (pushes * 8) as i32;
    (slot, slot + if after_call { 8 } else { 0 })
}

/// How a return-hooking stub keeps the target's registers and flags while its own code
/// runs: the registers it pushes, and whether the flags move on to r10 (the recording
/// hook's `rdtsc` needs rax).
#[derive(Debug, Clone, Copy)]
pub(super) struct HookFrame {
    pub(super) registers: &'static [AsmRegister64],
    pub(super) flags_in_r10: bool,
}

impl HookFrame {
    /// Pushes the registers and saves the flags.
    pub(super) fn save(self, a: &mut CodeAssembler) -> Result<(), IcedError> {
        push_registers(a, self.registers)?;
        save_flags(a)?;
        if self.flags_in_r10 {
            a.mov(r10d, eax)?;
        }
        Ok(())
    }

    /// Restores the flags and pops the registers.
    pub(super) fn restore(self, a: &mut CodeAssembler) -> Result<(), IcedError> {
        if self.flags_in_r10 {
            a.mov(eax, r10d)?;
        }
        restore_flags(a)?;
        pop_registers(a, self.registers)
    }
}

/// Labels of a return-hooking stub's entry and its slow paths.
pub(super) struct EntryLabels {
    /// The thread has no state yet: register it.
    pub(super) register: CodeLabel,
    /// Where the entry goes on once the thread has a state (rcx).
    pub(super) have_state: CodeLabel,
    /// The thread passes through or must reconcile its shadow stack.
    pub(super) special: CodeLabel,
    /// Run the function without a return hook.
    pub(super) passthrough: CodeLabel,
}

impl EntryLabels {
    pub(super) fn new(a: &mut CodeAssembler) -> EntryLabels {
        EntryLabels {
            register: a.create_label(),
            have_state: a.create_label(),
            special: a.create_label(),
            passthrough: a.create_label(),
        }
    }
}

/// The start of a return-hooking stub's entry: saves the registers, loads the thread's
/// state into rcx, and branches off to the slow paths if it has none yet or its flags
/// ask for one.
pub(super) fn enter_with_state(
    a: &mut CodeAssembler,
    frame: HookFrame,
    labels: &mut EntryLabels,
) -> Result<(), IcedError> {
    frame.save(a)?;
    load_state(a, rcx)?;
    a.test(rcx, rcx)?;
    a.jz(labels.register)?;
    a.set_label(&mut labels.have_state)?;
    a.test(
        byte_ptr(rcx + STATE_FLAGS),
        (FLAG_PASSTHROUGH | FLAG_RECONCILE) as i32,
    )?;
    a.jnz(labels.special)
}

/// The entry's special path: a thread passing through goes to `passthrough`; one whose
/// return hooks an unwinder took out has the agent re-install them (`before_push`),
/// then goes on at `resume` as usual.
pub(super) fn special_path(
    a: &mut CodeAssembler,
    labels: &mut EntryLabels,
    before_push: Handler,
    slow_call: CodeLabel,
    resume: CodeLabel,
) -> Result<(), IcedError> {
    a.set_label(&mut labels.special)?;
    a.test(byte_ptr(rcx + STATE_FLAGS), FLAG_PASSTHROUGH as i32)?;
    a.jnz(labels.passthrough)?;
    call_slow(a, before_push, slow_call)?;
    a.jmp(resume)
}

/// The entry's other slow paths, then the slow-call pointer (at `slow_call`): a
/// shadow stack to prune, a full one (counted, then passed through), passing through,
/// and registering the thread.
#[allow(clippy::too_many_arguments)]
pub(super) fn entry_slow_paths(
    a: &mut CodeAssembler,
    frame: HookFrame,
    labels: &mut EntryLabels,
    shadow: &mut ShadowLabels,
    before_push: Handler,
    entry_slot: i32,
    body: CodeLabel,
    slow_call: &mut CodeLabel,
) -> Result<(), IcedError> {
    a.set_label(&mut shadow.prune)?;
    // Drop the entries of frames that are gone (or keep them, on a signal stack).
    call_slow(a, before_push, *slow_call)?;
    a.mov(rdx, qword_ptr(rcx + STATE_SHADOW_TOP))?;
    a.lea(r11, qword_ptr(rsp + entry_slot))?;
    a.jmp(shadow.push_entry)?;
    a.set_label(&mut shadow.overflow)?;
    a.inc(qword_ptr(rcx + STATE_SHADOW_OVERFLOWS))?;
    a.set_label(&mut labels.passthrough)?;
    frame.restore(a)?;
    a.jmp(body)?;
    a.set_label(&mut labels.register)?;
    call_slow(a, handlers().register_thread, *slow_call)?;
    a.jmp(labels.have_state)?;
    slow_call_pointer(a, slow_call)
}

/// The registers the return hook saves ([`RETURN_HOOK_PUSHES`] of them).
const RETURN_HOOK_FRAME: HookFrame = HookFrame {
    registers: &[rax, rcx, rdx, r11],
    flags_in_r10: false,
};
const _: () = assert!(RETURN_HOOK_FRAME.registers.len() == RETURN_HOOK_PUSHES as usize);

/// `after_call`: the hook runs from a call thunk, so the thunk's own return address is
/// on the stack above the function's return slot.
pub(super) fn count_returns_hook(
    mut layout: Layout,
    id: u32,
    after_call: bool,
) -> Result<Layout, IcedError> {
    let frame = RETURN_HOOK_FRAME;
    let (slot, entry_slot) = return_slots(RETURN_HOOK_PUSHES, after_call);
    let handlers = handlers();
    let before_push: Handler = if after_call {
        handlers.returns_before_push_after_call
    } else {
        handlers.returns_before_push
    };
    let body = layout.body;
    let a = &mut layout.assembler;
    let mut entry = EntryLabels::new(a);
    let mut counted = a.create_label();
    let mut exit = a.create_label();
    let mut mismatch = a.create_label();
    let mut slow_call = a.create_label();
    let mut shadow = ShadowLabels {
        overflow: a.create_label(),
        prune: a.create_label(),
        same_slot: None,
        push_entry: a.create_label(),
    };

    // Entry: [rsp] is the caller's return address.
    a.set_label(&mut layout.entry)?;
    enter_with_state(a, frame, &mut entry)?;
    a.set_label(&mut counted)?;
    a.inc(qword_ptr(rcx + thread_state::calls_displacement(id)))?;
    check_shadow_top(a, entry_slot, &mut shadow)?;
    push_shadow_entry(
        a,
        entry_slot,
        Word::Immediate(id as u64),
        exit,
        &mut shadow.push_entry,
    )?;
    restore_flags(a)?;
    if after_call {
        // The return address lives in the shadow entry; the exit takes its place, and
        // the thunk goes on to the callee.
        a.mov(qword_ptr(rsp + entry_slot), r11)?;
        pop_registers(a, frame.registers)?;
        a.jmp(body)?;
    } else {
        pop_registers(a, frame.registers)?;
        // The return address lives in the shadow entry; `call` puts the exit in its slot.
        a.lea(rsp, qword_ptr(rsp + 8))?;
        a.call(body)?;
    }

    // Exit: the function returned here; rsp is S + 8.
    a.set_label(&mut exit)?;
    a.lea(rsp, qword_ptr(rsp - 8))?;
    frame.save(a)?;
    load_state(a, rcx)?;
    pop_shadow_entry(a, slot, mismatch)?;
    a.inc(qword_ptr(rcx + thread_state::returns_displacement(id)))?;
    frame.restore(a)?;
    return_to_caller(a, after_call)?;
    a.set_label(&mut mismatch)?;
    call_slow(a, handlers.returns_mismatched_return, slow_call)?;
    frame.restore(a)?;
    return_to_caller(a, after_call)?;

    // Entry slow paths.
    special_path(a, &mut entry, before_push, slow_call, counted)?;
    entry_slow_paths(
        a,
        frame,
        &mut entry,
        &mut shadow,
        before_push,
        entry_slot,
        body,
        &mut slow_call,
    )?;
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
        let code = build(
            address,
            7,
            Hook::CountReturns,
            None,
            tendril_wire::events::HookShape::Jump,
            body(20),
        )
        .unwrap();
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
