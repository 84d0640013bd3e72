//! speedscope export: speedscope's file format (`$schema`
//! `https://www.speedscope.app/file-format-schema.json`).
//!
//! The one idea: speedscope's "sampled" profile is a list of stacks with weights, so
//! each calling context with self time is one stack weighing its self time (in ns) —
//! one such profile for all threads merged, then one per thread. A profile with a trace
//! adds one "evented" profile per thread: the trace's open ("O") and close ("C")
//! events, which speedscope shows as a time-ordered chart.

use super::{Frames, for_each_context};
use crate::profile::depth_cut::cut_deep_stacks;
use crate::profile::model::{Node, Profile};
use crate::profile::trace::{Edge, Trace};
use serde::Serialize;
use std::io::{self, Write};

pub const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

#[derive(Serialize)]
struct File<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    shared: Shared<'a>,
    profiles: Vec<SpeedscopeProfile>,
    name: String,
    #[serde(rename = "activeProfileIndex")]
    active_profile_index: usize,
    exporter: String,
}

#[derive(Serialize)]
struct Shared<'a> {
    frames: Vec<FrameJson<'a>>,
}

#[derive(Serialize)]
struct FrameJson<'a> {
    name: &'a str,
    file: &'a str,
}

#[derive(Serialize)]
#[serde(tag = "type")]
enum SpeedscopeProfile {
    #[serde(rename = "sampled")]
    Sampled {
        name: String,
        unit: &'static str,
        #[serde(rename = "startValue")]
        start_value: u64,
        #[serde(rename = "endValue")]
        end_value: u64,
        samples: Vec<Vec<usize>>,
        weights: Vec<u64>,
    },
    #[serde(rename = "evented")]
    Evented {
        name: String,
        unit: &'static str,
        #[serde(rename = "startValue")]
        start_value: u64,
        #[serde(rename = "endValue")]
        end_value: u64,
        events: Vec<EventJson>,
    },
}

#[derive(Serialize)]
struct EventJson {
    #[serde(rename = "type")]
    kind: &'static str,
    frame: usize,
    at: u64,
}

/// A sampled profile of `roots`: one stack per context with self time.
fn sampled<'a>(name: String, roots: &'a [Node], frames: &mut Frames<'a>) -> SpeedscopeProfile {
    let mut samples = Vec::new();
    let mut weights = Vec::new();
    for_each_context(roots, frames, |stack, node| {
        if node.self_ns > 0 {
            samples.push(stack.to_vec());
            weights.push(node.self_ns);
        }
    });
    SpeedscopeProfile::Sampled {
        name,
        unit: "nanoseconds",
        start_value: 0,
        end_value: weights.iter().sum(),
        samples,
        weights,
    }
}

/// One evented profile per traced thread.
fn evented<'a>(trace: &'a Trace, frames: &mut Frames<'a>) -> Vec<SpeedscopeProfile> {
    let numbers: Vec<usize> = trace
        .functions
        .iter()
        .map(|f| frames.named(&f.name, &f.module, None))
        .collect();
    trace
        .threads
        .iter()
        .map(|thread| SpeedscopeProfile::Evented {
            name: format!(
                "timeline of thread {}{} (first {} s)",
                thread.tid,
                thread_label(&thread.name),
                trace.seconds
            ),
            unit: "nanoseconds",
            start_value: 0,
            end_value: thread.events.last().map_or(0, |e| e.at_ns()),
            events: thread
                .events
                .iter()
                .map(|event| EventJson {
                    kind: match event.edge() {
                        Edge::Begin => "O",
                        Edge::End => "C",
                    },
                    frame: numbers[event.function() as usize],
                    at: event.at_ns(),
                })
                .collect(),
        })
        .collect()
}

fn thread_label(name: &str) -> String {
    if name.is_empty() {
        String::new()
    } else {
        format!(" ({name})")
    }
}

/// Writes the profile as a speedscope file.
pub fn write_speedscope(profile: &Profile, out: &mut impl Write) -> io::Result<()> {
    let profile = &*cut_deep_stacks(profile);
    let mut frames = Frames::default();
    let mut profiles = vec![sampled(
        format!("all threads merged ({})", profile.roots.join(", ")),
        &profile.merged.roots,
        &mut frames,
    )];
    for thread in &profile.threads {
        profiles.push(sampled(
            format!("thread {}{}", thread.tid, thread_label(&thread.name)),
            &thread.roots,
            &mut frames,
        ));
    }
    if let Some(trace) = &profile.trace {
        profiles.extend(evented(trace, &mut frames));
    }
    let file = File {
        schema: SCHEMA,
        shared: Shared {
            frames: frames
                .frames
                .iter()
                .map(|f| FrameJson {
                    name: f.name,
                    file: f.module,
                })
                .collect(),
        },
        profiles,
        name: format!(
            "tendril: {} in pid {} ({})",
            profile.roots.join(", "),
            profile.pid,
            profile.exe
        ),
        active_profile_index: 0,
        exporter: format!("tendril {}", env!("CARGO_PKG_VERSION")),
    };
    crate::terminal_text::write_json_compact(&mut *out, &file)?;
    out.write_all(b"\n")
}
