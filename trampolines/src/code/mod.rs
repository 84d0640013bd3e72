//! Layer 2, code reading and planning: pure functions over bytes and addresses.
//!
//! What an entry patch overwrites (`entry_plan`) and how its instructions are relocated
//! (`relocate`), where dead padding can hold a jump (`padding`), and which branches land
//! where (`branch_index`). For edge profiles (issue 18): a whole function's basic blocks
//! and control-flow graph (`control_flow`, with `jump_table` for `switch` dispatch),
//! where its status flags are live (`flags_liveness`), its copy with counters inserted
//! (`function_copy`, which places the Ball–Larus path register's code, numbered by
//! `tendril_callgraph::paths`) and the copy's unwind rows (`copy_unwind`).
//! Nothing here reads or writes the process: callers hand in the bytes, so every
//! decision is unit-tested without a target.

pub mod branch_index;
pub mod control_flow;
pub mod copy_unwind;
pub mod entry_plan;
#[cfg(all(test, not(miri)))]
pub mod executable_memory;
pub mod flags_liveness;
pub mod function_copy;
pub mod jump_table;
pub mod lsda;
pub mod padding;
pub mod relocate;
