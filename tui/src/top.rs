//! `tendril top`: a live table of where a process spends its time, per function, like
//! `py-spy top` — self and total sample percentages of the last refresh, and the
//! estimated self and total time since sampling began.
//!
//! The one idea: the controller hands over a [`TopSnapshot`] (rows already summed per
//! function) once per refresh; this view only sorts, scrolls and draws it, so a frame
//! costs the rows on screen, whatever the number of threads sampled.

use ratatui::Frame;
use ratatui::crossterm::event::{Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Row, Table};

use crate::printable::printable;
use crate::theme;

/// One function's figures.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TopRow {
    pub name: String,
    /// The module; for one of two functions that share a name and module (`static`
    /// functions of two files), the module and its address (`app at 0x…`).
    pub module: String,
    /// Share of the last refresh's samples in which it was the innermost frame.
    pub self_percent: f64,
    /// Share of the last refresh's samples with it anywhere on the stack.
    pub total_percent: f64,
    /// Estimated time since sampling began (samples × period), in seconds.
    pub self_seconds: f64,
    pub total_seconds: f64,
}

/// What one refresh shows.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TopSnapshot {
    /// `pid 4242 (/usr/bin/server)`.
    pub target: String,
    pub threads: usize,
    pub rate_hz: u64,
    /// Samples in the last refresh, and since the start.
    pub recent_samples: u64,
    pub samples: u64,
    pub lost_samples: u64,
    pub elapsed_seconds: f64,
    pub rows: Vec<TopRow>,
    /// Set when the process has exited (the table keeps its last figures).
    pub exited: bool,
}

/// The column the table is sorted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopSort {
    SelfPercent,
    TotalPercent,
    SelfTime,
    TotalTime,
}

/// What a key asks the controller to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopAction {
    Quit,
}

/// The live table's state.
#[derive(Debug, Clone)]
pub struct TopView {
    snapshot: TopSnapshot,
    sort: TopSort,
    /// First row shown.
    scroll: usize,
    /// Rows that fit the last frame drawn (for page keys).
    page: usize,
}

impl Default for TopView {
    fn default() -> Self {
        Self::new()
    }
}

impl TopView {
    pub fn new() -> TopView {
        TopView {
            snapshot: TopSnapshot::default(),
            sort: TopSort::SelfPercent,
            scroll: 0,
            page: 10,
        }
    }

    /// Shows a new refresh, sorted by the current column.
    pub fn update(&mut self, snapshot: TopSnapshot) {
        self.snapshot = snapshot;
        self.sort_rows();
    }

    pub fn snapshot(&self) -> &TopSnapshot {
        &self.snapshot
    }

    pub fn sort(&self) -> TopSort {
        self.sort
    }

    fn sort_rows(&mut self) {
        let key = |row: &TopRow| match self.sort {
            TopSort::SelfPercent => (row.self_percent, row.self_seconds),
            TopSort::TotalPercent => (row.total_percent, row.total_seconds),
            TopSort::SelfTime => (row.self_seconds, row.self_percent),
            TopSort::TotalTime => (row.total_seconds, row.total_percent),
        };
        self.snapshot.rows.sort_by(|a, b| {
            let (ka, kb) = (key(a), key(b));
            kb.0.total_cmp(&ka.0)
                .then(kb.1.total_cmp(&ka.1))
                .then_with(|| a.name.cmp(&b.name))
        });
    }

    /// Handles a key: `q`/Esc/Ctrl-C quit, `1`–`4` choose the sort column, arrows and
    /// page keys scroll.
    pub fn handle_event(&mut self, event: &Event) -> Option<TopAction> {
        let Event::Key(key) = event else {
            return None;
        };
        if key.kind == KeyEventKind::Release {
            return None;
        }
        let last = self.snapshot.rows.len().saturating_sub(1);
        match key.code {
            KeyCode::Char('q') | KeyCode::Esc => return Some(TopAction::Quit),
            KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => {
                return Some(TopAction::Quit);
            }
            KeyCode::Char('1') => self.sort = TopSort::SelfPercent,
            KeyCode::Char('2') => self.sort = TopSort::TotalPercent,
            KeyCode::Char('3') => self.sort = TopSort::SelfTime,
            KeyCode::Char('4') => self.sort = TopSort::TotalTime,
            KeyCode::Down | KeyCode::Char('j') => self.scroll = (self.scroll + 1).min(last),
            KeyCode::Up | KeyCode::Char('k') => self.scroll = self.scroll.saturating_sub(1),
            KeyCode::PageDown => self.scroll = (self.scroll + self.page).min(last),
            KeyCode::PageUp => self.scroll = self.scroll.saturating_sub(self.page),
            KeyCode::Home => self.scroll = 0,
            _ => return None,
        }
        self.sort_rows();
        None
    }

    /// Draws the header lines, the table and the key hints.
    pub fn draw(&mut self, frame: &mut Frame) {
        let [header, table, keys] = Layout::vertical([
            Constraint::Length(2),
            Constraint::Min(1),
            Constraint::Length(1),
        ])
        .areas(frame.area());
        self.draw_header(frame, header);
        self.draw_table(frame, table);
        let hints = "q quit  1 %self  2 %total  3 self time  4 total time  ↑↓ PgUp PgDn scroll";
        frame.render_widget(Paragraph::new(hints).style(theme::bar()), keys);
    }

    fn draw_header(&self, frame: &mut Frame, area: Rect) {
        let s = &self.snapshot;
        let mut first = vec![
            theme::label("tendril top "),
            Span::raw(printable(&s.target).into_owned()),
        ];
        if s.exited {
            first.push(Span::styled("  process exited", theme::warning()));
        }
        let mut second = vec![Span::raw(format!(
            "{} threads  {} Hz  {} samples in the last refresh, {} in {:.1} s",
            s.threads, s.rate_hz, s.recent_samples, s.samples, s.elapsed_seconds
        ))];
        if s.lost_samples > 0 {
            second.push(Span::styled(
                format!("  {} lost", s.lost_samples),
                theme::warning(),
            ));
        }
        frame.render_widget(
            Paragraph::new(vec![Line::from(first), Line::from(second)]),
            area,
        );
    }

    fn draw_table(&mut self, frame: &mut Frame, area: Rect) {
        let visible = area.height.saturating_sub(1) as usize;
        self.page = visible.max(1);
        self.scroll = self
            .scroll
            .min(self.snapshot.rows.len().saturating_sub(visible.max(1)));
        let marked = |title: &str, sort: TopSort| {
            if self.sort == sort {
                format!("{title}▾")
            } else {
                title.to_owned()
            }
        };
        let header = Row::new(vec![
            marked("%Self", TopSort::SelfPercent),
            marked("%Total", TopSort::TotalPercent),
            marked("Self s", TopSort::SelfTime),
            marked("Total s", TopSort::TotalTime),
            "Function (module)".to_owned(),
        ])
        .style(theme::header());
        let rows = self
            .snapshot
            .rows
            .iter()
            .skip(self.scroll)
            .take(visible)
            .map(|row| {
                Row::new(vec![
                    format!("{:6.1}", row.self_percent),
                    format!("{:6.1}", row.total_percent),
                    format!("{:8.2}", row.self_seconds),
                    format!("{:8.2}", row.total_seconds),
                    format!("{} ({})", printable(&row.name), printable(&row.module)),
                ])
            });
        let widths = [
            Constraint::Length(7),
            Constraint::Length(7),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Min(10),
        ];
        frame.render_widget(Table::new(rows, widths).header(header), area);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;
    use ratatui::crossterm::event::KeyEvent;

    fn row(name: &str, self_percent: f64, total_percent: f64) -> TopRow {
        TopRow {
            name: name.to_owned(),
            module: "app".to_owned(),
            self_percent,
            total_percent,
            self_seconds: self_percent / 100.0,
            total_seconds: total_percent / 100.0,
        }
    }

    fn key(code: KeyCode) -> Event {
        Event::Key(KeyEvent::new(code, KeyModifiers::NONE))
    }

    #[test]
    fn rows_sort_by_the_chosen_column_and_q_quits() {
        let mut view = TopView::new();
        view.update(TopSnapshot {
            rows: vec![
                row("leaf", 60.0, 60.0),
                row("main", 0.0, 100.0),
                row("mid", 40.0, 90.0),
            ],
            ..TopSnapshot::default()
        });
        let names = |view: &TopView| -> Vec<String> {
            view.snapshot()
                .rows
                .iter()
                .map(|r| r.name.clone())
                .collect()
        };
        assert_eq!(names(&view), ["leaf", "mid", "main"]);
        assert_eq!(view.handle_event(&key(KeyCode::Char('2'))), None);
        assert_eq!(names(&view), ["main", "mid", "leaf"]);
        assert_eq!(
            view.handle_event(&key(KeyCode::Char('q'))),
            Some(TopAction::Quit)
        );
    }

    #[test]
    fn the_table_draws_its_rows_in_80_columns() {
        let mut view = TopView::new();
        view.update(TopSnapshot {
            target: "pid 42 (/bin/app)".to_owned(),
            threads: 3,
            rate_hz: 499,
            rows: vec![row("compute", 75.5, 80.0)],
            ..TopSnapshot::default()
        });
        let mut terminal = Terminal::new(TestBackend::new(80, 10)).unwrap();
        terminal.draw(|frame| view.draw(frame)).unwrap();
        let screen: String = terminal
            .backend()
            .buffer()
            .content()
            .iter()
            .map(|cell| cell.symbol())
            .collect();
        assert!(screen.contains("pid 42 (/bin/app)"));
        assert!(screen.contains("75.5"));
        assert!(screen.contains("compute (app)"));
    }
}
