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
//! thread is inside: a thread in a slow call is inside a hook, which may still write a
//! return hook's exit once the handler returns (see `retire`, which must know exactly
//! which threads are inside tendril's code before the unwinder's hooks come out).

use std::sync::Once;

/// The registers as `tendril_slow_call` saved them, lowest address first. The stub's own
/// pushes lie above `return_address`.
#[repr(C)]
#[derive(Debug)]
pub struct SavedRegisters {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub rdi: u64,
    pub rsi: u64,
    pub rdx: u64,
    pub rcx: u64,
    pub rbx: u64,
    pub rax: u64,
    pub rflags: u64,
    pub rbp: u64,
    /// Where `tendril_slow_call` returns to, inside the stub.
    pub return_address: u64,
}

impl SavedRegisters {
    /// The address just above the return address: the stub's stack pointer before it
    /// called `tendril_slow_call`.
    pub fn caller_stack_pointer(&self) -> u64 {
        &self.return_address as *const u64 as u64 + 8
    }
}

/// A slow-path handler, called with the thread's saved registers.
pub type Handler = extern "C" fn(&mut SavedRegisters);

core::arch::global_asm!(
    ".pushsection .text",
    ".globl tendril_slow_call",
    ".hidden tendril_slow_call",
    ".type tendril_slow_call, @function",
    "tendril_slow_call:",
    "push rbp",
    "mov rbp, rsp",
    "pushfq",
    "push rax", "push rbx", "push rcx", "push rdx", "push rsi", "push rdi",
    "push r8", "push r9", "push r10", "push r11", "push r12", "push r13", "push r14", "push r15",
    // The flags are saved: `inc` may change them.
    "mov rax, qword ptr [rip + tendril_slow_depth@GOTTPOFF]",
    "inc qword ptr fs:[rax]",
    "mov rbx, rsp",
    "sub rsp, qword ptr [rip + {xsave_size}]",
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
    "dec qword ptr fs:[rax]",
    "mov rsp, rbx",
    "pop r15", "pop r14", "pop r13", "pop r12", "pop r11", "pop r10", "pop r9", "pop r8",
    "pop rdi", "pop rsi", "pop rdx", "pop rcx", "pop rbx", "pop rax",
    "popfq",
    "pop rbp",
    "ret",
    ".size tendril_slow_call, . - tendril_slow_call",
    ".popsection",
    xsave_size = sym XSAVE_AREA_BYTES,
);

core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".balign 8",
    ".globl tendril_slow_depth",
    ".hidden tendril_slow_depth",
    ".type tendril_slow_depth, @object",
    ".size tendril_slow_depth, 8",
    "tendril_slow_depth:",
    ".zero 8",
    ".popsection",
);

unsafe extern "C" {
    fn tendril_slow_call();
}

/// The address of the calling thread's `tendril_slow_depth`: how many slow calls it is
/// inside. Other threads read it there (atomically, a whole aligned word) while this
/// thread lives.
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

/// Bytes `tendril_slow_call` reserves for `xsave`: the size CPUID gives for the enabled
/// features, plus room to align to 64. Set by [`prepare`] before any stub runs.
static mut XSAVE_AREA_BYTES: u64 = 16 * 1024;

/// Sizes the xsave area from CPUID. Call before the first patch.
pub fn prepare() {
    static SIZED: Once = Once::new();
    SIZED.call_once(|| {
        // SAFETY: CPUID leaf 0xD sub-leaf 0 exists on every cpu with XSAVE, which every
        // x86-64 Linux machine tendril supports has; EBX is the xsave area size for the
        // features enabled in XCR0. Written once, before any stub can read it.
        unsafe {
            let size = std::arch::x86_64::__cpuid_count(0xd, 0).ebx as u64;
            XSAVE_AREA_BYTES = size.max(576) + 64;
        }
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
        assert_eq!(rdx_after, 77);
        assert_eq!(xmm_low, 77, "xmm7 is restored");
    }
}
