//! tendril: a dynamic instrumentation profiler for running native x86-64 Linux processes.
//!
//! This crate is the controller: it inspects and attaches to a target process, loads the
//! agent into it (`inject`), talks to the agent (`agent_connection`), and reads the
//! target's symbols (`symbols`). The agent itself lives in the `tendril-agent` crate
//! (`trampolines/`), embedded in this binary by `build.rs`.

pub mod agent_bundle;
pub mod agent_connection;
pub mod commands;
pub mod demo_workload;
pub mod departure;
pub mod edge_analysis;
pub mod inject;
pub mod interrupt;
pub mod live;
pub mod process;
pub mod profile;
pub mod quantities;
pub mod recording;
pub mod refusals;
pub mod sampling;
pub mod symbols;
pub mod targets;
pub mod terminal_text;
