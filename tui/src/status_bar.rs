//! The status bar under the live view: the session on one line, collection counters on
//! the next.
//!
//! The one idea: the most important facts come first on each line (state, target, roots;
//! rate and counters), so truncation at the right edge on a narrow screen loses the least.

use ratatui::style::Style;
use ratatui::text::{Line, Span};

use crate::format::{compact, count, elapsed, percent};
use crate::model::Status;
use crate::theme;

const SEPARATOR: &str = " │ ";

/// The collection state shown first on the status bar.
pub fn state_label(status: &Status, read_only: bool) -> (&'static str, Style) {
    if read_only {
        ("READ-ONLY", theme::strong())
    } else if status.detached {
        ("DETACHED", theme::warning())
    } else if status.paused {
        ("PAUSED", theme::warning())
    } else {
        ("RUNNING", theme::good())
    }
}

/// The two status lines: session, then counters.
pub fn status_lines(status: &Status, read_only: bool) -> [Line<'static>; 2] {
    let (state, state_style) = state_label(status, read_only);
    let roots = if status.roots.is_empty() {
        "no root yet".to_string()
    } else {
        format!("root: {}", status.roots.join(", "))
    };
    let session = Line::from(vec![
        Span::styled(format!(" {state}"), state_style),
        Span::raw(SEPARATOR),
        Span::raw(status.target.clone()),
        Span::raw(SEPARATOR),
        Span::raw(elapsed(status.elapsed)),
        Span::raw(SEPARATOR),
        Span::raw(roots),
    ]);
    let lost_style = if status.lost_events > 0 {
        theme::error()
    } else {
        Style::new()
    };
    let counters = Line::from(vec![
        Span::raw(format!(" {} ev/s", compact(status.events_per_second))),
        Span::raw(SEPARATOR),
        Span::raw(format!(
            "{} instr / {} invoked",
            count(status.instrumented_functions),
            count(status.invoked_functions)
        )),
        Span::raw(SEPARATOR),
        Span::raw(format!(
            "{} indirect: {} followed, {} targets",
            count(status.indirect_call_sites),
            count(status.indirect_sites_followed),
            count(status.indirect_targets)
        )),
        Span::raw(SEPARATOR),
        Span::styled(format!("{} lost", count(status.lost_events)), lost_style),
        Span::raw(SEPARATOR),
        Span::raw(format!(
            "~{} overhead",
            percent(status.estimated_overhead_percent)
        )),
    ]);
    [session, counters]
}
