//! Hot spots: self time and calls per function, summed over every calling context it
//! appears in — what `report --format hot` prints, and what a test checks against the
//! tree it comes from.
//!
//! The one idea: a function is its (name, module, entry address) triple; its rows in
//! every context of the merged tree add up, so the hot spots count exactly the calls the
//! tree does. The address keeps apart two functions that share a name and module
//! (`static` functions of two files).

use super::model::{Node, Visit, walk};
use std::collections::HashMap;

/// One function's figures over all its contexts (`calls`: in a sampled profile, the
/// samples in which it was innermost).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotSpot<'a> {
    pub name: &'a str,
    pub module: &'a str,
    /// The entry address, when the profile has it.
    pub address: Option<u64>,
    /// Another hot spot has the same name and module.
    pub has_a_twin: bool,
    pub self_ns: u64,
    pub calls: u64,
    /// Every context's self time was below resolution ([`Node::below_resolution`]).
    pub below_resolution: bool,
    /// Calls into JIT code, not counted, in an instrumented tree ([`Node::jit`]).
    pub jit: bool,
}

/// The functions of `roots` by self time, largest first (then by name).
pub fn hot_spots(roots: &[Node]) -> Vec<HotSpot<'_>> {
    let mut by_function: HashMap<(&str, &str, Option<u64>), usize> = HashMap::new();
    let mut spots: Vec<HotSpot> = Vec::new();
    let _ = walk(roots, |step| -> Result<(), ()> {
        if let Visit::Enter { node, .. } = step {
            let key = (node.name.as_str(), node.module.as_str(), node.address);
            let index = *by_function.entry(key).or_insert_with(|| {
                spots.push(HotSpot {
                    name: key.0,
                    module: key.1,
                    address: key.2,
                    has_a_twin: false,
                    self_ns: 0,
                    calls: 0,
                    below_resolution: true,
                    jit: node.jit && node.samples.is_none(),
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
    let mut named: HashMap<(&str, &str), usize> = HashMap::new();
    for spot in &spots {
        *named.entry((spot.name, spot.module)).or_default() += 1;
    }
    for spot in &mut spots {
        spot.has_a_twin = named[&(spot.name, spot.module)] > 1;
    }
    spots.sort_by(|a, b| {
        (b.self_ns.cmp(&a.self_ns))
            .then(a.name.cmp(b.name))
            .then(a.address.cmp(&b.address))
    });
    spots
}

impl HotSpot<'_> {
    /// The module to print: the module, and for one of twins its address.
    pub fn location(&self) -> String {
        match (self.has_a_twin, self.address) {
            (true, Some(address)) => format!("{} at {address:#x}", self.module),
            _ => self.module.to_owned(),
        }
    }
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

    #[test]
    fn two_functions_of_one_name_and_module_are_two_spots_that_say_where() {
        let twin = |address, calls, self_ns| {
            let mut node = Node::leaf("step", "m", calls, self_ns, self_ns);
            node.address = Some(address);
            node
        };
        let mut root = Node::leaf("main", "m", 1, 40, 0);
        root.children.push(twin(0x1210, 1000, 10));
        root.children.push(twin(0x1260, 3000, 30));
        let roots = [root];
        let spots = hot_spots(&roots);
        let shown: Vec<(String, u64)> = (spots.iter())
            .map(|s| (format!("{} ({})", s.name, s.location()), s.calls))
            .collect();
        assert_eq!(
            shown,
            [
                ("step (m at 0x1260)".to_owned(), 3000),
                ("step (m at 0x1210)".to_owned(), 1000),
                ("main (m)".to_owned(), 1),
            ]
        );
    }
}
