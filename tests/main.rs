//! The integration tests, in one binary: each module is the tests of one feature,
//! against real fixture processes (`common`).
//!
//! One binary, not one per file: each of 47 binaries compiled `common` (2,000 lines)
//! again and was linked on its own, which took the test build 180 s of its 440 on
//! 2 cores, and cargo ran the binaries one after another, one or two tests at a time
//! (issue #36). Run one module's tests with `cargo test --test tests MODULE::`.
//! Tests that load the machine with busy live targets take turns across modules
//! (`common::live_target_turn`).

mod common;

mod accuracy;
mod adaptive_timing;
mod agent_channel;
mod agent_code;
mod attach;
mod bad_input;
mod blocked_traps;
mod code_view;
mod coroutines;
mod count;
mod cpu_time;
mod default_output;
mod departures;
mod docs;
mod edges;
mod edges_command;
mod exports;
mod fixtures;
mod footprint;
mod fork;
mod go;
mod hostile_names;
mod in_situ;
mod indirect;
mod interruptions;
mod jit;
mod large_batches;
mod layers;
mod live_tree;
mod live_ui;
mod lost_connection;
mod many_classes;
mod many_threads;
mod output_files;
mod patch_stress;
mod record;
mod report_output;
mod sampled_ui;
mod sampling;
mod seccomp;
mod security;
mod signal_blocking;
mod symbol_cache;
mod symbols;
mod terminal_signals;
mod unloaded_libraries;
mod unwinder_hooks;
mod unwinding;
