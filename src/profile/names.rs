//! Function and module names as `tendril report` prints them.
//!
//! The one idea: a name comes from the target's symbol tables (or a profile file anyone
//! can write), so it may hold any character — an escape sequence that recolours the
//! terminal, moves its cursor or rewrites its title, a carriage return that hides the
//! line, a right-to-left override. Every name is escaped by the one sanitizer,
//! [`printable`] (`tendril_tui::printable`: `\x1b`, `\u{9b}`, `\u{202e}`, `\\`), so
//! no two names print alike and every name can be read back; in folded stacks only
//! `;`, which separates frames, becomes `:`.
//!
//! A row names a function once: `name (module)`, or for a stripped function, whose
//! name is already `module+0xOFFSET`, just that. A row too wide for the terminal is cut
//! in the middle, never at the end, and the `+0xOFFSET` of a stripped name is always
//! kept whole — so functions that differ only in their offsets never look the same.

pub use crate::terminal_text::printable;
use std::borrow::Cow;
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

/// Narrowest a cut name gets, whatever the room left.
pub const MIN_NAME_WIDTH: usize = 16;

/// How a report row names a function: `name (module)`, or only `name` when the name
/// is already `module+0xOFFSET` (a stripped function) or `[jit] 0x…` (unnamed JIT
/// code, module `[jit]`); control characters escaped.
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
    // (` 0x`: unnamed JIT code, `[jit] 0x…` of module `[jit]`.)
    let at = text.rfind("+0x").max(text.rfind(" 0x"))?;
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

/// `name` as one frame of a folded stack: escaped ([`printable`]), and `;` (the frame
/// separator) as `:`.
pub fn folded_frame(name: &str) -> Cow<'_, str> {
    match printable(name) {
        Cow::Borrowed(name) if !name.contains(';') => Cow::Borrowed(name),
        escaped => Cow::Owned(escaped.replace(';', ":")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stripped_name_names_its_module_once() {
        assert_eq!(
            function_label("libc.so.6+0x16d800", "libc.so.6"),
            "libc.so.6+0x16d800"
        );
        assert_eq!(function_label("memcpy", "libc.so.6"), "memcpy (libc.so.6)");
        // Unnamed JIT code names its module once too; named JIT code like any function.
        assert_eq!(function_label("[jit] 0x7f0012", "[jit]"), "[jit] 0x7f0012");
        assert_eq!(function_label("JS:*leafy", "[jit]"), "JS:*leafy ([jit])");
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
        assert_eq!(folded_frame("a;b\\c\nd\u{202e}"), "a:b\\\\c\\x0ad\\u{202e}");
    }
}
