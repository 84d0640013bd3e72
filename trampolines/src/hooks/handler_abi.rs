//! The ABI between the hooks and the runtime: the registers a slow path hands its
//! handler, and the set of handlers the runtime installs before the first hook is built.
//!
//! The one idea: the hook templates never import the code that answers them; the
//! runtime passes its handlers in as addresses, described here, so this module sits
//! below both `slow_call`/`stubs` and the layer state that keeps the installed set.

use std::sync::atomic::AtomicU64;

/// The registers as `tendril_slow_call` saved them, lowest address first. The stub's own
/// pushes lie above `return_address`.
#[repr(C)]
#[derive(Debug, Default)]
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

/// The runtime's answers to the stubs' slow paths. The runtime installs them once,
/// before the first hook is built (`stubs::install_handlers`); the templates never import
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
    /// A recording hook found its ring full, or has none yet (or the thread's untimed
    /// calls are to be written first).
    pub ring_space: Handler,
    /// The untimed hook found no slot of its (function in `rdx`, return address in
    /// `rax`) in the thread's table.
    pub untimed_miss: Handler,
    /// A recording hook's function runs in the graph for the first time (id in `edx`).
    pub discover: Handler,
    /// A pointer check in a recorded function's copy met a target its thread has not
    /// passed at that site (target in `rax`, the site's id in `edx`;
    /// `pointer_checks`).
    pub pointer_target: Handler,
    /// Address of the recording's invoked bytes (one per function id), or 0.
    pub invoked_table: fn() -> u64,
    /// Address of the word that numbers recordings (the untimed-call table's counts
    /// belong to one).
    pub generation_word: fn() -> u64,
    /// [`Hook::UnwinderStarts`]: the real return addresses go back on the stack.
    pub unwinder_starts: Handler,
    /// [`Hook::ExceptionCaught`]: the surviving frames' return hooks go back in.
    pub exception_caught: Handler,
    /// [`Hook::Backtrace`].
    pub backtrace: BacktraceStandIn,
}

/// How tendril's own stand-in for `_Unwind_Backtrace` is reached: the first copy of
/// the unwinder is replaced (`stubs::internal::replace_hook`) by `replacement`, which calls
/// the original through the body whose address goes to `body`; a further copy (an
/// unwinder linked statically as well) gets the plain unwinder hook.
#[derive(Clone, Copy)]
pub struct BacktraceStandIn {
    pub replacement: u64,
    pub body: &'static AtomicU64,
}
