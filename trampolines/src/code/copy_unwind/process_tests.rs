//! The whole chain in this process, with libgcc's unwinder: the FDE of a real function
//! found (`sys::frame_registry`), its rows read, a copy's section written and
//! registered, and then found by the unwinder, walked by a backtrace and unwound through
//! by a panic, in a copy that runs for real with a counter-like stretch of pushes.

use super::*;
use crate::sys::frame_registry::{find_fde, register_on_this_thread, unwinder_finds};
use std::ffi::{c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

// The original: `fn(callback, argument)` calls `callback(argument)` with rbx saved, so
// its rows move the CFA and save a register. Its copy is written by hand below.
core::arch::global_asm!(
    ".pushsection .text",
    ".globl tendril_copy_unwind_test_call",
    ".hidden tendril_copy_unwind_test_call",
    ".type tendril_copy_unwind_test_call, @function",
    "tendril_copy_unwind_test_call:",
    ".cfi_startproc",
    "push rbx",
    ".cfi_adjust_cfa_offset 8",
    ".cfi_offset rbx, -16",
    "mov rax, rdi",
    "mov rdi, rsi",
    "call rax",
    "pop rbx",
    ".cfi_adjust_cfa_offset -8",
    ".cfi_restore rbx",
    "ret",
    ".cfi_endproc",
    ".size tendril_copy_unwind_test_call, . - tendril_copy_unwind_test_call",
    ".popsection",
);

/// Called with a `*mut Vec<u64>` for the return addresses it sees.
type Callback = extern "C-unwind" fn(*mut c_void);
type CallWith = unsafe extern "C-unwind" fn(Callback, *mut c_void);

unsafe extern "C-unwind" {
    fn tendril_copy_unwind_test_call(callback: Callback, frames: *mut c_void);
}

unsafe extern "C" {
    fn _Unwind_Backtrace(
        trace: extern "C" fn(*mut c_void, *mut c_void) -> c_int,
        argument: *mut c_void,
    ) -> c_int;
    fn _Unwind_GetIP(context: *mut c_void) -> usize;
}

/// The original's length and the offsets of its instructions.
const ORIGINAL_LEN: u64 = 11;
const CALL: u64 = 7;
const AFTER_CALL: u64 = 9;

/// The copy: the original's instructions, with the call moved inside a counter-like
/// stretch (`lea rsp,[rsp-128]; push rcx; push rcx` … `pop rcx; pop rcx; lea
/// rsp,[rsp+128]`), so the callback runs, and unwinds, with 144 more bytes on the stack.
/// Each: bytes, the original instruction whose row applies, bytes pushed at its start.
const COPY: [(&[u8], u64, u32); 12] = [
    (&[0x53], 0, 0),                                             // push rbx
    (&[0x48, 0x89, 0xf8], 1, 0),                                 // mov rax, rdi
    (&[0x48, 0x89, 0xf7], 4, 0),                                 // mov rdi, rsi
    (&[0x48, 0x8d, 0x64, 0x24, 0x80], CALL, 0),                  // lea rsp, [rsp-128]
    (&[0x51], CALL, 128),                                        // push rcx
    (&[0x51], CALL, 136),                                        // push rcx
    (&[0xff, 0xd0], CALL, 144),                                  // call rax
    (&[0x59], AFTER_CALL, 144),                                  // pop rcx
    (&[0x59], AFTER_CALL, 136),                                  // pop rcx
    (&[0x48, 0x8d, 0xa4, 0x24, 0x80, 0, 0, 0], AFTER_CALL, 128), // lea rsp, [rsp+128]
    (&[0x5b], AFTER_CALL, 0),                                    // pop rbx
    (&[0xc3], 10, 0),                                            // ret
];

/// A fresh page of its own, never unmapped: the unwinder keeps the FDEs registered for
/// it, which must never describe other code later mapped there.
fn leaked_page(protection: c_int) -> u64 {
    // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            protection,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(page, libc::MAP_FAILED);
    page as u64
}

/// The original's rows, from its FDE as the unwinder finds it.
fn original() -> OriginalUnwind {
    let address = tendril_copy_unwind_test_call as *const () as u64;
    let found = find_fde(address + 2).expect("the assembled function has an FDE");
    assert_eq!(found.function, address);
    let (start, section) = found.section();
    let original = OriginalUnwind::parse(section, start, found.fde).unwrap();
    assert_eq!(
        (original.start, original.end),
        (address, address + ORIGINAL_LEN)
    );
    original
}

#[test]
fn the_unwinder_finds_a_registered_copy_with_the_originals_rows_moved() {
    let original = original();
    let copy_start = leaked_page(libc::PROT_NONE);
    let len = ORIGINAL_LEN;
    let one_to_one: Vec<CopiedInstruction> = (0..len)
        .map(|offset| CopiedInstruction {
            copy: copy_start + offset,
            row_of: original.start + offset,
            extra_stack: 0,
        })
        .collect();
    assert!(unwinder_finds(copy_start).is_none(), "no code there yet");
    register_on_this_thread(
        eh_frame_for_copy(&original, copy_start, len, &one_to_one, None).unwrap(),
    );
    for offset in 0..len {
        let found = unwinder_finds(copy_start + offset).expect("the copy's FDE is registered");
        assert_eq!(found.function, copy_start);
        let (start, section) = found.section();
        let copy = OriginalUnwind::parse(section, start, found.fde).unwrap();
        assert_eq!((copy.start, copy.end), (copy_start, copy_start + len));
        let row = copy.row_at(copy_start + offset).unwrap();
        let original_row = original.row_at(original.start + offset).unwrap();
        assert_eq!(
            (row.cfa_register, row.cfa_offset),
            (original_row.cfa_register, original_row.cfa_offset)
        );
    }
    assert!(
        unwinder_finds(copy_start + len).is_none(),
        "the FDE ends with the copy"
    );
}

/// Records the return addresses on the stack, then panics.
extern "C-unwind" fn record_frames_and_panic(frames: *mut c_void) {
    extern "C" fn record(context: *mut c_void, frames: *mut c_void) -> c_int {
        // SAFETY: the unwinder passes the context of the frame being walked.
        let ip = unsafe { _Unwind_GetIP(context) } as u64;
        // SAFETY: `frames` is the vector handed to `_Unwind_Backtrace` below.
        unsafe { (*frames.cast::<Vec<u64>>()).push(ip) };
        0 // _URC_NO_REASON: go on
    }
    // SAFETY: walks this thread's stack; `frames` is valid for the walk.
    unsafe { _Unwind_Backtrace(record, frames) };
    // No panic hook, no message: the unwinding itself is the test.
    resume_unwind(Box::new(ThroughTheCopy));
}

struct ThroughTheCopy;

/// Calls `function` (the original or the copy) with the panicking callback; returns
/// the return addresses the backtrace saw.
fn panic_through(function: CallWith) -> Vec<u64> {
    let mut frames = Vec::new();
    let frames_pointer: *mut c_void = (&mut frames as *mut Vec<u64>).cast();
    // SAFETY: `function` is the assembled original or its copy: it calls the callback
    // with the pointer, which stays valid across the call.
    let result = catch_unwind(AssertUnwindSafe(|| unsafe {
        function(record_frames_and_panic, frames_pointer)
    }));
    let payload = result.expect_err("the callback panicked");
    assert!(payload.is::<ThroughTheCopy>());
    frames
}

#[test]
fn a_panic_and_a_backtrace_pass_through_a_copy_with_inserted_pushes() {
    let original = original();
    let through_original = panic_through(tendril_copy_unwind_test_call);
    let at_original = through_original
        .iter()
        .position(|&ip| ip == original.start + AFTER_CALL)
        .expect("the backtrace passes the original");

    let copy_start = leaked_page(libc::PROT_READ | libc::PROT_WRITE);
    let mut instructions = Vec::new();
    let mut at = copy_start;
    for (bytes, row_of, extra_stack) in COPY {
        // SAFETY: the page is this test's, writable, and the copy (28 bytes) fits.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), at as *mut u8, bytes.len()) };
        instructions.push(CopiedInstruction {
            copy: at,
            row_of: original.start + row_of,
            extra_stack,
        });
        at += bytes.len() as u64;
    }
    let len = at - copy_start;
    // SAFETY: makes this test's page executable; nothing runs there yet.
    let protected = unsafe {
        libc::mprotect(
            copy_start as *mut c_void,
            4096,
            libc::PROT_READ | libc::PROT_EXEC,
        )
    };
    assert_eq!(protected, 0);
    register_on_this_thread(
        eh_frame_for_copy(&original, copy_start, len, &instructions, None).unwrap(),
    );

    // SAFETY: the copy is the original's code, moved: same arguments, same behaviour.
    let copy = unsafe { std::mem::transmute::<u64, CallWith>(copy_start) };
    let frames = panic_through(copy);
    let return_address = copy_start + 16;
    let at_copy = frames
        .iter()
        .position(|&ip| ip == return_address)
        .expect("the backtrace passes the copy");
    // Past the copy, the walk finds its caller as past the original: the CFA (144 bytes
    // further) and the return address were recovered right.
    assert_eq!(
        frames.get(at_copy + 1),
        through_original.get(at_original + 1),
        "{frames:x?}"
    );
}
