//! The hooks layer's global state: every static of `hooks` in one struct, [`STATE`],
//! with this module as its one owner (see `sys::state` for the pattern).

use crate::hooks::handler_abi::Handlers;
use crate::hooks::stubs::template::{RecordTemplate, UntimedTemplate};
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, Once, OnceLock};

/// Slots of the table of targets followed through pointers (2 MiB; a slot holds a
/// target's address): see `pointer_checks`.
pub const POINTER_TABLE_SLOTS: usize = 1 << 18;

/// The hooks layer's statics.
pub struct HooksState {
    /// The runtime's handlers, installed once before the first hook is built
    /// (`stubs::install_handlers`); the first installation stays.
    pub handlers: OnceLock<Handlers>,
    /// The recording hooks assembled once: root or inner, with or without a call thunk
    /// (index `root * 2 + thunk`). Scheme B builds hooks while the target waits.
    pub record_templates: Mutex<[Option<RecordTemplate>; 4]>,
    /// The untimed hooks assembled once (`stubs::untimed`): the plain one and the one
    /// of a root timed at its outermost call, each for an entry jump and behind a call
    /// thunk.
    pub untimed_templates: Mutex<[Option<UntimedTemplate>; 4]>,
    /// Bytes `tendril_slow_call` reserves for `xsave`: the size CPUID gives for the
    /// enabled features, plus room to align to 64. The assembly reads this word by
    /// symbol and offset; `slow_call::prepare` sets it once, before the first stub that
    /// reads it is patched in (the patch is published after the store).
    pub xsave_area_bytes: AtomicU64,
    /// `slow_call::prepare` has sized the xsave area.
    pub xsave_sized: Once,
    /// The address of the table of the targets of calls through pointers a recording
    /// follows (`pointer_checks`), mapped on first use; 0 if it could not be.
    pub pointer_table: OnceLock<u64>,
}

/// The one instance.
pub static STATE: HooksState = HooksState {
    handlers: OnceLock::new(),
    record_templates: Mutex::new([None, None, None, None]),
    untimed_templates: Mutex::new([None, None, None, None]),
    xsave_area_bytes: AtomicU64::new(16 * 1024),
    xsave_sized: Once::new(),
    pointer_table: OnceLock::new(),
};
