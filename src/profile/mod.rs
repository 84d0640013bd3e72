//! The controller's profile: calling context trees built from the agent's event streams,
//! corrected for tendril's own cost, and the profile file and reports made from them.
//!
//! The one idea: times are measured in the target but *corrected* here. Each completed
//! invocation is charged `t_meas − t_I − m·t_O` (JFluid §5.3, see [`calibration`]) into a
//! per-thread calling context tree ([`cct::CctBuilder`]); a snapshot turns the trees into
//! a [`Profile`] (the file format of docs/DESIGN.md §5) that the reports, the file and the
//! live view read. Trees can be as deep as the target's recursion, so no code here
//! recurses over a tree on a fixed-size stack: tree code keeps explicit stacks, and the
//! file's serde recursion runs on a stack that grows on demand.
//!
//! - [`model`]: the profile file's types;
//! - [`file`](mod@file): reading and writing it (serde_json, any depth);
//! - [`cct`]: the builder (per-thread trees in `thread_tree` over an `arena`);
//! - [`calibration`]: the correction formula;
//! - [`report`]: `tendril report` text formats ([`hot`]: the hot spots);
//! - [`export`]: the formats other tools read (pprof, speedscope, Trace Event Format,
//!   SVG flame graphs);
//! - [`trace`]: timelines of a recording's first seconds (`record --trace`);
//! - [`diff`]: two profiles compared call path by call path.
//! - [`prune`]: `report`'s `--thread`, `--depth` and `--threshold`;
//! - [`untimed_calls`]: where the calls of untimed functions go in a tree;
//! - [`per_function`]: each function's calls and mean time, for adaptive timing.

mod arena;
pub mod calibration;
mod calibration_model;
pub mod cct;
pub mod clock;
pub mod depth_cut;
pub mod diff;
pub mod export;
pub mod file;
pub mod folded;
pub mod hot;
pub mod model;
pub mod names;
pub mod overlap;
pub mod per_function;
pub mod prune;
pub mod report;
mod thread_tree;
pub mod trace;
pub mod trace_model;
pub mod untimed_calls;

#[cfg(test)]
mod tests_support;

pub use calibration::{CalibrationError, Correction};
pub use cct::{BuildCounters, CctBuilder, FunctionName, FunctionNames, RecordingInfo};
pub use clock::{Clock, NoCpuTime};
pub use file::ProfileError;
pub use model::{
    Calibration, DiscoveryStats, GrossTime, MergedProfile, ModuleMapping, Node, NotFollowed,
    Profile, SamplingInfo, ShapeCalibration, Stats, ThreadProfile, Timing, TimingPolicy, Visit,
    walk,
};
pub use prune::{Prune, PruneError};
pub use report::{
    ReportFormat, UnknownReportFormat, library_churn_note, stack_switch_warning, write_report,
};
pub use thread_tree::OwnFunctions;
