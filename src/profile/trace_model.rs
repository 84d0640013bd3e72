//! A trace as a profile stores it: per-thread timelines of enter and exit events, in
//! nanoseconds already corrected for tendril's own cost (see `trace` for how they are
//! captured and corrected).

use serde::{Deserialize, Serialize};

/// How long `record --trace` traces when no duration is given.
pub const DEFAULT_TRACE_SECONDS: f64 = 1.0;

/// The most raw events (entries and exits) a trace keeps; the rest of the recording
/// still goes into the tree.
pub const MAX_TRACE_EVENTS: u64 = 1_000_000;

/// Per-thread timelines of enter ("B") and exit ("E") events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    /// How long the trace was asked to cover, in seconds.
    pub seconds: f64,
    /// The most raw events it could keep ([`MAX_TRACE_EVENTS`]).
    pub max_events: u64,
    /// Whether it stopped at `max_events` before its time was up.
    pub capped: bool,
    /// The functions the events name, by index.
    pub functions: Vec<TraceFunction>,
    pub threads: Vec<TraceThread>,
}

/// A function a trace event names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceFunction {
    pub name: String,
    pub module: String,
}

/// One thread's timeline: begins and ends, properly nested, in time order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TraceThread {
    pub tid: u32,
    /// The thread's name, empty if unknown.
    pub name: String,
    pub events: Vec<TraceEvent>,
}

/// `["B" or "E", function index, ns since the trace began (corrected)]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEvent(pub Edge, pub u32, pub u64);

/// Whether a [`TraceEvent`] begins or ends a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Edge {
    #[serde(rename = "B")]
    Begin,
    #[serde(rename = "E")]
    End,
}

impl TraceEvent {
    pub fn edge(&self) -> Edge {
        self.0
    }

    pub fn function(&self) -> u32 {
        self.1
    }

    pub fn at_ns(&self) -> u64 {
        self.2
    }
}

impl Trace {
    /// Begin and end events over all threads.
    pub fn event_count(&self) -> u64 {
        self.threads.iter().map(|t| t.events.len() as u64).sum()
    }

    /// The latest timestamp of any thread, in ns.
    pub fn span_ns(&self) -> u64 {
        self.threads
            .iter()
            .filter_map(|t| t.events.last())
            .map(TraceEvent::at_ns)
            .max()
            .unwrap_or(0)
    }

    /// One line for reports: how many events, threads and how long.
    pub fn summary(&self) -> String {
        format!(
            "trace: {} events on {} thread{} over {:.3} ms (first {} s of the recording; at \
             most {} raw events kept{})",
            self.event_count(),
            self.threads.len(),
            if self.threads.len() == 1 { "" } else { "s" },
            self.span_ns() as f64 / 1e6,
            self.seconds,
            self.max_events,
            if self.capped {
                ", reached: the trace ends there"
            } else {
                ""
            }
        )
    }

    /// The name of function `index`, `?` if the trace has no such function.
    pub fn function_name(&self, index: u32) -> &str {
        self.functions
            .get(index as usize)
            .map_or("?", |f| f.name.as_str())
    }
}
