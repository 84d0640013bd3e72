//! Folded stacks (`root;caller;callee <self ns>`), the input of flame-graph tools, of a
//! tree cut at `depth_cut::MAX_STACK_DEPTH` levels, so a pathological recursion cannot
//! make gigabytes of output.

use super::depth_cut::cut_deep_stacks;
use super::model::{Profile, Visit, walk};
use super::names::folded_frame;
use std::io::{self, Write};

/// Folded stacks: `root;caller;callee <self ns>` for every context with self time, of
/// the merged tree cut at `depth_cut::MAX_STACK_DEPTH` levels (a deeper subtree is one
/// `[N levels cut]` frame with its time).
pub fn write_folded(profile: &Profile, out: &mut impl Write) -> io::Result<()> {
    let profile = cut_deep_stacks(profile);
    let mut path = String::new();
    // The length of `path` before each open node's name was appended.
    let mut path_lengths: Vec<usize> = Vec::new();
    walk(&profile.merged.roots, |step| match step {
        Visit::Enter { node, .. } => {
            path_lengths.push(path.len());
            if !path.is_empty() {
                path.push(';');
            }
            path.push_str(&folded_frame(&node.name));
            if node.self_ns > 0 {
                writeln!(out, "{path} {}", node.self_ns)?;
            }
            Ok(())
        }
        Visit::Leave { .. } => {
            path.truncate(path_lengths.pop().unwrap_or(0));
            Ok(())
        }
    })
}
