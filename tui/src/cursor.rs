//! Selection and scrolling for every list and table in the UI.
//!
//! The one idea: a list only ever renders the window `offset..offset + height`, and the
//! cursor keeps the selected row inside that window, so the cost of drawing does not grow
//! with the length of the list.

use std::ops::Range;

use ratatui::crossterm::event::KeyCode;

/// The selected row and the first visible row of a list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListCursor {
    selected: usize,
    offset: usize,
    /// Rows shown by the last draw; paging moves by this much.
    page: usize,
    /// Rows below the selection to bring into view at the next draw (e.g. just expanded).
    reveal_below: usize,
}

impl ListCursor {
    pub fn selected(&self) -> usize {
        self.selected
    }

    /// Selects `row`, clamped to a list of `len` rows.
    pub fn select(&mut self, row: usize, len: usize) {
        self.selected = row.min(len.saturating_sub(1));
    }

    /// Moves by `delta` rows within a list of `len` rows.
    pub fn move_by(&mut self, delta: isize, len: usize) {
        let target = self.selected.saturating_add_signed(delta);
        self.select(target, len);
    }

    /// At the next draw, scroll so the `rows` rows below the selection are visible too, as
    /// far as the window allows without scrolling the selection out of it.
    pub fn reveal_below(&mut self, rows: usize) {
        self.reveal_below = rows;
    }

    /// Applies a navigation key (arrows, PageUp/PageDown, Home/End); returns whether it was one.
    pub fn navigate(&mut self, code: KeyCode, len: usize) -> bool {
        let page = self.page.max(1) as isize;
        match code {
            KeyCode::Up => self.move_by(-1, len),
            KeyCode::Down => self.move_by(1, len),
            KeyCode::PageUp => self.move_by(-page, len),
            KeyCode::PageDown => self.move_by(page, len),
            KeyCode::Home => self.select(0, len),
            KeyCode::End => self.select(len.saturating_sub(1), len),
            _ => return false,
        }
        true
    }

    /// The rows to draw in a window of `height` rows, scrolling so the selection is visible.
    pub fn visible(&mut self, height: usize, len: usize) -> Range<usize> {
        self.page = height;
        self.select(self.selected, len);
        if height == 0 || len == 0 {
            self.offset = 0;
            return 0..0;
        }
        if self.selected < self.offset {
            self.offset = self.selected;
        } else if self.selected >= self.offset + height {
            self.offset = self.selected + 1 - height;
        }
        let reveal_to = self
            .selected
            .saturating_add(std::mem::take(&mut self.reveal_below))
            .min(len - 1);
        if reveal_to >= self.offset + height {
            self.offset = (reveal_to + 1 - height).min(self.selected);
        }
        self.offset = self.offset.min(len.saturating_sub(height));
        self.offset..(self.offset + height).min(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_follows_the_selection() {
        let mut cursor = ListCursor::default();
        assert_eq!(cursor.visible(3, 10), 0..3);
        cursor.move_by(5, 10);
        assert_eq!(cursor.visible(3, 10), 3..6);
        cursor.navigate(KeyCode::End, 10);
        assert_eq!(cursor.visible(3, 10), 7..10);
        cursor.navigate(KeyCode::PageUp, 10);
        assert_eq!(cursor.selected(), 6);
        cursor.navigate(KeyCode::Home, 10);
        assert_eq!(cursor.visible(3, 10), 0..3);
    }

    #[test]
    fn revealing_rows_below_keeps_the_selection_in_view() {
        let mut cursor = ListCursor::default();
        cursor.select(5, 20);
        assert_eq!(cursor.visible(4, 20), 2..6);
        cursor.reveal_below(2);
        assert_eq!(cursor.visible(4, 20), 4..8);
        cursor.reveal_below(10);
        assert_eq!(
            cursor.visible(4, 20),
            5..9,
            "the selection stays at the top"
        );
        assert_eq!(cursor.visible(4, 20), 5..9, "a reveal applies once");
    }

    #[test]
    fn empty_and_shrinking_lists_stay_in_range() {
        let mut cursor = ListCursor::default();
        assert_eq!(cursor.visible(5, 0), 0..0);
        cursor.select(8, 10);
        cursor.visible(4, 10);
        assert_eq!(cursor.visible(4, 2), 0..2);
        assert_eq!(cursor.selected(), 1);
    }
}
