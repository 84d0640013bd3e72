//! Sampling a running process from the outside: where its threads spend their time,
//! without loading anything into it or changing a byte of it.
//!
//! The one idea: the kernel takes the samples (`perf_event_open` on each thread, a
//! `cpu-clock` event with the user registers and a copy of the top of the user stack),
//! and the controller does everything else — it walks each copied stack with the
//! modules' `.eh_frame` (framehop, so code without frame pointers unwinds), names the
//! frames with tendril's own symbol tables and adds them to calling context trees. The
//! result is an ordinary profile (`"scheme": "sampled"`, nodes with `"samples"`), so
//! `report`, `view`, the exports and `compare` read it like an instrumented one.
//! Whaley's partial CCT and Arnold–Sweeney's approximate CCT are the ideas; the first
//! look that tells a user which root to instrument.
//!
//! - [`perf`]: one thread's event and its ring;
//! - [`records`]: the records read from a ring;
//! - [`unwind`]: framehop over the process's modules;
//! - [`go_unwind`]: Go frames, stepped with Go's own table (`.gopclntab`);
//! - [`jit_unwind`]: frames of code generated at run time (no unwind table);
//! - [`tree`]: the sampled trees and the function table;
//! - [`marks`]: a deep walk stops where the thread's previous one is unchanged;
//! - [`walker`]: one sample to a named stack in the trees;
//! - [`sampler`]: a session over all of a process's threads, and its profile.

pub mod go_unwind;
pub mod jit_unwind;
pub mod marks;
pub mod perf;
pub mod records;
pub mod sampler;
pub mod tree;
pub mod unwind;
pub mod walker;

pub use sampler::{Clock, SampleError, Sampler, SamplerOptions};
