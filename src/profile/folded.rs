//! Folded stacks (`root;caller;callee <self ns>`), the input of flame-graph tools, with
//! their depth capped so a pathological recursion cannot make gigabytes of output.

use super::model::{Profile, Visit, walk};
use super::names::folded_frame;
use std::io::{self, Write};

/// Folded stacks keep at most this many frames, the innermost ones, below a
/// `[N frames elided]` frame: otherwise a chain 100,000 calls deep writes gigabytes
/// (every line repeats the whole path above it).
pub const MAX_FOLDED_FRAMES: usize = 1024;

/// Folded stacks: `root;caller;callee <self ns>` for every context with self time.
/// A stack deeper than [`MAX_FOLDED_FRAMES`] keeps its innermost frames under one
/// `[N frames elided]` frame (see [`folded_stacks_elided`]).
pub fn write_folded(profile: &Profile, out: &mut impl Write) -> io::Result<()> {
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
                let frames = path_lengths.len();
                if frames > MAX_FOLDED_FRAMES {
                    let elided = frames - MAX_FOLDED_FRAMES;
                    // Frame `elided` starts after the `;` that precedes it.
                    let kept = &path[path_lengths[elided] + 1..];
                    writeln!(out, "[{elided} frames elided];{kept} {}", node.self_ns)?;
                } else {
                    writeln!(out, "{path} {}", node.self_ns)?;
                }
            }
            Ok(())
        }
        Visit::Leave { .. } => {
            path.truncate(path_lengths.pop().unwrap_or(0));
            Ok(())
        }
    })
}

/// How many folded stacks [`write_folded`] cuts to [`MAX_FOLDED_FRAMES`] frames.
pub fn folded_stacks_elided(profile: &Profile) -> u64 {
    let mut elided = 0;
    let _ = walk(&profile.merged.roots, |step| -> Result<(), ()> {
        if let Visit::Enter { node, depth } = step
            && node.self_ns > 0
            && depth >= MAX_FOLDED_FRAMES
        {
            elided += 1;
        }
        Ok(())
    });
    elided
}
