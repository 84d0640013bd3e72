//! The data of assembled hooks: a hook's position-independent code, and a recording
//! hook's template with where its per-function words are. Data only, so the hooks
//! layer's state can keep the templates without importing the code that builds them.

/// A trampoline's hook part, position-independent: its bytes (up to where the body
/// goes) and the offsets of its entry points.
#[derive(Debug, Clone)]
pub(in crate::hooks) struct HookCode {
    pub(in crate::hooks) bytes: Vec<u8>,
    pub(in crate::hooks) entry: usize,
    /// Where the body starts: the length of `bytes`.
    pub(in crate::hooks) body: usize,
}

/// A recording hook assembled once, and where its per-function data words are.
#[derive(Debug, Clone)]
pub(in crate::hooks) struct RecordTemplate {
    pub(in crate::hooks) hook: HookCode,
    /// Offsets of the words of `record::RecordValues`, in its field order.
    pub(in crate::hooks) words: [usize; 4],
}

/// The untimed hook assembled once, and where its per-function data words are.
#[derive(Debug, Clone)]
pub(in crate::hooks) struct UntimedTemplate {
    pub(in crate::hooks) hook: HookCode,
    /// Offsets of the words of `untimed::UntimedValues`, in its field order, then of
    /// the word that holds where an outermost call goes (`untimed::outermost_word`).
    pub(in crate::hooks) words: [usize; 3],
}
