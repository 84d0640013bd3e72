//! The `tendril` subcommands, one module each. `main.rs` parses the command line and
//! calls into these; each prints its own output and returns errors for `main` to report.

pub mod attach;
pub mod compare;
pub mod count;
pub mod counters;
pub mod demo;
pub mod detach;
pub mod diff;
pub mod duration;
pub mod edges;
pub mod output;
pub mod picker;
pub mod progress;
pub mod record;
pub mod report;
pub mod rescue;
pub mod run;
pub mod sample;
pub mod status;
pub mod top;
pub mod view;
