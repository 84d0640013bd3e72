//! The prologue simulation on the code runtimes generate, and the rules run on a stack.

use super::*;

/// Python 3.12's perf trampoline (`Python/asm_trampoline.S`): no frame pointer.
const PYTHON_TRAMPOLINE: [u8; 11] = [
    0x48, 0x83, 0xec, 0x08, // sub rsp, 8
    0xff, 0xd1, // call rcx
    0x48, 0x83, 0xc4, 0x08, // add rsp, 8
    0xc3, // ret
];

/// A function with a frame pointer, as the fixture and V8 generate them.
const WITH_FRAME: [u8; 16] = [
    0x55, // push rbp
    0x48, 0x89, 0xe5, // mov rbp, rsp
    0x53, // push rbx
    0x48, 0x83, 0xec, 0x18, // sub rsp, 0x18
    0xff, 0xd0, // call rax
    0x48, 0x8b, 0x5d, 0xf8, // mov rbx, [rbp-8]
    0xc9, // leave
];

const START: u64 = 0x7f00_0000_1000;

#[test]
fn a_python_trampoline_steps_by_its_stack_offset() {
    let at =
        |offset: u64, is_return| simulate(&PYTHON_TRAMPOLINE, START, START + offset, is_return);
    let offset = |return_at| Rule::Offset {
        return_at,
        bp_at: None,
    };
    // Returned to from the evaluation loop: below the return address, the 8 bytes.
    assert_eq!(at(6, true), offset(8));
    // Sampled in it: at its entry, at the call, after the `add`.
    assert_eq!(at(0, false), offset(0));
    assert_eq!(at(4, false), offset(8));
    assert_eq!(at(10, false), offset(0));
}

#[test]
fn a_frame_pointer_is_used_once_it_is_set_up() {
    // Returned to after `call rax`.
    assert_eq!(
        simulate(&WITH_FRAME, START, START + 11, true),
        Rule::FramePointer
    );
    // Sampled after `push rbp`, before `mov rbp, rsp`: rbp is at the stack pointer.
    assert_eq!(
        simulate(&WITH_FRAME, START, START + 1, false),
        Rule::Offset {
            return_at: 8,
            bp_at: Some(0)
        }
    );
    // Not on an instruction boundary, or past the bytes read: the frame pointer.
    assert_eq!(
        simulate(&WITH_FRAME, START, START + 2, false),
        Rule::FramePointer
    );
    assert_eq!(
        simulate(&WITH_FRAME[..4], START, START + 11, true),
        Rule::FramePointer
    );
}

#[test]
fn prologue_checks_and_pushes_are_followed() {
    let code = [
        0xf3, 0x0f, 0x1e, 0xfa, // endbr64
        0x48, 0x8b, 0x05, 0, 0, 0, 0, // mov rax, [rip]
        0x75, 0x02, // jne +2
        0x41, 0x57, // push r15
        0x6a, 0x01, // push 1
        0xe8, 0, 0, 0, 0, // call (returns)
        0x48, 0x81, 0xec, 0, 1, 0, 0, // sub rsp, 0x100
        0xff, 0x10, // call [rax]
    ];
    let len = code.len() as u64;
    assert_eq!(
        simulate(&code, START, START + len, true),
        Rule::Offset {
            return_at: 16 + 0x100,
            bp_at: None
        }
    );
    // `pop` and `leave` move rsp in ways not followed.
    assert_eq!(
        simulate(&[0x5b, 0xc3], START, START + 1, false),
        Rule::FramePointer
    );
}

/// A stack at 0x1000: words from there up.
fn stack(words: &[u64]) -> impl FnMut(u64) -> Result<u64, ()> + '_ {
    move |address| {
        let index = address.checked_sub(0x1000).ok_or(())? / 8;
        words.get(index as usize).copied().ok_or(())
    }
}

#[test]
fn rules_step_to_the_caller_and_end_at_a_zero_return_address() {
    let words = [0xaaaa, 0x5555_1234, 0x1030, 0x6666_0000, 0, 0, 0, 0];
    let mut read = stack(&words);
    let mut regs = UnwindRegsX86_64::new(START + 6, 0x1000, 0x9999);
    let step = execute(
        Rule::Offset {
            return_at: 8,
            bp_at: None,
        },
        &mut regs,
        &mut read,
    );
    assert_eq!(step, Ok(Some(0x5555_1234)));
    assert_eq!((regs.sp(), regs.bp()), (0x1010, 0x9999));
    // By frame pointer: rbp 0x1010 holds the caller's rbp, then the return address.
    regs.set_bp(0x1010);
    assert_eq!(
        execute(Rule::FramePointer, &mut regs, &mut read),
        Ok(Some(0x6666_0000))
    );
    assert_eq!((regs.sp(), regs.bp()), (0x1020, 0x1030));
    // The next frame's return address is 0: the outermost frame.
    assert_eq!(execute(Rule::FramePointer, &mut regs, &mut read), Ok(None));
    // A frame pointer below the stack pointer is not one.
    let mut regs = UnwindRegsX86_64::new(START, 0x1020, 0x1000);
    assert_eq!(execute(Rule::FramePointer, &mut regs, &mut read), Err(()));
}

#[test]
fn frames_outside_the_modules_code_are_jit_frames() {
    let unwinder = JitUnwinder::new(1, vec![0x5000..0x6000, 0x1000..0x2000]);
    assert!(!unwinder.covers(0x1000) && !unwinder.covers(0x5fff));
    assert!(unwinder.covers(0x2000) && unwinder.covers(0x4fff) && unwinder.covers(0x10));
}
