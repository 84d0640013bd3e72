//! Layer 3, hook templates: the machine code a patched function jumps to, and the ABI
//! it shares with the runtime.
//!
//! `stubs` assembles each hook kind's trampoline (its data: `stubs::template`); `handler_abi`
//! is what a stub hands the runtime's handlers; `slow_call` is the one way a stub calls
//! Rust code; `thread_layout` is the per-thread state the stubs address by offset, and `state_access`
//! the one sound way Rust code reaches it (raw pointers and atomics, never references). The
//! runtime's handlers are passed in as addresses, never imported, so templates sit
//! below the code that answers them. Inside a function copied for `tendril edges`,
//! `edge_counters` counts blocks and edges and `path_register` numbers paths (both
//! built from `inserted_code`). `unwind_probe` (tests only) checks that the
//! agent's assembly routines carry the unwind information a backtrace needs. The layer's
//! statics are `state`.

pub mod edge_counters;
pub mod handler_abi;
mod inserted_code;
pub mod path_register;
pub mod pointer_checks;
pub mod slow_call;
mod state;
pub mod state_access;
pub mod stubs;
pub mod thread_layout;
#[cfg(test)]
pub mod unwind_probe;
