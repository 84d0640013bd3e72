//! Function and module names as `tendril report` prints them.
//!
//! The one idea: a name comes from the target's symbol tables (or a profile file anyone
//! can write), so it may hold any character — an escape sequence that recolours the
//! terminal, moves its cursor or rewrites its title, a carriage return that hides the
//! line. No control character is ever printed raw: each is written as `\xNN` (C0
//! controls and DEL) or `\u{NN}` (C1 controls, which some terminals obey as well).
//! Folded stacks keep names lossless: `\` itself is written `\x5c` there, so every
//! name can be read back; only `;`, which separates frames, becomes `:`.
//!
//! A row names a function once: `name (module)`, or for a stripped function, whose
//! name is already `module+0xOFFSET`, just that. A row too wide for the terminal is cut
//! in the middle, never at the end, and the `+0xOFFSET` of a stripped name is always
//! kept whole — so functions that differ only in their offsets never look the same.

use std::borrow::Cow;
use std::fmt::Write;
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

/// Narrowest a cut name gets, whatever the room left.
pub const MIN_NAME_WIDTH: usize = 16;

/// How a report row names a function: `name (module)`, or only `name` when the name
/// is already `module+0xOFFSET` (a stripped function); control characters escaped.
pub fn function_label(name: &str, module: &str) -> String {
    if stripped_name_of(name, module) {
        printable(name).into_owned()
    } else {
        format!("{} ({})", printable(name), printable(module))
    }
}

/// Whether `name` is `module+0xOFFSET`: the module already says where it is.
pub fn stripped_name_of(name: &str, module: &str) -> bool {
    name.strip_prefix(module)
        .is_some_and(|rest| offset_suffix(rest) == Some(rest))
}

/// The `+0xOFFSET` that ends `text`, if it ends with one.
fn offset_suffix(text: &str) -> Option<&str> {
    let at = text.rfind("+0x")?;
    let digits = &text[at + 3..];
    (!digits.is_empty() && digits.chars().all(|c| c.is_ascii_hexdigit())).then(|| &text[at..])
}

/// `label` in at most `width` columns (and never fewer than [`MIN_NAME_WIDTH`]): cut
/// in the middle with `…`, keeping its start and its end — the end being at least the
/// `+0xOFFSET` of a stripped name, or the offset and ` (module)` that follow one.
pub fn fit_middle(label: &str, width: usize) -> Cow<'_, str> {
    let width = width.max(MIN_NAME_WIDTH);
    if label.width() <= width {
        return Cow::Borrowed(label);
    }
    // What must stay whole at the end: from the last `+0x` on, when an offset follows,
    // else the ` (module)`.
    let offset = label.rfind("+0x").filter(|&at| {
        let after = &label[at + 3..];
        let digits = after.split(' ').next().unwrap_or_default();
        !digits.is_empty() && digits.chars().all(|c| c.is_ascii_hexdigit())
    });
    let module = label.ends_with(')').then(|| label.rfind(" (")).flatten();
    let protected = offset.or(module).map_or(0, |at| label[at..].width());
    let room = width - 1;
    let tail_width = if protected < room {
        protected.max(room / 2)
    } else {
        room / 2
    };
    let head = take_width(label.chars(), room - tail_width);
    let tail: String = {
        let reversed = take_width(label.chars().rev(), tail_width);
        reversed.chars().rev().collect()
    };
    Cow::Owned(format!("{head}…{tail}"))
}

/// The leading characters of `chars` that fit in `width` columns.
fn take_width(chars: impl Iterator<Item = char>, width: usize) -> String {
    let mut used = 0;
    let mut out = String::new();
    for c in chars {
        let w = c.width().unwrap_or(0);
        if used + w > width {
            break;
        }
        used += w;
        out.push(c);
    }
    out
}

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
    fn a_stripped_name_names_its_module_once() {
        assert_eq!(
            function_label("libc.so.6+0x16d800", "libc.so.6"),
            "libc.so.6+0x16d800"
        );
        assert_eq!(function_label("memcpy", "libc.so.6"), "memcpy (libc.so.6)");
        // Another module's offset is not this module's name.
        assert_eq!(function_label("a.so+0x10", "b.so"), "a.so+0x10 (b.so)");
        assert_eq!(
            function_label("libc.so.6+0xzz", "libc.so.6"),
            "libc.so.6+0xzz (libc.so.6)"
        );
    }

    #[test]
    fn long_names_are_cut_in_the_middle_and_offsets_stay_whole() {
        let names = [
            "libpython3.12.so.1.0+0x1a2b30",
            "libpython3.12.so.1.0+0x1a2b90",
            "libpython3.12.so.1.0+0x1a2c10",
        ];
        let cut: Vec<String> = names
            .iter()
            .map(|n| fit_middle(n, 20).into_owned())
            .collect();
        assert_eq!(cut[0], "libpython3…+0x1a2b30");
        assert!(cut.iter().all(|c| c.width() == 20), "{cut:?}");
        assert!(cut[0] != cut[1] && cut[1] != cut[2], "{cut:?}");
        // Narrower than the minimum: the minimum.
        assert_eq!(fit_middle(names[0], 3), "libpyt…+0x1a2b30");
        assert_eq!(fit_middle("short (m)", 20), "short (m)");
        let long = "std::vector<int, std::allocator<int>>::push_back (libapp.so)";
        let cut = fit_middle(long, 30);
        assert_eq!(cut.width(), 30);
        assert!(
            cut.starts_with("std::vector") && cut.ends_with(" (libapp.so)"),
            "{cut}"
        );
        // Double-width characters: at most the width, never more.
        let wide = fit_middle("日本語の関数名がとても長い関数 (m)", 16);
        assert!((15..=16).contains(&wide.width()), "{wide}");
    }

    #[test]
    fn folded_frames_are_lossless_and_never_split_a_line() {
        assert_eq!(folded_frame("ns::f"), "ns::f");
        assert_eq!(folded_frame("a;b\\c\nd"), "a:b\\x5cc\\x0ad");
    }
}
