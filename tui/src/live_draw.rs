//! Drawing the live view: the tab line and the call tree, hot spots and threads tables.
//!
//! The one idea: each table draws only the rows inside its scroll window, from rows that
//! were derived once per snapshot, so a frame costs the same for 100 or 100,000 nodes.
//! A sampled snapshot (the Sampled view) is drawn the same way, with samples where an
//! instrumented one has calls.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use crate::columns::{Align, ColumnLayout, ColumnSpec};
use crate::format::{
    IN_CALLER, bar, count, millis, module_cell, pad_right_aligned, percent, self_millis, share,
    total_millis,
};
use crate::live::{LiveTab, LiveView, TreeSource, source_roots};
use crate::model::ProfileSnapshot;
use crate::printable::printable;

/// The calls cell of a call into JIT code: not counted, never patched.
const JIT_MARK: &str = "jit";
use crate::theme;
use crate::tree_view::{FlatRow, SortKey};

const INDENT: usize = 2;
const BAR_WIDTH: usize = 12;

fn dim() -> Style {
    Style::new().add_modifier(Modifier::DIM)
}

/// The tab line: tab titles, whose tree is shown, and the sort order.
pub fn draw_tabs(live: &LiveView, snapshot: &ProfileSnapshot, frame: &mut Frame, area: Rect) {
    let mut spans = Vec::new();
    for (number, tab) in LiveTab::ALL.iter().enumerate() {
        let text = format!(" {} {} ", number + 1, tab.title());
        let style = if *tab == live.tab {
            theme::selected().add_modifier(Modifier::BOLD)
        } else {
            Style::new()
        };
        spans.push(Span::styled(text, style));
    }
    let source = match live.source {
        TreeSource::Merged => "all threads".to_string(),
        TreeSource::Thread(tid) => match snapshot.threads.iter().find(|thread| thread.tid == tid) {
            Some(thread) if !thread.name.is_empty() => {
                format!("thread {tid} {}", printable(&thread.name))
            }
            _ => format!("thread {tid}"),
        },
    };
    let sampled = snapshot.status.sampling.is_some();
    if sampled {
        spans.push(Span::styled("  SAMPLED", theme::strong()));
        spans.push(theme::dim(format!(" · {source}")));
    } else {
        spans.push(theme::dim(format!("  {source}")));
    }
    if live.tab == LiveTab::CallTree {
        let sort = match live.tree.sort() {
            SortKey::Calls if sampled => "samples",
            other => other.label(),
        };
        spans.push(theme::dim(format!(" · sort: {sort}")));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

/// The body of the current tab.
pub fn draw_body(
    live: &mut LiveView,
    snapshot: &ProfileSnapshot,
    read_only: bool,
    frame: &mut Frame,
    area: Rect,
) {
    live.refresh(snapshot);
    let lines = match live.tab {
        LiveTab::CallTree => tree_lines(live, snapshot, read_only, area),
        LiveTab::HotSpots => hot_spot_lines(live, snapshot, area),
        LiveTab::Threads => thread_lines(live, snapshot, area),
    };
    frame.render_widget(Paragraph::new(lines), area);
}

/// Splits `area` into a header line and the body height, or `None` if nothing fits.
fn body_height(area: Rect) -> Option<usize> {
    (area.height >= 2).then(|| area.height as usize - 1)
}

/// The count column's title: samples in a sampled tree, calls otherwise.
fn count_title(snapshot: &ProfileSnapshot) -> &'static str {
    if snapshot.status.sampling.is_some() {
        "SAMPLES"
    } else {
        "CALLS"
    }
}

fn tree_columns(sort: SortKey, sampled: bool) -> [ColumnSpec; 7] {
    let marked = |key: SortKey, plain: &'static str, with_mark: &'static str| {
        if sort == key { with_mark } else { plain }
    };
    let counts = if sampled {
        marked(SortKey::Calls, "SAMPLES", "SAMPLES▾")
    } else {
        marked(SortKey::Calls, "CALLS", "CALLS▾")
    };
    [
        ColumnSpec::flexible("FUNCTION"),
        ColumnSpec::new("MODULE", 16, Align::Left, 30).styled(dim()),
        ColumnSpec::new(counts, 9, Align::Right, 10),
        ColumnSpec::new(
            marked(SortKey::Total, "TOTAL ms", "TOTAL ms▾"),
            10,
            Align::Right,
            8,
        ),
        ColumnSpec::new(
            marked(SortKey::SelfTime, "SELF ms", "SELF ms▾"),
            10,
            Align::Right,
            12,
        ),
        ColumnSpec::new("%", 6, Align::Right, 14),
        ColumnSpec::new("", BAR_WIDTH, Align::Left, 40).styled(theme::bar()),
    ]
}

/// Indentation and expander before a tree row's name. Indentation is capped at half the
/// name column; deeper rows show their depth instead, so deep recursion stays readable.
fn tree_label(row: &FlatRow, name_width: usize) -> String {
    let expander = match (row.has_children, row.expanded) {
        (false, _) => "  ",
        (true, true) => "▾ ",
        (true, false) => "▸ ",
    };
    let max_indent = name_width / 2;
    let indent = row.depth * INDENT;
    let prefix = if indent <= max_indent {
        " ".repeat(indent)
    } else {
        pad_right_aligned(&format!("{}→", row.depth), max_indent)
    };
    format!("{prefix}{expander}{}", row.name)
}

fn tree_lines(
    live: &mut LiveView,
    snapshot: &ProfileSnapshot,
    read_only: bool,
    area: Rect,
) -> Vec<Line<'static>> {
    let Some(height) = body_height(area) else {
        return Vec::new();
    };
    let sampled = snapshot.status.sampling.is_some();
    let layout = ColumnLayout::plan(
        area.width as usize,
        &tree_columns(live.tree.sort(), sampled),
    );
    let mut lines = vec![layout.header(theme::header())];
    let tree = &mut live.tree;
    let total = tree.roots_total_ns();
    let len = tree.rows().len();
    let window = tree.cursor_mut().visible(height, len);
    let selected = tree.cursor().selected();
    for index in window {
        let row = &tree.rows()[index];
        let row_share = share(row.total_ns, total);
        let cells = [
            tree_label(row, layout.name_width()),
            module_cell(&row.name, &row.module),
            if row.jit {
                JIT_MARK.to_string()
            } else {
                count(row.calls)
            },
            total_millis(row.total_ns, row.error_ns, row.in_caller),
            match row.in_caller {
                true => IN_CALLER.to_string(),
                false => self_millis(row.self_ns, row.below_resolution),
            },
            percent(row_share),
            bar(row_share, BAR_WIDTH),
        ];
        let mut line = layout.row(&cells);
        if index == selected {
            line = line.style(theme::selected());
        }
        lines.push(line);
    }
    if tree.rows().is_empty() {
        let waiting = source_roots(snapshot, live.source).is_empty()
            && !read_only
            && !snapshot.status.detached;
        let empty = if waiting && sampled {
            "  no samples yet: a sample comes from a thread using the CPU (r picks a root by name)"
        } else if waiting {
            "  no calls yet: waiting for a root function to run"
        } else {
            "  no calls recorded"
        };
        lines.push(theme::dim_line(empty));
    }
    lines
}

fn hot_spot_lines(
    live: &mut LiveView,
    snapshot: &ProfileSnapshot,
    area: Rect,
) -> Vec<Line<'static>> {
    let Some(height) = body_height(area) else {
        return Vec::new();
    };
    const COLUMNS: [ColumnSpec; 7] = [
        ColumnSpec::flexible("FUNCTION"),
        ColumnSpec::new("MODULE", 16, Align::Left, 30),
        ColumnSpec::new("CALLS", 9, Align::Right, 10),
        ColumnSpec::new("SELF ms▾", 10, Align::Right, 8),
        ColumnSpec::new("%", 6, Align::Right, 12),
        ColumnSpec::new("TOTAL ms", 10, Align::Right, 14),
        ColumnSpec::new("", BAR_WIDTH, Align::Left, 40),
    ];
    let columns = COLUMNS.map(|spec| match spec.title {
        "MODULE" => spec.styled(dim()),
        "" => spec.styled(theme::bar()),
        "CALLS" => ColumnSpec {
            title: count_title(snapshot),
            ..spec
        },
        _ => spec,
    });
    let layout = ColumnLayout::plan(area.width as usize, &columns);
    let mut lines = vec![layout.header(theme::header())];
    let total_self: f64 = live.hot_spots.spots().iter().map(|spot| spot.self_ns).sum();
    let len = live.hot_spots.spots().len();
    let window = live.hot_spots.cursor.visible(height, len);
    let selected = live.hot_spots.cursor.selected();
    for index in window {
        let spot = &live.hot_spots.spots()[index];
        let spot_share = share(spot.self_ns, total_self);
        let cells = [
            spot.label(),
            module_cell(&spot.name, &spot.module),
            count(spot.calls),
            self_millis(spot.self_ns, spot.below_resolution),
            percent(spot_share),
            millis(spot.total_ns),
            bar(spot_share, BAR_WIDTH),
        ];
        let mut line = layout.row(&cells);
        if index == selected {
            line = line.style(theme::selected());
        }
        lines.push(line);
    }
    if len == 0 {
        lines.push(theme::dim_line(if snapshot.status.sampling.is_some() {
            "  no samples yet"
        } else {
            "  no calls recorded"
        }));
    }
    lines
}

fn thread_lines(live: &mut LiveView, snapshot: &ProfileSnapshot, area: Rect) -> Vec<Line<'static>> {
    let Some(height) = body_height(area) else {
        return Vec::new();
    };
    const COLUMNS: [ColumnSpec; 6] = [
        // Threads come in thread-id order (`ProfileSnapshot::threads`): say so.
        ColumnSpec::new("TID▴", 8, Align::Right, 0),
        ColumnSpec::flexible("THREAD"),
        ColumnSpec::new("CALLS", 9, Align::Right, 10),
        ColumnSpec::new("TOTAL ms", 10, Align::Right, 8),
        ColumnSpec::new("%", 6, Align::Right, 12),
        ColumnSpec::new("", BAR_WIDTH, Align::Left, 30),
    ];
    let columns = COLUMNS.map(|spec| match spec.title {
        "" => spec.styled(theme::bar()),
        "CALLS" => ColumnSpec {
            title: count_title(snapshot),
            ..spec
        },
        _ => spec,
    });
    let layout = ColumnLayout::plan(area.width as usize, &columns);
    let mut lines = vec![layout.header(theme::header())];
    let all_threads: f64 = snapshot.threads.iter().map(|thread| thread.total_ns).sum();
    let window = live.threads.visible(height, snapshot.threads.len());
    let selected = live.threads.selected();
    for index in window {
        let thread = &snapshot.threads[index];
        let thread_share = share(thread.total_ns, all_threads);
        let filtered = live.source == TreeSource::Thread(thread.tid);
        let name = format!("{}{}", if filtered { "● " } else { "" }, thread.name);
        let cells = [
            thread.tid.to_string(),
            name,
            count(thread.calls),
            millis(thread.total_ns),
            percent(thread_share),
            bar(thread_share, BAR_WIDTH),
        ];
        let mut line = layout.row(&cells);
        if index == selected {
            line = line.style(theme::selected());
        }
        lines.push(line);
    }
    if snapshot.threads.is_empty() {
        lines.push(theme::dim_line(if snapshot.status.sampling.is_some() {
            "  no thread sampled yet"
        } else {
            "  no thread has entered a root yet"
        }));
    }
    lines
}
