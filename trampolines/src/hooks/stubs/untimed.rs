//! The untimed hook: inside the call graph, one `Call` event per call — the function's
//! id and its return address, no timestamp — and no return hook; then the body.
//!
//! A function whose calls are shorter than what timing them costs (a timestamp takes
//! about 10 ns on these machines, the timed hooks 20–30 ns a call) cannot be timed
//! truly, and its timing perturbs its caller. With this hook its calls are still
//! counted, each in its context: the return address says which function called it,
//! and the controller nests the call under that caller's node. Its time is part of
//! its caller's (`"timing": "in_caller"`). The hook saves the same registers as the
//! recording hook, so discovery finds the return address where it looks for a
//! recording hook's; like the count hook, its fast path falls through into the body.
//!
//! A root's variant (`Hook::RecordRootOutermost`, a recursive root such as `fib`):
//! outside the call graph, where the plain hook steps aside, it jumps to the root's own
//! timed hook, whose address it reads from a data word the patcher fills in
//! ([`outermost_word`]); its calls inside the graph are untimed.

use super::record::RECORD_HOOK_FRAME;
use super::returns::return_slots;
use super::template::{HookCode, UntimedTemplate};
use super::{ASSEMBLY_BASE, Layout, RECORD_HOOK_PUSHES, call_slow, finish_hook, handlers};
use super::{load_state, new_layout, slow_call_pointer};
use crate::hooks::state::STATE;
use crate::hooks::thread_layout::UNTIMED_FLUSH_EVERY as FLUSH_EVERY;
use crate::hooks::thread_layout::{
    FLAG_PASSTHROUGH, STATE_FLAGS, STATE_GRAPH_DEPTH, STATE_RING_LIMIT, STATE_UNTIMED_ORDER,
    STATE_UNTIMED_SLOTS, STATE_UNTIMED_USED, UNTIMED_HASH_MULTIPLIER, UNTIMED_PROBES,
    UNTIMED_SLOT_COUNT, UNTIMED_SLOT_FUNCTION, UNTIMED_SLOT_RETURN_ADDRESS, UNTIMED_SLOT_SIZE,
    UNTIMED_SLOTS,
};
use crate::sys::error::AgentError;
use iced_x86::code_asm::*;

/// The per-function values the untimed hook reads from data words of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct UntimedValues {
    id: u64,
}

impl UntimedValues {
    pub(super) fn new(id: u32) -> Self {
        UntimedValues { id: id as u64 }
    }
}

/// The labels of the untimed hook's data words.
pub(super) struct UntimedWords {
    id: CodeLabel,
    outermost: CodeLabel,
}

impl UntimedTemplate {
    /// The template of the plain hook, or of a root's (`outermost`), for an entry jump
    /// or behind a call thunk (`after_call`); assembled on first use.
    pub(super) fn get(outermost: bool, after_call: bool) -> Result<UntimedTemplate, AgentError> {
        let mut templates = STATE
            .untimed_templates
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let template = &mut templates[usize::from(outermost) * 2 + usize::from(after_call)];
        if template.is_none() {
            let assembled = Self::assemble(outermost, after_call).map_err(AgentError::Assembly)?;
            *template = Some(assembled);
        }
        Ok(template.clone().expect("just assembled"))
    }

    fn assemble(outermost: bool, after_call: bool) -> Result<UntimedTemplate, IcedError> {
        let values = UntimedValues::new(0);
        let (layout, words) = untimed_hook(new_layout()?, values, outermost, after_call)?;
        let (hook, result) = finish_hook(layout, ASSEMBLY_BASE)?;
        let offset = |label: &CodeLabel| -> Result<usize, IcedError> {
            Ok((result.label_ip(label)? - ASSEMBLY_BASE) as usize)
        };
        Ok(UntimedTemplate {
            hook,
            words: [offset(&words.id)?, offset(&words.outermost)?],
        })
    }

    /// The hook of function `id`: the template with that function's data words.
    pub(super) fn instantiate(&self, id: u32) -> HookCode {
        let values = UntimedValues::new(id);
        let mut hook = self.hook.clone();
        for (&offset, value) in self.words.iter().zip([values.id]) {
            hook.bytes[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
        }
        hook
    }
}

/// Where the word is, in a root's untimed hook whose body starts at `body` (behind a
/// call thunk: `after_call`), that its patcher fills with the address of the root's
/// timed hook.
pub fn outermost_word(body: u64, after_call: bool) -> Result<u64, AgentError> {
    let template = UntimedTemplate::get(true, after_call)?;
    Ok(body - template.hook.body as u64 + template.words[1] as u64)
}

/// The untimed hook (see the module comment); a root's if `outermost`. The slow paths
/// and the data words come first, so the fast path falls through into the body. Behind
/// a call thunk (`after_call`) the caller's return address is one slot further, and the
/// body is a jump to the call's target (the thunk pushed its return address).
pub(super) fn untimed_hook(
    mut layout: Layout,
    values: UntimedValues,
    outermost: bool,
    after_call: bool,
) -> Result<(Layout, UntimedWords), IcedError> {
    let frame = RECORD_HOOK_FRAME;
    let (_, return_address) = return_slots(RECORD_HOOK_PUSHES, after_call);
    let handlers = handlers();
    let a = &mut layout.assembler;
    let mut words = UntimedWords {
        id: a.create_label(),
        outermost: a.create_label(),
    };
    let mut have_state = a.create_label();
    let mut register = a.create_label();
    let mut discover = a.create_label();
    let mut counted = a.create_label();
    let mut miss = a.create_label();
    let mut probe = a.create_label();
    let mut found = a.create_label();
    let mut again = a.create_label();
    let mut listed_full = a.create_label();
    let mut done = a.create_label();
    let mut slow_call = a.create_label();
    let mut outside = a.create_label();

    // Slow paths.
    a.set_label(&mut register)?;
    call_slow(a, handlers.register_thread, slow_call)?;
    a.jmp(have_state)?;
    a.set_label(&mut discover)?;
    a.mov(edx, dword_ptr(words.id))?;
    call_slow(a, handlers.discover, slow_call)?;
    a.jmp(counted)?;
    // A pair not in the table: the slow path inserts it (rax holds the return address);
    // or its count reached a multiple of FLUSH_EVERY.
    a.set_label(&mut listed_full)?;
    a.mov(rax, qword_ptr(rsp + return_address))?;
    a.set_label(&mut miss)?;
    a.mov(rdx, qword_ptr(words.id))?;
    call_slow(a, handlers.untimed_miss, slow_call)?;
    a.jmp(done)?;
    list_again(a, &mut again, listed_full, done)?;
    probe_next_slots(a, &mut probe, words.id, found, miss)?;
    a.set_label(&mut outside)?;
    if outermost {
        // The outermost call of a root: its timed hook, as if this one were not here.
        frame.restore(a)?;
        a.jmp(qword_ptr(words.outermost))?;
    } else {
        a.jmp(done)?;
    }
    slow_call_pointer(a, &mut slow_call)?;
    for (label, value) in [(&mut words.id, values.id), (&mut words.outermost, 0)] {
        a.set_label(label)?;
        a.dq(&[value])?;
    }

    // Entry: [rsp] is the caller's return address.
    a.set_label(&mut layout.entry)?;
    frame.save(a)?;
    load_state(a, rcx)?;
    a.test(rcx, rcx)?;
    a.jz(register)?;
    a.set_label(&mut have_state)?;
    a.test(byte_ptr(rcx + STATE_FLAGS), FLAG_PASSTHROUGH as i32)?;
    a.jnz(done)?;
    // Outside the call graph a function records nothing; a root starts it.
    a.cmp(qword_ptr(rcx + STATE_GRAPH_DEPTH), 0)?;
    a.je(outside)?;
    a.mov(r11, (handlers.invoked_table)())?;
    a.add(r11, qword_ptr(words.id))?;
    a.cmp(byte_ptr(r11), 0)?;
    a.je(discover)?;
    a.set_label(&mut counted)?;
    // The slot of (function, return address) in the thread's table
    // (`thread_layout::untimed_home_slot`): counted there if it is this pair's.
    a.mov(rax, qword_ptr(rsp + return_address))?;
    home_slot(a, words.id)?;
    a.mov(r11, qword_ptr(words.id))?;
    a.cmp(qword_ptr(rdx + UNTIMED_SLOT_RETURN_ADDRESS), rax)?;
    a.jne(probe)?;
    a.cmp(qword_ptr(rdx + UNTIMED_SLOT_FUNCTION), r11)?;
    a.jne(probe)?;
    a.set_label(&mut found)?;
    a.inc(qword_ptr(rdx + UNTIMED_SLOT_COUNT))?;
    a.cmp(qword_ptr(rdx + UNTIMED_SLOT_COUNT), 1)?;
    a.je(again)?;
    // Every 2^16 calls of a pair the slow path writes the table out: a root that never
    // returns still shows its callees' counts, and an event's count never overflows.
    a.test(
        dword_ptr(rdx + UNTIMED_SLOT_COUNT),
        (FLUSH_EVERY - 1) as i32,
    )?;
    a.jz(miss)?;
    a.set_label(&mut done)?;
    frame.restore(a)?;
    Ok((layout, words))
}

/// rdx: the address of the home slot of the pair (function `id`, the return address in
/// rax), as `thread_layout::untimed_home_slot` computes it. Clobbers r11.
fn home_slot(a: &mut CodeAssembler, id: CodeLabel) -> Result<(), IcedError> {
    a.mov(rdx, qword_ptr(id))?;
    a.shl(rdx, 32)?;
    a.xor(rdx, rax)?;
    a.mov(r11, UNTIMED_HASH_MULTIPLIER)?;
    a.imul_2(rdx, r11)?;
    a.shr(rdx, 64 - UNTIMED_SLOTS.trailing_zeros())?;
    a.shl(edx, UNTIMED_SLOT_SIZE.trailing_zeros())?;
    a.lea(rdx, qword_ptr(rcx + rdx + STATE_UNTIMED_SLOTS))
}

/// At `again`: a pair the table kept from an earlier timed frame, counted again (its
/// count went from 0 to 1), is listed for the next flush, and the ring limit lowered so
/// that the next recording hook flushes (as `untimed_table::insert` does, without a
/// slow call); then `done`. rdx is its slot's address. A list already full (only a
/// signal handler's hook interleaved with this one can make it so) goes to
/// `listed_full`: the slow path flushes instead of writing past the list.
fn list_again(
    a: &mut CodeAssembler,
    again: &mut CodeLabel,
    listed_full: CodeLabel,
    done: CodeLabel,
) -> Result<(), IcedError> {
    a.set_label(again)?;
    a.lea(r11, qword_ptr(rcx + STATE_UNTIMED_SLOTS))?;
    a.sub(rdx, r11)?;
    a.shr(rdx, UNTIMED_SLOT_SIZE.trailing_zeros())?;
    a.mov(rax, qword_ptr(rcx + STATE_UNTIMED_USED))?;
    a.cmp(rax, UNTIMED_SLOTS as i32)?;
    a.jae(listed_full)?;
    a.mov(qword_ptr(rcx + rax * 8 + STATE_UNTIMED_ORDER), rdx)?;
    a.inc(qword_ptr(rcx + STATE_UNTIMED_USED))?;
    a.mov(qword_ptr(rcx + STATE_RING_LIMIT), 0)?;
    a.jmp(done)
}

/// At `probe`: the pair (function `id`, return address in rax) is not in its home slot
/// (rdx): the next ones, as `untimed_table::find` looks, to `found` with rdx the slot
/// that holds it, else to `miss`. A count of the probes left is kept on the stack (no
/// register is free).
fn probe_next_slots(
    a: &mut CodeAssembler,
    probe: &mut CodeLabel,
    id: CodeLabel,
    found: CodeLabel,
    miss: CodeLabel,
) -> Result<(), IcedError> {
    let (mut each_probe, mut in_table, mut next, mut found_probing) = (
        a.create_label(),
        a.create_label(),
        a.create_label(),
        a.create_label(),
    );
    a.set_label(probe)?;
    a.push((UNTIMED_PROBES - 1) as i32)?;
    a.set_label(&mut each_probe)?;
    a.add(rdx, UNTIMED_SLOT_SIZE)?;
    a.lea(r11, qword_ptr(rcx + SLOTS_END))?;
    a.cmp(rdx, r11)?;
    a.jb(in_table)?;
    a.sub(rdx, SLOTS_BYTES)?;
    a.set_label(&mut in_table)?;
    a.mov(r11, qword_ptr(id))?;
    a.cmp(qword_ptr(rdx + UNTIMED_SLOT_RETURN_ADDRESS), rax)?;
    a.jne(next)?;
    a.cmp(qword_ptr(rdx + UNTIMED_SLOT_FUNCTION), r11)?;
    a.je(found_probing)?;
    a.set_label(&mut next)?;
    a.dec(qword_ptr(rsp))?;
    a.jnz(each_probe)?;
    a.lea(rsp, qword_ptr(rsp + 8))?;
    a.jmp(miss)?;
    a.set_label(&mut found_probing)?;
    a.lea(rsp, qword_ptr(rsp + 8))?;
    a.jmp(found)
}

/// Bytes of the untimed-call table's slots, and where they end in the thread's state.
const SLOTS_BYTES: i32 = UNTIMED_SLOTS as i32 * UNTIMED_SLOT_SIZE;
const SLOTS_END: i32 = STATE_UNTIMED_SLOTS + SLOTS_BYTES;

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(not(miri))]
    use crate::code::executable_memory::Mapped;
    use crate::hooks::stubs::test_code::{body, disassemble};
    use crate::hooks::stubs::{ASSEMBLY_BASE, assemble_hook, build};
    use tendril_wire::Hook;
    use tendril_wire::events::HookShape;

    /// Runs the hook's `home_slot` code on (`function`, `return_address`), with the
    /// thread state at address 0: the slot it finds.
    #[cfg(not(miri))]
    fn home_slot_in_assembly(function: u64, return_address: u64) -> usize {
        const PAGE: usize = 4096;
        let page = Mapped::new(PAGE);
        let mut a = CodeAssembler::new(64).unwrap();
        let mut id = a.create_label();
        a.mov(rax, rdi).unwrap();
        a.xor(ecx, ecx).unwrap();
        home_slot(&mut a, id).unwrap();
        a.mov(rax, rdx).unwrap();
        a.ret().unwrap();
        a.set_label(&mut id).unwrap();
        a.dq(&[function]).unwrap();
        page.write(0, &a.assemble(page.address).unwrap());
        // SAFETY: the page now holds a function of one argument (rdi) that returns a
        // value in rax and touches only rax, rcx, rdx and r11, all caller-saved; it
        // stays mapped until `page` drops, after the call.
        let run: extern "C" fn(u64) -> u64 = unsafe { std::mem::transmute(page.address) };
        let address = run(return_address);
        ((address - STATE_UNTIMED_SLOTS as u64) / UNTIMED_SLOT_SIZE as u64) as usize
    }

    #[test]
    #[cfg(not(miri))]
    fn the_hook_finds_the_home_slot_the_runtime_computes() {
        use crate::hooks::thread_layout::untimed_home_slot;
        for (function, return_address) in [
            (0, 0x7f00_0000_4321),
            (5, 0x7f00_0000_4321),
            (43, 0x5555_5555_0a0b),
            (70_000, 0x7fff_ffff_f000),
            (u32::MAX as u64, 1),
        ] {
            assert_eq!(
                home_slot_in_assembly(function, return_address),
                untimed_home_slot(function, return_address),
                "{function} {return_address:#x}"
            );
        }
    }

    #[test]
    fn the_untimed_hook_takes_no_timestamp_hooks_no_return_and_falls_into_the_body() {
        let address = 0x7f00_0000_1000;
        let code = build(address, 9, Hook::Untimed, None, HookShape::Jump, body(4)).unwrap();
        let from = (code.hook - address) as usize;
        let fast_path = disassemble(&code.bytes[from..(code.body - address) as usize], code.hook);
        let text = fast_path.join("\n");
        assert!(!text.contains("rdtsc"), "{text}");
        assert!(
            !text.contains("call "),
            "no slow call on the fast path: {text}"
        );
        let depth_check = format!("cmp qword ptr [rcx+{STATE_GRAPH_DEPTH:X}h],0");
        assert!(
            text.contains(&depth_check),
            "outside the graph: steps aside"
        );
        assert_eq!(fast_path.last().unwrap(), "pop rax", "falls into the body");
        assert_eq!(code.bytes[(code.body - address) as usize], 0x90);
    }

    #[test]
    fn an_untimed_hook_from_the_template_is_the_hook_assembled_for_its_function() {
        for (kind, after_call) in [
            (Hook::Untimed, None),
            (Hook::Untimed, Some(0x7f00_0000_2005)),
            (Hook::RecordRootOutermost, None),
            (Hook::RecordRootOutermost, Some(0x7f00_0000_2005)),
        ] {
            let outermost = kind == Hook::RecordRootOutermost;
            let template = UntimedTemplate::get(outermost, after_call.is_some()).unwrap();
            for id in [0, 5, 300, 70_000] {
                let assembled =
                    assemble_hook(ASSEMBLY_BASE, id, kind, after_call, HookShape::Jump).unwrap();
                let instantiated = template.instantiate(id);
                assert_eq!(instantiated.bytes, assembled.bytes, "{kind:?} {id}");
                assert_eq!(instantiated.entry, assembled.entry);
            }
        }
    }

    #[test]
    fn a_roots_untimed_hook_sends_its_outermost_calls_to_the_word_its_patcher_fills() {
        let address = 0x7f00_0000_1000;
        let code = build(
            address,
            9,
            Hook::RecordRootOutermost,
            None,
            HookShape::Jump,
            body(4),
        )
        .unwrap();
        let word = outermost_word(code.body, false).unwrap();
        assert!(
            word > address && word < code.hook,
            "a data word before the entry"
        );
        let whole = disassemble(&code.bytes[..(code.body - address) as usize], address);
        let jump = format!("jmp qword ptr [{word:X}h]");
        assert!(
            whole.iter().any(|line| line.ends_with(&jump)),
            "{jump} in {whole:#?}"
        );
        let plain = build(address, 9, Hook::Untimed, None, HookShape::Jump, body(4)).unwrap();
        let template = UntimedTemplate::get(false, false).unwrap();
        let plain_word = plain.body - template.hook.body as u64 + template.words[1] as u64;
        let plain = disassemble(&plain.bytes[..(plain.body - address) as usize], address);
        // Only a jump through its own word would be the outermost path: the data words
        // (the handlers' addresses, which ASLR moves) may disassemble as any jump.
        let through_word = format!("jmp qword ptr [{plain_word:X}h]");
        assert!(!plain.iter().any(|line| line.ends_with(&through_word)));
    }
}
