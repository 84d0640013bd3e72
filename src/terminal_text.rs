//! What tendril prints: the target's text (names, paths, thread names, the agent's
//! answers) made safe for a terminal, on stdout, on stderr and in JSON.
//!
//! The one idea: strings stay exact while tendril works with them (errors, profiles,
//! messages), and are escaped once, where they are printed, by the one sanitizer
//! (`tendril_tui::printable`, which the terminal UI draws with too):
//! - a line on stderr goes through [`say!`] (`tendril: ` and the line, escaped);
//! - an error is escaped as a whole where `main` prints it;
//! - a command's text output escapes each name it prints;
//! - JSON keeps every string exact but writes the characters a terminal would obey as
//!   `\uXXXX` escapes ([`write_json`]), so `--json` and `report --format json` on a
//!   terminal are safe too, and any JSON reader gets the same strings.

use serde::Serialize;
use serde_json::ser::{CompactFormatter, Formatter, PrettyFormatter};
use std::io::{self, Write};
use std::sync::Mutex;
use std::sync::mpsc::{SendError, Sender};
pub use tendril_tui::printable::{already_printed, is_unsafe, printable, printable_bytes};

/// `eprintln!("tendril: …")` with the whole line escaped: for every message on stderr,
/// which may name the target's functions, files and threads.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::terminal_text::say_line(&format!($($arg)*))
    };
}
pub(crate) use say;

/// Where notes go instead of stderr while one is set (see [`divert_notes`]).
static NOTE_SINK: Mutex<Option<Sender<String>>> = Mutex::new(None);

/// Prints `tendril: LINE` on stderr, `line` escaped ([`printable`]); while notes are
/// diverted, sends that line to the diverting receiver instead.
pub fn say_line(line: &str) {
    let text = format!("tendril: {}", printable(line));
    let sink = NOTE_SINK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // A receiver gone gives the line back: it goes to stderr then.
    let text = match sink.as_ref() {
        Some(sink) => match sink.send(text) {
            Ok(()) => return,
            Err(SendError(text)) => text,
        },
        None => text,
    };
    drop(sink);
    eprintln!("{text}");
}

/// Sends every note said from now on to `sink` (`None`: to stderr again). The live view
/// takes them this way, at once and in the order they were said, so a note said before
/// a state change is never shown after that change's message.
pub fn divert_notes(sink: Option<Sender<String>>) {
    *NOTE_SINK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner()) = sink;
}

/// A JSON formatter that writes like `F` (pretty or compact), except that inside strings
/// every character [`is_unsafe`] for a terminal is written as a `\uXXXX` escape (two for
/// a character beyond U+FFFF). serde_json already escapes the C0 controls; this adds
/// DEL, the C1 controls, the bidirectional controls and the invisible characters. The
/// string a JSON reader gets is unchanged.
pub struct SafeStrings<F>(pub F);

impl<F: Formatter> Formatter for SafeStrings<F> {
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        out: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut rest = fragment;
        while let Some((at, c)) = rest.char_indices().find(|&(_, c)| is_unsafe(c)) {
            self.0.write_string_fragment(out, &rest[..at])?;
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                write!(out, "\\u{unit:04x}")?;
            }
            rest = &rest[at + c.len_utf8()..];
        }
        self.0.write_string_fragment(out, rest)
    }

    // Everything else is the wrapped formatter's.
    fn begin_array<W: ?Sized + Write>(&mut self, out: &mut W) -> io::Result<()> {
        self.0.begin_array(out)
    }
    fn end_array<W: ?Sized + Write>(&mut self, out: &mut W) -> io::Result<()> {
        self.0.end_array(out)
    }
    fn begin_array_value<W: ?Sized + Write>(&mut self, out: &mut W, first: bool) -> io::Result<()> {
        self.0.begin_array_value(out, first)
    }
    fn end_array_value<W: ?Sized + Write>(&mut self, out: &mut W) -> io::Result<()> {
        self.0.end_array_value(out)
    }
    fn begin_object<W: ?Sized + Write>(&mut self, out: &mut W) -> io::Result<()> {
        self.0.begin_object(out)
    }
    fn end_object<W: ?Sized + Write>(&mut self, out: &mut W) -> io::Result<()> {
        self.0.end_object(out)
    }
    fn begin_object_key<W: ?Sized + Write>(&mut self, out: &mut W, first: bool) -> io::Result<()> {
        self.0.begin_object_key(out, first)
    }
    fn end_object_key<W: ?Sized + Write>(&mut self, out: &mut W) -> io::Result<()> {
        self.0.end_object_key(out)
    }
    fn begin_object_value<W: ?Sized + Write>(&mut self, out: &mut W) -> io::Result<()> {
        self.0.begin_object_value(out)
    }
    fn end_object_value<W: ?Sized + Write>(&mut self, out: &mut W) -> io::Result<()> {
        self.0.end_object_value(out)
    }
}

/// Writes `value` as pretty JSON (serde_json's layout) with [`SafeStrings`].
pub fn write_json<W: Write, T: Serialize + ?Sized>(out: W, value: &T) -> io::Result<()> {
    let mut json = serde_json::Serializer::with_formatter(out, SafeStrings(PrettyFormatter::new()));
    value.serialize(&mut json).map_err(io::Error::from)
}

/// Writes `value` as compact JSON with [`SafeStrings`].
pub fn write_json_compact<W: Write, T: Serialize + ?Sized>(out: W, value: &T) -> io::Result<()> {
    let mut json = serde_json::Serializer::with_formatter(out, SafeStrings(CompactFormatter));
    value.serialize(&mut json).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_stay_exact_and_hold_nothing_a_terminal_obeys() {
        let names = vec![
            "plain",
            "esc\x1b[31m",
            "del\x7f c1\u{9b}2J",
            "bidi\u{202e}gnp.exe",
            "tag\u{e0041}",
            "quote\" back\\ größe",
        ];
        let mut pretty = Vec::new();
        write_json(&mut pretty, &names).unwrap();
        let mut compact = Vec::new();
        write_json_compact(&mut compact, &names).unwrap();
        for bytes in [pretty, compact] {
            let text = String::from_utf8(bytes).unwrap();
            assert!(!text.chars().any(|c| is_unsafe(c) && c != '\n'), "{text}");
            assert!(text.contains(r"bidi\u202egnp.exe"), "{text}");
            assert!(text.contains(r"tag\udb40\udc41"), "{text}");
            assert!(text.contains("größe"), "{text}");
            let read: Vec<String> = serde_json::from_str(&text).unwrap();
            assert_eq!(read, names);
        }
        let mut plain = Vec::new();
        write_json(&mut plain, &["a", "b"]).unwrap();
        assert_eq!(plain, serde_json::to_vec_pretty(&["a", "b"]).unwrap());
    }
}
