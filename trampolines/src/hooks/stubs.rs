//! The machine code of a trampoline: the hook that runs at a patched function's entry,
//! and the relocated first instructions of the function.
//!
//! A trampoline is one block of executable memory: the hook's slow paths, then the
//! *hook* itself, where the patch at the function entry jumps, then the *body* — the
//! function's overwritten instructions re-encoded for their new address, and a jump
//! back into the function. The hook saves the few registers it uses (and the flags,
//! with `lahf`/`seto`, much cheaper than `pushfq`/`popfq`), finds the thread's state
//! through the TLS slot, does its work and falls through into the body.
//!
//! The return hook does not overwrite the return address in place: it takes the return
//! address off the stack into the thread's shadow stack and *calls* the body, so the
//! `call` itself puts the hook's exit address where the return address was. The
//! function sees the same stack layout (its stack arguments stay at `rsp+8`...), and
//! the cpu's return-stack predictor stays balanced: the function's `ret` returns to the
//! exit as predicted, and the exit's `ret` to the real caller as predicted.
//!
//! Registers, flags and the vector state are preserved on every path; the exit path
//! leaves the return registers (rax, rdx, xmm0, xmm1, st0) as the function set them.

use crate::hooks::slow_call::{self, Handler};
use crate::hooks::thread_layout::{
    self as thread_state, ENTRY_EXIT, ENTRY_FUNCTION, ENTRY_RETURN_ADDRESS, ENTRY_SIZE, ENTRY_SLOT,
    FLAG_PASSTHROUGH, FLAG_RECONCILE, STATE_FLAGS, STATE_GRAPH_DEPTH, STATE_RING_EVENTS,
    STATE_RING_HEAD, STATE_RING_HEADER, STATE_RING_LIMIT, STATE_RING_MASK, STATE_SHADOW_BASE,
    STATE_SHADOW_LIMIT, STATE_SHADOW_OVERFLOWS, STATE_SHADOW_TOP,
};
use iced_x86::BlockEncoderOptions;
use iced_x86::code_asm::*;
use std::sync::OnceLock;

/// The runtime's answers to the stubs' slow paths. The runtime installs them once,
/// before the first hook is built ([`install_handlers`]); the templates never import
/// the code that answers them.
#[derive(Clone, Copy)]
pub struct Handlers {
    /// A thread without state yet: registers it, answers its state in `rcx`.
    pub register_thread: Handler,
    /// Before a return hook pushes a shadow entry while the thread must reconcile its
    /// entries; `_after_call` for a call thunk's hook (one more word on the stack).
    pub returns_before_push: Handler,
    pub returns_before_push_after_call: Handler,
    /// A return hook's exit that does not match the top shadow entry.
    pub returns_mismatched_return: Handler,
    /// The same three for recording hooks.
    pub record_before_push: Handler,
    pub record_before_push_after_call: Handler,
    pub record_mismatched_return: Handler,
    /// A recording hook found its ring full, or has none yet.
    pub ring_space: Handler,
    /// A recording hook's function runs in the graph for the first time (id in `edx`).
    pub discover: Handler,
    /// Address of the recording's invoked bytes (one per function id), or 0.
    pub invoked_table: fn() -> u64,
}

static HANDLERS: OnceLock<Handlers> = OnceLock::new();

/// Installs the runtime's handlers; the first installation stays.
pub fn install_handlers(handlers: Handlers) {
    let _ = HANDLERS.set(handlers);
}

/// The installed handlers; [`build`] checks they are there before assembling.
fn handlers() -> &'static Handlers {
    HANDLERS
        .get()
        .expect("build() checks that the handlers are installed")
}

/// Room for one trampoline (body + hook); checked when the code is built.
pub const TRAMPOLINE_BYTES: u64 = 1024;
/// Registers the return hook pushes below the return-address slot.
pub const RETURN_HOOK_PUSHES: u64 = 4;

/// What the hook at a function's entry does.
#[derive(Debug, Clone, Copy)]
pub enum HookKind {
    /// Count the call in the thread's call counter.
    Count,
    /// Count the call, hook the return (shadow stack) and count normal returns.
    CountReturns,
    /// Record entry and exit events with timestamps, inside the call graph only: a root
    /// starts the graph on its thread; another function outside it steps aside.
    Record { root: bool },
    /// Call an agent handler with all registers saved, then run the function.
    Internal(Handler),
    /// Jump to an agent function (`target`) with the function's own signature instead;
    /// it calls the original through the trampoline's body, whose address goes to
    /// `body_sink` once the trampoline is built.
    Replace {
        target: u64,
        body_sink: Option<&'static std::sync::atomic::AtomicU64>,
    },
}

/// A trampoline's code and the addresses that matter in it.
#[derive(Debug, Clone)]
pub struct TrampolineCode {
    /// The whole trampoline, to be written at its address.
    pub bytes: Vec<u8>,
    /// Where the function-entry patch jumps (and a trapped thread is sent).
    pub hook: u64,
    /// Where the relocated body starts.
    pub body: u64,
    /// Where a thread that trapped on the entry's transient `int3` continues.
    pub trap_entry: u64,
}

/// The labels every hook defines: where the patch jumps, where a trapped thread goes,
/// and where the body goes.
struct Layout {
    assembler: CodeAssembler,
    entry: CodeLabel,
    /// Only for a call thunk; otherwise a trapped thread goes to the entry.
    trap_entry: Option<CodeLabel>,
    /// Only for a call thunk: the data word holding the address its call returns to.
    returns_to_word: Option<CodeLabel>,
    body: CodeLabel,
}

/// Builds the trampoline for function `id` at `address`. `body_at` relocates the
/// function's overwritten instructions for the address the body will have and returns
/// their bytes (ending with the jump back into the function). `thunk_returns_to` is set
/// for a call thunk: the address the patched `call` returns to.
///
/// Recording hooks are built during Scheme B discovery, while the target waits, so they
/// come from a template assembled once (see [`RecordTemplate`]); the others are
/// assembled each time.
pub fn build(
    address: u64,
    id: u32,
    kind: HookKind,
    thunk_returns_to: Option<u64>,
    body_at: impl FnOnce(u64) -> Result<Vec<u8>, String>,
) -> Result<TrampolineCode, String> {
    if HANDLERS.get().is_none() {
        return Err("the runtime's hook handlers are not installed".into());
    }
    let hook = match kind {
        HookKind::Record { root } => {
            RecordTemplate::get(root, thunk_returns_to.is_some())?.instantiate(id, thunk_returns_to)
        }
        _ => assemble_hook(address, id, kind, thunk_returns_to)
            .map_err(|e| format!("cannot assemble a hook: {e}"))?,
    };
    let body = address + hook.body as u64;
    let mut bytes = hook.bytes;
    bytes.extend_from_slice(&body_at(body)?);
    if bytes.len() as u64 > TRAMPOLINE_BYTES {
        return Err(format!(
            "a trampoline needs {} bytes, more than the {TRAMPOLINE_BYTES} reserved",
            bytes.len()
        ));
    }
    Ok(TrampolineCode {
        bytes,
        hook: address + hook.entry as u64,
        body,
        trap_entry: address + hook.trap_entry as u64,
    })
}

/// A trampoline's hook part, position-independent: its bytes (up to where the body
/// goes) and the offsets of its entry points.
#[derive(Debug, Clone)]
struct HookCode {
    bytes: Vec<u8>,
    entry: usize,
    trap_entry: usize,
    /// Where the body starts: the length of `bytes`.
    body: usize,
}

/// Where a hook is assembled when its address does not matter: every reference it
/// makes is relative to itself or absolute.
const ASSEMBLY_BASE: u64 = 0x1000_0000;

/// Assembles the hook for function `id`.
fn assemble_hook(
    address: u64,
    id: u32,
    kind: HookKind,
    thunk_returns_to: Option<u64>,
) -> Result<HookCode, IcedError> {
    let after_call = thunk_returns_to.is_some();
    let layout = new_layout(thunk_returns_to)?;
    let layout = match kind {
        HookKind::Count => count_hook(layout, id)?,
        HookKind::CountReturns => count_returns_hook(layout, id, after_call)?,
        HookKind::Record { root } => {
            let values = RecordValues::new(id, thunk_returns_to);
            record_hook(layout, root, after_call, values)?.0
        }
        HookKind::Internal(handler) => internal_hook(layout, handler)?,
        HookKind::Replace { target, .. } => replace_hook(layout, target)?,
    };
    Ok(finish_hook(layout, address)?.0)
}

/// Assembles a hook at `address`; also returns the assembler's result, which knows
/// where the hook's other labels ended up.
fn finish_hook(
    mut layout: Layout,
    address: u64,
) -> Result<(HookCode, CodeAssemblerResult), IcedError> {
    // The body label needs an instruction: a one-byte placeholder, cut off below.
    layout.assembler.set_label(&mut layout.body)?;
    layout.assembler.nop()?;
    let result = layout
        .assembler
        .assemble_options(address, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)?;
    let offset = |label: &CodeLabel| -> Result<usize, IcedError> {
        Ok((result.label_ip(label)? - address) as usize)
    };
    let entry = offset(&layout.entry)?;
    let body = offset(&layout.body)?;
    let trap_entry = match &layout.trap_entry {
        Some(label) => offset(label)?,
        None => entry,
    };
    let mut bytes = result.inner.code_buffer.clone();
    bytes.truncate(body);
    Ok((
        HookCode {
            bytes,
            entry,
            trap_entry,
            body,
        },
        result,
    ))
}

/// The per-function values a recording hook reads from data words of its own, so that
/// one assembled template serves every function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RecordValues {
    entry_event: u64,
    exit_event: u64,
    /// The shadow entry's function word (the id, marked as recorded).
    shadow_function: u64,
    id: u64,
    /// For a call thunk: where its call returns.
    returns_to: u64,
}

impl RecordValues {
    fn new(id: u32, thunk_returns_to: Option<u64>) -> Self {
        use tendril_wire::events::EventKind;
        RecordValues {
            entry_event: id as u64 | (EventKind::Entry as u64) << 32,
            exit_event: id as u64 | (EventKind::Exit as u64) << 32,
            shadow_function: id as u64 | thread_state::ENTRY_RECORDED,
            id: id as u64,
            returns_to: thunk_returns_to.unwrap_or(0),
        }
    }
}

/// The labels of a recording hook's data words.
struct RecordWords {
    entry_event: CodeLabel,
    exit_event: CodeLabel,
    shadow_function: CodeLabel,
    id: CodeLabel,
}

/// A recording hook assembled once, and where its per-function data words are.
#[derive(Debug, Clone)]
struct RecordTemplate {
    hook: HookCode,
    /// Offsets of the words of [`RecordValues`], in its field order.
    words: [Option<usize>; 5],
}

impl RecordTemplate {
    /// The template for a root or inner hook, with or without a call thunk.
    fn get(root: bool, thunk: bool) -> Result<RecordTemplate, String> {
        static TEMPLATES: std::sync::Mutex<[Option<RecordTemplate>; 4]> =
            std::sync::Mutex::new([None, None, None, None]);
        let mut templates = TEMPLATES.lock().unwrap_or_else(|p| p.into_inner());
        let slot = &mut templates[root as usize * 2 + thunk as usize];
        if slot.is_none() {
            let thunk_returns_to = thunk.then_some(0);
            *slot = Some(
                Self::assemble(root, thunk_returns_to)
                    .map_err(|e| format!("cannot assemble a hook: {e}"))?,
            );
        }
        Ok(slot.clone().expect("just assembled"))
    }

    fn assemble(root: bool, thunk_returns_to: Option<u64>) -> Result<RecordTemplate, IcedError> {
        let layout = new_layout(thunk_returns_to)?;
        let values = RecordValues::new(0, thunk_returns_to);
        let (layout, words) = record_hook(layout, root, thunk_returns_to.is_some(), values)?;
        let returns_to_word = layout.returns_to_word;
        let (hook, result) = finish_hook(layout, ASSEMBLY_BASE)?;
        let offset = |label: &CodeLabel| -> Result<usize, IcedError> {
            Ok((result.label_ip(label)? - ASSEMBLY_BASE) as usize)
        };
        let returns_to = match &returns_to_word {
            Some(label) => Some(offset(label)?),
            None => None,
        };
        Ok(RecordTemplate {
            hook,
            words: [
                Some(offset(&words.entry_event)?),
                Some(offset(&words.exit_event)?),
                Some(offset(&words.shadow_function)?),
                Some(offset(&words.id)?),
                returns_to,
            ],
        })
    }

    /// The hook of function `id`: the template with that function's data words.
    fn instantiate(&self, id: u32, thunk_returns_to: Option<u64>) -> HookCode {
        let values = RecordValues::new(id, thunk_returns_to);
        let values = [
            values.entry_event,
            values.exit_event,
            values.shadow_function,
            values.id,
            values.returns_to,
        ];
        let mut hook = self.hook.clone();
        for (offset, value) in self.words.iter().zip(values) {
            if let Some(offset) = *offset {
                hook.bytes[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
            }
        }
        hook
    }
}

/// Starts a trampoline. For a call thunk it begins with the trap entry: a thread that
/// traps on the entry's transient `int3` has not made the thunk's call, so the trap
/// entry pushes the call's return address first, then goes to the hook.
fn new_layout(thunk_returns_to: Option<u64>) -> Result<Layout, IcedError> {
    let mut assembler = CodeAssembler::new(64)?;
    let entry = assembler.create_label();
    let body = assembler.create_label();
    let mut trap_entry = None;
    let mut returns_to_word = None;
    if let Some(returns_to) = thunk_returns_to {
        let a = &mut assembler;
        let mut label = a.create_label();
        let mut word = a.create_label();
        a.set_label(&mut label)?;
        trap_entry = Some(label);
        a.push(qword_ptr(word))?;
        a.jmp(entry)?;
        a.set_label(&mut word)?;
        a.dq(&[returns_to])?;
        returns_to_word = Some(word);
    }
    Ok(Layout {
        assembler,
        entry,
        trap_entry,
        returns_to_word,
        body,
    })
}

/// `mov reg, fs:[slot]`: the thread's state (0 before it registered).
fn load_state(a: &mut CodeAssembler, register: AsmRegister64) -> Result<(), IcedError> {
    a.mov(register, qword_ptr(thread_state::slot_offset() as i64).fs())
}

/// Calls `handler` through `tendril_slow_call`; `r11` must have been saved.
fn call_slow(
    a: &mut CodeAssembler,
    handler: Handler,
    slow_call: CodeLabel,
) -> Result<(), IcedError> {
    a.mov(r11, handler as usize as u64)?;
    a.call(qword_ptr(slow_call))
}

/// The data word holding `tendril_slow_call`'s address (it may be far away).
fn slow_call_pointer(a: &mut CodeAssembler, label: &mut CodeLabel) -> Result<(), IcedError> {
    a.set_label(label)?;
    a.dq(&[slow_call::address()])
}

/// Flags into ah (SF ZF AF PF CF) and al (OF); rax must have been saved.
fn save_flags(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.lahf()?;
    a.seto(al)
}

/// The reverse of [`save_flags`]: `add al, 0x7f` overflows exactly when al is 1, which
/// sets OF, and `sahf` then restores the other flags (it leaves OF alone).
fn restore_flags(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.add(al, 0x7f)?;
    a.sahf()
}

fn count_hook(mut layout: Layout, id: u32) -> Result<Layout, IcedError> {
    let a = &mut layout.assembler;
    let mut have_state = a.create_label();
    let mut register = a.create_label();
    let mut done = a.create_label();
    let mut slow_call = a.create_label();
    // Slow path first, so the fast path falls through into the body.
    a.set_label(&mut register)?;
    a.push(r11)?;
    call_slow(a, handlers().register_thread, slow_call)?;
    a.pop(r11)?;
    a.jmp(have_state)?;
    slow_call_pointer(a, &mut slow_call)?;

    a.set_label(&mut layout.entry)?;
    a.push(rax)?;
    a.push(rcx)?;
    save_flags(a)?;
    load_state(a, rcx)?;
    a.test(rcx, rcx)?;
    a.jz(register)?;
    a.set_label(&mut have_state)?;
    a.test(byte_ptr(rcx + STATE_FLAGS), FLAG_PASSTHROUGH as i32)?;
    a.jnz(done)?;
    a.inc(qword_ptr(rcx + thread_state::calls_displacement(id)))?;
    a.set_label(&mut done)?;
    restore_flags(a)?;
    a.pop(rcx)?;
    a.pop(rax)?;
    Ok(layout)
}

/// Returns from an exit stub to the real return address, now in the slot at `rsp`.
/// A hook that called the body left the caller's return prediction on the cpu's return
/// stack, so `ret` is right. A call thunk's exit was reached by the function's `ret`,
/// which already used (and missed) that prediction: another `ret` would miss the next
/// one too, and every return after it; an indirect `jmp` keeps the return stack
/// balanced. (The address it reads lies in the red zone, which signals never touch.)
fn return_to_caller(a: &mut CodeAssembler, after_call: bool) -> Result<(), IcedError> {
    if after_call {
        a.lea(rsp, qword_ptr(rsp + 8))?;
        a.jmp(qword_ptr(rsp - 8))
    } else {
        a.ret()
    }
}

/// Labels of a return-hooking stub's entry that the shadow-stack code branches to.
struct ShadowLabels {
    /// The shadow stack is full: run the function without a return hook.
    overflow: CodeLabel,
    /// The top entry's frame may be gone: let the agent prune (and reconcile).
    prune: CodeLabel,
    /// The top entry has our slot: a tail call from it if the slot holds its exit
    /// (checked by the stub when it has a spare register, else by the agent).
    same_slot: Option<CodeLabel>,
    /// Where the entry is written (the prune path comes back here).
    push_entry: CodeLabel,
}

/// Checks that the shadow stack has room and that the top entry's frame lies above
/// the new one (rcx: state; leaves rdx: top, r11: the new return slot).
fn check_shadow_top(
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
enum Word {
    Immediate(u64),
    Data(CodeLabel),
}

/// Pushes the shadow entry (rdx: top, r11: the return slot) for `function_word`, with
/// `exit` as the exit; leaves r11 holding the exit's address.
fn push_shadow_entry(
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
fn pop_shadow_entry(
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

/// Pushes `registers` in order.
fn push_registers(a: &mut CodeAssembler, registers: &[AsmRegister64]) -> Result<(), IcedError> {
    registers.iter().try_for_each(|&register| a.push(register))
}

/// Pops what [`push_registers`] pushed (in reverse order).
fn pop_registers(a: &mut CodeAssembler, registers: &[AsmRegister64]) -> Result<(), IcedError> {
    registers
        .iter()
        .rev()
        .try_for_each(|&register| a.pop(register))
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
fn count_returns_hook(mut layout: Layout, id: u32, after_call: bool) -> Result<Layout, IcedError> {
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

/// Registers the recording hook pushes below the return-address slot.
pub const RECORD_HOOK_PUSHES: u64 = 5;

/// The registers the recording hook saves.
const RECORD_HOOK_REGISTERS: [AsmRegister64; RECORD_HOOK_PUSHES as usize] =
    [rax, rcx, rdx, r10, r11];

fn push_record_hook_registers(a: &mut CodeAssembler) -> Result<(), IcedError> {
    push_registers(a, &RECORD_HOOK_REGISTERS)
}

fn pop_record_hook_registers(a: &mut CodeAssembler) -> Result<(), IcedError> {
    pop_registers(a, &RECORD_HOOK_REGISTERS)
}

/// `rdtsc` into `rax` as one 64-bit value (clobbers rdx and the flags).
fn read_tsc(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.rdtsc()?;
    a.shl(rdx, 32)?;
    a.or(rax, rdx)
}

/// Writes the event `(rax, [word])` at the thread's ring head (r11 holds the head) and
/// publishes the new head. Clobbers rax, rdx, r11.
fn write_event(a: &mut CodeAssembler, word: CodeLabel) -> Result<(), IcedError> {
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

/// The recording hook (see [`HookKind::Record`]). Flags live in r10 (rdtsc needs rax
/// and rdx); the entry's timestamp is taken last, the exit's first, so that as little
/// of the hooks' own cost as possible falls between them.
fn record_hook(
    mut layout: Layout,
    root: bool,
    after_call: bool,
    values: RecordValues,
) -> Result<(Layout, RecordWords), IcedError> {
    let slot = (RECORD_HOOK_PUSHES * 8) as i32;
    let entry_slot = slot + if after_call { 8 } else { 0 };
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
    let mut have_state = a.create_label();
    let mut register = a.create_label();
    let mut special = a.create_label();
    let mut activation = a.create_label();
    let mut counted = a.create_label();
    let mut discover = a.create_label();
    let mut prune = a.create_label();
    let mut same_slot = a.create_label();
    let mut passthrough = a.create_label();
    let mut overflow = a.create_label();
    let push_entry = a.create_label();
    let mut entry_ring = a.create_label();
    let mut entry_room = a.create_label();
    let mut entry_done = a.create_label();
    let mut exit = a.create_label();
    let mut exit_ring = a.create_label();
    let mut exit_room = a.create_label();
    let mut exit_done = a.create_label();
    let mut mismatch = a.create_label();
    let mut slow_call = a.create_label();

    a.set_label(&mut layout.entry)?;
    push_record_hook_registers(a)?;
    save_flags(a)?;
    a.mov(r10d, eax)?;
    load_state(a, rcx)?;
    a.test(rcx, rcx)?;
    a.jz(register)?;
    a.set_label(&mut have_state)?;
    a.test(
        byte_ptr(rcx + STATE_FLAGS),
        (FLAG_PASSTHROUGH | FLAG_RECONCILE) as i32,
    )?;
    a.jnz(special)?;
    a.set_label(&mut activation)?;
    if !root {
        // Outside the call graph a function records nothing.
        a.cmp(qword_ptr(rcx + STATE_GRAPH_DEPTH), 0)?;
        a.je(passthrough)?;
    }
    a.mov(r11, (handlers.invoked_table)())?;
    a.add(r11, qword_ptr(words.id))?;
    a.cmp(byte_ptr(r11), 0)?;
    a.je(discover)?;
    a.set_label(&mut counted)?;
    let mut labels = ShadowLabels {
        overflow,
        prune,
        same_slot: Some(same_slot),
        push_entry,
    };
    check_shadow_top(a, entry_slot, &mut labels)?;
    let function_word = Word::Data(words.shadow_function);
    push_shadow_entry(a, entry_slot, function_word, exit, &mut labels.push_entry)?;
    if after_call {
        a.mov(qword_ptr(rsp + entry_slot), r11)?;
    }
    a.inc(qword_ptr(rcx + STATE_GRAPH_DEPTH))?;
    a.mov(r11, qword_ptr(rcx + STATE_RING_HEAD))?;
    a.cmp(r11, qword_ptr(rcx + STATE_RING_LIMIT))?;
    a.jae(entry_ring)?;
    a.set_label(&mut entry_room)?;
    read_tsc(a)?;
    write_event(a, words.entry_event)?;
    a.set_label(&mut entry_done)?;
    a.mov(eax, r10d)?;
    restore_flags(a)?;
    pop_record_hook_registers(a)?;
    if after_call {
        a.jmp(body)?;
    } else {
        // The return address lives in the shadow entry; `call` puts the exit in its slot.
        a.lea(rsp, qword_ptr(rsp + 8))?;
        a.call(body)?;
    }

    // Exit: the function returned here; rsp is S + 8.
    a.set_label(&mut exit)?;
    a.lea(rsp, qword_ptr(rsp - 8))?;
    push_record_hook_registers(a)?;
    save_flags(a)?;
    a.mov(r10d, eax)?;
    read_tsc(a)?;
    load_state(a, rcx)?;
    pop_shadow_entry(a, slot, mismatch)?;
    a.dec(qword_ptr(rcx + STATE_GRAPH_DEPTH))?;
    a.mov(r11, qword_ptr(rcx + STATE_RING_HEAD))?;
    a.cmp(r11, qword_ptr(rcx + STATE_RING_LIMIT))?;
    a.jae(exit_ring)?;
    a.set_label(&mut exit_room)?;
    write_event(a, words.exit_event)?;
    a.set_label(&mut exit_done)?;
    a.mov(eax, r10d)?;
    restore_flags(a)?;
    pop_record_hook_registers(a)?;
    return_to_caller(a, after_call)?;

    // Exit slow paths (the timestamp is in rax).
    a.set_label(&mut mismatch)?;
    call_slow(a, handlers.record_mismatched_return, slow_call)?;
    a.jmp(exit_done)?;
    a.set_label(&mut exit_ring)?;
    call_slow(a, handlers.ring_space, slow_call)?;
    a.test(rdx, rdx)?;
    a.jnz(exit_done)?;
    // The wait for room (an Adjust event now in the ring) must lie inside the frame it
    // is removed from: the exit is timed again, after it.
    read_tsc(a)?;
    a.mov(r11, qword_ptr(rcx + STATE_RING_HEAD))?;
    a.jmp(exit_room)?;

    // Entry slow paths.
    a.set_label(&mut entry_ring)?;
    call_slow(a, handlers.ring_space, slow_call)?;
    a.test(rdx, rdx)?;
    a.jnz(entry_done)?;
    a.mov(r11, qword_ptr(rcx + STATE_RING_HEAD))?;
    a.jmp(entry_room)?;
    a.set_label(&mut discover)?;
    a.mov(edx, dword_ptr(words.id))?;
    call_slow(a, handlers.discover, slow_call)?;
    a.jmp(counted)?;
    a.set_label(&mut special)?;
    a.test(byte_ptr(rcx + STATE_FLAGS), FLAG_PASSTHROUGH as i32)?;
    a.jnz(passthrough)?;
    call_slow(a, before_push, slow_call)?;
    a.jmp(activation)?;
    // The top frame's slot is ours: a tail call from it if the slot holds its exit.
    a.set_label(&mut same_slot)?;
    a.mov(rax, qword_ptr(r11))?;
    a.cmp(rax, qword_ptr(rdx + (ENTRY_EXIT - ENTRY_SIZE)))?;
    a.je(push_entry)?;
    a.set_label(&mut prune)?;
    call_slow(a, before_push, slow_call)?;
    a.mov(rdx, qword_ptr(rcx + STATE_SHADOW_TOP))?;
    a.lea(r11, qword_ptr(rsp + entry_slot))?;
    a.jmp(push_entry)?;
    a.set_label(&mut overflow)?;
    a.inc(qword_ptr(rcx + STATE_SHADOW_OVERFLOWS))?;
    a.set_label(&mut passthrough)?;
    a.mov(eax, r10d)?;
    restore_flags(a)?;
    pop_record_hook_registers(a)?;
    a.jmp(body)?;
    a.set_label(&mut register)?;
    call_slow(a, handlers.register_thread, slow_call)?;
    a.jmp(have_state)?;
    slow_call_pointer(a, &mut slow_call)?;
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

/// Calls `handler` with every register saved, then runs the function.
fn internal_hook(mut layout: Layout, handler: Handler) -> Result<Layout, IcedError> {
    let a = &mut layout.assembler;
    let mut slow_call = a.create_label();
    slow_call_pointer(a, &mut slow_call)?;
    a.set_label(&mut layout.entry)?;
    a.push(r11)?;
    call_slow(a, handler, slow_call)?;
    a.pop(r11)?;
    Ok(layout)
}

/// Jumps to `target`, an agent function with the patched function's signature; the
/// body stays reachable for it at its own address.
fn replace_hook(mut layout: Layout, target: u64) -> Result<Layout, IcedError> {
    let a = &mut layout.assembler;
    let mut pointer = a.create_label();
    a.set_label(&mut layout.entry)?;
    a.jmp(qword_ptr(pointer))?;
    a.set_label(&mut pointer)?;
    a.dq(&[target])?;
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter};

    fn disassemble(code: &[u8], ip: u64) -> Vec<String> {
        let mut formatter = IntelFormatter::new();
        Decoder::with_ip(64, code, ip, DecoderOptions::NONE)
            .iter()
            .map(|instruction| {
                let mut text = String::new();
                formatter.format(&instruction, &mut text);
                text
            })
            .collect()
    }

    /// A body of `len` bytes: nops, then a 5-byte `jmp` standing for the jump back.
    fn body(len: usize) -> impl FnOnce(u64) -> Result<Vec<u8>, String> {
        move |_| {
            let mut bytes = vec![0x90; len];
            bytes.extend_from_slice(&[0xe9, 0, 0, 0, 0]);
            Ok(bytes)
        }
    }

    #[test]
    fn count_hook_counts_into_the_thread_state_and_falls_into_the_body() {
        let address = 0x7f00_0000_1000;
        let code = build(address, 3, HookKind::Count, None, body(1)).unwrap();
        let hook_offset = (code.hook - address) as usize;
        let body_offset = (code.body - address) as usize;
        let fast_path = disassemble(&code.bytes[hook_offset..body_offset], code.hook);
        let text = fast_path.join("\n");
        let slot = thread_state::slot_offset() as i64 as u64;
        let load = fast_path
            .iter()
            .find(|l| l.starts_with("mov rcx,fs:["))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(load.ends_with(&format!("{slot:X}h]")), "{text}");
        let counter = thread_state::calls_displacement(3);
        assert!(
            text.contains(&format!("inc qword ptr [rcx+{counter:X}h]")),
            "{text}"
        );
        assert_eq!(&fast_path[..4], ["push rax", "push rcx", "lahf", "seto al"]);
        assert_eq!(
            fast_path.last().unwrap(),
            "pop rax",
            "falls through into the body"
        );
        assert_eq!(code.bytes[body_offset], 0x90, "the body follows the hook");
        assert_eq!(code.bytes.len(), body_offset + 6);
    }

    #[test]
    fn record_hook_times_the_call_and_keeps_its_return_prediction() {
        let address = 0x7f00_0000_1000;
        let root = build(address, 9, HookKind::Record { root: true }, None, body(4)).unwrap();
        let inner = build(address, 9, HookKind::Record { root: false }, None, body(4)).unwrap();
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
                for id in [0, 5, 300, 70_000] {
                    let kind = HookKind::Record { root };
                    let assembled = assemble_hook(ASSEMBLY_BASE, id, kind, returns_to).unwrap();
                    let template = RecordTemplate::get(root, returns_to.is_some()).unwrap();
                    let instantiated = template.instantiate(id, returns_to);
                    assert_eq!(
                        instantiated.bytes, assembled.bytes,
                        "{root} {returns_to:?} {id}"
                    );
                    assert_eq!(
                        (
                            instantiated.entry,
                            instantiated.trap_entry,
                            instantiated.body
                        ),
                        (assembled.entry, assembled.trap_entry, assembled.body)
                    );
                }
            }
        }
    }

    #[test]
    fn return_hook_calls_the_body_and_reports_its_exit() {
        let address = 0x7f00_0000_1000;
        let code = build(address, 7, HookKind::CountReturns, None, body(20)).unwrap();
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
