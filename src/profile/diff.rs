//! Two profiles compared call path by call path (`tendril diff A B`).
//!
//! The one idea: a call path (the functions from a root down to a context, as in the
//! merged tree) names the same work in both profiles, so each path's total and self
//! time in A and in B can be set side by side; the rows that changed most, either way,
//! come first. The same pairs, as `path selfA selfB` lines, are the input of inferno's
//! differential flame graph (`inferno-flamegraph`, after `inferno-diff-folded`'s
//! format). Trees deeper than the stack exports draw are cut as theirs are
//! (`depth_cut`: below level 1023, one `[N levels cut]` frame).

use super::depth_cut::cut_deep_stacks;
use super::export::{Frames, for_each_context};
use super::model::Profile;
use super::names::folded_frame;
use std::collections::HashMap;
use std::io::{self, Write};

/// One call path's times in both profiles (0 where it did not occur).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathChange {
    /// The path as a folded stack (`root;caller;callee`, names escaped).
    pub path: String,
    pub total_a_ns: u64,
    pub total_b_ns: u64,
    pub self_a_ns: u64,
    pub self_b_ns: u64,
}

impl PathChange {
    pub fn total_change_ns(&self) -> i128 {
        self.total_b_ns as i128 - self.total_a_ns as i128
    }

    pub fn self_change_ns(&self) -> i128 {
        self.self_b_ns as i128 - self.self_a_ns as i128
    }
}

/// Every call path of either profile's merged tree, by absolute change in total time
/// (then in self time, then by path).
pub fn compare(a: &Profile, b: &Profile) -> Vec<PathChange> {
    // The two profiles may come from two processes: paths pair by names, not addresses.
    let mut frames = Frames::across_processes();
    let mut index: HashMap<Vec<usize>, usize> = HashMap::new();
    let mut rows: Vec<PathChange> = Vec::new();
    let (a, b) = (cut_deep_stacks(a), cut_deep_stacks(b));
    for (side, profile) in [&*a, &*b].into_iter().enumerate() {
        for_each_context(&profile.merged.roots, &mut frames, |stack, node| {
            let row = *index.entry(stack.to_vec()).or_insert_with(|| {
                rows.push(PathChange {
                    path: String::new(),
                    total_a_ns: 0,
                    total_b_ns: 0,
                    self_a_ns: 0,
                    self_b_ns: 0,
                });
                rows.len() - 1
            });
            let row = &mut rows[row];
            if side == 0 {
                row.total_a_ns += node.total_ns;
                row.self_a_ns += node.self_ns;
            } else {
                row.total_b_ns += node.total_ns;
                row.self_b_ns += node.self_ns;
            }
        });
    }
    for (stack, row) in &index {
        let names: Vec<String> = stack
            .iter()
            .map(|&frame| folded_frame(frames.frames[frame].name).into_owned())
            .collect();
        rows[*row].path = names.join(";");
    }
    rows.sort_by(|x, y| {
        y.total_change_ns()
            .abs()
            .cmp(&x.total_change_ns().abs())
            .then(y.self_change_ns().abs().cmp(&x.self_change_ns().abs()))
            .then(x.path.cmp(&y.path))
    });
    rows
}

fn signed_ms(ns: i128) -> String {
    format!("{:+.3}", ns as f64 / 1e6)
}

/// The comparison as text: a header naming both sides, then one row per path.
pub fn write_diff_text(
    rows: &[PathChange],
    (name_a, a): (&str, &Profile),
    (name_b, b): (&str, &Profile),
    out: &mut impl Write,
) -> io::Result<()> {
    writeln!(
        out,
        "{} (total {:.3} ms) -> {} (total {:.3} ms): {} call paths, by absolute change in \
         total time",
        super::names::printable(name_a),
        a.merged_total_ns() as f64 / 1e6,
        super::names::printable(name_b),
        b.merged_total_ns() as f64 / 1e6,
        rows.len()
    )?;
    writeln!(
        out,
        "{:>12} {:>12} {:>12} {:>12}  call path",
        "total ms", "self ms", "A total ms", "B total ms"
    )?;
    for row in rows {
        writeln!(
            out,
            "{:>12} {:>12} {:>12.3} {:>12.3}  {}",
            signed_ms(row.total_change_ns()),
            signed_ms(row.self_change_ns()),
            row.total_a_ns as f64 / 1e6,
            row.total_b_ns as f64 / 1e6,
            row.path
        )?;
    }
    Ok(())
}

/// `path selfA selfB` lines, the input of inferno's differential flame graph; paths
/// with no self time on either side are left out.
pub fn write_diff_folded(rows: &[PathChange], out: &mut impl Write) -> io::Result<()> {
    for row in rows {
        if row.self_a_ns > 0 || row.self_b_ns > 0 {
            writeln!(out, "{} {} {}", row.path, row.self_a_ns, row.self_b_ns)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::file::tests::small_profile;
    use crate::profile::model::Node;

    #[test]
    fn paths_pair_across_processes_whose_functions_sit_at_other_addresses() {
        let with_addresses = |base: u64| {
            let mut profile = small_profile();
            let mut pending: Vec<&mut Node> = profile.merged.roots.iter_mut().collect();
            let mut next = base;
            while let Some(node) = pending.pop() {
                node.address = Some(next);
                next += 0x10;
                pending.extend(node.children.iter_mut());
            }
            profile
        };
        let rows = compare(&with_addresses(0x5555_0000), &with_addresses(0x7777_0000));
        assert_eq!(rows.len(), 3, "{rows:?}");
        assert!(rows.iter().all(|r| r.total_change_ns() == 0), "{rows:?}");
    }

    #[test]
    fn paths_are_paired_and_sorted_by_absolute_change() {
        let a = small_profile();
        let mut b = small_profile();
        // root 100 → 150: mid 90 → 80 (leaf 60 → 40), and a new path root;extra 60.
        let root = &mut b.merged.roots[0];
        root.total_ns = 150;
        root.self_ns = 10;
        root.children[0].total_ns = 80;
        root.children[0].self_ns = 40;
        root.children[0].children[0].total_ns = 40;
        root.children[0].children[0].self_ns = 40;
        root.children.push(Node::leaf("extra;x", "app", 1, 60, 60));
        let rows = compare(&a, &b);
        let summary: Vec<(&str, i128, i128)> = rows
            .iter()
            .map(|r| (r.path.as_str(), r.total_change_ns(), r.self_change_ns()))
            .collect();
        assert_eq!(
            summary,
            [
                ("root;extra:x", 60, 60),
                ("root", 50, 0),
                ("root;mid \"quoted\";leaf", -20, -20),
                ("root;mid \"quoted\"", -10, 10),
            ]
        );
        let mut folded = Vec::new();
        write_diff_folded(&rows, &mut folded).unwrap();
        assert_eq!(
            String::from_utf8(folded).unwrap(),
            "root;extra:x 0 60\nroot 10 10\nroot;mid \"quoted\";leaf 60 40\n\
             root;mid \"quoted\" 30 40\n"
        );
    }
}
