//! The count hook: one `inc` of the thread's call counter for the function, then the
//! body. Its slow path (a thread without state yet) comes first, so the fast path falls
//! through into the body.

use super::{
    Layout, call_slow, handlers, load_state, restore_flags, save_flags, slow_call_pointer,
};
use crate::hooks::thread_layout::{self as thread_state, FLAG_PASSTHROUGH, STATE_FLAGS};
use iced_x86::code_asm::*;

pub(super) fn count_hook(mut layout: Layout, id: u32) -> Result<Layout, IcedError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks::stubs::build;
    use crate::hooks::stubs::test_code::{body, disassemble};
    use tendril_wire::Hook;

    #[test]
    fn count_hook_counts_into_the_thread_state_and_falls_into_the_body() {
        let address = 0x7f00_0000_1000;
        let code = build(
            address,
            3,
            Hook::Count,
            None,
            tendril_wire::events::HookShape::Jump,
            body(1),
        )
        .unwrap();
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
}
