//! Profiles in the formats other tools read: pprof (`go tool pprof`, Pyroscope, Parca),
//! speedscope, the Trace Event Format (Perfetto, chrome://tracing) and SVG flame
//! graphs (inferno).
//!
//! The one idea: each format is a different layout of the same calling contexts, so the
//! walk is shared. [`Frames`] numbers each distinct function once, and
//! [`for_each_context`] visits every context of a tree with its stack of frame numbers,
//! root first, without recursion. Each stack export draws its trees cut at
//! `depth_cut::MAX_STACK_DEPTH` levels, so a 100,000-deep recursion does not write every
//! path in full.

pub mod chrome;
pub mod flamegraph;
pub mod pprof;
pub mod speedscope;

use super::model::{Node, Visit, walk};
use std::collections::HashMap;

/// One distinct function of a profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<'a> {
    pub name: &'a str,
    pub module: &'a str,
    pub address: Option<u64>,
}

/// Each distinct (name, module, address) numbered once, in order of first appearance:
/// two functions that share a name and module (`static` functions of two files) are two
/// frames. [`Frames::across_processes`] leaves the address out.
#[derive(Debug, Default)]
pub struct Frames<'a> {
    index: HashMap<(&'a str, &'a str, Option<u64>), usize>,
    pub frames: Vec<Frame<'a>>,
    /// Frames are numbered by (name, module) only.
    ignore_addresses: bool,
}

impl<'a> Frames<'a> {
    /// Frames numbered by (name, module), for profiles of different processes: the same
    /// function sits at another address in each (address randomisation, a rebuild).
    pub fn across_processes() -> Frames<'a> {
        Frames {
            ignore_addresses: true,
            ..Frames::default()
        }
    }

    /// The number of `node`'s function.
    pub fn of(&mut self, node: &'a Node) -> usize {
        self.named(&node.name, &node.module, node.address)
    }

    /// The number of the function `name` in `module` at `address`.
    pub fn named(&mut self, name: &'a str, module: &'a str, address: Option<u64>) -> usize {
        let key = (name, module, address.filter(|_| !self.ignore_addresses));
        *self.index.entry(key).or_insert_with(|| {
            self.frames.push(Frame {
                name,
                module,
                address,
            });
            self.frames.len() - 1
        })
    }
}

/// Visits every context of `roots`, depth first: `visit(stack, node)` gets the frame
/// numbers from the root down to `node`. The caller cuts a deep tree first
/// (`depth_cut::cut_deep_stacks`): the stacks are as deep as the tree.
pub fn for_each_context<'a>(
    roots: &'a [Node],
    frames: &mut Frames<'a>,
    mut visit: impl FnMut(&[usize], &'a Node),
) {
    let mut stack: Vec<usize> = Vec::new();
    let _ = walk(roots, |step| -> Result<(), ()> {
        match step {
            Visit::Enter { node, .. } => {
                stack.push(frames.of(node));
                visit(&stack, node);
            }
            Visit::Leave { .. } => {
                stack.pop();
            }
        }
        Ok(())
    });
}

/// The sum of self times over every context of `roots`: what a flame graph, pprof or
/// speedscope adds up to (equal to the roots' total unless a correction clamped).
pub fn self_sum_ns(roots: &[Node]) -> u64 {
    let mut sum = 0u64;
    let _ = walk(roots, |step| -> Result<(), ()> {
        if let Visit::Enter { node, .. } = step {
            sum += node.self_ns;
        }
        Ok(())
    });
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::model::tests::chain;

    #[test]
    fn contexts_come_with_their_stacks() {
        let mut root = Node::leaf("a", "m", 1, 10, 5);
        root.children.push(Node::leaf("b", "m", 1, 5, 5));
        root.children.push(Node::leaf("a", "m", 1, 0, 0));
        let mut frames = Frames::default();
        let mut seen = Vec::new();
        for_each_context(std::slice::from_ref(&root), &mut frames, |stack, node| {
            seen.push((stack.to_vec(), node.name.clone()))
        });
        assert_eq!(
            seen,
            [
                (vec![0], "a".to_owned()),
                (vec![0, 1], "b".to_owned()),
                (vec![0, 0], "a".to_owned())
            ]
        );
        assert_eq!(self_sum_ns(&[chain("f", 7)]), 7);
    }
}
