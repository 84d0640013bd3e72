//! The planner's answers about threads on a patch's bytes: where a thread between
//! overwritten instructions or on a pad goes on, and which batches a peek may install.

use super::*;
use crate::code::entry_plan::plan_entry_patch;

/// A site for `code` at `function`, its trampoline's body at `body`.
fn site(function: u64, code: &[u8], body: u64) -> Site {
    let plan = plan_entry_patch(function, code).unwrap();
    let relocated = crate::code::relocate::relocate(function, code, &plan, body).unwrap();
    let patch_at = function + plan.patch_offset as u64;
    Site {
        patch_at,
        original: [0; MAX_ENTRY_PATCH],
        pad: None,
        trampoline: Trampoline {
            body,
            hook: body - 0x100,
            entry_bytes: code[..plan.patch_offset + plan.overwritten_len].to_vec(),
            plan,
            instruction_map: relocated.instruction_map,
        },
        owner: 1,
        id: 0,
        kind: tendril_wire::Hook::Count,
        internal: false,
        recorded: [None, None],
    }
}

#[test]
fn a_thread_between_overwritten_instructions_goes_on_in_the_copy() {
    let f = 0x7f00_0000_1000;
    // push rbp (kept); mov rbp,rsp; sub rsp,0x10; leave; ret
    let code = [0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0xc9, 0xc3];
    let body = 0x7f00_4000_0000;
    let batch = [site(f, &code, body)];
    // The copy is: push rbp (1 byte), mov rbp,rsp (3), sub rsp,0x10 (4), jmp back.
    assert_eq!(resume_point_in_copy(f + 4, &batch), Some(body + 4));
    // At the patch itself, or before it (the kept push), or after it: no move.
    assert_eq!(resume_point_in_copy(f + 1, &batch), None);
    assert_eq!(resume_point_in_copy(f, &batch), None);
    assert_eq!(resume_point_in_copy(f + 8, &batch), None);
    // Inside an instruction (no thread can be there): no move either.
    assert_eq!(resume_point_in_copy(f + 5, &batch), None);
}

#[test]
fn a_thread_on_a_pad_goes_on_to_its_hook() {
    let pads = [PendingPad {
        pad: Pad {
            address: 0x5000,
            original: [0xcc; PAD_LEN as usize],
        },
        hook: 0x9000,
        recorded: None,
    }];
    assert_eq!(resume_point_off_pad(0x5000, &pads), Some(0x9000));
    assert_eq!(
        resume_point_off_pad(0x5000 + PAD_LEN - 1, &pads),
        Some(0x9000)
    );
    assert_eq!(resume_point_off_pad(0x5000 + PAD_LEN, &pads), None);
}

#[test]
fn only_the_unwinders_entries_are_installed_with_a_peek() {
    let f = 0x7f00_0000_1000;
    let code = [0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0xc9, 0xc3];
    let body = 0x7f00_4000_0000;
    let hot = site(f, &code, body);
    assert!(hot.needs_stop());
    assert_eq!(moves_off_unwinder_entries(std::slice::from_ref(&hot)), None);
    let mut unwinder = site(f, &code, body);
    unwinder.internal = true;
    // The one boundary inside the overwritten bytes, moved as a stop would move it.
    assert_eq!(
        moves_off_unwinder_entries(std::slice::from_ref(&unwinder)),
        Some(vec![(f + 4, f + 5, body + 4)])
    );
    assert_eq!(
        resume_point_in_copy(f + 4, std::slice::from_ref(&unwinder)),
        Some(body + 4)
    );
    // Beside any other function's entry, the batch needs a stop: that entry's guard
    // would be up for the whole peek.
    let one_instruction = [0xb8, 0x01, 0x00, 0x00, 0x00, 0xc3]; // mov eax,1; ret
    let other = site(f + 0x100, &one_instruction, body + 0x100);
    assert!(!other.needs_stop());
    assert_eq!(moves_off_unwinder_entries(&[unwinder, other]), None);
    let mut unwinder = site(f, &code, body);
    unwinder.internal = true;
    assert_eq!(moves_off_unwinder_entries(&[unwinder, hot]), None);
}
