//! The footer's message line: one message at a time, where an answer to the user's key
//! is not replaced by a background note before it can be read.
//!
//! Two kinds of message reach the line. An *answer* says what a key did ("saved to …",
//! "no sampled tree in this session"). A *note* comes on its own (a line tendril wrote on
//! stderr, a new status message). A note that arrives while an answer is younger than
//! [`ANSWER_HOLD`] waits, and the newest waiting note is shown once the hold ends.
//! Nothing is lost: every note also goes to stderr when the UI ends.

use std::time::{Duration, Instant};

/// How long an answer stays on the line before a waiting note replaces it.
pub const ANSWER_HOLD: Duration = Duration::from_secs(3);

#[derive(Debug, Default)]
pub struct MessageLine {
    shown: Option<String>,
    /// Bumped by every change to what is shown, so a caller can tell whether handling a
    /// key changed it.
    serial: u64,
    /// The shown message answers a key, and holds the line until then.
    held_until: Option<Instant>,
    /// The newest note that arrived during the hold.
    waiting: Option<String>,
}

impl MessageLine {
    pub fn shown(&self) -> Option<&str> {
        self.shown.as_deref()
    }

    /// A number that changes whenever the shown message changes.
    pub fn serial(&self) -> u64 {
        self.serial
    }

    /// Shows `text` now (an answer, or an error the user must see).
    pub fn show(&mut self, text: String) {
        self.shown = Some(text);
        self.serial += 1;
    }

    /// Shows a note now, or after the hold if an answer holds the line at `now`.
    pub fn note(&mut self, text: String, now: Instant) {
        if self.is_held(now) {
            self.waiting = Some(text);
        } else {
            self.show(text);
        }
    }

    /// The message shown answers a key: notes wait behind it for [`ANSWER_HOLD`].
    pub fn hold(&mut self, now: Instant) {
        if self.shown.is_some() {
            self.held_until = Some(now + ANSWER_HOLD);
        }
    }

    /// Esc: the line is emptied, and a waiting note is dropped with it.
    pub fn clear(&mut self) {
        self.shown = None;
        self.serial += 1;
        self.held_until = None;
        self.waiting = None;
    }

    /// Ends a hold that has run out, showing the note that waited; whether it did.
    pub fn release(&mut self, now: Instant) -> bool {
        if self.is_held(now) || self.held_until.is_none() {
            return false;
        }
        self.held_until = None;
        match self.waiting.take() {
            Some(text) => {
                self.show(text);
                true
            }
            None => false,
        }
    }

    fn is_held(&self, now: Instant) -> bool {
        self.held_until.is_some_and(|until| now < until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_replaces_a_message_that_is_not_held() {
        let mut line = MessageLine::default();
        let now = Instant::now();
        line.show("saved".into());
        line.note("a note".into(), now);
        assert_eq!(line.shown(), Some("a note"));
    }

    #[test]
    fn a_note_waits_behind_a_held_answer_and_follows_it() {
        let mut line = MessageLine::default();
        let now = Instant::now();
        line.show("no sampled tree".into());
        line.hold(now);
        line.note("first note".into(), now);
        line.note("second note".into(), now + Duration::from_secs(1));
        assert_eq!(line.shown(), Some("no sampled tree"));
        assert!(!line.release(now + Duration::from_secs(2)));
        assert_eq!(line.shown(), Some("no sampled tree"));
        assert!(line.release(now + ANSWER_HOLD));
        assert_eq!(line.shown(), Some("second note"));
        line.note("third note".into(), now + ANSWER_HOLD);
        assert_eq!(line.shown(), Some("third note"), "the hold is over");
    }

    #[test]
    fn a_new_answer_replaces_a_held_one_at_once() {
        let mut line = MessageLine::default();
        let now = Instant::now();
        line.show("first answer".into());
        line.hold(now);
        let serial = line.serial();
        line.show("second answer".into());
        assert_eq!(line.shown(), Some("second answer"));
        assert_ne!(line.serial(), serial);
    }

    #[test]
    fn esc_drops_the_answer_and_the_waiting_note() {
        let mut line = MessageLine::default();
        let now = Instant::now();
        line.show("answer".into());
        line.hold(now);
        line.note("note".into(), now);
        line.clear();
        assert_eq!(line.shown(), None);
        assert!(!line.release(now + ANSWER_HOLD));
        assert_eq!(line.shown(), None);
    }
}
