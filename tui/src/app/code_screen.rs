//! The App's side of the annotated-code screen (`e` in the live view): opening it,
//! its keys, and the counts and refusals the controller sends to it. The view itself
//! (scrolling, drawing) is `code_view`.

use super::{App, ScreenKind};
use crate::action::Action;
use crate::code_view::CodeSnapshot;
use ratatui::crossterm::event::{KeyCode, KeyEvent};

impl App {
    /// `e`: the selected function's annotated code, which the controller prepares.
    pub(super) fn open_code(&mut self) -> Option<Action> {
        let Some((name, module, address)) = self.live.selected_function(&self.snapshot) else {
            self.set_message("e: select a function in the call tree (1) or the hot spots (2)");
            return None;
        };
        self.code.open(name.clone());
        self.screen = ScreenKind::Code;
        self.message.clear();
        Some(Action::ShowCode {
            name,
            module,
            address,
        })
    }

    pub(super) fn code_key(&mut self, key: KeyEvent) -> Option<Action> {
        match key.code {
            KeyCode::Char('q') => return Some(Action::Quit),
            KeyCode::Char('?') => self.help_visible = true,
            KeyCode::Esc => {
                self.screen = ScreenKind::Live;
                return Some(Action::CloseCode);
            }
            code => {
                self.code.handle_key(code);
            }
        }
        None
    }

    /// New counts for the annotated code on screen (ignored once it was left).
    pub fn update_code(&mut self, snapshot: CodeSnapshot) {
        if self.screen == ScreenKind::Code {
            self.code.update(snapshot);
        }
    }

    /// The annotated code cannot be shown (or shown any more): back to the live view,
    /// saying why.
    pub fn close_code(&mut self, why: impl Into<String>) {
        if self.screen == ScreenKind::Code {
            self.screen = ScreenKind::Live;
        }
        self.set_message(why);
    }

    /// The annotated code on screen: its function, and its lines once they came.
    pub fn code(&self) -> Option<(&str, Option<&CodeSnapshot>)> {
        (self.screen == ScreenKind::Code).then(|| (self.code.function(), self.code.snapshot()))
    }
}
