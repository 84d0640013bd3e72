//! What the text report says about adaptive timing: the header's policy lines, the
//! columns of a node counted in its caller, and totals whose error exceeds them.

use crate::profile::model::{Node, Stats, Timing, TimingPolicy, Visit, walk};

/// What a time column shows for a node counted, not timed: its time is its caller's.
pub const IN_CALLER: &str = "in caller";

/// Marks a total whose estimated error is larger than itself.
pub const UNCERTAIN: char = '?';

/// The header's lines on adaptive timing: what was counted and not timed, and (a
/// detail) how its rows read.
pub struct PolicyLines {
    pub summary: String,
    pub detail: String,
}

/// The header's lines on adaptive timing, if the recording used it.
pub fn policy_lines(stats: &Stats) -> Option<PolicyLines> {
    let TimingPolicy {
        threshold_ns,
        untimed_functions,
        untimed_calls,
        refused,
    } = stats.timing.as_ref()?;
    let mut summary = format!(
        "adaptive timing: {untimed_functions} function{} counted, not timed: under \
         {threshold_ns:.0} ns a call, callees included (--time-all times every call)",
        if *untimed_functions == 1 { "" } else { "s" },
    );
    if *refused > 0 {
        summary += &format!("; {refused} that qualified could not be switched and stay timed");
    }
    let detail = format!(
        "their {untimed_calls} calls show \"{IN_CALLER}\": their time is their callers' self \
         time; counted per caller within each timed call"
    );
    Some(PolicyLines { summary, detail })
}

/// A total column, `width` wide: milliseconds, [`IN_CALLER`], or milliseconds marked
/// [`UNCERTAIN`].
pub fn total_cell(node: &Node, width: usize) -> String {
    if node.timing == Timing::InCaller {
        return format!("{IN_CALLER:>width$}");
    }
    let ms = node.total_ns as f64 / 1e6;
    if is_uncertain(node) {
        let width = width - 1;
        format!("{ms:>width$.3}{UNCERTAIN}")
    } else {
        format!("{ms:>width$.3}")
    }
}

fn is_uncertain(node: &Node) -> bool {
    node.error_ns.is_some_and(|error| error > node.total_ns)
}

/// The title line's note on [`UNCERTAIN`], when some row shows it.
pub fn uncertain_note(roots: &[Node]) -> &'static str {
    let mut any = false;
    let _ = walk(roots, |step| {
        if let Visit::Enter { node, .. } = step
            && is_uncertain(node)
        {
            any = true;
            return Err(());
        }
        Ok(())
    });
    if any {
        "; ?: the total's estimated error (error_ns) is larger than the total"
    } else {
        ""
    }
}
