//! The event records the agent writes and the controller reads, and the layout of the
//! shared-memory file they travel through.
//!
//! The one idea: every event is one fixed-size 16-byte record in a per-thread
//! single-producer ring, so the agent's hook stubs write it with two stores and the
//! controller decodes it without parsing. A thread's events are in program order: the
//! consumer rebuilds the call stack from entries and exits alone.

/// What an [`Event`] says. Stored in [`Event::kind`].
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// The function [`Event::function`] was entered at [`Event::value`] (TSC ticks).
    Entry = 1,
    /// The function [`Event::function`] returned normally at [`Event::value`].
    Exit = 2,
    /// The function [`Event::function`] was left by an unwind (a C++ exception, a Rust
    /// panic, `longjmp`, thread exit or cancellation) at about [`Event::value`].
    Unwind = 3,
    /// tendril paused this thread for [`Event::value`] ticks (patching, discovery, a full
    /// ring): remove that time from every frame open on the thread.
    Adjust = 4,
    /// A frame of [`Event::function`] that an earlier Unwind closed returned after all
    /// at [`Event::value`]: its stack had been left (a coroutine switched away) and was
    /// resumed. Its frame is not open again; the event only says that it was dropped.
    Resumed = 5,
}

impl EventKind {
    /// The kind stored as `raw`, if it is one.
    pub fn from_raw(raw: u32) -> Option<EventKind> {
        Some(match raw {
            1 => EventKind::Entry,
            2 => EventKind::Exit,
            3 => EventKind::Unwind,
            4 => EventKind::Adjust,
            5 => EventKind::Resumed,
            _ => return None,
        })
    }
}

/// One record of a per-thread ring: 16 bytes, no padding.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Event {
    /// A TSC timestamp (Entry, Exit, Unwind) or a duration in TSC ticks (Adjust).
    pub value: u64,
    /// The function's id: its index in the function table the controller gave the agent.
    /// Unused (0) for Adjust.
    pub function: u32,
    /// An [`EventKind`] as `u32`.
    pub kind: u32,
}

impl Event {
    pub const SIZE: usize = 16;

    pub fn new(kind: EventKind, function: u32, value: u64) -> Event {
        Event {
            value,
            function,
            kind: kind as u32,
        }
    }

    pub fn kind(&self) -> Option<EventKind> {
        EventKind::from_raw(self.kind)
    }
}

const _: () = assert!(std::mem::size_of::<Event>() == Event::SIZE);
