//! The key map of every screen, and the help overlay and footer hints drawn from it.
//!
//! The one idea: the keys are listed once, here, with whether they need a live target, so
//! the help overlay, the footer and the read-only mode can never disagree with each other.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph};

use crate::format::pad_left_aligned;
use crate::theme;

/// What a key needs to be available.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Always available.
    Nothing,
    /// An attached target (not detached, not read-only).
    Target,
    /// Live data that can still be saved (not read-only).
    Session,
    /// A sampled tree to show (the session began in the Sampled view).
    Samples,
}

/// What the session has at the moment, which decides the keys available.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Context {
    /// Browsing a saved profile.
    pub read_only: bool,
    /// The target is detached (or gone).
    pub detached: bool,
    /// There is a sampled tree.
    pub sampled: bool,
}

/// One line of the key map.
#[derive(Debug, Clone, Copy)]
pub struct KeyHelp {
    pub keys: &'static str,
    pub what: &'static str,
    pub needs: Needs,
    /// Shown in the footer when no message is pending.
    pub hint: Option<&'static str>,
}

const fn key(
    keys: &'static str,
    what: &'static str,
    needs: Needs,
    hint: Option<&'static str>,
) -> KeyHelp {
    KeyHelp {
        keys,
        what,
        needs,
        hint,
    }
}

pub const PROCESS_PICKER_KEYS: &[KeyHelp] = &[
    key(
        "type",
        "filter by pid, user or command line",
        Needs::Nothing,
        Some("type to filter"),
    ),
    key("↑↓ PgUp PgDn Home End", "move", Needs::Nothing, None),
    key(
        "Enter",
        "attach to the selected process",
        Needs::Nothing,
        Some("Enter attach"),
    ),
    key(
        "Esc",
        "clear the filter; quit when it is empty",
        Needs::Nothing,
        None,
    ),
    key(
        "Ctrl-R",
        "refresh the process list",
        Needs::Nothing,
        Some("Ctrl-R refresh"),
    ),
    key(
        "q Ctrl-C",
        "quit (q only while the filter is empty)",
        Needs::Nothing,
        Some("q quit"),
    ),
    key("F1", "this help", Needs::Nothing, Some("F1 help")),
];

pub const ROOT_PICKER_KEYS: &[KeyHelp] = &[
    key(
        "type",
        "fuzzy-filter functions by name (smart case)",
        Needs::Nothing,
        Some("type to filter"),
    ),
    key("↑↓ PgUp PgDn Home End", "move", Needs::Nothing, None),
    key(
        "Tab",
        "select or unselect the function (for several roots)",
        Needs::Nothing,
        Some("Tab select"),
    ),
    key(
        "Enter",
        "profile the selection plus this function (after Tab: the selection)",
        Needs::Nothing,
        Some("Enter profile"),
    ),
    key(
        "Esc",
        "clear the filter; back to the live view when it is empty",
        Needs::Nothing,
        Some("Esc back"),
    ),
    key("Ctrl-C", "quit", Needs::Nothing, Some("Ctrl-C quit")),
    key("F1", "this help", Needs::Nothing, Some("F1 help")),
];

pub const LIVE_KEYS: &[KeyHelp] = &[
    key(
        "1 2 3 Tab Shift-Tab",
        "call tree, hot spots, threads",
        Needs::Nothing,
        Some("1-3 views"),
    ),
    key("↑↓ jk PgUp PgDn Home End", "move", Needs::Nothing, None),
    key(
        "→ ←",
        "expand / collapse (or step to child / parent)",
        Needs::Nothing,
        None,
    ),
    key(
        "Enter",
        "tree: expand/collapse; threads: show its tree",
        Needs::Nothing,
        None,
    ),
    key(
        "s",
        "sort the tree by total, self or calls",
        Needs::Nothing,
        Some("s sort"),
    ),
    key(
        "h",
        "expand the hottest path below the selected node",
        Needs::Nothing,
        Some("h hottest"),
    ),
    key(
        "c",
        "collapse everything below the roots",
        Needs::Nothing,
        None,
    ),
    key("m", "back to all threads merged", Needs::Nothing, None),
    key(
        "C",
        "wall-clock or on-CPU times (waiting in system calls, on locks, for a CPU)",
        Needs::Nothing,
        Some("C cpu/wall"),
    ),
    key(
        "E",
        "the selected node's estimated error (the calibration's spread times its calls)",
        Needs::Nothing,
        None,
    ),
    key(
        "e",
        "the selected function's code with exact block, branch and path counts, live",
        Needs::Target,
        Some("e code"),
    ),
    key(
        "S",
        "the sampled tree (taken before instrumenting), to compare",
        Needs::Samples,
        Some("S sampled"),
    ),
    key("Esc", "clear the message line", Needs::Nothing, None),
    key(
        "p",
        "pause or resume collection",
        Needs::Target,
        Some("p pause"),
    ),
    key(
        "X",
        "reset: discard the collected data",
        Needs::Target,
        Some("X reset"),
    ),
    key(
        "r",
        "add or change the root functions",
        Needs::Target,
        Some("r roots"),
    ),
    key(
        "w",
        "save the profile to a file",
        Needs::Session,
        Some("w save"),
    ),
    key(
        "t",
        "trace the next second: a timeline saved with the profile",
        Needs::Target,
        None,
    ),
    key(
        "d",
        "detach: restore the target, keep browsing",
        Needs::Target,
        Some("d detach"),
    ),
    key(
        "q Ctrl-C",
        "quit (detaches first)",
        Needs::Nothing,
        Some("q quit"),
    ),
    key("? F1", "this help", Needs::Nothing, Some("? help")),
];

pub const SAMPLED_KEYS: &[KeyHelp] = &[
    key(
        "1 2 3 Tab Shift-Tab",
        "call tree, hot spots, threads (sampled)",
        Needs::Nothing,
        Some("1-3 views"),
    ),
    key("↑↓ jk PgUp PgDn Home End", "move", Needs::Nothing, None),
    key(
        "→ ←",
        "expand / collapse (or step to child / parent)",
        Needs::Nothing,
        None,
    ),
    key(
        "Enter",
        "instrument this function: make it the root and watch it live (threads: show its tree)",
        Needs::Target,
        Some("Enter instrument"),
    ),
    key(
        "s",
        "sort the tree by total, self or samples",
        Needs::Nothing,
        Some("s sort"),
    ),
    key(
        "h",
        "expand the hottest path below the selected node",
        Needs::Nothing,
        Some("h hottest"),
    ),
    key(
        "c",
        "collapse everything below the roots",
        Needs::Nothing,
        None,
    ),
    key("m", "back to all threads merged", Needs::Nothing, None),
    key(
        "r",
        "choose a root by typing its name (the root picker)",
        Needs::Target,
        Some("r roots"),
    ),
    key(
        "w",
        "save the sampled profile to a file (tendril report, compare, view read it)",
        Needs::Nothing,
        Some("w save"),
    ),
    key(
        "S",
        "the instrumented tree, once a root is instrumented",
        Needs::Nothing,
        Some("S instrumented"),
    ),
    key("Esc", "clear the message line", Needs::Nothing, None),
    key(
        "q Ctrl-C",
        "quit (detaches first if a root is instrumented)",
        Needs::Nothing,
        Some("q quit"),
    ),
    key("? F1", "this help", Needs::Nothing, Some("? help")),
];

pub const CODE_KEYS: &[KeyHelp] = &[
    key("↑↓ jk PgUp PgDn Home End", "move", Needs::Nothing, None),
    key(
        "Esc",
        "back to the live view (the counting goes on until the recording stops)",
        Needs::Nothing,
        Some("Esc back"),
    ),
    key(
        "q Ctrl-C",
        "quit (detaches first)",
        Needs::Nothing,
        Some("q quit"),
    ),
    key("? F1", "this help", Needs::Nothing, Some("? help")),
];

/// Whether a key is available given the session's state.
pub fn available(needs: Needs, context: Context) -> bool {
    match needs {
        Needs::Nothing => true,
        Needs::Target => !context.read_only && !context.detached,
        Needs::Session => !context.read_only,
        Needs::Samples => context.sampled,
    }
}

/// The footer's hints, most important first: by the key each starts with. A narrow
/// footer drops the least important ones; the rest keep the table's order.
const HINT_IMPORTANCE: &[&str] = &[
    "?", "F1", "q", "Ctrl-C", "Enter", "type", "S", "p", "r", "w", "d", "1-3", "Tab", "Esc", "s",
    "h", "Ctrl-R", "X", "C", "E", "e",
];

/// The footer's key hints for `keys` that fit in `width` columns (the most important
/// ones, see [`HINT_IMPORTANCE`]).
pub fn hints(keys: &[KeyHelp], context: Context, width: usize) -> Line<'static> {
    let shown: Vec<&str> = keys
        .iter()
        .filter(|help| available(help.needs, context))
        .filter_map(|help| help.hint)
        .collect();
    let importance = |hint: &str| {
        let first = hint.split(' ').next().unwrap_or("");
        HINT_IMPORTANCE
            .iter()
            .position(|key| *key == first)
            .unwrap_or(HINT_IMPORTANCE.len())
    };
    let cells = |hint: &str| hint.chars().count() + 2;
    let mut kept: Vec<bool> = vec![true; shown.len()];
    let mut used: usize = shown.iter().map(|hint| cells(hint)).sum();
    let mut by_importance: Vec<usize> = (0..shown.len()).collect();
    by_importance.sort_by_key(|&i| std::cmp::Reverse(importance(shown[i])));
    for i in by_importance {
        if used <= width {
            break;
        }
        kept[i] = false;
        used -= cells(shown[i]);
    }
    let spans = shown
        .iter()
        .zip(kept)
        .filter(|(_, kept)| *kept)
        .map(|(hint, _)| theme::dim(format!(" {hint} ")))
        .collect::<Vec<_>>();
    Line::from(spans)
}

/// Draws the help overlay for `keys`, centred over `area`.
pub fn draw_overlay(keys: &[KeyHelp], context: Context, frame: &mut Frame, area: Rect) {
    let shown: Vec<&KeyHelp> = keys
        .iter()
        .filter(|help| available(help.needs, context))
        .collect();
    let key_width = shown
        .iter()
        .map(|help| help.keys.chars().count())
        .max()
        .unwrap_or(0);
    let mut lines: Vec<Line> = shown
        .iter()
        .map(|help| {
            Line::from(vec![
                theme::label(format!(" {} ", pad_left_aligned(help.keys, key_width))),
                Span::raw(help.what),
            ])
        })
        .collect();
    if context.read_only {
        lines.push(theme::dim_line(
            " read-only: keys that need a live target are hidden",
        ));
    } else if context.detached {
        lines.push(theme::dim_line(
            " detached: keys that need the target are hidden",
        ));
    }
    let content_width = lines.iter().map(Line::width).max().unwrap_or(0) as u16 + 1;
    let width = (content_width + 2).min(area.width);
    let height = (lines.len() as u16 + 2).min(area.height);
    let popup = Rect {
        x: area.x + (area.width - width) / 2,
        y: area.y + (area.height - height) / 2,
        width,
        height,
    };
    frame.render_widget(Clear, popup);
    let block = Block::default()
        .borders(Borders::ALL)
        .title(" keys · Esc closes ");
    frame.render_widget(Paragraph::new(lines).block(block), popup);
}
