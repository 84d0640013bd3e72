//! The recorder's trace (`record --trace`, the live view's trace key) and the
//! module list a finished profile carries for pprof (its nodes carry their addresses).
//!
//! The one idea: a trace is one more reader of the events the rings deliver — it copies
//! the raw events of its window as they are drained into the trees, and is corrected
//! and named only when a profile is made. The agent does nothing different.

use super::Recorder;
use crate::profile::trace::{MAX_TRACE_EVENTS, TraceCapture};
use crate::profile::{Correction, ModuleMapping, Node, Profile};
use crate::recording::tsc;
use crate::symbols::ProcessSymbols;
use std::collections::{HashMap, HashSet};

/// Where a trace stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceStatus {
    /// Raw events kept so far.
    pub events: u64,
    /// No more events are taken (its time is up or it reached its cap).
    pub over: bool,
}

impl Recorder {
    /// Keeps the raw events of the next `seconds` (at most
    /// [`MAX_TRACE_EVENTS`]) for a timeline; a trace already taken is replaced.
    pub fn start_trace(&mut self, seconds: f64) {
        self.trace = Some(TraceCapture::new(
            tsc::read(),
            self.tsc_hz,
            seconds,
            MAX_TRACE_EVENTS,
        ));
    }

    /// The trace's progress, if one was started.
    pub fn trace_status(&self) -> Option<TraceStatus> {
        self.trace.as_ref().map(|trace| TraceStatus {
            events: trace.kept_events(),
            over: trace.is_over(tsc::read()),
        })
    }

    /// Puts the trace, corrected and named, into `profile`.
    pub(super) fn add_trace(&self, profile: &mut Profile) {
        let Some(capture) = &self.trace else {
            return;
        };
        let Ok(correction) = Correction::new(&profile.calibration) else {
            return;
        };
        let thread_names: HashMap<u32, String> = profile
            .threads
            .iter()
            .map(|t| (t.tid, t.name.clone()))
            .collect();
        profile.trace = Some(capture.to_trace(&correction, self.names.as_slice(), |tid| {
            thread_names
                .get(&tid)
                .cloned()
                .unwrap_or_else(|| crate::process::thread_name(self.target.pid, tid as i32))
        }));
    }
}

/// Lists the modules the nodes of `profile` are in, with their address ranges (pprof's
/// mappings; each node carries its function's entry address from the recording).
pub(super) fn add_modules(profile: &mut Profile, symbols: &ProcessSymbols) {
    let mut modules: HashSet<String> = HashSet::new();
    let mut pending: Vec<&Node> = profile.merged.roots.iter().collect();
    for thread in &profile.threads {
        pending.extend(&thread.roots);
    }
    while let Some(node) = pending.pop() {
        if !modules.contains(&node.module) {
            modules.insert(node.module.clone());
        }
        pending.extend(&node.children);
    }
    profile.modules = symbols
        .modules()
        .iter()
        .filter(|m| modules.contains(&m.name))
        .map(|m| ModuleMapping {
            name: m.name.clone(),
            path: m.path.display().to_string(),
            start: m.start,
            end: m.end,
        })
        .collect();
}
