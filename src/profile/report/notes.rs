//! The one-line notes a report's header adds when a recording needs them: the pauses
//! the rings took, libraries loaded and unloaded while it ran, and stacks switched.

use super::{ms, plural};
use crate::profile::model::{Profile, Stats};

/// The part of the pauses the rings took, when there is one: threads waiting for room
/// in a full ring (the drain fell behind), and faulting a ring's memory in.
pub(super) fn ring_pauses_line(stats: &Stats) -> Option<String> {
    let parts: Vec<String> = [
        (
            stats.ring_wait_ns,
            "waiting for room in a full ring (tendril's reading fell behind)",
        ),
        (stats.ring_fault_ns, "faulting their ring's memory in"),
    ]
    .iter()
    .filter(|(ns, _)| *ns > 0)
    .map(|&(ns, what)| format!("{:.3} ms {what}", ms(ns)))
    .collect();
    (!parts.is_empty()).then(|| format!("of those pauses, threads spent {}", parts.join(", and ")))
}

/// What a profile recorded while the process loaded and unloaded libraries must say
/// (`None` if it followed every library, and none took instrumented code with it).
pub fn library_churn_note(stats: &Stats) -> Option<String> {
    let missed = stats
        .libraries_loaded
        .saturating_sub(stats.libraries_followed);
    if missed == 0 && stats.unloaded_functions == 0 {
        return None;
    }
    let gone = match stats.unloaded_functions {
        0 => String::new(),
        n => format!(
            "; {} went with {} library",
            plural(n, "instrumented function", "instrumented functions"),
            if n == 1 { "its" } else { "their" }
        ),
    };
    Some(format!(
        "the process loaded {} and unloaded {} while recording, and tendril followed {}: \
         calls into the others (loaded and unloaded between its looks, every 100 ms) are not \
         recorded{gone}",
        plural(stats.libraries_loaded, "library", "libraries"),
        stats.libraries_unloaded,
        stats.libraries_followed,
    ))
}

/// The warning a profile whose threads switched stacks must carry (`None` if none
/// did): how many switches and how many frames the trees cut short, per thread.
pub fn stack_switch_warning(profile: &Profile) -> Option<String> {
    let stats = &profile.stats;
    if stats.stack_switches == 0 && stats.dropped_frames == 0 {
        return None;
    }
    let threads: Vec<String> = profile
        .threads
        .iter()
        .filter(|t| t.stack_switches > 0 || t.dropped_frames > 0)
        .map(|t| {
            format!(
                "thread {}: {} switches, {} dropped",
                t.tid, t.stack_switches, t.dropped_frames
            )
        })
        .collect();
    Some(format!(
        "warning: threads switched stacks {} (coroutines?) and {} closed when their stack \
         was left returned later ({}); their times stop at the switch, and what they did \
         after it is charged to the frames open then",
        plural(stats.stack_switches, "time", "times"),
        plural(stats.dropped_frames, "frame", "frames"),
        threads.join("; ")
    ))
}
