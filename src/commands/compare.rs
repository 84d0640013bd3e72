//! `tendril compare A.json B.json [--root SYM] [--top N]`: how far two profiles'
//! calling context trees agree, and the call paths where they differ most.
//!
//! The one idea: the first line is always `overlap X.XXX  hotcover Y.YYY` (see
//! `profile::overlap` for the definitions), so scripts read it; the table below it
//! lists each call path's self share in A and in B. A sampled whole-process tree and an
//! instrumented tree compare below the instrumented tree's roots unless `--root` says
//! otherwise, each read as the other can show it (`weights_to_compare`: tail calls in
//! their caller's place, time counted in a caller at that caller), and a path only one
//! side has that ends in a function that side did not follow says why.

use crate::profile::names::printable;
use crate::profile::overlap::{
    Agreement, HOT_THRESHOLD, PathWeights, agreement, at_timed_callers, on_common_clock,
    path_weights, path_weights_as_sampled, root_names,
};
use crate::profile::{NotFollowed, Profile};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

/// Rows listed when `--top` is not given.
pub const DEFAULT_ROWS: usize = 20;

pub fn run(a: &Path, b: &Path, root: Option<&str>, rows: usize) -> anyhow::Result<()> {
    let mut profile_a = Profile::load(a)?;
    let mut profile_b = Profile::load(b)?;
    let on_cpu = on_common_clock(&mut profile_a, &mut profile_b);
    let roots = comparison_roots(&profile_a, &profile_b, root);
    refuse_without_time(&[(a, &profile_a), (b, &profile_b)], &roots)?;
    let (weights_a, weights_b, moved) = weights_to_compare(&profile_a, &profile_b, &roots);
    let result = agreement(&weights_a, &weights_b);
    let why_a = not_followed_by_name(&profile_a);
    let why_b = not_followed_by_name(&profile_b);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = (|| -> std::io::Result<()> {
        writeln!(
            out,
            "overlap {:.3}  hotcover {:.3}",
            result.overlap, result.hotcover
        )?;
        writeln!(
            out,
            "A: {} ({})  B: {} ({}){}",
            printable(&a.display().to_string()),
            describe(&profile_a),
            printable(&b.display().to_string()),
            describe(&profile_b),
            if roots.is_empty() {
                String::new()
            } else {
                format!("; below {}", printable(&roots.join(", ")))
            }
        )?;
        writeln!(
            out,
            "overlap: Σ over call paths of min(self share in A, in B); hotcover: {} of A's {} \
             call paths with ≥ {:.0}% of the total are in B",
            result.hot_covered,
            result.hot_paths,
            HOT_THRESHOLD * 100.0
        )?;
        if moved.tail_calls > 0 {
            writeln!(
                out,
                "tail calls: {} recorded calling contexts reached by a tail jump are compared \
                 as a sampled stack shows them, in their caller's place (its frame is gone)",
                moved.tail_calls
            )?;
        }
        if moved.to_timed_callers > 0 {
            writeln!(
                out,
                "counted, not timed: {} sampled call paths at or below a function the \
                 recording counted in its caller are compared at that caller, where the \
                 recording puts their time",
                moved.to_timed_callers
            )?;
        }
        if on_cpu {
            writeln!(
                out,
                "times: on-CPU (one profile is sampled on the CPU clock, the other's on-CPU \
                 times are used)"
            )?;
        }
        writeln!(
            out,
            "{:>7} {:>7} {:>7}  call path",
            "A self", "B self", "B−A"
        )?;
        write_rows(&mut out, &result, [&why_a, &why_b], rows)?;
        out.flush()
    })();
    match written {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// Fails when a profile has no time to compare (below `roots`, if given).
fn refuse_without_time(profiles: &[(&Path, &Profile)], roots: &[String]) -> anyhow::Result<()> {
    for &(path, profile) in profiles {
        let weights = path_weights(profile, roots);
        if weights.is_empty() || weights.values().all(|w| w.total_share == 0.0) {
            let below = if roots.is_empty() {
                String::new()
            } else {
                format!(" below {}", roots.join(", "))
            };
            anyhow::bail!(
                "{} has no time{below} to compare{}",
                path.display(),
                if roots.is_empty() {
                    ""
                } else {
                    " (is the name spelled as in `tendril report`?)"
                }
            );
        }
    }
    Ok(())
}

/// The `rows` call paths whose shares differ most; a path only one side has that ends
/// in a function the other did not follow says why (`why` is each side's reasons).
fn write_rows(
    out: &mut impl Write,
    result: &Agreement,
    [why_a, why_b]: [&HashMap<&str, &str>; 2],
    rows: usize,
) -> std::io::Result<()> {
    for (path, share_a, share_b) in result.differences.iter().take(rows) {
        // A path only the other profile has may end in a function this one did
        // not follow: say why.
        let function = path.rsplit(';').next().unwrap_or(path);
        let why = match (share_a, share_b) {
            (a, _) if *a == 0.0 => why_a.get(function),
            (_, b) if *b == 0.0 => why_b.get(function),
            _ => None,
        };
        writeln!(
            out,
            "{:>6.1}% {:>6.1}% {:>+6.1}%  {}{}",
            share_a * 100.0,
            share_b * 100.0,
            (share_b - share_a) * 100.0,
            printable(path),
            why.map_or(String::new(), |why| format!(
                "  (not followed there: {})",
                printable(why)
            ))
        )?;
    }
    Ok(())
}

/// What was moved to compare a recording with samples: contexts reached by a tail
/// jump, and sampled paths below functions the recording counted in their caller.
#[derive(Debug, Default, Clone, Copy)]
struct Moved {
    tail_calls: usize,
    to_timed_callers: usize,
}

/// The two profiles' path weights, each read as the other can show it: a recording
/// compared with samples as a sampled stack shows it (tail calls in their caller's
/// place), and the samples as the recording shows them (time below a function it
/// counted but did not time, at its timed caller).
fn weights_to_compare(
    a: &Profile,
    b: &Profile,
    roots: &[String],
) -> (PathWeights, PathWeights, Moved) {
    let (recorded, sampled, a_is_sampled) = match (is_sampled(a), is_sampled(b)) {
        (false, true) => (a, b, false),
        (true, false) => (b, a, true),
        _ => {
            return (
                path_weights(a, roots),
                path_weights(b, roots),
                Moved::default(),
            );
        }
    };
    let recorded = path_weights_as_sampled(recorded, roots);
    let (sampled, to_timed_callers) =
        at_timed_callers(&path_weights(sampled, roots), &recorded.in_caller);
    let moved = Moved {
        tail_calls: recorded.moved,
        to_timed_callers,
    };
    match a_is_sampled {
        true => (sampled, recorded.weights, moved),
        false => (recorded.weights, sampled, moved),
    }
}

/// The functions a recording did not follow (`discovery`), by name, with the reason.
fn not_followed_by_name(profile: &Profile) -> HashMap<&str, &str> {
    let Some(discovery) = &profile.discovery else {
        return HashMap::new();
    };
    let lists: [&[NotFollowed]; 2] = [&discovery.indirect_not_followed, &discovery.not_followed];
    lists
        .into_iter()
        .flatten()
        .map(|item| {
            // "name (module)"
            let name = item
                .target
                .rsplit_once(" (")
                .map_or(&*item.target, |(n, _)| n);
            (name, item.reason.as_str())
        })
        .collect()
}

/// The roots the comparison starts at: `--root`, else the instrumented profile's roots
/// when exactly one of the two is sampled, else the whole trees.
fn comparison_roots(a: &Profile, b: &Profile, root: Option<&str>) -> Vec<String> {
    if let Some(root) = root {
        return vec![root.to_owned()];
    }
    match (is_sampled(a), is_sampled(b)) {
        (true, false) => root_names(b),
        (false, true) => root_names(a),
        _ => Vec::new(),
    }
}

fn is_sampled(profile: &Profile) -> bool {
    profile.scheme == "sampled"
}

fn describe(profile: &Profile) -> String {
    match &profile.sampling {
        Some(sampling) => format!(
            "sampled, {} samples at {} Hz, {} clock",
            sampling.samples,
            sampling.rate_hz,
            printable(&sampling.clock)
        ),
        None => format!("scheme {}", printable(&profile.scheme)),
    }
}
