//! The recording hook: entry and exit events with timestamps, written to the thread's
//! ring, inside the call graph only. Recording hooks are built during Scheme B discovery
//! while the target waits, so each comes from a [`RecordTemplate`] assembled once, with
//! the function's own values in data words of the hook.

use super::returns::{
    EntryLabels, HookFrame, ShadowLabels, Word, check_shadow_top, enter_with_state,
    entry_slow_paths, pop_shadow_entry, push_shadow_entry, return_slots, special_path,
};
use super::template::{HookCode, RecordTemplate};
use super::untimed_flush::{routine_word, write_untimed_calls};
use super::{
    ASSEMBLY_BASE, Layout, RECORD_HOOK_PUSHES, call_slow, finish_hook, handlers, load_state,
    new_layout, return_to_caller,
};
use crate::hooks::handler_abi::Handler;
use crate::hooks::state::STATE;
use crate::hooks::thread_layout::{
    self as thread_state, ENTRY_EXIT, ENTRY_SIZE, STATE_GRAPH_DEPTH, STATE_RING_EVENTS,
    STATE_RING_HEAD, STATE_RING_HEADER, STATE_RING_LIMIT, STATE_RING_MASK,
};
use crate::sys::error::AgentError;
use iced_x86::code_asm::*;
use tendril_wire::events::HookShape;

/// The per-function values a recording hook reads from data words of its own, so that
/// one assembled template serves every function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RecordValues {
    entry_event: u64,
    exit_event: u64,
    /// The shadow entry's function word (the id, marked as recorded).
    shadow_function: u64,
    id: u64,
}

impl RecordValues {
    pub(super) fn new(id: u32, shape: HookShape) -> Self {
        use tendril_wire::events::EventKind;
        RecordValues {
            entry_event: id as u64 | (shape.kind_word(EventKind::Entry) as u64) << 32,
            exit_event: id as u64 | (EventKind::Exit as u64) << 32,
            shadow_function: id as u64 | thread_state::ENTRY_RECORDED,
            id: id as u64,
        }
    }
}

/// The labels of a recording hook's data words.
pub(super) struct RecordWords {
    entry_event: CodeLabel,
    exit_event: CodeLabel,
    shadow_function: CodeLabel,
    id: CodeLabel,
}

impl RecordTemplate {
    /// The template for a root or inner hook, with or without a call thunk.
    pub(super) fn get(root: bool, thunk: bool) -> Result<RecordTemplate, AgentError> {
        let mut templates = STATE
            .record_templates
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let slot = &mut templates[root as usize * 2 + thunk as usize];
        if slot.is_none() {
            let thunk_returns_to = thunk.then_some(0);
            *slot = Some(Self::assemble(root, thunk_returns_to).map_err(AgentError::Assembly)?);
        }
        Ok(slot.clone().expect("just assembled"))
    }

    fn assemble(root: bool, thunk_returns_to: Option<u64>) -> Result<RecordTemplate, IcedError> {
        let layout = new_layout()?;
        let values = RecordValues::new(0, HookShape::Jump);
        let (layout, words) = record_hook(layout, root, thunk_returns_to.is_some(), values)?;
        let (hook, result) = finish_hook(layout, ASSEMBLY_BASE)?;
        let offset = |label: &CodeLabel| -> Result<usize, IcedError> {
            Ok((result.label_ip(label)? - ASSEMBLY_BASE) as usize)
        };
        Ok(RecordTemplate {
            hook,
            words: [
                offset(&words.entry_event)?,
                offset(&words.exit_event)?,
                offset(&words.shadow_function)?,
                offset(&words.id)?,
            ],
        })
    }

    /// The hook of function `id`, whose entry reaches it as `shape` says: the template
    /// with that function's data words.
    pub(super) fn instantiate(&self, id: u32, shape: HookShape) -> HookCode {
        let values = RecordValues::new(id, shape);
        let values = [
            values.entry_event,
            values.exit_event,
            values.shadow_function,
            values.id,
        ];
        let mut hook = self.hook.clone();
        for (&offset, value) in self.words.iter().zip(values) {
            hook.bytes[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
        }
        hook
    }
}

/// The registers the recording hook saves; its flags live in r10.
pub(super) const RECORD_HOOK_FRAME: HookFrame = HookFrame {
    registers: &[rax, rcx, rdx, r10, r11],
    flags_in_r10: true,
};
const _: () = assert!(RECORD_HOOK_FRAME.registers.len() == RECORD_HOOK_PUSHES as usize);

/// `rdtsc` into `rax` as one 64-bit value (clobbers rdx and the flags).
fn read_tsc(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.rdtsc()?;
    a.shl(rdx, 32)?;
    a.or(rax, rdx)
}

/// Writes the event `(rax, [word])` at the thread's ring head (r11 holds the head) and
/// publishes the new head. Clobbers rax, rdx, r11.
pub(super) fn write_event(a: &mut CodeAssembler, word: CodeLabel) -> Result<(), IcedError> {
    a.mov(rdx, r11)?;
    a.and(rdx, qword_ptr(rcx + STATE_RING_MASK))?;
    a.shl(rdx, 4)?;
    a.add(rdx, qword_ptr(rcx + STATE_RING_EVENTS))?;
    a.mov(qword_ptr(rdx), rax)?;
    a.mov(rax, qword_ptr(word))?;
    a.mov(qword_ptr(rdx + 8), rax)?;
    a.inc(r11)?;
    a.mov(qword_ptr(rcx + STATE_RING_HEAD), r11)?;
    a.mov(rdx, qword_ptr(rcx + STATE_RING_HEADER))?;
    a.mov(qword_ptr(rdx + tendril_wire::rings::ring::HEAD as i32), r11)
}

/// The recording hook (see [`Hook::Record`](tendril_wire::Hook::Record)). Flags live in r10 (rdtsc needs rax
/// and rdx); the entry's timestamp is taken last, the exit's first, so that as little
/// of the hooks' own cost as possible falls between them.
pub(super) fn record_hook(
    mut layout: Layout,
    root: bool,
    after_call: bool,
    values: RecordValues,
) -> Result<(Layout, RecordWords), IcedError> {
    let (slot, entry_slot) = return_slots(RECORD_HOOK_PUSHES, after_call);
    let handlers = handlers();
    let before_push: Handler = if after_call {
        handlers.record_before_push_after_call
    } else {
        handlers.record_before_push
    };
    let body = layout.body;
    let a = &mut layout.assembler;
    let mut words = RecordWords {
        entry_event: a.create_label(),
        exit_event: a.create_label(),
        shadow_function: a.create_label(),
        id: a.create_label(),
    };
    let mut entry = RecordEntryLabels::new(a);
    let mut exit = ExitLabels::new(a);
    let mut slow_call = a.create_label();
    let mut untimed_routine = a.create_label();
    let hook = RecordHook {
        root,
        after_call,
        entry_slot,
        before_push,
        body,
    };

    a.set_label(&mut layout.entry)?;
    hook.entry_path(a, &mut entry, &words, exit.exit)?;
    let routines = SlowRoutines {
        slow_call,
        untimed_routine,
    };
    exit_path(a, &mut exit, slot, after_call, words.exit_event, routines)?;
    hook.entry_slow_paths(a, &mut entry, &words, &mut slow_call, untimed_routine)?;
    routine_word(a, &mut untimed_routine)?;
    // The per-function data words (see `RecordTemplate`).
    for (label, value) in [
        (&mut words.entry_event, values.entry_event),
        (&mut words.exit_event, values.exit_event),
        (&mut words.shadow_function, values.shadow_function),
        (&mut words.id, values.id),
    ] {
        a.set_label(label)?;
        a.dq(&[value])?;
    }
    Ok((layout, words))
}

/// What shapes a recording hook's entry: whether it is a root, whether it runs after
/// a call thunk, its shadow entry's slot, its handler before the push, and the body.
struct RecordHook {
    root: bool,
    after_call: bool,
    entry_slot: i32,
    before_push: Handler,
    body: CodeLabel,
}

/// The labels of the recording hook's entry: the shared entry's, where its activation
/// starts, the first call's discovery and where the counted call goes on, the shadow
/// stack's (with the same slot's check), and the ring's slow path, the room after it
/// and the entry's end.
struct RecordEntryLabels {
    entry: EntryLabels,
    activation: CodeLabel,
    counted: CodeLabel,
    discover: CodeLabel,
    same_slot: CodeLabel,
    shadow: ShadowLabels,
    ring: CodeLabel,
    room: CodeLabel,
    done: CodeLabel,
}

impl RecordEntryLabels {
    fn new(a: &mut CodeAssembler) -> RecordEntryLabels {
        let entry = EntryLabels::new(a);
        let activation = a.create_label();
        let counted = a.create_label();
        let discover = a.create_label();
        let same_slot = a.create_label();
        let shadow = ShadowLabels {
            overflow: a.create_label(),
            prune: a.create_label(),
            same_slot: Some(same_slot),
            push_entry: a.create_label(),
        };
        RecordEntryLabels {
            entry,
            activation,
            counted,
            discover,
            same_slot,
            shadow,
            ring: a.create_label(),
            room: a.create_label(),
            done: a.create_label(),
        }
    }
}

impl RecordHook {
    /// The entry: the call counted in the shadow stack and the graph's depth, the
    /// entry event timed last, then the body run with the exit as its return address.
    fn entry_path(
        &self,
        a: &mut CodeAssembler,
        labels: &mut RecordEntryLabels,
        words: &RecordWords,
        exit: CodeLabel,
    ) -> Result<(), IcedError> {
        let frame = RECORD_HOOK_FRAME;
        let entry_slot = self.entry_slot;
        enter_with_state(a, frame, &mut labels.entry)?;
        a.set_label(&mut labels.activation)?;
        if !self.root {
            // Outside the call graph a function records nothing.
            a.cmp(qword_ptr(rcx + STATE_GRAPH_DEPTH), 0)?;
            a.je(labels.entry.passthrough)?;
        }
        a.mov(r11, (handlers().invoked_table)())?;
        a.add(r11, qword_ptr(words.id))?;
        a.cmp(byte_ptr(r11), 0)?;
        a.je(labels.discover)?;
        a.set_label(&mut labels.counted)?;
        check_shadow_top(a, entry_slot, &mut labels.shadow)?;
        let function_word = Word::Data(words.shadow_function);
        push_shadow_entry(
            a,
            entry_slot,
            function_word,
            exit,
            &mut labels.shadow.push_entry,
        )?;
        if self.after_call {
            a.mov(qword_ptr(rsp + entry_slot), r11)?;
        }
        a.inc(qword_ptr(rcx + STATE_GRAPH_DEPTH))?;
        a.mov(r11, qword_ptr(rcx + STATE_RING_HEAD))?;
        a.cmp(r11, qword_ptr(rcx + STATE_RING_LIMIT))?;
        a.jae(labels.ring)?;
        a.set_label(&mut labels.room)?;
        read_tsc(a)?;
        write_event(a, words.entry_event)?;
        a.set_label(&mut labels.done)?;
        frame.restore(a)?;
        if self.after_call {
            a.jmp(self.body)?;
        } else {
            // The return address lives in the shadow entry; `call` puts the exit in its
            // slot.
            a.lea(rsp, qword_ptr(rsp + 8))?;
            a.call(self.body)?;
        }
        Ok(())
    }

    /// The entry's slow paths: the ring's, the first call's discovery, the special
    /// path, the same slot's check and the shared ones (which place `slow_call`).
    fn entry_slow_paths(
        &self,
        a: &mut CodeAssembler,
        labels: &mut RecordEntryLabels,
        words: &RecordWords,
        slow_call: &mut CodeLabel,
        untimed_routine: CodeLabel,
    ) -> Result<(), IcedError> {
        let handlers = handlers();
        a.set_label(&mut labels.ring)?;
        write_untimed_calls(a, untimed_routine, labels.room)?;
        call_slow(a, handlers.ring_space, *slow_call)?;
        a.test(rdx, rdx)?;
        a.jnz(labels.done)?;
        a.mov(r11, qword_ptr(rcx + STATE_RING_HEAD))?;
        a.jmp(labels.room)?;
        a.set_label(&mut labels.discover)?;
        a.mov(edx, dword_ptr(words.id))?;
        call_slow(a, handlers.discover, *slow_call)?;
        a.jmp(labels.counted)?;
        special_path(
            a,
            &mut labels.entry,
            self.before_push,
            *slow_call,
            labels.activation,
        )?;
        // The top frame's slot is ours: a tail call from it if the slot holds its exit.
        a.set_label(&mut labels.same_slot)?;
        a.mov(rax, qword_ptr(r11))?;
        a.cmp(rax, qword_ptr(rdx + (ENTRY_EXIT - ENTRY_SIZE)))?;
        a.je(labels.shadow.push_entry)?;
        entry_slow_paths(
            a,
            RECORD_HOOK_FRAME,
            &mut labels.entry,
            &mut labels.shadow,
            self.before_push,
            self.entry_slot,
            self.body,
            slow_call,
        )
    }
}

/// The data words of the routines the hook's slow paths call: `tendril_slow_call`'s,
/// and `tendril_write_untimed_calls`'s (`untimed_flush`).
#[derive(Clone, Copy)]
struct SlowRoutines {
    slow_call: CodeLabel,
    untimed_routine: CodeLabel,
}

/// The labels of the recording hook's exit: where the function returns to, its ring
/// slow path and the room after it, its end, and a return that does not match the
/// shadow stack's top.
struct ExitLabels {
    exit: CodeLabel,
    ring: CodeLabel,
    room: CodeLabel,
    done: CodeLabel,
    mismatch: CodeLabel,
}

impl ExitLabels {
    fn new(a: &mut CodeAssembler) -> ExitLabels {
        ExitLabels {
            exit: a.create_label(),
            ring: a.create_label(),
            room: a.create_label(),
            done: a.create_label(),
            mismatch: a.create_label(),
        }
    }
}

/// The recording hook's exit, where the function returns (its shadow entry's return
/// address is `labels.exit`): the timestamp first, the shadow entry popped, the exit
/// event written; then its slow paths.
fn exit_path(
    a: &mut CodeAssembler,
    labels: &mut ExitLabels,
    slot: i32,
    after_call: bool,
    exit_event: CodeLabel,
    routines: SlowRoutines,
) -> Result<(), IcedError> {
    let SlowRoutines {
        slow_call,
        untimed_routine,
    } = routines;
    let handlers = handlers();
    // Exit: the function returned here; rsp is S + 8.
    a.set_label(&mut labels.exit)?;
    a.lea(rsp, qword_ptr(rsp - 8))?;
    RECORD_HOOK_FRAME.save(a)?;
    read_tsc(a)?;
    load_state(a, rcx)?;
    pop_shadow_entry(a, slot, labels.mismatch)?;
    a.dec(qword_ptr(rcx + STATE_GRAPH_DEPTH))?;
    a.mov(r11, qword_ptr(rcx + STATE_RING_HEAD))?;
    a.cmp(r11, qword_ptr(rcx + STATE_RING_LIMIT))?;
    a.jae(labels.ring)?;
    a.set_label(&mut labels.room)?;
    write_event(a, exit_event)?;
    a.set_label(&mut labels.done)?;
    RECORD_HOOK_FRAME.restore(a)?;
    return_to_caller(a, after_call)?;

    // Exit slow paths (the timestamp is in rax).
    a.set_label(&mut labels.mismatch)?;
    call_slow(a, handlers.record_mismatched_return, slow_call)?;
    a.jmp(labels.done)?;
    a.set_label(&mut labels.ring)?;
    write_untimed_calls(a, untimed_routine, labels.room)?;
    call_slow(a, handlers.ring_space, slow_call)?;
    a.test(rdx, rdx)?;
    a.jnz(labels.done)?;
    // The wait for room (an Adjust event now in the ring) must lie inside the frame it
    // is removed from: the exit is timed again, after it.
    read_tsc(a)?;
    a.mov(r11, qword_ptr(rcx + STATE_RING_HEAD))?;
    a.jmp(labels.room)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks::stubs::test_code::{body, disassemble};
    use crate::hooks::stubs::{ASSEMBLY_BASE, TrampolineCode, assemble_hook, build};
    use tendril_wire::Hook;

    #[test]
    fn record_hook_times_the_call_and_keeps_its_return_prediction() {
        let address = 0x7f00_0000_1000;
        let root = build(address, 9, Hook::RecordRoot, None, HookShape::Jump, body(4)).unwrap();
        let inner = build(address, 9, Hook::Record, None, HookShape::Jump, body(4)).unwrap();
        let text = |code: &TrampolineCode| {
            let from = (code.hook - address) as usize;
            disassemble(&code.bytes[from..(code.body - address) as usize], code.hook)
        };
        let (root, inner) = (text(&root), text(&inner));
        let depth_check = format!("cmp qword ptr [rcx+{STATE_GRAPH_DEPTH:X}h],0");
        assert!(
            inner.contains(&depth_check),
            "outside the graph: steps aside"
        );
        assert!(!root.contains(&depth_check), "a root starts the graph");
        // The entry, the exit, and the exit again after a wait for ring space.
        assert_eq!(inner.iter().filter(|t| *t == "rdtsc").count(), 3);
        assert!(
            inner.iter().any(|t| t.starts_with("call ")),
            "the body is called"
        );
    }

    #[test]
    fn a_recording_hook_from_the_template_is_the_hook_assembled_for_its_function() {
        for root in [false, true] {
            for returns_to in [None, Some(0x7f00_1234_5678)] {
                for (id, shape) in [0, 5, 300, 70_000]
                    .into_iter()
                    .zip(HookShape::ALL.iter().cycle())
                {
                    let kind = if root { Hook::RecordRoot } else { Hook::Record };
                    let assembled =
                        assemble_hook(ASSEMBLY_BASE, id, kind, returns_to, *shape).unwrap();
                    let template = RecordTemplate::get(root, returns_to.is_some()).unwrap();
                    let instantiated = template.instantiate(id, *shape);
                    assert_eq!(
                        instantiated.bytes, assembled.bytes,
                        "{root} {returns_to:?} {id} {shape:?}"
                    );
                    assert_eq!(
                        (instantiated.entry, instantiated.body),
                        (assembled.entry, assembled.body)
                    );
                }
            }
        }
    }
}
