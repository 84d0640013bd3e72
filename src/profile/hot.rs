//! Hot spots: self time and calls per function, summed over every calling context it
//! appears in — what `report --format hot` prints, and what a test checks against the
//! tree it comes from.
//!
//! The one idea: a function is its (name, module) pair; its rows in every context of
//! the merged tree add up, so the hot spots count exactly the calls the tree does.

use super::model::{Node, Visit, walk};
use std::collections::HashMap;

/// One function's figures over all its contexts (`calls`: in a sampled profile, the
/// samples in which it was innermost).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotSpot<'a> {
    pub name: &'a str,
    pub module: &'a str,
    pub self_ns: u64,
    pub calls: u64,
    /// Every context's self time was below resolution ([`Node::below_resolution`]).
    pub below_resolution: bool,
}

/// The functions of `roots` by self time, largest first (then by name).
pub fn hot_spots(roots: &[Node]) -> Vec<HotSpot<'_>> {
    let mut by_function: HashMap<(&str, &str), usize> = HashMap::new();
    let mut spots: Vec<HotSpot> = Vec::new();
    let _ = walk(roots, |step| -> Result<(), ()> {
        if let Visit::Enter { node, .. } = step {
            let key = (node.name.as_str(), node.module.as_str());
            let index = *by_function.entry(key).or_insert_with(|| {
                spots.push(HotSpot {
                    name: key.0,
                    module: key.1,
                    self_ns: 0,
                    calls: 0,
                    below_resolution: true,
                });
                spots.len() - 1
            });
            let spot = &mut spots[index];
            spot.self_ns += node.self_ns;
            spot.calls += match node.samples {
                // A sampled profile counts the samples in which it was innermost.
                Some(samples) => {
                    samples.saturating_sub(node.children.iter().filter_map(|c| c.samples).sum())
                }
                None => node.calls,
            };
            spot.below_resolution &= node.below_resolution;
        }
        Ok(())
    });
    spots.sort_by(|a, b| b.self_ns.cmp(&a.self_ns).then(a.name.cmp(b.name)));
    spots
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_add_up_per_function() {
        let mut inner = Node::leaf("f", "m", 3, 0, 0);
        inner.below_resolution = true;
        let mut outer = Node::leaf("f", "m", 2, 10, 10);
        outer.children.push(inner.clone());
        let mut root = Node::leaf("main", "m", 1, 10, 0);
        root.below_resolution = true;
        root.children.push(outer);
        root.children.push(Node::leaf("g", "lib", 1, 0, 0));
        let roots = [root];
        let spots = hot_spots(&roots);
        let f = spots.iter().find(|s| s.name == "f").unwrap();
        assert_eq!((f.calls, f.self_ns, f.below_resolution), (5, 10, false));
        let main = spots.iter().find(|s| s.name == "main").unwrap();
        assert!(main.below_resolution);
        assert!(
            !spots
                .iter()
                .find(|s| s.name == "g")
                .unwrap()
                .below_resolution
        );
        assert_eq!(spots[0].name, "f");
    }
}
