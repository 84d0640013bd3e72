//! The few styles the UI uses, in one place so every view looks the same.
//!
//! The one idea: colour only marks state (paused, lost events, selection); everything
//! still reads correctly on a monochrome terminal.

use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};

pub fn header() -> Style {
    Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED)
}

pub fn selected() -> Style {
    Style::new().add_modifier(Modifier::REVERSED)
}

pub fn bar() -> Style {
    Style::new().fg(Color::Cyan)
}

pub fn warning() -> Style {
    Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD)
}

pub fn error() -> Style {
    Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)
}

pub fn good() -> Style {
    Style::new().fg(Color::Green).add_modifier(Modifier::BOLD)
}

pub fn strong() -> Style {
    Style::new().add_modifier(Modifier::BOLD)
}

pub fn label(text: impl Into<String>) -> Span<'static> {
    Span::styled(text.into(), strong())
}

pub fn dim(text: impl Into<String>) -> Span<'static> {
    Span::styled(text.into(), Style::new().add_modifier(Modifier::DIM))
}

pub fn dim_line(text: impl Into<String>) -> Line<'static> {
    Line::from(dim(text))
}

pub fn status_bar() -> Style {
    Style::new().bg(Color::DarkGray).fg(Color::White)
}
