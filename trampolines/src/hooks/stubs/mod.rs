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
//!
//! This module holds the public API and what every hook kind shares: the layout of a
//! trampoline, its assembly, and the small instruction sequences (thread state, flags,
//! slow calls). Each hook kind's code lives in its own file: [`count`], [`returns`]
//! (with the shadow-stack push and pop), [`record`] (and its template), [`untimed`],
//! [`internal`]
//! (internal and replace hooks). Every hook kind can sit behind a call thunk.

mod count;
mod internal;
mod record;
mod returns;
pub(in crate::hooks) mod template;
mod untimed;
mod untimed_flush;

use crate::hooks::handler_abi::Handler;
pub use crate::hooks::handler_abi::{BacktraceStandIn, Handlers};
use crate::hooks::slow_call;
use crate::hooks::state::STATE;
use crate::hooks::thread_layout as thread_state;
use crate::sys::error::AgentError;
use iced_x86::BlockEncoderOptions;
use iced_x86::code_asm::*;
use record::RecordValues;
use std::sync::atomic::{AtomicU64, Ordering};
use template::{HookCode, RecordTemplate, UntimedTemplate};
use tendril_wire::Hook;
use tendril_wire::events::HookShape;
pub use untimed::outermost_word;

/// Installs the runtime's handlers; the first installation stays.
pub fn install_handlers(handlers: Handlers) {
    let _ = STATE.handlers.set(handlers);
}

/// The installed handlers; [`build`] checks they are there before assembling.
fn handlers() -> &'static Handlers {
    STATE
        .handlers
        .get()
        .expect("build() checks that the handlers are installed")
}

/// Where a pointer check's slow path goes (`pointer_checks`), once the handlers are
/// installed.
pub fn pointer_slow_path() -> Result<crate::hooks::pointer_checks::SlowPath, AgentError> {
    let handlers = STATE
        .handlers
        .get()
        .ok_or(AgentError::HandlersNotInstalled)?;
    Ok(crate::hooks::pointer_checks::SlowPath {
        handler: handlers.pointer_target as usize as u64,
        slow_call: slow_call::address(),
    })
}

/// Room for one trampoline (body + hook); checked when the code is built.
pub const TRAMPOLINE_BYTES: u64 = 1024;
/// Registers the return hook pushes below the return-address slot.
pub const RETURN_HOOK_PUSHES: u64 = 4;

/// Registers the recording hook pushes below the return-address slot.
pub const RECORD_HOOK_PUSHES: u64 = 5;

/// A trampoline's code and the addresses that matter in it.
#[derive(Debug, Clone)]
pub struct TrampolineCode {
    /// The whole trampoline, to be written at its address.
    pub bytes: Vec<u8>,
    /// Where the function-entry patch jumps.
    pub hook: u64,
    /// Where the relocated body starts.
    pub body: u64,
    /// Where the body's address goes once the trampoline is written (a replace hook's
    /// original), if anywhere.
    pub body_sink: Option<&'static AtomicU64>,
}

/// The labels every hook defines: where the patch jumps and where the body goes.
struct Layout {
    assembler: CodeAssembler,
    entry: CodeLabel,
    body: CodeLabel,
}

/// Builds the trampoline for function `id` at `address`. `body_at` relocates the
/// function's overwritten instructions for the address the body will have and returns
/// their bytes (ending with the jump back into the function). `thunk_returns_to` is set
/// for a call thunk: the address the patched `call` returns to. `shape` is how the
/// entry reaches the hook, which a recording hook's entry events say.
///
/// Recording hooks are built during Scheme B discovery, while the target waits, so they
/// come from a template assembled once (see [`RecordTemplate`]); the others are
/// assembled each time.
pub fn build(
    address: u64,
    id: u32,
    kind: Hook,
    thunk_returns_to: Option<u64>,
    shape: HookShape,
    body_at: impl FnOnce(u64) -> Result<Vec<u8>, AgentError>,
) -> Result<TrampolineCode, AgentError> {
    build_in(
        address,
        TRAMPOLINE_BYTES,
        id,
        kind,
        thunk_returns_to,
        shape,
        body_at,
    )
}

/// [`build`] in `room` bytes reserved at `address` (a whole-function copy needs more
/// than [`TRAMPOLINE_BYTES`]).
pub fn build_in(
    address: u64,
    room: u64,
    id: u32,
    kind: Hook,
    thunk_returns_to: Option<u64>,
    shape: HookShape,
    body_at: impl FnOnce(u64) -> Result<Vec<u8>, AgentError>,
) -> Result<TrampolineCode, AgentError> {
    let Some(handlers) = STATE.handlers.get() else {
        return Err(AgentError::HandlersNotInstalled);
    };
    let body_sink = (kind == Hook::Backtrace && replaces_backtrace(handlers))
        .then_some(handlers.backtrace.body);
    let hook = match kind {
        Hook::Record | Hook::RecordRoot => {
            RecordTemplate::get(kind == Hook::RecordRoot, thunk_returns_to.is_some())?
                .instantiate(id, shape)
        }
        Hook::Untimed | Hook::RecordRootOutermost => {
            let after_call = thunk_returns_to.is_some();
            UntimedTemplate::get(kind == Hook::RecordRootOutermost, after_call)?.instantiate(id)
        }
        _ => assemble_hook(address, id, kind, thunk_returns_to, shape)
            .map_err(AgentError::Assembly)?,
    };
    let body = address + hook.body as u64;
    let mut bytes = hook.bytes;
    bytes.extend_from_slice(&body_at(body)?);
    if bytes.len() as u64 > room {
        return Err(AgentError::TrampolineTooLarge {
            needed: bytes.len(),
            reserved: room,
        });
    }
    Ok(TrampolineCode {
        bytes,
        hook: address + hook.entry as u64,
        body,
        body_sink,
    })
}

/// Whether a [`Hook::Backtrace`] built now replaces the unwinder's walk: only while no
/// stand-in has its original yet.
fn replaces_backtrace(handlers: &Handlers) -> bool {
    handlers.backtrace.body.load(Ordering::Acquire) == 0
}

/// Where a hook is assembled when its address does not matter: every reference it
/// makes is relative to itself or absolute.
const ASSEMBLY_BASE: u64 = 0x1000_0000;

/// Assembles the hook for function `id`.
fn assemble_hook(
    address: u64,
    id: u32,
    kind: Hook,
    thunk_returns_to: Option<u64>,
    shape: HookShape,
) -> Result<HookCode, IcedError> {
    let after_call = thunk_returns_to.is_some();
    let layout = new_layout()?;
    let handlers = handlers();
    let layout = match kind {
        Hook::Count => count::count_hook(layout, id)?,
        Hook::CountReturns => returns::count_returns_hook(layout, id, after_call)?,
        Hook::Record | Hook::RecordRoot => {
            let values = RecordValues::new(id, shape);
            record::record_hook(layout, kind == Hook::RecordRoot, after_call, values)?.0
        }
        Hook::Untimed | Hook::RecordRootOutermost => {
            let values = untimed::UntimedValues::new(id);
            let outermost = kind == Hook::RecordRootOutermost;
            untimed::untimed_hook(layout, values, outermost, after_call)?.0
        }
        Hook::UnwinderStarts => internal::internal_hook(layout, handlers.unwinder_starts)?,
        Hook::ExceptionCaught => internal::internal_hook(layout, handlers.exception_caught)?,
        Hook::Backtrace if replaces_backtrace(handlers) => {
            internal::replace_hook(layout, handlers.backtrace.replacement)?
        }
        Hook::Backtrace => internal::internal_hook(layout, handlers.unwinder_starts)?,
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
    let mut bytes = result.inner.code_buffer.clone();
    bytes.truncate(body);
    Ok((HookCode { bytes, entry, body }, result))
}

/// Starts a trampoline's hook.
fn new_layout() -> Result<Layout, IcedError> {
    let mut assembler = CodeAssembler::new(64)?;
    let entry = assembler.create_label();
    let body = assembler.create_label();
    Ok(Layout {
        assembler,
        entry,
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

#[cfg(test)]
mod test_code {
    //! What the hook kinds' tests share: a disassembler and a stand-in body.

    use crate::sys::error::AgentError;
    use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter};

    pub fn disassemble(code: &[u8], ip: u64) -> Vec<String> {
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
    pub fn body(len: usize) -> impl FnOnce(u64) -> Result<Vec<u8>, AgentError> {
        move |_| {
            let mut bytes = vec![0x90; len];
            bytes.extend_from_slice(&[0xe9, 0, 0, 0, 0]);
            Ok(bytes)
        }
    }
}
