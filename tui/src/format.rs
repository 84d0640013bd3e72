//! Text formatting for cells: numbers, durations, bars, and fitting text into a column.
//!
//! The one idea: every cell is produced at an exact display width (padded or truncated with
//! an ellipsis), so rows line up whatever the names contain and however narrow the screen.

use std::time::Duration;

use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

const ELLIPSIS: char = '…';

/// `text` cut to at most `width` columns, ending in `…` when something was cut — or,
/// for a stripped function's name (`module+0xOFFSET`), cut in the middle so that the
/// offset, the only part that tells such functions apart, stays visible.
pub fn truncate(text: &str, width: usize) -> String {
    if text.width() <= width {
        return text.to_string();
    }
    if width == 0 {
        return String::new();
    }
    if let Some(offset) = offset_suffix(text)
        && offset.width() + 2 <= width
    {
        let head = truncate(&text[..text.len() - offset.len()], width - offset.width());
        return format!("{head}{offset}");
    }
    let mut out = String::new();
    let mut used = 0;
    for ch in text.chars() {
        let w = ch.width().unwrap_or(0);
        if used + w > width - 1 {
            break;
        }
        out.push(ch);
        used += w;
    }
    out.push(ELLIPSIS);
    out
}

/// The `+0xOFFSET` that ends a stripped function's name, if `text` ends with one.
fn offset_suffix(text: &str) -> Option<&str> {
    // (` 0x`: unnamed JIT code, `[jit] 0x…` of module `[jit]`.)
    let at = text.rfind("+0x").max(text.rfind(" 0x"))?;
    let digits = &text[at + 3..];
    (!digits.is_empty() && digits.chars().all(|c| c.is_ascii_hexdigit())).then(|| &text[at..])
}

/// A function's module cell: empty when its name is already `module+0xOFFSET` (a
/// stripped function), so a row names the module once.
pub fn module_cell(name: &str, module: &str) -> String {
    let stripped = name
        .strip_prefix(module)
        .is_some_and(|rest| offset_suffix(rest) == Some(rest));
    if stripped {
        String::new()
    } else {
        module.to_string()
    }
}

/// A self time in milliseconds, or `<res` where it is below what the profiler can
/// measure (the hook cost removed exceeded it) — not a measured 0.
pub fn self_millis(ns: f64, below_resolution: bool) -> String {
    if below_resolution {
        "<res".to_string()
    } else {
        millis(ns)
    }
}

/// What a time cell shows for a node counted, not timed (adaptive timing).
pub const IN_CALLER: &str = "in caller";

/// A total time in milliseconds, marked `?` when its estimated error is larger than
/// itself, or [`IN_CALLER`].
pub fn total_millis(ns: f64, error_ns: Option<f64>, in_caller: bool) -> String {
    if in_caller {
        IN_CALLER.to_string()
    } else if error_ns.is_some_and(|error| error > ns) {
        format!("{}?", millis(ns))
    } else {
        millis(ns)
    }
}

/// `text` truncated to `width` and padded on the right to exactly `width` columns.
pub fn pad_left_aligned(text: &str, width: usize) -> String {
    let mut out = truncate(text, width);
    let used = out.width();
    out.extend(std::iter::repeat_n(' ', width.saturating_sub(used)));
    out
}

/// `text` truncated to `width` and padded on the left to exactly `width` columns.
pub fn pad_right_aligned(text: &str, width: usize) -> String {
    let cut = truncate(text, width);
    let used = cut.width();
    let mut out: String = std::iter::repeat_n(' ', width.saturating_sub(used)).collect();
    out.push_str(&cut);
    out
}

/// Nanoseconds as milliseconds with a precision that fits about eight columns.
pub fn millis(ns: f64) -> String {
    let ms = ns / 1e6;
    let magnitude = ms.abs();
    if magnitude >= 1e7 {
        format!("{:.3e}", ms)
    } else if magnitude >= 1000.0 {
        format!("{ms:.0}")
    } else if magnitude >= 100.0 {
        format!("{ms:.1}")
    } else if magnitude >= 10.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.3}")
    }
}

/// A count: exact below 100,000, then with a k/M/G suffix.
pub fn count(value: u64) -> String {
    if value < 100_000 {
        return value.to_string();
    }
    compact(value as f64)
}

/// An exact count with thousands separators (`104,512`).
pub fn grouped(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// A rate or large quantity with a k/M/G suffix (`1.2M`).
pub fn compact(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude >= 1e9 {
        format!("{:.1}G", value / 1e9)
    } else if magnitude >= 1e6 {
        format!("{:.1}M", value / 1e6)
    } else if magnitude >= 1e3 {
        format!("{:.1}k", value / 1e3)
    } else {
        format!("{value:.0}")
    }
}

/// A percentage with one decimal (`42.0%`).
pub fn percent(value: f64) -> String {
    format!("{value:.1}%")
}

/// `part` as a percentage of `whole`; 0 when the whole is empty.
pub fn share(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        part / whole * 100.0
    } else {
        0.0
    }
}

/// Elapsed time as `hh:mm:ss`.
pub fn elapsed(duration: Duration) -> String {
    let seconds = duration.as_secs();
    format!(
        "{:02}:{:02}:{:02}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}

/// A horizontal bar `width` columns wide filled to `percent` (eighth-block resolution).
pub fn bar(percent: f64, width: usize) -> String {
    const PARTIAL: [char; 8] = [' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉'];
    let fraction = (percent / 100.0).clamp(0.0, 1.0);
    let eighths = (fraction * width as f64 * 8.0).round() as usize;
    let mut out = String::with_capacity(width * 3);
    out.extend(std::iter::repeat_n('█', eighths / 8));
    if eighths / 8 < width {
        out.push(PARTIAL[eighths % 8]);
    }
    let used = out.chars().count();
    out.extend(std::iter::repeat_n(' ', width.saturating_sub(used)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_width_and_marks_the_cut() {
        assert_eq!(truncate("compute_block", 20), "compute_block");
        assert_eq!(truncate("compute_block", 8), "compute…");
        // Stripped names keep their offsets: three of them never look the same.
        let names = [
            "libpython3.12.so.1.0+0x1a2b30",
            "libpython3.12.so.1.0+0x1a2b90",
            "libpython3.12.so.1.0+0x1a2c10",
        ];
        let cut: Vec<String> = names.iter().map(|n| truncate(n, 16)).collect();
        assert_eq!(cut[0], "libpyt…+0x1a2b30");
        assert!(cut.iter().all(|c| c.width() == 16), "{cut:?}");
        assert!(cut[0] != cut[1] && cut[1] != cut[2], "{cut:?}");
        assert_eq!(truncate("compute_block", 1), "…");
        assert_eq!(truncate("compute_block", 0), "");
        assert_eq!(pad_left_aligned("ab", 4), "ab  ");
        assert_eq!(pad_right_aligned("ab", 4), "  ab");
        assert_eq!(truncate("日本語の関数", 5), "日本…");
    }

    #[test]
    fn stripped_names_leave_the_module_cell_empty() {
        assert_eq!(module_cell("libc.so.6+0x16d800", "libc.so.6"), "");
        assert_eq!(module_cell("memcpy", "libc.so.6"), "libc.so.6");
        assert_eq!(module_cell("a.so+0x10", "b.so"), "b.so");
        assert_eq!(self_millis(0.0, true), "<res");
        assert_eq!(self_millis(0.0, false), "0.000");
    }

    #[test]
    fn numbers_are_compact() {
        assert_eq!(millis(1_234_567.0), "1.235");
        assert_eq!(millis(12_345_678_900.0), "12346");
        assert_eq!(count(99_999), "99999");
        assert_eq!(count(1_250_000), "1.2M");
        assert_eq!(grouped(104_512), "104,512");
        assert_eq!(grouped(1_000), "1,000");
        assert_eq!(grouped(999), "999");
        assert_eq!(elapsed(Duration::from_secs(3723)), "01:02:03");
    }

    #[test]
    fn bars_fill_to_their_width() {
        assert_eq!(bar(100.0, 4), "████");
        assert_eq!(bar(0.0, 4), "    ");
        assert_eq!(bar(50.0, 4).chars().count(), 4);
        assert_eq!(bar(250.0, 3), "███");
    }
}
