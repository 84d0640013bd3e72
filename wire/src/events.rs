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
    /// The untimed function [`Event::function`] was called from the code whose return
    /// address is in [`Event::value`] (no timestamp: the call is counted, in its
    /// caller's context, and its time is the caller's own); see [`Event::call_site`].
    Call = 6,
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
            6 => EventKind::Call,
            _ => return None,
        })
    }
}

/// How a recorded function's entry reaches its hook, which decides part of the hook's
/// cost: a 5-byte `jmp` to a trampoline that runs the overwritten instructions after
/// the hook, a 2-byte `jmp` to a `jmp` placed in padding nearby, or a `call` replaced
/// by a call to the hook (an entry that was a call). An Entry event carries it in bits
/// 8..16 of its kind word, so the controller can remove each shape's own cost.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HookShape {
    Jump = 0,
    PadJump = 1,
    CallThunk = 2,
}

/// The number of [`HookShape`]s.
pub const HOOK_SHAPES: usize = 3;

impl HookShape {
    pub const ALL: [HookShape; HOOK_SHAPES] =
        [HookShape::Jump, HookShape::PadJump, HookShape::CallThunk];

    /// The shape stored as `raw`; an unknown value is taken as [`HookShape::Jump`].
    pub fn from_raw(raw: u32) -> HookShape {
        match raw {
            1 => HookShape::PadJump,
            2 => HookShape::CallThunk,
            _ => HookShape::Jump,
        }
    }

    /// The name profiles and reports use.
    pub fn name(self) -> &'static str {
        match self {
            HookShape::Jump => "jump",
            HookShape::PadJump => "pad jump",
            HookShape::CallThunk => "call thunk",
        }
    }

    /// An event's kind word for `kind` with this shape (used for Entry events).
    pub const fn kind_word(self, kind: EventKind) -> u32 {
        kind as u32 | (self as u32) << 8
    }
}

/// The bits of [`Event::kind`] that hold the [`EventKind`].
pub const KIND_MASK: u32 = 0xff;

/// Bits of a Call event's value that hold the return address (see [`Event::call_site`]).
pub const CALL_ADDRESS_BITS: u32 = 48;
/// The mask of those bits.
pub const CALL_ADDRESS_MASK: u64 = (1 << CALL_ADDRESS_BITS) - 1;

/// One record of a per-thread ring: 16 bytes, no padding.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Event {
    /// A TSC timestamp (Entry, Exit, Unwind, Resumed), a duration in TSC ticks
    /// (Adjust), or a call site and a count (Call).
    pub value: u64,
    /// The function's id: its index in the function table the controller gave the agent.
    /// Unused (0) for Adjust.
    pub function: u32,
    /// An [`EventKind`] as `u32` in its low 8 bits ([`KIND_MASK`]); an Entry event's
    /// [`HookShape`] in the next 8.
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
        EventKind::from_raw(self.kind & KIND_MASK)
    }

    /// Whether [`Event::value`] is a timestamp (Entry, Exit, Unwind, Resumed).
    pub fn has_timestamp(&self) -> bool {
        matches!(
            self.kind(),
            Some(EventKind::Entry | EventKind::Exit | EventKind::Unwind | EventKind::Resumed)
        )
    }

    /// A Call event's return address and number of calls: the value holds the return
    /// address in its low [`CALL_ADDRESS_BITS`] bits (a user-space address fits) and
    /// the calls less one above them.
    pub fn call_site(&self) -> (u64, u64) {
        (
            self.value & CALL_ADDRESS_MASK,
            (self.value >> CALL_ADDRESS_BITS) + 1,
        )
    }

    /// The shape of the hook that wrote this (an Entry event's; Jump for others).
    pub fn hook_shape(&self) -> HookShape {
        HookShape::from_raw((self.kind >> 8) & 0xff)
    }
}

const _: () = assert!(std::mem::size_of::<Event>() == Event::SIZE);
