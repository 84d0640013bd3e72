//! `tendril_slow_call`: how a hook stub calls Rust code without disturbing the thread.
//!
//! A stub's fast path is a few instructions of assembly that touch four registers it
//! saved itself. Anything more (registering a thread, a return that does not match the
//! shadow stack, an unwinder starting) is Rust code, which may use every caller-saved
//! register, vector registers included. The stub puts the handler's address in `r11` and
//! calls `tendril_slow_call`, which saves every general register, the flags and the
//! whole extended state (`xsave`), calls `handler(&mut SavedRegisters)`, and restores it
//! all — including any register the handler chose to change, which is how a handler
//! answers (e.g. the new thread state in `rcx`).
//!
//! The one idea: callers compiled with `-fipa-ra` keep live values in caller-saved
//! registers across calls to functions they know leave them alone, so from the outside
//! a hook must be invisible in every register but the ones it documents.
//!
//! It also counts, in the thread-local `tendril_slow_depth`, how many slow calls the
//! thread is inside, and in the word after it how many it has finished: a thread in a
//! slow call is inside a hook, which may still write a return hook's exit once the
//! handler returns (see `retire`, which must know exactly which threads are inside
//! tendril's code before the unwinder's hooks come out; the finished count tells it
//! that a thread asleep at a stop was not in a slow call then).

pub use crate::hooks::handler_abi::{Handler, SavedRegisters};
use crate::hooks::state::{HooksState, STATE};
use std::sync::atomic::Ordering;

// The `.cfi_*` lines tell an unwinder (a backtrace, a sampler, an exception passing
// through a handler) where the caller's frame is at every instruction: the CFA (the
// stack pointer before the call) is rsp-based through the pushes, then rbx-based from
// the moment rsp is realigned for `xsave` until it is put back; each saved register's
// slot is given as it is pushed and forgotten as it is popped. (The flags, DWARF
// register 49, are left out: libgcc's unwinder knows only the first 17 registers.)
core::arch::global_asm!(
    ".pushsection .text",
    ".globl tendril_slow_call",
    ".hidden tendril_slow_call",
    ".type tendril_slow_call, @function",
    "tendril_slow_call:",
    ".cfi_startproc",
    "push rbp",
    ".cfi_def_cfa_offset 16",
    ".cfi_offset rbp, -16",
    "mov rbp, rsp",
    "pushfq",
    ".cfi_def_cfa_offset 24",
    "push rax", ".cfi_def_cfa_offset 32", ".cfi_offset rax, -32",
    "push rbx", ".cfi_def_cfa_offset 40", ".cfi_offset rbx, -40",
    "push rcx", ".cfi_def_cfa_offset 48", ".cfi_offset rcx, -48",
    "push rdx", ".cfi_def_cfa_offset 56", ".cfi_offset rdx, -56",
    "push rsi", ".cfi_def_cfa_offset 64", ".cfi_offset rsi, -64",
    "push rdi", ".cfi_def_cfa_offset 72", ".cfi_offset rdi, -72",
    "push r8", ".cfi_def_cfa_offset 80", ".cfi_offset r8, -80",
    "push r9", ".cfi_def_cfa_offset 88", ".cfi_offset r9, -88",
    "push r10", ".cfi_def_cfa_offset 96", ".cfi_offset r10, -96",
    "push r11", ".cfi_def_cfa_offset 104", ".cfi_offset r11, -104",
    "push r12", ".cfi_def_cfa_offset 112", ".cfi_offset r12, -112",
    "push r13", ".cfi_def_cfa_offset 120", ".cfi_offset r13, -120",
    "push r14", ".cfi_def_cfa_offset 128", ".cfi_offset r14, -128",
    "push r15", ".cfi_def_cfa_offset 136", ".cfi_offset r15, -136",
    // The flags are saved: `inc` may change them.
    "mov rax, qword ptr [rip + tendril_slow_depth@GOTTPOFF]",
    "inc qword ptr fs:[rax]",
    "mov rbx, rsp",
    // rbx (callee-saved, so the handler keeps it) holds the frame while rsp moves.
    ".cfi_def_cfa_register rbx",
    "sub rsp, qword ptr [rip + {state} + {xsave_size}]",
    "and rsp, -64",
    // XRSTOR requires the reserved bytes of the xsave header to be zero.
    "mov qword ptr [rsp + 512], 0", "mov qword ptr [rsp + 520], 0",
    "mov qword ptr [rsp + 528], 0", "mov qword ptr [rsp + 536], 0",
    "mov qword ptr [rsp + 544], 0", "mov qword ptr [rsp + 552], 0",
    "mov qword ptr [rsp + 560], 0", "mov qword ptr [rsp + 568], 0",
    "mov eax, -1",
    "mov edx, -1",
    "xsave64 [rsp]",
    "cld",
    "mov rdi, rbx",
    "call r11",
    "mov eax, -1",
    "mov edx, -1",
    "xrstor64 [rsp]",
    "mov rax, qword ptr [rip + tendril_slow_depth@GOTTPOFF]",
    // Counted as done before the depth falls: a reader that sees the depth at zero
    // then sees this call counted (x86 keeps stores, and loads, in order).
    "inc qword ptr fs:[rax + 8]",
    "dec qword ptr fs:[rax]",
    "mov rsp, rbx",
    ".cfi_def_cfa_register rsp",
    "pop r15", ".cfi_def_cfa_offset 128", ".cfi_restore r15",
    "pop r14", ".cfi_def_cfa_offset 120", ".cfi_restore r14",
    "pop r13", ".cfi_def_cfa_offset 112", ".cfi_restore r13",
    "pop r12", ".cfi_def_cfa_offset 104", ".cfi_restore r12",
    "pop r11", ".cfi_def_cfa_offset 96", ".cfi_restore r11",
    "pop r10", ".cfi_def_cfa_offset 88", ".cfi_restore r10",
    "pop r9", ".cfi_def_cfa_offset 80", ".cfi_restore r9",
    "pop r8", ".cfi_def_cfa_offset 72", ".cfi_restore r8",
    "pop rdi", ".cfi_def_cfa_offset 64", ".cfi_restore rdi",
    "pop rsi", ".cfi_def_cfa_offset 56", ".cfi_restore rsi",
    "pop rdx", ".cfi_def_cfa_offset 48", ".cfi_restore rdx",
    "pop rcx", ".cfi_def_cfa_offset 40", ".cfi_restore rcx",
    "pop rbx", ".cfi_def_cfa_offset 32", ".cfi_restore rbx",
    "pop rax", ".cfi_def_cfa_offset 24", ".cfi_restore rax",
    "popfq",
    ".cfi_def_cfa_offset 16",
    "pop rbp",
    ".cfi_def_cfa_offset 8",
    ".cfi_restore rbp",
    "ret",
    ".cfi_endproc",
    ".size tendril_slow_call, . - tendril_slow_call",
    ".popsection",
    state = sym STATE,
    xsave_size = const std::mem::offset_of!(HooksState, xsave_area_bytes),
);

core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".balign 8",
    ".globl tendril_slow_depth",
    ".hidden tendril_slow_depth",
    ".type tendril_slow_depth, @object",
    ".size tendril_slow_depth, 16",
    "tendril_slow_depth:",
    ".zero 16",
    ".popsection",
);

unsafe extern "C" {
    fn tendril_slow_call();
}

/// Where, after a thread's `tendril_slow_depth`, the count of slow calls it finished is.
pub const FINISHED_OFFSET: u64 = 8;

/// The address of the calling thread's `tendril_slow_depth`: how many slow calls it is
/// inside (and, [`FINISHED_OFFSET`] bytes on, how many it finished). Other threads read
/// them there (atomically, whole aligned words) while this thread lives.
pub fn current_depth_address() -> u64 {
    let (thread_pointer, offset): (u64, i64);
    // SAFETY: fs:0 holds the thread pointer itself (the x86-64 TLS ABI), and the GOT
    // entry holds the variable's initial-exec offset from it; both are plain reads.
    unsafe {
        std::arch::asm!(
            "mov {tp}, qword ptr fs:[0]",
            "mov {offset}, qword ptr [rip + tendril_slow_depth@GOTTPOFF]",
            tp = out(reg) thread_pointer,
            offset = out(reg) offset,
            options(nostack, readonly, preserves_flags)
        );
    }
    thread_pointer.wrapping_add_signed(offset)
}

/// Sizes the xsave area from CPUID. Call before the first patch.
pub fn prepare() {
    STATE.xsave_sized.call_once(|| {
        // CPUID leaf 0xD sub-leaf 0 exists on every cpu with XSAVE, which every x86-64
        // Linux machine tendril supports has; EBX is the xsave area size for the
        // features enabled in XCR0.
        let size = std::arch::x86_64::__cpuid_count(0xd, 0).ebx as u64;
        // Written once, before the first stub that reads it is patched in (the patch is
        // published after this store).
        STATE
            .xsave_area_bytes
            .store(size.max(576) + 64, Ordering::SeqCst);
    });
}

/// Address of `tendril_slow_call`, which stubs call.
pub fn address() -> u64 {
    tendril_slow_call as *const () as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    static DEPTH_SEEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    extern "C" fn double_rcx_and_set_xmm(registers: &mut SavedRegisters) {
        registers.rcx *= 2;
        // SAFETY: the address is this thread's own live TLS word.
        let depth = unsafe { *(current_depth_address() as *const u64) };
        DEPTH_SEEN.store(depth, std::sync::atomic::Ordering::SeqCst);
        // Clobber a vector register and the flags: the caller must not see it.
        // SAFETY: writes xmm7 and flags, both caller-saved in the handler's ABI.
        unsafe {
            std::arch::asm!("pcmpeqd xmm7, xmm7", "xor eax, eax", out("xmm7") _, out("eax") _)
        };
    }

    #[test]
    fn a_handler_sees_and_changes_registers_and_nothing_else_changes() {
        prepare();
        let finished_address = current_depth_address() + FINISHED_OFFSET;
        // SAFETY: the address is this thread's own live TLS word.
        let finished_before = unsafe { *(finished_address as *const u64) };
        let handler: Handler = double_rcx_and_set_xmm;
        let (rcx_after, rdx_after, xmm_low): (u64, u64, u64);
        // SAFETY: calls tendril_slow_call as stubs do, with r11 = handler; every other
        // register it could disturb is declared as an input or output here.
        unsafe {
            std::arch::asm!(
                "mov rcx, 21",
                "mov rdx, 77",
                "movq xmm7, rdx",
                "call {slow}",
                "movq {xmm}, xmm7",
                slow = in(reg) address(),
                xmm = out(reg) xmm_low,
                in("r11") handler as usize,
                out("rcx") rcx_after,
                out("rdx") rdx_after,
                out("xmm7") _,
            );
        }
        assert_eq!(rcx_after, 42);
        assert_eq!(DEPTH_SEEN.load(std::sync::atomic::Ordering::SeqCst), 1);
        // SAFETY: the address is this thread's own live TLS word.
        assert_eq!(unsafe { *(current_depth_address() as *const u64) }, 0);
        // SAFETY: as above.
        let finished_after = unsafe { *(finished_address as *const u64) };
        assert_eq!(
            finished_after,
            finished_before + 1,
            "the call is counted as finished"
        );
        assert_eq!(rdx_after, 77);
        assert_eq!(xmm_low, 77, "xmm7 is restored");
    }

    extern "C" fn leave_all_alone(_registers: &mut SavedRegisters) {}

    #[test]
    fn a_backtrace_at_every_step_of_a_slow_call_reaches_its_caller() {
        prepare();
        let handler: Handler = leave_all_alone;
        let steps =
            crate::hooks::unwind_probe::step_through(address(), [0, 0, 0, handler as usize as u64]);
        crate::hooks::unwind_probe::assert_every_walk_reaches_the_caller(
            "tendril_slow_call",
            address(),
            &steps,
        );
    }
}
