//! Text from the target made safe to print on a terminal: the one sanitizer of tendril,
//! used by every command that prints a name, a path, a thread or process name, or a
//! string the agent sent, and by the terminal UI as it draws them.
//!
//! The one idea: such text is attacker-controlled — root profiles other users'
//! processes, whose symbol tables, file names and thread names they choose — so it may
//! hold an escape sequence that recolours the terminal, moves its cursor or rewrites its
//! title, a carriage return that hides a line, a right-to-left override that shows
//! `gnp.exe` for `exe.png`, or an invisible character that makes two names look the
//! same. None of those is ever printed raw; each is *shown*, escaped:
//!
//! - C0 controls and DEL as `\xNN` (`\x1b`, `\x0d`, `\x7f`);
//! - C1 controls (U+0080–U+009F, which some terminals obey as well), the bidirectional
//!   controls (U+202A–U+202E, U+2066–U+2069, U+200E, U+200F, U+061C), the other
//!   characters Unicode says to draw as nothing (`Default_Ignorable_Code_Point`: zero
//!   widths, joiners, soft hyphens, tags, variation selectors…) and the line and
//!   paragraph separators as `\u{NN}` (`\u{9b}`, `\u{202e}`);
//! - a byte that is not UTF-8 (in a byte string: a file name, a thread name) as `\xNN`,
//!   always 80 or above, so it is never read as a control character;
//! - the backslash itself as `\\`.
//!
//! Escaping the backslash makes the mapping one-to-one: two different names never print
//! alike (a name that spells `\x1b` prints `\\x1b`). The price is that text must be
//! escaped exactly once, where it meets the terminal: strings are kept exact everywhere
//! else (errors, messages, the view-model), and the place that prints one escapes it.

use std::borrow::Cow;
use std::fmt::Write;

/// Whether `c` is never printed raw: a control character, a bidirectional control, an
/// invisible character, or a line or paragraph separator.
pub fn is_unsafe(c: char) -> bool {
    c.is_control() || is_invisible(c) || matches!(c, '\u{2028}' | '\u{2029}')
}

/// Unicode's `Default_Ignorable_Code_Point` (DerivedCoreProperties.txt): characters a
/// terminal draws as nothing. The bidirectional controls are among them.
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00ad}'
            | '\u{034f}'
            | '\u{061c}'
            | '\u{115f}'..='\u{1160}'
            | '\u{17b4}'..='\u{17b5}'
            | '\u{180b}'..='\u{180f}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{3164}'
            | '\u{fe00}'..='\u{fe0f}'
            | '\u{feff}'
            | '\u{ffa0}'
            | '\u{fff0}'..='\u{fff8}'
            | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0000}'..='\u{e0fff}'
    )
}

/// `text` with every unsafe character (see [`is_unsafe`]) and every backslash escaped;
/// borrowed when there is nothing to escape.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c == '\\' || is_unsafe(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    push_printable(&mut out, text);
    Cow::Owned(out)
}

/// A byte string (a path, a thread or process name, a line read from a file) as
/// [`printable`] text: its UTF-8 parts escaped as text is, each byte that is not UTF-8
/// as `\xNN`.
pub fn printable_bytes(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => printable(text),
        Err(_) => {
            let mut out = String::with_capacity(bytes.len() + 8);
            for chunk in bytes.utf8_chunks() {
                push_printable(&mut out, chunk.valid());
                for byte in chunk.invalid() {
                    let _ = write!(out, "\\x{byte:02x}");
                }
            }
            Cow::Owned(out)
        }
    }
}

/// A line tendril printed once already (its stderr, captured while the terminal UI
/// runs), to show again: as it is when it holds nothing unsafe — its backslashes are
/// then the first printing's escapes — and escaped like any text otherwise (a line
/// some library or a panic wrote raw).
pub fn already_printed(line: &str) -> Cow<'_, str> {
    if line.chars().any(is_unsafe) {
        printable(line)
    } else {
        Cow::Borrowed(line)
    }
}

fn push_printable(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\0'..='\x1f' | '\x7f' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if is_unsafe(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_names_are_kept_as_they_are() {
        for name in [
            "plain::name<int>",
            "größe→π",
            "日本語の関数",
            "libc.so.6+0x16d800",
            "operator()",
        ] {
            assert!(matches!(printable(name), Cow::Borrowed(_)), "{name}");
        }
    }

    #[test]
    fn controls_are_shown_escaped() {
        assert_eq!(
            printable("a\x1b[31mred\x07\r\n\u{9b}2J\x7f\0"),
            "a\\x1b[31mred\\x07\\x0d\\x0a\\u{9b}2J\\x7f\\x00"
        );
        assert_eq!(printable("\u{80}\u{85}\u{9f}"), "\\u{80}\\u{85}\\u{9f}");
    }

    #[test]
    fn bidirectional_controls_are_shown_escaped() {
        let bidi = [
            '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}', '\u{2066}', '\u{2067}',
            '\u{2068}', '\u{2069}', '\u{200e}', '\u{200f}', '\u{061c}',
        ];
        for c in bidi {
            let text = format!("exe{c}gnp");
            assert_eq!(printable(&text), format!("exe\\u{{{:x}}}gnp", c as u32));
        }
        assert_eq!(printable("evil\u{202e}eman"), "evil\\u{202e}eman");
    }

    #[test]
    fn invisible_characters_and_separators_are_shown_escaped() {
        assert_eq!(printable("ma\u{200b}in"), "ma\\u{200b}in");
        assert_eq!(printable("a\u{feff}b\u{ad}c"), "a\\u{feff}b\\u{ad}c");
        assert_eq!(printable("x\u{e0041}"), "x\\u{e0041}");
        assert_eq!(printable("one\u{2028}two"), "one\\u{2028}two");
    }

    #[test]
    fn two_different_names_never_print_alike() {
        let names = [
            "a\x1bb",
            "a\\x1bb",
            "a\\\\x1bb",
            "a\u{202e}b",
            "a\\u{202e}b",
            "ab",
            "a\u{200b}b",
            "a\u{9b}b",
            "a\\u{9b}b",
        ];
        let printed: Vec<String> = names.iter().map(|n| printable(n).into_owned()).collect();
        for (i, a) in printed.iter().enumerate() {
            for b in &printed[i + 1..] {
                assert_ne!(a, b, "{printed:?}");
            }
        }
        assert_eq!(printable("a\\x1bb"), "a\\\\x1bb");
    }

    #[test]
    fn nothing_unsafe_survives() {
        let everything: String = (0..0x11_0000u32).filter_map(char::from_u32).collect();
        let printed = printable(&everything);
        assert!(printed.chars().all(|c| !is_unsafe(c)));
        assert!(printed.chars().all(|c| !c.is_control()));
    }

    #[test]
    fn bytes_that_are_not_utf8_are_shown_as_bytes() {
        assert_eq!(printable_bytes(b"ok\x1b"), "ok\\x1b");
        assert_eq!(
            printable_bytes(b"bad\xff\xfe\x1b[2J"),
            "bad\\xff\\xfe\\x1b[2J"
        );
        // A C1 control spelled in UTF-8 is a character; a lone byte 0x9b is not UTF-8.
        assert_eq!(printable_bytes("\u{9b}".as_bytes()), "\\u{9b}");
        assert_eq!(printable_bytes(b"\x9b"), "\\x9b");
        assert_eq!(
            printable_bytes("caf\u{e9}\u{202e}".as_bytes()),
            "caf\u{e9}\\u{202e}"
        );
    }

    #[test]
    fn a_line_printed_once_is_not_escaped_twice() {
        let once = printable("name\x1b[31m\\").into_owned();
        assert_eq!(already_printed(&once), once);
        assert_eq!(already_printed("raw\x1b[2J"), "raw\\x1b[2J");
    }
}
