//! Recording a call graph: the controller's side of JFluid-style profiling.
//!
//! * [`recorder`]: a recording from start to profile (`record`, `run`, the live view);
//! * [`rings`]: reading the agent's shared-memory rings and counters;
//! * [`drain_priority`]: the reading thread runs ahead of a busy target's threads;
//! * [`function_table`]: the bounds of every function, handed to the agent for
//!   discovery;
//! * [`address_taken`]: the candidate targets of calls through pointers;
//! * [`indirect`]: which of them a recording instruments, and what became of them;
//! * [`closure`]: Scheme A's static call graph;
//! * [`gross`]: `--gross-only` time distributions;
//! * [`off_cpu`]: when the target's threads were off the CPU (context switches);
//! * [`tsc`]: the time-stamp counter's frequency.
//!
//! The one idea: the agent only patches and writes raw events; names, trees and the
//! cost correction are built here (`crate::profile`).

pub mod address_taken;
pub mod closure;
pub mod drain_priority;
pub mod function_table;
pub mod gross;
pub mod indirect;
pub mod off_cpu;
pub mod recorder;
pub mod rings;
pub mod tsc;

pub use recorder::{
    CALLS_TO_JUDGE, Finished, HookedCopy, RecordError, RecordOptions, Recorder, Scheme,
    TimingOptions, threshold_ns,
};
