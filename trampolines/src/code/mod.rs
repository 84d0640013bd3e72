//! Layer 2, code reading and planning: pure functions over bytes and addresses.
//!
//! What an entry patch overwrites (`entry_plan`) and how its instructions are relocated
//! (`relocate`),
//! where dead padding can hold a jump (`padding`), and which branches land where
//! (`branch_index`). Nothing here reads or writes the process: callers hand in the
//! bytes, so every decision is unit-tested without a target.

pub mod branch_index;
pub mod entry_plan;
pub mod padding;
pub mod relocate;
