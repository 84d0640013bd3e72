//! Helpers for the profile module's unit tests: events and function tables made by hand.

use super::cct::{FunctionName, RecordingInfo};
use tendril_wire::events::{Event, EventKind, HookShape};

pub fn entry(function: u32, ts: u64) -> Event {
    Event::new(EventKind::Entry, function, ts)
}

/// An Entry event written by a hook of `shape`.
pub fn shaped_entry(function: u32, shape: HookShape, ts: u64) -> Event {
    Event {
        kind: shape.kind_word(EventKind::Entry),
        ..entry(function, ts)
    }
}

pub fn exit(function: u32, ts: u64) -> Event {
    Event::new(EventKind::Exit, function, ts)
}

pub fn unwind(function: u32, ts: u64) -> Event {
    Event::new(EventKind::Unwind, function, ts)
}

pub fn resumed(function: u32, ts: u64) -> Event {
    Event::new(EventKind::Resumed, function, ts)
}

pub fn pause(ticks: u64) -> Event {
    Event::new(EventKind::Adjust, 0, ticks)
}

/// A function table: id `i` is `names[i]` in module `app`.
pub fn names(names: &[&str]) -> Vec<FunctionName> {
    names
        .iter()
        .map(|name| FunctionName {
            name: (*name).to_owned(),
            module: "app".to_owned(),
            address: None,
        })
        .collect()
}

pub fn info() -> RecordingInfo {
    RecordingInfo {
        pid: 4242,
        exe: "/usr/bin/app".to_owned(),
        roots: vec!["main".to_owned()],
        scheme: "B".to_owned(),
        instrumented_functions: 4,
        invoked_functions: 3,
        lost_events: 0,
        indirect_call_sites: 1,
        timing: None,
    }
}
