//! Layer 2, code reading and planning: pure functions over bytes and addresses.
//!
//! What an entry patch overwrites (`entry_plan`) and how its instructions are relocated
//! (`relocate`),
//! where dead padding can hold a jump (`padding`), and which branches land where
//! (`branch_index`). A whole function's basic blocks and control-flow graph
//! (`control_flow`, with `jump_table` for `switch` dispatch) and its Ball–Larus path
//! numbering (`paths`) are the first layer of edge and path profiles (issue 18).
//! Nothing here reads or writes the process: callers hand in the bytes, so every
//! decision is unit-tested without a target.

pub mod branch_index;
// The control-flow layers land ahead of their user, the whole-function copy with
// counters (issue 18); until it lands, only their tests call them.
#[cfg_attr(not(test), allow(dead_code))]
pub mod control_flow;
pub mod entry_plan;
#[cfg_attr(not(test), allow(dead_code))]
pub mod jump_table;
pub mod padding;
#[cfg_attr(not(test), allow(dead_code))]
pub mod paths;
pub mod relocate;
