//! How numbers and durations are written for people: `1,500 calls`, `2.0` seconds.
//!
//! Used by the commands' lines and by the listings of the edge analysis and the live
//! UI alike, so it sits below both.

use std::time::Duration;

/// `1234567` as `1,234,567`: the live UI's own grouping, so a number reads the same in
/// a command's line and on the screen.
pub use tendril_tui::grouped as thousands;

/// `1 call`, `1,500 calls`.
pub fn amount(count: u64, one: &str, many: &str) -> String {
    format!(
        "{} {}",
        thousands(count),
        if count == 1 { one } else { many }
    )
}

/// A requested duration in seconds, to the millisecond, with one to three decimals:
/// `5.0`, `0.25`, `0.001`.
pub fn format_seconds(duration: Duration) -> String {
    let millis = duration.as_millis();
    let whole = millis / 1000;
    let fraction = format!("{:03}", millis % 1000);
    let fraction = fraction.trim_end_matches('0');
    let fraction = if fraction.is_empty() { "0" } else { fraction };
    format!("{whole}.{fraction}")
}

/// A measured duration in seconds: one decimal, or to the millisecond below 0.1 s (so
/// a short run never shows as `0.0 s`).
pub fn format_elapsed(elapsed: Duration) -> String {
    if elapsed < Duration::from_millis(100) {
        format_seconds(elapsed)
    } else {
        format!("{:.1}", elapsed.as_secs_f64())
    }
}
