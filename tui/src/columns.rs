//! Column layout for the tables: which columns fit, and how wide the name column is.
//!
//! The one idea: one flexible column (the name, or the command line) takes whatever width is
//! left, and each fixed column says how much of that width it is worth. On a narrow screen
//! the columns worth the least (the bar, then the module) are dropped first, and whatever
//! remains is truncated with an ellipsis. Every cell is escaped on its way in
//! ([`crate::printable`]), so no table shows a name's control characters raw.

use ratatui::style::Style;
use ratatui::text::{Line, Span};

use crate::format::{pad_left_aligned, pad_right_aligned};
use crate::printable::printable;

/// Horizontal alignment of a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// One column of a table: either fixed-width, or the one flexible column.
#[derive(Debug, Clone, Copy)]
pub struct ColumnSpec {
    pub title: &'static str,
    pub width: usize,
    pub align: Align,
    /// A fixed column is shown only while the flexible column keeps at least this width.
    pub name_needs: usize,
    pub style: Style,
    pub flexible: bool,
}

impl ColumnSpec {
    /// A fixed column of `width`, shown while the flexible column keeps `name_needs` columns.
    pub const fn new(title: &'static str, width: usize, align: Align, name_needs: usize) -> Self {
        ColumnSpec {
            title,
            width,
            align,
            name_needs,
            style: Style::new(),
            flexible: false,
        }
    }

    /// The column that takes the remaining width (never dropped).
    pub const fn flexible(title: &'static str) -> Self {
        ColumnSpec {
            title,
            width: 0,
            align: Align::Left,
            name_needs: 0,
            style: Style::new(),
            flexible: true,
        }
    }

    pub const fn styled(mut self, style: Style) -> Self {
        self.style = style;
        self
    }
}

/// The columns that fit a given width.
#[derive(Debug, Clone)]
pub struct ColumnLayout {
    specs: Vec<ColumnSpec>,
    shown: Vec<bool>,
    name_width: usize,
}

const SEPARATOR: &str = " ";

impl ColumnLayout {
    /// Plans `specs` (in display order, exactly one of them flexible) into `total_width`.
    pub fn plan(total_width: usize, specs: &[ColumnSpec]) -> Self {
        let mut shown = vec![true; specs.len()];
        let name_width = |shown: &[bool]| {
            let used: usize = specs
                .iter()
                .zip(shown)
                .filter(|(spec, shown)| **shown && !spec.flexible)
                .map(|(spec, _)| spec.width + SEPARATOR.len())
                .sum();
            total_width.saturating_sub(used)
        };
        let mut drop_order: Vec<usize> = (0..specs.len()).collect();
        drop_order.sort_by_key(|&index| std::cmp::Reverse(specs[index].name_needs));
        for index in drop_order {
            if !specs[index].flexible && name_width(&shown) < specs[index].name_needs {
                shown[index] = false;
            }
        }
        let name_width = name_width(&shown);
        ColumnLayout {
            specs: specs.to_vec(),
            shown,
            name_width,
        }
    }

    pub fn name_width(&self) -> usize {
        self.name_width
    }

    /// Whether the column titled `title` is shown.
    #[cfg(test)]
    pub fn shows(&self, title: &str) -> bool {
        self.specs
            .iter()
            .zip(&self.shown)
            .any(|(spec, shown)| *shown && spec.title == title)
    }

    /// The header line: the shown columns' titles.
    pub fn header(&self, style: Style) -> Line<'static> {
        let cells: Vec<String> = self
            .specs
            .iter()
            .map(|spec| spec.title.to_string())
            .collect();
        let mut line = self.row(&cells);
        line.spans.iter_mut().for_each(|span| span.style = style);
        line.style = style;
        line
    }

    /// One row from `cells`, one per spec in the order given to [`ColumnLayout::plan`];
    /// cells of dropped columns are skipped, the others escaped ([`printable`]: they
    /// hold the target's names) and padded or cut to their width.
    pub fn row(&self, cells: &[String]) -> Line<'static> {
        let mut spans = Vec::with_capacity(cells.len() * 2);
        for ((spec, shown), cell) in self.specs.iter().zip(&self.shown).zip(cells) {
            if !shown {
                continue;
            }
            let width = if spec.flexible {
                self.name_width
            } else {
                spec.width
            };
            // Names, modules, command lines: the target's text, escaped here, once.
            let cell = printable(cell);
            let text = match spec.align {
                Align::Left => pad_left_aligned(&cell, width),
                Align::Right => pad_right_aligned(&cell, width),
            };
            if !spans.is_empty() {
                spans.push(Span::raw(SEPARATOR));
            }
            spans.push(Span::styled(text, spec.style));
        }
        Line::from(spans)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs() -> Vec<ColumnSpec> {
        vec![
            ColumnSpec::flexible("name"),
            ColumnSpec::new("module", 16, Align::Left, 30),
            ColumnSpec::new("calls", 9, Align::Right, 10),
            ColumnSpec::new("bar", 12, Align::Left, 40),
        ]
    }

    #[test]
    fn wide_screens_show_everything() {
        let layout = ColumnLayout::plan(120, &specs());
        assert!(layout.shows("bar") && layout.shows("module") && layout.shows("calls"));
        assert_eq!(layout.name_width(), 120 - 16 - 9 - 12 - 3);
    }

    #[test]
    fn the_bar_goes_first_then_the_module() {
        let layout = ColumnLayout::plan(70, &specs());
        assert!(!layout.shows("bar") && layout.shows("module"));
        let layout = ColumnLayout::plan(40, &specs());
        assert!(!layout.shows("bar") && !layout.shows("module") && layout.shows("calls"));
        let layout = ColumnLayout::plan(5, &specs());
        assert!(!layout.shows("calls"));
        assert_eq!(layout.name_width(), 5);
    }

    #[test]
    fn rows_have_the_full_width() {
        let layout = ColumnLayout::plan(50, &specs());
        let cells = ["a_rather_long_function_name_indeed_it_is", "m", "7", "x"].map(String::from);
        let line = layout.row(&cells);
        assert_eq!(line.width(), 50);
    }
}
