//! The status bar under the live view: the session on one line, collection counters on
//! the next.
//!
//! The one idea: the most important facts come first on the session line (state, target,
//! roots), so truncation at the right edge on a narrow screen loses the least; the
//! counters line drops its least important parts whole (indirect calls, then the
//! instrumented functions, then the event rate) so that lost events, the overhead and
//! the timing policy are always read in full.
//! A sampled snapshot (the Sampled view) has lines of its own: how it is sampled, and
//! that nothing is loaded into the target.

use ratatui::style::Style;
use ratatui::text::{Line, Span};

use crate::format::{compact, count, elapsed, percent};
use crate::model::{SamplingStatus, Status};
use crate::printable::printable;
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

/// The two status lines for a screen `width` columns wide: session, then counters.
pub fn status_lines(status: &Status, read_only: bool, width: usize) -> [Line<'static>; 2] {
    if let Some(sampling) = &status.sampling {
        return sampled_lines(status, sampling, read_only);
    }
    let (state, state_style) = state_label(status, read_only);
    let roots = if status.roots.is_empty() {
        "no root yet".to_string()
    } else {
        format!("root: {}", printable(&status.roots.join(", ")))
    };
    let mut session = Line::from(vec![
        Span::styled(format!(" {state}"), state_style),
        Span::raw(SEPARATOR),
        Span::raw(printable(&status.target).into_owned()),
        Span::raw(SEPARATOR),
        Span::raw(elapsed(status.elapsed)),
        Span::raw(SEPARATOR),
    ]);
    if status.shows_cpu_time {
        session
            .spans
            .push(Span::styled("on-CPU times", theme::strong()));
        session.spans.push(Span::raw(SEPARATOR));
    }
    // Before the roots, which may be long: the agreement with the sampled tree.
    if let Some(overlap) = status.overlap {
        session.spans.push(Span::styled(
            format!("overlap {overlap:.3}"),
            theme::strong(),
        ));
        session.spans.push(theme::dim(" with sampled"));
        session.spans.push(Span::raw(SEPARATOR));
    }
    session.spans.push(Span::raw(roots));
    let lost_style = if status.lost_events > 0 {
        theme::error()
    } else {
        Style::new()
    };
    // Shown in this order; on a narrow screen the least important go first, so that
    // what no other place shows (lost events, the overhead, the timing policy) stays.
    let mut counters = vec![
        Counter {
            keep: 3,
            span: Span::raw(format!("{} ev/s", compact(status.events_per_second))),
        },
        Counter {
            keep: 2,
            span: Span::raw(format!(
                "{} instr / {} invoked",
                count(status.instrumented_functions),
                count(status.invoked_functions)
            )),
        },
        Counter {
            keep: 1,
            span: Span::raw(format!(
                "{} indirect: {} followed, {} targets",
                count(status.indirect_call_sites),
                count(status.indirect_sites_followed),
                count(status.indirect_targets)
            )),
        },
        Counter {
            keep: 9,
            span: Span::styled(format!("{} lost", count(status.lost_events)), lost_style),
        },
        Counter {
            keep: 8,
            span: Span::raw(format!(
                "~{} overhead",
                percent(status.estimated_overhead_percent)
            )),
        },
    ];
    if let Some((functions, threshold_ns)) = status.untimed {
        counters.push(Counter {
            keep: 7,
            span: Span::raw(format!(
                "{} untimed (<{threshold_ns:.0} ns)",
                count(functions)
            )),
        });
    }
    [session, fitted(counters, width)]
}

/// One part of a counters line, and how much it matters (the highest is dropped last).
struct Counter {
    keep: u8,
    span: Span<'static>,
}

/// `counters` in their order, separated, without the least important ones that do not
/// fit in `width` columns (the most important one always stays).
fn fitted(mut counters: Vec<Counter>, width: usize) -> Line<'static> {
    let columns = |counters: &[Counter]| -> usize {
        1 + counters.iter().map(|c| c.span.width()).sum::<usize>()
            + SEPARATOR.chars().count() * counters.len().saturating_sub(1)
    };
    while counters.len() > 1 && columns(&counters) > width {
        let least = (0..counters.len())
            .min_by_key(|&i| counters[i].keep)
            .expect("not empty");
        counters.remove(least);
    }
    let mut spans = vec![Span::raw(" ")];
    for (i, counter) in counters.into_iter().enumerate() {
        if i > 0 {
            spans.push(Span::raw(SEPARATOR));
        }
        spans.push(counter.span);
    }
    Line::from(spans)
}

/// The Sampled view's two lines: what is sampled and how, then its counters.
fn sampled_lines(
    status: &Status,
    sampling: &SamplingStatus,
    read_only: bool,
) -> [Line<'static>; 2] {
    let (state, state_style) = if read_only {
        ("READ-ONLY", theme::strong())
    } else if sampling.stopped {
        ("SAMPLED", theme::warning())
    } else {
        ("SAMPLING", theme::good())
    };
    let session = Line::from(vec![
        Span::styled(format!(" {state}"), state_style),
        Span::raw(SEPARATOR),
        Span::raw(printable(&status.target).into_owned()),
        Span::raw(SEPARATOR),
        Span::raw(elapsed(status.elapsed)),
        Span::raw(SEPARATOR),
        Span::raw(format!(
            "{} Hz {} clock: {} samples",
            sampling.rate_hz,
            printable(&sampling.clock),
            count(sampling.samples)
        )),
    ]);
    let lost_style = if sampling.lost_samples > 0 {
        theme::error()
    } else {
        Style::new()
    };
    let what = if read_only {
        "a saved sampled profile"
    } else if sampling.stopped {
        "sampling stopped: the tree stays as it was"
    } else {
        "nothing loaded into the target"
    };
    let counters = Line::from(vec![
        Span::raw(format!(
            " {} thread{}",
            count(sampling.threads as u64),
            if sampling.threads == 1 { "" } else { "s" }
        )),
        Span::raw(SEPARATOR),
        Span::styled(format!("{} lost", count(sampling.lost_samples)), lost_style),
        Span::raw(SEPARATOR),
        Span::raw(format!(
            "{} stacks truncated",
            count(sampling.truncated_stacks)
        )),
        Span::raw(SEPARATOR),
        Span::raw(what),
    ]);
    [session, counters]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(line: &Line) -> String {
        line.spans.iter().map(|s| s.content.as_ref()).collect()
    }

    #[test]
    fn a_narrow_counters_line_drops_whole_parts_and_keeps_losses_overhead_and_policy() {
        let status = Status {
            lost_events: 12,
            estimated_overhead_percent: 12.4,
            untimed: Some((2, 26.5)),
            ..Status::default()
        };
        let wide = text(&status_lines(&status, false, 200)[1]);
        assert!(wide.contains("indirect") && wide.contains("ev/s"), "{wide}");
        for width in [100, 80, 60] {
            let line = text(&status_lines(&status, false, width)[1]);
            assert!(line.chars().count() <= width, "{width}: {line}");
            for kept in ["12 lost", "overhead", "2 untimed (<26 ns)"] {
                assert!(line.contains(kept), "{width}: {line}");
            }
        }
        let narrow = text(&status_lines(&status, false, 60)[1]);
        assert!(!narrow.contains("indirect"), "{narrow}");
    }
}
