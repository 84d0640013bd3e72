//! Function and module names as `tendril report` prints them.
//!
//! The one idea: a name comes from the target's symbol tables (or a profile file anyone
//! can write), so it may hold any character — an escape sequence that recolours the
//! terminal, moves its cursor or rewrites its title, a carriage return that hides the
//! line. No control character is ever printed raw: each is written as `\xNN` (C0
//! controls and DEL) or `\u{NN}` (C1 controls, which some terminals obey as well).
//! Folded stacks keep names lossless: `\` itself is written `\x5c` there, so every
//! name can be read back; only `;`, which separates frames, becomes `:`.

use std::borrow::Cow;
use std::fmt::Write;

/// `name` with its control characters escaped, for the tree and hot-spot rows.
pub fn printable(name: &str) -> Cow<'_, str> {
    if !name.chars().any(char::is_control) {
        return Cow::Borrowed(name);
    }
    let mut text = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        push_escaped(&mut text, c);
    }
    Cow::Owned(text)
}

/// `name` as one frame of a folded stack: control characters and `\` escaped, `;`
/// (the frame separator) as `:`.
pub fn folded_frame(name: &str) -> Cow<'_, str> {
    if !name
        .chars()
        .any(|c| c.is_control() || c == '\\' || c == ';')
    {
        return Cow::Borrowed(name);
    }
    let mut text = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        match c {
            ';' => text.push(':'),
            '\\' => text.push_str("\\x5c"),
            c => push_escaped(&mut text, c),
        }
    }
    Cow::Owned(text)
}

fn push_escaped(text: &mut String, c: char) {
    match c as u32 {
        code @ (0..=0x1f | 0x7f) => {
            let _ = write!(text, "\\x{code:02x}");
        }
        code if c.is_control() => {
            let _ = write!(text, "\\u{{{code:x}}}");
        }
        _ => text.push(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(printable("plain::name<int>"), "plain::name<int>");
        assert_eq!(
            printable("a\x1b[31mred\x07\r\n\u{9b}2J\x7f"),
            "a\\x1b[31mred\\x07\\x0d\\x0a\\u{9b}2J\\x7f"
        );
        assert_eq!(printable("größe→π"), "größe→π");
    }

    #[test]
    fn folded_frames_are_lossless_and_never_split_a_line() {
        assert_eq!(folded_frame("ns::f"), "ns::f");
        assert_eq!(folded_frame("a;b\\c\nd"), "a:b\\x5cc\\x0ad");
    }
}
