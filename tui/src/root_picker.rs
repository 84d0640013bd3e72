//! The root picker: fuzzy-find functions of the target and choose one or several roots.
//!
//! The one idea: the current roots start out selected, and Enter on a function adds it to
//! them. Tab edits the selection instead (fzf's multi-select key, so Space can still
//! separate words of the query); once Tab was used, Enter confirms exactly the selection.
//! So adding a root is "type, Enter", several roots "Tab, Tab, Enter", and replacing a
//! root "Tab it off, Tab the new one, Enter".

use ratatui::Frame;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use crate::columns::{Align, ColumnLayout, ColumnSpec};
use crate::cursor::ListCursor;
use crate::format::{grouped, truncate};
use crate::fuzzy::FunctionFilter;
use crate::model::FunctionEntry;
use crate::printable::printable;
use crate::theme;

/// What a key did in the root picker.
#[derive(Debug, PartialEq)]
pub enum RootPickerOutcome {
    Stay,
    /// Esc on an empty query: go back where the picker was opened from, if anywhere.
    Leave,
    /// The chosen roots.
    Choose(Vec<FunctionEntry>),
}

#[derive(Debug, Default)]
pub struct RootPicker {
    /// `None` while the controller is still loading the target's symbols.
    functions: Option<Vec<FunctionEntry>>,
    filter: FunctionFilter,
    query: String,
    /// Indices into `functions`, in the order they were selected.
    chosen: Vec<u32>,
    /// Tab was used since the picker opened: Enter confirms `chosen` as it is.
    edited: bool,
    cursor: ListCursor,
}

const COLUMNS: [ColumnSpec; 4] = [
    ColumnSpec::new("", 1, Align::Left, 0),
    ColumnSpec::flexible("FUNCTION"),
    ColumnSpec::new("MODULE", 18, Align::Left, 30),
    ColumnSpec::new("SIZE", 7, Align::Right, 20),
];

impl RootPicker {
    pub fn has_functions(&self) -> bool {
        self.functions.is_some()
    }

    /// Sets the function list; the current query is applied to it and the selection
    /// starts as the functions named in `current_roots`.
    pub fn set_functions(&mut self, functions: Vec<FunctionEntry>, current_roots: &[String]) {
        self.filter.reset(&functions);
        self.filter.set_query(&self.query, &functions);
        self.functions = Some(functions);
        self.cursor.select(0, 0);
        self.preselect(current_roots);
    }

    /// Clears the query and selects the functions named in `current_roots` (called on open).
    pub fn open(&mut self, current_roots: &[String]) {
        self.query.clear();
        if let Some(functions) = &self.functions {
            self.filter.set_query("", functions);
        }
        self.cursor.select(0, 0);
        self.preselect(current_roots);
    }

    fn preselect(&mut self, current_roots: &[String]) {
        self.chosen.clear();
        self.edited = false;
        let Some(functions) = &self.functions else {
            return;
        };
        for root in current_roots {
            if let Some(index) = functions.iter().position(|function| &function.name == root) {
                self.chosen.push(index as u32);
            }
        }
    }

    fn highlighted(&self) -> Option<u32> {
        self.filter.matches().get(self.cursor.selected()).copied()
    }

    fn set_query(&mut self, query: String) {
        self.query = query;
        if let Some(functions) = &self.functions {
            self.filter.set_query(&self.query, functions);
        }
        self.cursor.select(0, self.filter.matches().len());
    }

    pub fn handle_key(&mut self, key: KeyEvent) -> RootPickerOutcome {
        let len = self.filter.matches().len();
        if self.cursor.navigate(key.code, len) {
            return RootPickerOutcome::Stay;
        }
        let typed = !key
            .modifiers
            .intersects(KeyModifiers::CONTROL | KeyModifiers::ALT);
        match key.code {
            KeyCode::Enter => {
                let mut roots = self.chosen.clone();
                let confirm_selection = self.edited && !roots.is_empty();
                if let Some(index) = self.highlighted().filter(|_| !confirm_selection)
                    && !roots.contains(&index)
                {
                    roots.push(index);
                }
                if !roots.is_empty() {
                    let functions = self.functions.as_deref().unwrap_or_default();
                    let chosen = roots.iter().map(|&index| functions[index as usize].clone());
                    return RootPickerOutcome::Choose(chosen.collect());
                }
            }
            KeyCode::Tab => {
                if let Some(index) = self.highlighted() {
                    self.edited = true;
                    match self.chosen.iter().position(|&chosen| chosen == index) {
                        Some(position) => _ = self.chosen.remove(position),
                        None => self.chosen.push(index),
                    }
                    self.cursor.move_by(1, len);
                }
            }
            KeyCode::Esc if self.query.is_empty() => return RootPickerOutcome::Leave,
            KeyCode::Esc => self.set_query(String::new()),
            KeyCode::Backspace => {
                let mut query = std::mem::take(&mut self.query);
                query.pop();
                self.set_query(query);
            }
            KeyCode::Char(ch) if typed => {
                let mut query = std::mem::take(&mut self.query);
                query.push(ch);
                self.set_query(query);
            }
            _ => {}
        }
        RootPickerOutcome::Stay
    }

    pub fn draw(&mut self, frame: &mut Frame, area: Rect) {
        if area.height == 0 {
            return;
        }
        let Some(functions) = &self.functions else {
            frame.render_widget(
                Paragraph::new(theme::dim_line(" loading the target's functions…")),
                area,
            );
            return;
        };
        let mut title = vec![
            theme::label(" root: "),
            Span::raw(format!("{}▏", self.query)),
            theme::dim(format!(
                "  {} of {} functions",
                grouped(self.filter.matches().len() as u64),
                grouped(functions.len() as u64)
            )),
        ];
        if !self.chosen.is_empty() {
            title.push(theme::dim(format!(" · {} selected", self.chosen.len())));
        }
        let mut lines = vec![Line::from(title)];
        if !self.chosen.is_empty() && area.height > 4 {
            let names: Vec<&str> = self
                .chosen
                .iter()
                .map(|&index| functions[index as usize].name.as_str())
                .collect();
            let text = format!(" selected: {}", printable(&names.join(", ")));
            lines.push(Line::from(theme::dim(truncate(&text, area.width as usize))));
        }
        let layout = ColumnLayout::plan(area.width as usize, &COLUMNS);
        if (lines.len() as u16) < area.height {
            lines.push(layout.header(theme::header()));
        }
        let body_height = (area.height as usize).saturating_sub(lines.len());
        let window = self
            .cursor
            .visible(body_height, self.filter.matches().len());
        let selected = self.cursor.selected();
        for row in window {
            let index = self.filter.matches()[row];
            let function = &functions[index as usize];
            let mark = if self.chosen.contains(&index) {
                "✓"
            } else {
                " "
            };
            let cells = [
                mark.to_string(),
                function.name.clone(),
                function.module.clone(),
                function.size.to_string(),
            ];
            let mut line = layout.row(&cells);
            if row == selected {
                line = line.style(theme::selected());
            }
            lines.push(line);
        }
        if self.filter.matches().is_empty() && body_height > 0 {
            lines.push(theme::dim_line("  no function matches"));
        }
        frame.render_widget(Paragraph::new(lines), area);
    }
}
