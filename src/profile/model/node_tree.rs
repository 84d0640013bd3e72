//! Walking, copying, comparing, printing and freeing a [`Node`] tree without recursion.
//!
//! The one idea: a profile's tree may be as deep as the target's recursion (100,000
//! levels is normal), and the derived `Drop`, `Clone`, `PartialEq` and `Debug` would
//! recurse once per level and overflow the stack. Everything here uses a heap worklist
//! or the iterative [`walk`].

use super::Node;
use std::fmt;

/// One step of [`walk`]: a node is entered before its children and left after them.
#[derive(Debug, Clone, Copy)]
pub enum Visit<'a> {
    /// `depth` is 0 for a root.
    Enter {
        node: &'a Node,
        depth: usize,
    },
    Leave {
        node: &'a Node,
        depth: usize,
    },
}

/// Visits every node of `roots` depth first, in order, without recursion; stops at the
/// first error `visit` returns.
pub fn walk<'a, E>(
    roots: &'a [Node],
    mut visit: impl FnMut(Visit<'a>) -> Result<(), E>,
) -> Result<(), E> {
    // Each entry: a node that was entered and the index of its next child to visit.
    let mut open: Vec<(&'a Node, usize)> = Vec::new();
    for root in roots {
        visit(Visit::Enter {
            node: root,
            depth: 0,
        })?;
        open.push((root, 0));
        while let Some((node, next_child)) = open.last_mut() {
            let node: &'a Node = node;
            if let Some(child) = node.children.get(*next_child) {
                *next_child += 1;
                visit(Visit::Enter {
                    node: child,
                    depth: open.len(),
                })?;
                open.push((child, 0));
            } else {
                open.pop();
                visit(Visit::Leave {
                    node,
                    depth: open.len(),
                })?;
            }
        }
    }
    Ok(())
}

/// Rebuilds a tree from a depth-first [`walk`] of another: `enter` makes a node (without
/// children) from each visited one. Iterative, like everything here.
fn map_tree(roots: &[Node], mut enter: impl FnMut(&Node) -> Node) -> Vec<Node> {
    let mut done: Vec<Node> = Vec::with_capacity(roots.len());
    // The nodes being built, each above the `done` list its children go into.
    let mut building: Vec<(Node, Vec<Node>)> = Vec::new();
    let _ = walk(roots, |step| -> Result<(), ()> {
        match step {
            Visit::Enter { node, .. } => {
                let siblings =
                    std::mem::replace(&mut done, Vec::with_capacity(node.children.len()));
                building.push((enter(node), siblings));
            }
            Visit::Leave { .. } => {
                let (mut built, siblings) = building.pop().expect("walk leaves what it entered");
                built.children = std::mem::replace(&mut done, siblings);
                done.push(built);
            }
        }
        Ok(())
    });
    done
}

impl Drop for Node {
    /// Frees the subtree with a heap worklist: the derived drop would recurse once per
    /// level and overflow the stack on a deep recursion's tree.
    fn drop(&mut self) {
        let mut pending = std::mem::take(&mut self.children);
        while let Some(mut node) = pending.pop() {
            pending.append(&mut node.children);
            // `node` now has no children: dropping it does not recurse.
        }
    }
}

impl Clone for Node {
    fn clone(&self) -> Node {
        map_tree(std::slice::from_ref(self), Node::without_children)
            .pop()
            .expect("one root in, one root out")
    }
}

impl PartialEq for Node {
    fn eq(&self, other: &Node) -> bool {
        let mut pairs: Vec<(&Node, &Node)> = vec![(self, other)];
        while let Some((a, b)) = pairs.pop() {
            if !a.same_fields(b) {
                return false;
            }
            pairs.extend(a.children.iter().zip(&b.children));
        }
        true
    }
}

impl Eq for Node {}

impl fmt::Debug for Node {
    /// `name (module) calls=… total_ns=… self_ns=… [children…]`, written iteratively.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        walk(std::slice::from_ref(self), |step| match step {
            Visit::Enter { node, depth } => {
                if depth > 0 {
                    f.write_str(" ")?;
                }
                write!(
                    f,
                    "{:?} ({}) calls={} total_ns={} self_ns={}",
                    node.name, node.module, node.calls, node.total_ns, node.self_ns
                )?;
                if node.below_resolution {
                    f.write_str(" below_resolution")?;
                }
                if node.jit {
                    f.write_str(" jit")?;
                }
                if !node.children.is_empty() {
                    f.write_str(" [")?;
                }
                Ok(())
            }
            Visit::Leave { node, .. } => {
                if !node.children.is_empty() {
                    f.write_str("]")?;
                }
                Ok(())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::model::tests::chain;

    fn small_tree() -> Node {
        let mut root = Node::leaf("root", "app", 1, 100, 10);
        let mut mid = Node::leaf("mid", "app", 3, 90, 30);
        mid.children
            .push(Node::leaf("leaf", "libc.so.6", 6, 60, 60));
        root.children.push(mid);
        root
    }

    #[test]
    fn walk_enters_and_leaves_in_depth_first_order() {
        let root = small_tree();
        let mut steps = Vec::new();
        walk(std::slice::from_ref(&root), |step| -> Result<(), ()> {
            steps.push(match step {
                Visit::Enter { node, depth } => format!("+{}@{depth}", node.name),
                Visit::Leave { node, depth } => format!("-{}@{depth}", node.name),
            });
            Ok(())
        })
        .unwrap();
        assert_eq!(
            steps,
            [
                "+root@0", "+mid@1", "+leaf@2", "-leaf@2", "-mid@1", "-root@0"
            ]
        );
    }

    #[test]
    fn walk_stops_at_the_first_error() {
        let root = small_tree();
        let mut entered = 0;
        let result = walk(std::slice::from_ref(&root), |step| {
            if let Visit::Enter { node, .. } = step {
                entered += 1;
                if node.name == "mid" {
                    return Err("stop");
                }
            }
            Ok(())
        });
        assert_eq!(result, Err("stop"));
        assert_eq!(entered, 2);
    }

    #[test]
    fn clone_and_eq_see_every_field() {
        let root = small_tree();
        let copy = root.clone();
        assert_eq!(copy, root);
        let mut changed = root.clone();
        changed.children[0].children[0].self_ns = 61;
        assert_ne!(changed, root);
        assert_eq!(
            format!("{root:?}"),
            "\"root\" (app) calls=1 total_ns=100 self_ns=10 [ \"mid\" (app) calls=3 \
             total_ns=90 self_ns=30 [ \"leaf\" (libc.so.6) calls=6 total_ns=60 self_ns=60]]"
        );
    }

    #[test]
    fn a_100_000_deep_tree_clones_compares_walks_and_drops() {
        let deep = chain("fib", 100_000);
        let copy = deep.clone();
        assert!(copy == deep);
        let mut deepest = 0;
        walk(std::slice::from_ref(&copy), |step| -> Result<(), ()> {
            if let Visit::Enter { depth, .. } = step {
                deepest = deepest.max(depth);
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(deepest, 99_999);
        assert!(format!("{copy:?}").len() > 100_000);
        drop(copy);
        drop(deep);
    }
}
