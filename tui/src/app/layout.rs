//! Drawing the whole UI: the screen's body, the status bar and the footer (the message
//! line and the key hints), laid out for any size down to nothing at all.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};
use std::time::Instant;
use unicode_width::UnicodeWidthStr;

use super::{App, ScreenKind};
use crate::help;
use crate::live_draw;
use crate::status_bar::status_lines;
use crate::theme;

impl App {
    /// Draws the whole UI into `frame` (any size, down to nothing at all).
    pub fn draw(&mut self, frame: &mut Frame) {
        let area = frame.area();
        if area.is_empty() {
            return;
        }
        self.message.release(Instant::now());
        let message_rows = self.message.shown().map_or(1, |message| {
            message_rows(message, area.width as usize, area.height)
        });
        let footer_height = if area.height >= 2 { message_rows } else { 0 };
        let shows_status = matches!(
            self.screen,
            ScreenKind::Live | ScreenKind::Sampled | ScreenKind::Code
        ) || (self.screen == ScreenKind::RootPicker && self.session_started);
        let status_height = match area.height {
            _ if !shows_status => 0,
            0..=4 => 0,
            5..=9 => 1,
            _ => 2,
        };
        let (rest, footer) = split_bottom(area, footer_height);
        let (body, status) = split_bottom(rest, status_height);
        match self.screen {
            ScreenKind::ProcessPicker => self.process_picker.draw(frame, body),
            ScreenKind::RootPicker => self.root_picker.draw(frame, body),
            ScreenKind::Live => {
                let tabs_height = u16::from(body.height >= 3);
                let (tabs, tree) = split_top(body, tabs_height);
                live_draw::draw_tabs(&self.live, &self.snapshot, frame, tabs);
                live_draw::draw_body(&mut self.live, &self.snapshot, self.read_only, frame, tree);
            }
            ScreenKind::Sampled => {
                let tabs_height = u16::from(body.height >= 3);
                let (tabs, tree) = split_top(body, tabs_height);
                live_draw::draw_tabs(&self.sampled_view, &self.sampled, frame, tabs);
                live_draw::draw_body(&mut self.sampled_view, &self.sampled, false, frame, tree);
            }
            ScreenKind::Code => self.code.draw(frame, body),
        }
        if status_height > 0 {
            let shown_status = if self.screen == ScreenKind::Sampled {
                &self.sampled.status
            } else {
                &self.snapshot.status
            };
            let lines = status_lines(shown_status, self.read_only, status.width as usize);
            let shown: Vec<Line> = lines.into_iter().take(status_height as usize).collect();
            frame.render_widget(Paragraph::new(shown).style(theme::status_bar()), status);
        }
        if footer_height > 1 {
            // A notice too long for one line: all of it, wrapped, without the hints.
            let message = self.message.shown().unwrap_or_default();
            let text = Line::from(Span::styled(format!(" {message}"), theme::strong()));
            frame.render_widget(Paragraph::new(text).wrap(Wrap { trim: false }), footer);
        } else if footer_height > 0 {
            let width = footer.width as usize;
            let line = match self.message.shown() {
                // The message first; the most important hints that fit follow it.
                Some(message) => {
                    let used = message.chars().count() + 3;
                    let hints =
                        help::hints(self.keys(), self.context(), width.saturating_sub(used));
                    let mut spans = vec![Span::styled(format!(" {message} "), theme::strong())];
                    spans.push(theme::dim("│"));
                    spans.extend(hints.spans);
                    Line::from(spans)
                }
                None => help::hints(self.keys(), self.context(), width),
            };
            frame.render_widget(Paragraph::new(line), footer);
        }
        if self.help_visible {
            help::draw_overlay(self.keys(), self.context(), frame, area);
        }
    }
}

/// Rows the footer takes for `message` on a screen `width` × `height`: one if it fits
/// beside a separator, else as many as it needs wrapped, up to three, on a screen tall
/// enough to give them (one of 12 rows or more); a notice cut at the edge could never be
/// read whole.
fn message_rows(message: &str, width: usize, height: u16) -> u16 {
    if message.width() + 2 <= width || height < 12 || width == 0 {
        return 1;
    }
    // Filled word by word, as the paragraph wraps it (a word longer than a row is cut).
    let mut rows = 1;
    let mut used = 1; // the leading space
    for word in message.split(' ') {
        let needed = word.width().min(width);
        if used > 0 && used + 1 + needed > width {
            rows += 1;
            used = needed;
        } else {
            used += usize::from(used > 0) + needed;
        }
    }
    rows.min(3)
}

/// `area` split into everything above the bottom `height` rows, and those rows.
fn split_bottom(area: Rect, height: u16) -> (Rect, Rect) {
    let height = height.min(area.height);
    let top = Rect {
        height: area.height - height,
        ..area
    };
    let bottom = Rect {
        y: area.y + area.height - height,
        height,
        ..area
    };
    (top, bottom)
}

/// `area` split into its top `height` rows and everything below them.
fn split_top(area: Rect, height: u16) -> (Rect, Rect) {
    let height = height.min(area.height);
    let top = Rect { height, ..area };
    let bottom = Rect {
        y: area.y + height,
        height: area.height - height,
        ..area
    };
    (top, bottom)
}
