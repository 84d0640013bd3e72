//! The call tree view's state: which nodes are expanded, the sort order, the selection, and
//! the flattened list of visible rows.
//!
//! The one idea: a node is identified by its path of functions (name, module, address)
//! from the root (hashed into a [`PathId`]), never by its index, so expansion and selection survive the snapshots that
//! replace the tree several times a second. Only expanded nodes are descended into when the
//! visible rows are rebuilt, and every walk uses an explicit stack (trees can be thousands
//! of levels deep).

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::cursor::ListCursor;
use crate::model::TreeNode;

/// A node's identity: a hash of its path of (name, module, address) triples from a root.
pub type PathId = u64;

const ROOT_PARENT: PathId = 0;

/// The identity of the child `node` of the node identified by `parent`.
pub fn child_path(parent: PathId, node: &TreeNode) -> PathId {
    let mut hasher = DefaultHasher::new();
    parent.hash(&mut hasher);
    node.name.hash(&mut hasher);
    node.module.hash(&mut hasher);
    node.address.hash(&mut hasher);
    hasher.finish()
}

/// The order of siblings in the call tree (always descending).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortKey {
    #[default]
    Total,
    SelfTime,
    Calls,
}

impl SortKey {
    /// The next key in the cycle total → self → calls → total.
    pub fn next(self) -> SortKey {
        match self {
            SortKey::Total => SortKey::SelfTime,
            SortKey::SelfTime => SortKey::Calls,
            SortKey::Calls => SortKey::Total,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            SortKey::Total => "total",
            SortKey::SelfTime => "self",
            SortKey::Calls => "calls",
        }
    }

    fn compare(self, left: &TreeNode, right: &TreeNode) -> std::cmp::Ordering {
        let by_key = match self {
            SortKey::Total => right.total_ns.total_cmp(&left.total_ns),
            SortKey::SelfTime => right.self_ns.total_cmp(&left.self_ns),
            SortKey::Calls => right.calls.cmp(&left.calls),
        };
        by_key
            .then_with(|| left.name.cmp(&right.name))
            .then_with(|| left.module.cmp(&right.module))
    }
}

/// One visible row of the tree, with the figures it displays copied out of the snapshot.
#[derive(Debug, Clone)]
pub struct FlatRow {
    pub path: PathId,
    pub parent_row: Option<usize>,
    /// Index of the node in its parent's `children` (or in the roots), unsorted.
    pub child_index: usize,
    pub depth: usize,
    pub name: String,
    pub module: String,
    pub calls: u64,
    pub total_ns: f64,
    pub self_ns: f64,
    pub below_resolution: bool,
    /// Counted, not timed: the time is the caller's.
    pub in_caller: bool,
    /// The estimated error of `total_ns`, when known.
    pub error_ns: Option<f64>,
    /// The function's entry address, when known.
    pub address: Option<u64>,
    /// A call into JIT code ([`TreeNode::jit`]).
    pub jit: bool,
    pub has_children: bool,
    pub expanded: bool,
}

/// A node waiting on the flattening stack.
struct PendingRow<'a> {
    node: &'a TreeNode,
    parent_row: Option<usize>,
    parent_path: PathId,
    child_index: usize,
    depth: usize,
}

/// Pushes `nodes` on `stack` so that they pop in `sort` order.
fn push_sorted<'a>(
    stack: &mut Vec<PendingRow<'a>>,
    sort: SortKey,
    nodes: &'a [TreeNode],
    parent_row: Option<usize>,
    parent_path: PathId,
    depth: usize,
) {
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by(|&a, &b| sort.compare(&nodes[a], &nodes[b]));
    stack.extend(order.into_iter().rev().map(|child_index| PendingRow {
        node: &nodes[child_index],
        parent_row,
        parent_path,
        child_index,
        depth,
    }));
}

/// Expansion, sorting and selection over whichever tree is being shown.
#[derive(Debug, Default)]
pub struct TreeView {
    expanded: HashSet<PathId>,
    /// Roots seen so far; a root is expanded once, the first time it appears.
    seen_roots: HashSet<PathId>,
    sort: SortKey,
    rows: Vec<FlatRow>,
    stale: bool,
    cursor: ListCursor,
    /// Where the selection should go at the next rebuild (set by expand-hottest-path).
    select_after_rebuild: Option<PathId>,
    /// The selected node was just expanded: scroll its new rows into view after the rebuild.
    reveal_selected_subtree: bool,
    roots_total_ns: f64,
}

impl TreeView {
    pub fn new() -> Self {
        TreeView {
            stale: true,
            ..TreeView::default()
        }
    }

    pub fn sort(&self) -> SortKey {
        self.sort
    }

    pub fn set_sort(&mut self, sort: SortKey) {
        self.sort = sort;
        self.stale = true;
    }

    /// The tree changed (new snapshot, or another thread's tree): rebuild before use.
    pub fn invalidate(&mut self) {
        self.stale = true;
    }

    pub fn rows(&self) -> &[FlatRow] {
        &self.rows
    }

    pub fn cursor(&self) -> &ListCursor {
        &self.cursor
    }

    pub fn cursor_mut(&mut self) -> &mut ListCursor {
        &mut self.cursor
    }

    pub fn selected_row(&self) -> Option<&FlatRow> {
        self.rows.get(self.cursor.selected())
    }

    /// Sum of the roots' total time: the 100% of the percentage column.
    pub fn roots_total_ns(&self) -> f64 {
        self.roots_total_ns
    }

    /// Rebuilds the visible rows from `roots` if anything changed since the last rebuild.
    pub fn refresh(&mut self, roots: &[TreeNode]) {
        if !self.stale {
            return;
        }
        self.stale = false;
        let wanted = self
            .select_after_rebuild
            .take()
            .map(|path| vec![path])
            .unwrap_or_else(|| self.selected_lineage());
        self.expand_new_roots(roots);
        self.roots_total_ns = roots.iter().map(|root| root.total_ns).sum();
        self.rows = self.flatten(roots);
        let row_of: HashMap<PathId, usize> = self
            .rows
            .iter()
            .enumerate()
            .map(|(row, flat)| (flat.path, row))
            .collect();
        let selected = wanted.iter().find_map(|path| row_of.get(path).copied());
        let len = self.rows.len();
        self.cursor
            .select(selected.unwrap_or(self.cursor.selected()), len);
        if std::mem::take(&mut self.reveal_selected_subtree) {
            let selected = self.cursor.selected();
            let depth = self.rows.get(selected).map_or(0, |row| row.depth);
            let descendants = self
                .rows
                .iter()
                .skip(selected + 1)
                .take_while(|row| row.depth > depth)
                .count();
            self.cursor.reveal_below(descendants);
        }
    }

    /// The selected row's path followed by its ancestors' paths (nearest first).
    fn selected_lineage(&self) -> Vec<PathId> {
        let mut lineage = Vec::new();
        let mut row = self
            .rows
            .get(self.cursor.selected())
            .map(|_| self.cursor.selected());
        while let Some(index) = row {
            lineage.push(self.rows[index].path);
            row = self.rows[index].parent_row;
        }
        lineage
    }

    fn expand_new_roots(&mut self, roots: &[TreeNode]) {
        for root in roots {
            let path = child_path(ROOT_PARENT, root);
            if self.seen_roots.insert(path) {
                self.expanded.insert(path);
            }
        }
    }

    /// Pre-order rows of `roots`, descending only into expanded nodes, siblings sorted.
    fn flatten(&self, roots: &[TreeNode]) -> Vec<FlatRow> {
        let mut rows = Vec::new();
        let mut stack: Vec<PendingRow> = Vec::new();
        push_sorted(&mut stack, self.sort, roots, None, ROOT_PARENT, 0);
        while let Some(PendingRow {
            node,
            parent_row,
            parent_path,
            child_index,
            depth,
        }) = stack.pop()
        {
            let path = child_path(parent_path, node);
            let has_children = !node.children.is_empty();
            let expanded = has_children && self.expanded.contains(&path);
            let row = rows.len();
            rows.push(FlatRow {
                path,
                parent_row,
                child_index,
                depth,
                name: node.name.clone(),
                module: node.module.clone(),
                calls: node.calls,
                total_ns: node.total_ns,
                self_ns: node.self_ns,
                below_resolution: node.below_resolution,
                in_caller: node.in_caller,
                error_ns: node.error_ns,
                address: node.address,
                jit: node.jit,
                has_children,
                expanded,
            });
            if expanded {
                push_sorted(
                    &mut stack,
                    self.sort,
                    &node.children,
                    Some(row),
                    path,
                    depth + 1,
                );
            }
        }
        rows
    }

    /// The node shown in `row`, found by following child indices down from the roots.
    fn node_of<'a>(&self, roots: &'a [TreeNode], row: usize) -> Option<&'a TreeNode> {
        let mut indices = Vec::new();
        let mut current = Some(row);
        while let Some(index) = current {
            let flat = self.rows.get(index)?;
            indices.push(flat.child_index);
            current = flat.parent_row;
        }
        let mut siblings = roots;
        let mut node = None;
        for &index in indices.iter().rev() {
            let found = siblings.get(index)?;
            siblings = &found.children;
            node = Some(found);
        }
        node
    }

    /// Expands or collapses the selected node (Enter).
    pub fn toggle_selected(&mut self) {
        if let Some(row) = self.selected_row().filter(|row| row.has_children) {
            let path = row.path;
            if !self.expanded.remove(&path) {
                self.expanded.insert(path);
                self.reveal_selected_subtree = true;
            }
            self.stale = true;
        }
    }

    /// Right: expand the selected node, or step into its first child if already expanded.
    pub fn expand_or_enter(&mut self) {
        let Some(row) = self.selected_row() else {
            return;
        };
        if !row.has_children {
            return;
        }
        if row.expanded {
            let len = self.rows.len();
            self.cursor.move_by(1, len);
        } else {
            let path = row.path;
            self.expanded.insert(path);
            self.reveal_selected_subtree = true;
            self.stale = true;
        }
    }

    /// Left: collapse the selected node, or step out to its parent if already collapsed.
    pub fn collapse_or_leave(&mut self) {
        let Some(row) = self.selected_row() else {
            return;
        };
        if row.expanded {
            let path = row.path;
            self.expanded.remove(&path);
            self.stale = true;
        } else if let Some(parent) = row.parent_row {
            let len = self.rows.len();
            self.cursor.select(parent, len);
        }
    }

    /// Collapses every node; the roots stay expanded so their callees remain in view.
    pub fn collapse_all(&mut self) {
        self.expanded.retain(|path| self.seen_roots.contains(path));
        self.stale = true;
    }

    /// Expands the hottest path below the selected node: at each level the child with the
    /// most total time, down to a leaf, which becomes the selection.
    pub fn expand_hottest_path(&mut self, roots: &[TreeNode]) {
        let selected = self.cursor.selected();
        let (Some(row), Some(mut node)) = (self.rows.get(selected), self.node_of(roots, selected))
        else {
            return;
        };
        let mut path = row.path;
        while let Some(hottest) = node.children.iter().reduce(|best, child| {
            if child.total_ns > best.total_ns {
                child
            } else {
                best
            }
        }) {
            self.expanded.insert(path);
            path = child_path(path, hottest);
            node = hottest;
        }
        self.select_after_rebuild = Some(path);
        self.stale = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, total: f64, children: Vec<TreeNode>) -> TreeNode {
        TreeNode::new(name, "m", 1, total, total / 2.0).with_children(children)
    }

    fn names(view: &TreeView) -> Vec<String> {
        view.rows()
            .iter()
            .map(|row| format!("{}{}", " ".repeat(row.depth), row.name))
            .collect()
    }

    #[test]
    fn roots_open_once_and_children_follow_the_sort() {
        let roots = vec![node(
            "main",
            10.0,
            vec![
                node("a", 2.0, vec![node("x", 1.0, vec![])]),
                node("b", 8.0, vec![]),
            ],
        )];
        let mut view = TreeView::new();
        view.refresh(&roots);
        assert_eq!(names(&view), ["main", " b", " a"]);
        view.collapse_or_leave();
        view.refresh(&roots);
        assert_eq!(names(&view), ["main"]);
        view.invalidate();
        view.refresh(&roots);
        assert_eq!(names(&view), ["main"], "a collapsed root stays collapsed");
    }

    #[test]
    fn hottest_path_expands_to_a_leaf_and_selects_it() {
        let roots = vec![node(
            "main",
            10.0,
            vec![
                node(
                    "a",
                    7.0,
                    vec![node("x", 1.0, vec![]), node("y", 6.0, vec![])],
                ),
                node("b", 3.0, vec![]),
            ],
        )];
        let mut view = TreeView::new();
        view.refresh(&roots);
        view.collapse_all();
        view.expand_hottest_path(&roots);
        view.refresh(&roots);
        assert_eq!(names(&view), ["main", " a", "  y", "  x", " b"]);
        assert_eq!(view.selected_row().map(|row| row.name.as_str()), Some("y"));
    }

    #[test]
    fn selection_falls_back_to_the_nearest_visible_ancestor() {
        let roots = vec![node(
            "main",
            10.0,
            vec![node("a", 7.0, vec![node("x", 1.0, vec![])])],
        )];
        let mut view = TreeView::new();
        view.refresh(&roots);
        view.expand_hottest_path(&roots);
        view.refresh(&roots);
        assert_eq!(view.selected_row().map(|row| row.name.as_str()), Some("x"));
        let pruned = vec![node("main", 10.0, vec![node("a", 7.0, vec![])])];
        view.invalidate();
        view.refresh(&pruned);
        assert_eq!(view.selected_row().map(|row| row.name.as_str()), Some("a"));
    }
}
