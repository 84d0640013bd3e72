//! The agent's own hooks: an internal hook calls an agent handler with every register
//! saved, then runs the function; a replace hook jumps to an agent function with the
//! patched function's signature, which calls the original through the body.

use super::{Layout, call_slow, slow_call_pointer};
use crate::hooks::slow_call::Handler;
use iced_x86::code_asm::*;

/// Calls `handler` with every register saved, then runs the function.
pub(super) fn internal_hook(mut layout: Layout, handler: Handler) -> Result<Layout, IcedError> {
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
pub(super) fn replace_hook(mut layout: Layout, target: u64) -> Result<Layout, IcedError> {
    let a = &mut layout.assembler;
    let mut pointer = a.create_label();
    a.set_label(&mut layout.entry)?;
    a.jmp(qword_ptr(pointer))?;
    a.set_label(&mut pointer)?;
    a.dq(&[target])?;
    Ok(layout)
}
