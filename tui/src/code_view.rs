//! The annotated code of one function (`e` on a node of the live view, issue 18): its
//! disassembly with exact block, branch and path counts that grow while the recording
//! goes on, hot blocks coloured; Esc goes back to the tree.
//!
//! The one idea: the controller writes the lines — the same listing `tendril edges`
//! prints, marked hot where it marks `▶` — and sends a fresh [`CodeSnapshot`] a few
//! times a second; this view only scrolls and draws them, keeping the selected line
//! where it was, so the listing can be read while its counts change.

use ratatui::Frame;
use ratatui::crossterm::event::KeyCode;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use crate::cursor::ListCursor;
use crate::format::truncate as fit;
use crate::printable::{already_printed, printable};
use crate::theme;

/// The annotated code of one function, as the controller last counted it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CodeSnapshot {
    /// What the lines are of: the function, its module, since when it is counted.
    pub title: String,
    pub lines: Vec<CodeLine>,
}

/// One line of the annotated code.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CodeLine {
    /// The line as `tendril edges` prints it, names already escaped (drawn through
    /// [`already_printed`], which escapes only what is still unsafe).
    pub text: String,
    /// The line starts a block run at least a tenth as often as the hottest one.
    pub hot: bool,
}

/// The code view's state: what is shown (or awaited) and where the reader is.
#[derive(Debug, Default)]
pub struct CodeView {
    /// The function asked for.
    function: String,
    snapshot: Option<CodeSnapshot>,
    cursor: ListCursor,
}

impl CodeView {
    /// Starts showing `function`, whose code the controller is preparing.
    pub fn open(&mut self, function: String) {
        *self = CodeView {
            function,
            ..CodeView::default()
        };
    }

    /// The function shown (or awaited).
    pub fn function(&self) -> &str {
        &self.function
    }

    /// Replaces the lines; the selected line stays where it was.
    pub fn update(&mut self, snapshot: CodeSnapshot) {
        self.snapshot = Some(snapshot);
    }

    /// The lines shown, once the controller has sent some.
    pub fn snapshot(&self) -> Option<&CodeSnapshot> {
        self.snapshot.as_ref()
    }

    /// Applies a navigation key; returns whether it was one.
    pub fn handle_key(&mut self, code: KeyCode) -> bool {
        let len = self.snapshot.as_ref().map_or(0, |s| s.lines.len());
        let code = match code {
            KeyCode::Char('j') => KeyCode::Down,
            KeyCode::Char('k') => KeyCode::Up,
            other => other,
        };
        self.cursor.navigate(code, len)
    }

    /// Draws the title line and the window of lines around the selection.
    pub fn draw(&mut self, frame: &mut Frame, area: Rect) {
        if area.is_empty() {
            return;
        }
        let width = area.width as usize;
        let Some(snapshot) = &self.snapshot else {
            let waiting = format!(
                " copying {} with counters behind its hook…",
                printable(&self.function)
            );
            frame.render_widget(Paragraph::new(theme::dim_line(fit(&waiting, width))), area);
            return;
        };
        let title = Line::from(Span::styled(
            fit(&format!(" {}", printable(&snapshot.title)), width),
            theme::header(),
        ));
        let height = area.height.saturating_sub(1) as usize;
        let window = self.cursor.visible(height, snapshot.lines.len());
        let selected = self.cursor.selected();
        let mut lines = vec![title];
        for (index, line) in snapshot.lines[window.clone()].iter().enumerate() {
            let mut style = if line.hot { hot() } else { Style::new() };
            if window.start + index == selected {
                style = style.patch(theme::selected());
            }
            lines.push(Line::from(Span::styled(
                fit(&format!(" {}", already_printed(&line.text)), width),
                style,
            )));
        }
        frame.render_widget(Paragraph::new(lines), area);
    }
}

/// A hot block's line: coloured, and bold so it reads on a monochrome terminal too.
fn hot() -> Style {
    Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    fn snapshot(lines: usize) -> CodeSnapshot {
        CodeSnapshot {
            title: "classify (branches) · 300 calls in 1.0 s".into(),
            lines: (0..lines)
                .map(|i| CodeLine {
                    text: format!("line {i}"),
                    hot: i == 2,
                })
                .collect(),
        }
    }

    fn screen(view: &mut CodeView, height: u16) -> Vec<String> {
        let mut terminal = Terminal::new(TestBackend::new(50, height)).unwrap();
        terminal
            .draw(|frame| view.draw(frame, frame.area()))
            .unwrap();
        let buffer = terminal.backend().buffer();
        (0..height)
            .map(|y| {
                (0..50)
                    .map(|x| buffer[(x, y)].symbol())
                    .collect::<String>()
                    .trim_end()
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn the_view_waits_for_the_code_then_scrolls_its_lines_and_colours_hot_ones() {
        let mut view = CodeView::default();
        view.open("classify".into());
        assert!(screen(&mut view, 5)[0].contains("copying classify"));
        view.update(snapshot(20));
        let shown = screen(&mut view, 5);
        assert_eq!(shown[0], " classify (branches) · 300 calls in 1.0 s");
        assert_eq!(shown[1..], [" line 0", " line 1", " line 2", " line 3"]);
        let mut terminal = Terminal::new(TestBackend::new(50, 5)).unwrap();
        terminal
            .draw(|frame| view.draw(frame, frame.area()))
            .unwrap();
        let hot_cell = &terminal.backend().buffer()[(1, 3)];
        assert_eq!(hot_cell.fg, Color::Red, "line 2 is hot");
        assert_eq!(terminal.backend().buffer()[(1, 2)].fg, Color::Reset);
        // End shows the last lines; new counts keep the selection where it is.
        assert!(view.handle_key(KeyCode::End));
        assert_eq!(screen(&mut view, 5)[4], " line 19");
        view.update(snapshot(20));
        assert_eq!(screen(&mut view, 5)[4], " line 19");
        assert!(view.handle_key(KeyCode::Char('k')));
        assert!(!view.handle_key(KeyCode::Char('x')));
    }
}
