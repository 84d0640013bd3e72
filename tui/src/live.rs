//! The live view's state and browsing keys: three tabs (call tree, hot spots, threads) over
//! either the merged tree or one thread's tree.
//!
//! The one idea: everything here is browsing, so nothing returns an action; the keys that
//! need the profiler are handled by [`crate::App`]. Derived data (visible rows, hot spots)
//! is marked stale when a snapshot arrives and rebuilt lazily, only for the tab on screen.

use ratatui::crossterm::event::{KeyCode, KeyEvent};

use crate::cursor::ListCursor;
use crate::hotspots::HotSpotsView;
use crate::model::{ProfileSnapshot, TreeNode};
use crate::tree_view::{FlatRow, TreeView};

/// The tabs of the live view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LiveTab {
    #[default]
    CallTree,
    HotSpots,
    Threads,
}

impl LiveTab {
    pub const ALL: [LiveTab; 3] = [LiveTab::CallTree, LiveTab::HotSpots, LiveTab::Threads];

    pub fn title(self) -> &'static str {
        match self {
            LiveTab::CallTree => "Call tree",
            LiveTab::HotSpots => "Hot spots",
            LiveTab::Threads => "Threads",
        }
    }

    fn index(self) -> usize {
        LiveTab::ALL
            .iter()
            .position(|&tab| tab == self)
            .unwrap_or(0)
    }

    fn cycle(self, step: isize) -> LiveTab {
        let count = LiveTab::ALL.len() as isize;
        LiveTab::ALL[(self.index() as isize + step).rem_euclid(count) as usize]
    }
}

/// Whose calling context tree the call tree and hot spots show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TreeSource {
    /// All threads merged.
    #[default]
    Merged,
    /// One thread, by tid.
    Thread(u32),
}

/// Browsing state of the live view; the data itself stays in the snapshot.
#[derive(Debug)]
pub struct LiveView {
    pub tab: LiveTab,
    pub source: TreeSource,
    pub tree: TreeView,
    pub hot_spots: HotSpotsView,
    pub threads: ListCursor,
}

impl Default for LiveView {
    fn default() -> Self {
        LiveView {
            tab: LiveTab::CallTree,
            source: TreeSource::Merged,
            tree: TreeView::new(),
            hot_spots: HotSpotsView::new(),
            threads: ListCursor::default(),
        }
    }
}

/// The roots of the tree `source` selects in `snapshot` (empty if the thread is unknown).
pub fn source_roots(snapshot: &ProfileSnapshot, source: TreeSource) -> &[TreeNode] {
    match source {
        TreeSource::Merged => &snapshot.merged,
        TreeSource::Thread(tid) => snapshot
            .threads
            .iter()
            .find(|thread| thread.tid == tid)
            .map_or(&[], |thread| &thread.roots),
    }
}

impl LiveView {
    /// A new snapshot arrived: derived data is rebuilt before it is next shown.
    pub fn data_changed(&mut self) {
        self.tree.invalidate();
        self.hot_spots.invalidate();
    }

    /// Shows `source`'s tree in the call tree and hot spots tabs.
    pub fn set_source(&mut self, source: TreeSource) {
        if self.source != source {
            self.source = source;
            self.data_changed();
        }
    }

    /// Brings the derived data of the current tab up to date with `snapshot`.
    pub fn refresh(&mut self, snapshot: &ProfileSnapshot) {
        let roots = source_roots(snapshot, self.source);
        match self.tab {
            LiveTab::CallTree => self.tree.refresh(roots),
            LiveTab::HotSpots => self
                .hot_spots
                .refresh(roots, snapshot.status.sampling.is_some()),
            LiveTab::Threads => {}
        }
    }

    /// Applies a browsing key; returns whether it was one.
    pub fn handle_key(&mut self, key: KeyEvent, snapshot: &ProfileSnapshot) -> bool {
        self.refresh(snapshot);
        match key.code {
            KeyCode::Char('1') => self.tab = LiveTab::CallTree,
            KeyCode::Char('2') => self.tab = LiveTab::HotSpots,
            KeyCode::Char('3') => self.tab = LiveTab::Threads,
            KeyCode::Tab => self.tab = self.tab.cycle(1),
            KeyCode::BackTab => self.tab = self.tab.cycle(-1),
            KeyCode::Char('m') => self.set_source(TreeSource::Merged),
            _ => {
                let code = match key.code {
                    KeyCode::Char('j') => KeyCode::Down,
                    KeyCode::Char('k') => KeyCode::Up,
                    other => other,
                };
                return match self.tab {
                    LiveTab::CallTree => self.tree_key(code, snapshot),
                    LiveTab::HotSpots => self.hot_spots_key(code),
                    LiveTab::Threads => self.threads_key(code, snapshot),
                };
            }
        }
        self.refresh(snapshot);
        true
    }

    /// The call-tree row selected, if the call tree is the tab shown.
    pub fn selected_tree_row(&mut self, snapshot: &ProfileSnapshot) -> Option<&FlatRow> {
        self.refresh(snapshot);
        match self.tab {
            LiveTab::CallTree => self.tree.selected_row(),
            LiveTab::HotSpots | LiveTab::Threads => None,
        }
    }

    /// The function (name, module, entry address when known) selected in the call tree or
    /// the hot spots, if any.
    pub fn selected_function(
        &mut self,
        snapshot: &ProfileSnapshot,
    ) -> Option<(String, String, Option<u64>)> {
        self.refresh(snapshot);
        match self.tab {
            LiveTab::CallTree => self
                .tree
                .selected_row()
                .map(|row| (row.name.clone(), row.module.clone(), row.address)),
            LiveTab::HotSpots => self
                .hot_spots
                .spots()
                .get(self.hot_spots.cursor.selected())
                .map(|spot| (spot.name.clone(), spot.module.clone(), spot.address)),
            LiveTab::Threads => None,
        }
    }

    fn tree_key(&mut self, code: KeyCode, snapshot: &ProfileSnapshot) -> bool {
        let len = self.tree.rows().len();
        if self.tree.cursor_mut().navigate(code, len) {
            return true;
        }
        match code {
            KeyCode::Left => self.tree.collapse_or_leave(),
            KeyCode::Right => self.tree.expand_or_enter(),
            KeyCode::Enter => self.tree.toggle_selected(),
            KeyCode::Char('s') => self.tree.set_sort(self.tree.sort().next()),
            KeyCode::Char('h') => self
                .tree
                .expand_hottest_path(source_roots(snapshot, self.source)),
            KeyCode::Char('c') => self.tree.collapse_all(),
            _ => return false,
        }
        self.tree.refresh(source_roots(snapshot, self.source));
        true
    }

    fn hot_spots_key(&mut self, code: KeyCode) -> bool {
        let len = self.hot_spots.spots().len();
        self.hot_spots.cursor.navigate(code, len)
    }

    fn threads_key(&mut self, code: KeyCode, snapshot: &ProfileSnapshot) -> bool {
        let len = snapshot.threads.len();
        if self.threads.navigate(code, len) {
            return true;
        }
        if code != KeyCode::Enter {
            return false;
        }
        if let Some(thread) = snapshot.threads.get(self.threads.selected()) {
            self.set_source(TreeSource::Thread(thread.tid));
            self.tab = LiveTab::CallTree;
            self.refresh(snapshot);
        }
        true
    }
}
