//! Trace Event Format export (Perfetto, chrome://tracing): JSON `traceEvents`.
//!
//! The one idea: a profile with a trace is a set of real timelines, so each traced
//! thread becomes a track of "B"/"E" events under the target's pid, timestamps in µs on
//! the corrected clock. The calling context trees are not timelines: they are laid out
//! as "X" (complete) events in a separate process named for what it is ("call trees,
//! aggregated — not a timeline"), children side by side from their parent's start, each
//! as long as its total time, so a root's length is its total. Events are written one
//! by one, so a million of them need no tree of JSON values in memory.

use crate::profile::model::{Node, Profile, Visit, walk};
use crate::profile::trace::Edge;
use serde::Serialize;
use std::io::{self, Write};

/// The pid of the process the aggregated call trees are shown under.
pub const TREE_PID: u32 = 2_000_000_000;

#[derive(Serialize)]
struct Event<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    cat: &'static str,
    ph: &'static str,
    /// Microseconds.
    ts: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    pid: u32,
    tid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<Args<'a>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Args<'a> {
    Name {
        name: &'a str,
    },
    Module {
        module: &'a str,
    },
    Context {
        module: &'a str,
        calls: u64,
        total_ns: u64,
        self_ns: u64,
        /// A call into JIT code, not measured ([`Node::jit`]).
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        jit: bool,
    },
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// Writes events as the elements of a JSON array, comma-separated.
struct EventWriter<'w, W: Write> {
    out: &'w mut W,
    first: bool,
}

impl<W: Write> EventWriter<'_, W> {
    fn write(&mut self, event: &Event) -> io::Result<()> {
        self.out
            .write_all(if self.first { b"\n" } else { b",\n" })?;
        self.first = false;
        crate::terminal_text::write_json_compact(&mut *self.out, event)?;
        Ok(())
    }

    fn metadata(&mut self, kind: &'static str, pid: u32, tid: u32, name: &str) -> io::Result<()> {
        self.write(&Event {
            name: kind,
            cat: "",
            ph: "M",
            ts: 0.0,
            dur: None,
            pid,
            tid,
            args: Some(Args::Name { name }),
        })
    }

    /// One "X" event per context of `roots`, laid out from time 0.
    fn tree(&mut self, roots: &[Node], tid: u32) -> io::Result<()> {
        // The start of the next child of each open node (the roots' first).
        let mut cursors: Vec<u64> = vec![0];
        walk(roots, |step| match step {
            Visit::Enter { node, .. } => {
                let children: u64 = node.children.iter().map(|c| c.total_ns).sum();
                let length = node.total_ns.max(children);
                let cursor = cursors.last_mut().expect("the roots' cursor stays");
                let start = *cursor;
                *cursor += length;
                cursors.push(start);
                self.write(&Event {
                    name: &node.name,
                    cat: "call tree",
                    ph: "X",
                    ts: us(start),
                    dur: Some(us(length)),
                    pid: TREE_PID,
                    tid,
                    args: Some(Args::Context {
                        module: &node.module,
                        calls: node.calls,
                        total_ns: node.total_ns,
                        self_ns: node.self_ns,
                        jit: node.jit,
                    }),
                })
            }
            Visit::Leave { .. } => {
                cursors.pop();
                Ok(())
            }
        })
    }
}

fn thread_title(tid: u32, name: &str) -> String {
    if name.is_empty() {
        format!("thread {tid}")
    } else {
        format!("{name} ({tid})")
    }
}

/// Writes the profile in the Trace Event Format.
pub fn write_chrome(profile: &Profile, out: &mut impl Write) -> io::Result<()> {
    out.write_all(b"{\"traceEvents\":[")?;
    let mut events = EventWriter {
        out: &mut *out,
        first: true,
    };
    if let Some(trace) = &profile.trace {
        let pid = profile.pid;
        events.metadata(
            "process_name",
            pid,
            0,
            &format!(
                "{} (pid {pid}): timeline of the first {} s",
                profile.exe, trace.seconds
            ),
        )?;
        for thread in &trace.threads {
            events.metadata(
                "thread_name",
                pid,
                thread.tid,
                &thread_title(thread.tid, &thread.name),
            )?;
            for event in &thread.events {
                let function = trace.functions.get(event.function() as usize);
                events.write(&Event {
                    name: function.map_or("?", |f| f.name.as_str()),
                    cat: "call",
                    ph: match event.edge() {
                        Edge::Begin => "B",
                        Edge::End => "E",
                    },
                    ts: us(event.at_ns()),
                    dur: None,
                    pid,
                    tid: thread.tid,
                    args: match event.edge() {
                        Edge::Begin => function.map(|f| Args::Module { module: &f.module }),
                        Edge::End => None,
                    },
                })?;
            }
        }
    }
    events.metadata(
        "process_name",
        TREE_PID,
        0,
        &format!(
            "call trees of pid {} ({}), aggregated — not a timeline",
            profile.pid,
            profile.roots.join(", ")
        ),
    )?;
    events.metadata("thread_name", TREE_PID, 0, "all threads merged")?;
    events.tree(&profile.merged.roots, 0)?;
    for thread in &profile.threads {
        events.metadata(
            "thread_name",
            TREE_PID,
            thread.tid,
            &thread_title(thread.tid, &thread.name),
        )?;
        events.tree(&thread.roots, thread.tid)?;
    }
    out.write_all(b"\n],\"displayTimeUnit\":\"ns\",\"otherData\":")?;
    let other = serde_json::json!({
        "exporter": format!("tendril {}", env!("CARGO_PKG_VERSION")),
        "pid": profile.pid,
        "exe": profile.exe,
        "roots": profile.roots,
        "times": "corrected for tendril's own cost",
    });
    crate::terminal_text::write_json_compact(&mut *out, &other)?;
    out.write_all(b"}\n")
}
