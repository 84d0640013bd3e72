//! The process picker: a filterable table of running processes; Enter attaches.
//!
//! The one idea: the filter is plain case-insensitive substring matching of every typed
//! word against "pid user command line", so typing a pid or part of a path finds exactly
//! what one expects; the selection follows the pid when the list is refreshed.

use ratatui::Frame;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::Paragraph;

use crate::action::Action;
use crate::columns::{Align, ColumnLayout, ColumnSpec};
use crate::cursor::ListCursor;
use crate::model::ProcessEntry;
use crate::theme;

#[derive(Debug, Default)]
pub struct ProcessPicker {
    processes: Vec<ProcessEntry>,
    /// Lower-cased "pid user command line" of each process, matched against the filter.
    haystacks: Vec<String>,
    query: String,
    matches: Vec<usize>,
    cursor: ListCursor,
}

const COLUMNS: [ColumnSpec; 4] = [
    ColumnSpec::new("PID", 8, Align::Right, 0),
    ColumnSpec::new("USER", 10, Align::Left, 24),
    ColumnSpec::new("THR", 4, Align::Right, 20),
    ColumnSpec::flexible("COMMAND"),
];

impl ProcessPicker {
    /// Replaces the list (a refresh), keeping the selected pid selected if it still exists.
    pub fn set_processes(&mut self, processes: Vec<ProcessEntry>) {
        let selected_pid = self.selected().map(|process| process.pid);
        self.haystacks = processes
            .iter()
            .map(|process| {
                format!("{} {} {}", process.pid, process.user, process.command_line).to_lowercase()
            })
            .collect();
        self.processes = processes;
        self.refilter();
        if let Some(row) = selected_pid.and_then(|pid| {
            self.matches
                .iter()
                .position(|&index| self.processes[index].pid == pid)
        }) {
            self.cursor.select(row, self.matches.len());
        }
    }

    pub fn selected(&self) -> Option<&ProcessEntry> {
        self.matches
            .get(self.cursor.selected())
            .map(|&index| &self.processes[index])
    }

    fn refilter(&mut self) {
        let words: Vec<String> = self
            .query
            .split_whitespace()
            .map(str::to_lowercase)
            .collect();
        self.matches = (0..self.processes.len())
            .filter(|&index| {
                words
                    .iter()
                    .all(|word| self.haystacks[index].contains(word.as_str()))
            })
            .collect();
        self.cursor
            .select(self.cursor.selected(), self.matches.len());
    }

    /// Navigation, filter editing, Enter (attach) and q/Esc (quit).
    pub fn handle_key(&mut self, key: KeyEvent) -> Option<Action> {
        if self.cursor.navigate(key.code, self.matches.len()) {
            return None;
        }
        let typed = !key
            .modifiers
            .intersects(KeyModifiers::CONTROL | KeyModifiers::ALT);
        match key.code {
            KeyCode::Enter => return self.selected().map(|process| Action::Attach(process.pid)),
            KeyCode::Esc if self.query.is_empty() => return Some(Action::Quit),
            KeyCode::Esc => {
                self.query.clear();
                self.refilter();
            }
            KeyCode::Char('q') if typed && self.query.is_empty() => return Some(Action::Quit),
            KeyCode::Char(ch) if typed => {
                self.query.push(ch);
                self.cursor.select(0, self.matches.len());
                self.refilter();
            }
            KeyCode::Backspace => {
                self.query.pop();
                self.refilter();
            }
            _ => {}
        }
        None
    }

    pub fn draw(&mut self, frame: &mut Frame, area: Rect) {
        if area.height == 0 {
            return;
        }
        let filter = Line::from(vec![
            theme::label(" filter: "),
            ratatui::text::Span::raw(format!("{}▏", self.query)),
            theme::dim(format!(
                "  {} of {} processes",
                self.matches.len(),
                self.processes.len()
            )),
        ]);
        frame.render_widget(Paragraph::new(filter), Rect { height: 1, ..area });
        let table_area = Rect {
            y: area.y + 1,
            height: area.height - 1,
            ..area
        };
        if table_area.height == 0 {
            return;
        }
        let layout = ColumnLayout::plan(table_area.width as usize, &COLUMNS);
        let mut lines = vec![layout.header(theme::header())];
        let body_height = table_area.height as usize - 1;
        let window = self.cursor.visible(body_height, self.matches.len());
        let selected = self.cursor.selected();
        for row in window {
            let process = &self.processes[self.matches[row]];
            let cells = [
                process.pid.to_string(),
                process.user.clone(),
                process.threads.to_string(),
                process.command_line.clone(),
            ];
            let mut line = layout.row(&cells);
            if row == selected {
                line = line.style(theme::selected());
            }
            lines.push(line);
        }
        if self.matches.is_empty() {
            lines.push(theme::dim_line("  no process matches the filter"));
        }
        frame.render_widget(Paragraph::new(lines), table_area);
    }
}
