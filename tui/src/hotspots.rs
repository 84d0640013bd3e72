//! Hot spots: self time per function, summed over every calling context it appears in.
//!
//! The one idea: a function's self time adds up across contexts, but its total time must be
//! counted only at the outermost occurrence on each path, or recursion would count the same
//! nanoseconds once per level. The walk is iterative, and it runs only when the hot spots
//! view is shown and the data changed, never once per frame. In a sampled tree a node's
//! count is its samples at or below it, an inclusive figure like total time, so it too
//! is counted only at the outermost occurrence.

use std::collections::HashMap;

use crate::cursor::ListCursor;
use crate::model::TreeNode;

/// One function's figures summed over all its contexts.
#[derive(Debug, Clone, PartialEq)]
pub struct HotSpot {
    pub name: String,
    pub module: String,
    pub calls: u64,
    pub self_ns: f64,
    /// Every context's self time was below what the profiler can measure.
    pub below_resolution: bool,
    /// Total time without double counting recursive activations.
    pub total_ns: f64,
    /// The entry address, when known: two functions that share a name and module
    /// (`static` functions of two files) are two hot spots.
    pub address: Option<u64>,
    /// Another hot spot has the same name and module: the rows show the addresses.
    pub has_a_twin: bool,
}

impl HotSpot {
    /// The function column: the name, and for one of twins its address (in this wide
    /// column, where the module's would cut it).
    pub fn label(&self) -> String {
        match (self.has_a_twin, self.address) {
            (true, Some(address)) => format!("{} at {address:#x}", self.name),
            _ => self.name.clone(),
        }
    }
}

/// Sums `roots` per function (name, module, address), sorted by self time (descending,
/// then by name). `inclusive_counts`: the nodes' `calls` are samples at or below them (a
/// sampled tree), counted once per path like total time.
pub fn aggregate(roots: &[TreeNode], inclusive_counts: bool) -> Vec<HotSpot> {
    enum Step<'a> {
        Enter(&'a TreeNode),
        Leave((&'a str, &'a str, Option<u64>)),
    }
    let mut by_function: HashMap<(&str, &str, Option<u64>), HotSpot> = HashMap::new();
    let mut active_on_path: HashMap<(&str, &str, Option<u64>), usize> = HashMap::new();
    let mut steps: Vec<Step> = roots.iter().rev().map(Step::Enter).collect();
    while let Some(step) = steps.pop() {
        match step {
            Step::Enter(node) => {
                let key = (node.name.as_str(), node.module.as_str(), node.address);
                let spot = by_function.entry(key).or_insert_with(|| HotSpot {
                    name: node.name.clone(),
                    module: node.module.clone(),
                    calls: 0,
                    self_ns: 0.0,
                    below_resolution: true,
                    total_ns: 0.0,
                    address: node.address,
                    has_a_twin: false,
                });
                spot.self_ns += node.self_ns;
                spot.below_resolution &= node.below_resolution;
                let active = active_on_path.entry(key).or_insert(0);
                if *active == 0 {
                    spot.total_ns += node.total_ns;
                }
                if *active == 0 || !inclusive_counts {
                    spot.calls += node.calls;
                }
                *active += 1;
                steps.push(Step::Leave(key));
                steps.extend(node.children.iter().rev().map(Step::Enter));
            }
            Step::Leave(key) => {
                if let Some(active) = active_on_path.get_mut(&key) {
                    *active -= 1;
                }
            }
        }
    }
    let mut spots: Vec<HotSpot> = by_function.into_values().collect();
    let mut named: HashMap<(String, String), usize> = HashMap::new();
    for spot in &spots {
        *named
            .entry((spot.name.clone(), spot.module.clone()))
            .or_default() += 1;
    }
    for spot in &mut spots {
        spot.has_a_twin = named[&(spot.name.clone(), spot.module.clone())] > 1;
    }
    spots.sort_by(|a, b| {
        b.self_ns
            .total_cmp(&a.self_ns)
            .then_with(|| a.name.cmp(&b.name))
            .then_with(|| a.module.cmp(&b.module))
            .then_with(|| a.address.cmp(&b.address))
    });
    spots
}

/// The hot spots table: cached rows, recomputed lazily, and its selection.
#[derive(Debug, Default)]
pub struct HotSpotsView {
    spots: Vec<HotSpot>,
    stale: bool,
    pub cursor: ListCursor,
}

impl HotSpotsView {
    pub fn new() -> Self {
        HotSpotsView {
            stale: true,
            ..HotSpotsView::default()
        }
    }

    /// The data changed: recompute before the next use.
    pub fn invalidate(&mut self) {
        self.stale = true;
    }

    /// Recomputes from `roots` if the data changed; keeps the selected function selected.
    /// `inclusive_counts` as for [`aggregate`].
    pub fn refresh(&mut self, roots: &[TreeNode], inclusive_counts: bool) {
        if !self.stale {
            return;
        }
        self.stale = false;
        let selected = self
            .spots
            .get(self.cursor.selected())
            .map(|spot| (spot.name.clone(), spot.module.clone(), spot.address));
        self.spots = aggregate(roots, inclusive_counts);
        let row = selected.and_then(|(name, module, address)| {
            self.spots.iter().position(|spot| {
                spot.name == name && spot.module == module && spot.address == address
            })
        });
        let len = self.spots.len();
        self.cursor
            .select(row.unwrap_or(self.cursor.selected()), len);
    }

    pub fn spots(&self) -> &[HotSpot] {
        &self.spots
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recursion_counts_total_time_once() {
        // fib -> fib -> fib: self times add up, total is the outermost one.
        let chain = TreeNode::new("fib", "m", 1, 30.0, 10.0)
            .with_children([TreeNode::new("fib", "m", 1, 20.0, 10.0)
                .with_children([TreeNode::new("fib", "m", 1, 10.0, 10.0)])]);
        let spots = aggregate(&[chain], false);
        assert_eq!(spots.len(), 1);
        assert_eq!(
            (spots[0].calls, spots[0].self_ns, spots[0].total_ns),
            (3, 30.0, 30.0)
        );
        // Sampled: 3 samples at or below the outermost fib are its 3 samples, not 3+2+1.
        let sampled = TreeNode::new("fib", "m", 3, 30.0, 10.0)
            .with_children([TreeNode::new("fib", "m", 2, 20.0, 10.0)
                .with_children([TreeNode::new("fib", "m", 1, 10.0, 10.0)])]);
        let spots = aggregate(&[sampled], true);
        assert_eq!((spots[0].calls, spots[0].total_ns), (3, 30.0));
    }

    #[test]
    fn same_name_in_another_module_is_another_function() {
        let root = TreeNode::new("main", "app", 1, 10.0, 2.0).with_children([
            TreeNode::new("init", "liba.so", 1, 4.0, 4.0),
            TreeNode::new("init", "libb.so", 1, 4.0, 4.0),
        ]);
        let spots = aggregate(&[root], false);
        assert_eq!(spots.len(), 3);
    }
}
