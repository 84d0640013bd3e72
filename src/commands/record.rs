//! `tendril record <PID> --root SYM... [--scheme a|b] [--duration SECS] [-o FILE]
//! [--gross-only]`: profile the call graph below the roots, then restore the code and
//! write the profile.
//!
//! The one idea: whatever ends the recording — the duration, Ctrl-C, the target
//! exiting or exec'ing — the code is restored first, then the last events are read, then the
//! profile is written (to `-o FILE`, `-` for stdout, or by default to
//! `tendril-<pid>-<time>.json` here); a one-line summary goes to stderr.

use crate::commands::duration::{format_elapsed, format_seconds, how_long};
use crate::commands::output::ProfileOutput;
use crate::commands::progress::{Progress, thousands};
use crate::departure::{Departure, agent_departure};
use crate::interrupt;
use crate::profile::trace::MAX_TRACE_EVENTS;
use crate::profile::{Node, Profile};
use crate::recording::{Finished, RecordOptions, Recorder, Scheme};
use crate::terminal_text::say;
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How often the rings are drained.
const POLL_INTERVAL: Duration = Duration::from_millis(2);
/// How long a closed connection waits to be explained by the process exiting.
const EXIT_GRACE: Duration = Duration::from_millis(100);
/// Most root names listed in one line.
const NAMES_SHOWN: usize = 5;
/// Most refused callees listed on stderr.
const REFUSALS_SHOWN: usize = 10;

/// What `tendril record` was asked for.
#[derive(Debug, Clone)]
pub struct RecordCommand {
    pub options: RecordOptions,
    pub duration: Option<Duration>,
    pub output: Option<PathBuf>,
    /// `--trace`: keep the raw events of this first stretch.
    pub trace: Option<Duration>,
}

pub fn run(command: &RecordCommand) -> anyhow::Result<()> {
    // Checked before the target is touched; nothing is written unless a profile is.
    // Without -o, a file named after the process and the time, as `w` in the live view
    // saves (perf and py-spy write a file too, rather than JSON on a terminal).
    let output = ProfileOutput::open_or_fresh(command.output.as_deref(), command.options.pid)?;
    interrupt::install();
    let mut recorder = Recorder::start(&command.options)?;
    start_trace(&mut recorder, command.trace);
    if !recorder.waiting_for().is_empty() {
        say!(
            "waiting for process {} to load {}: no module of its matches yet; its roots are \
             recorded from then on",
            recorder.pid(),
            recorder.waiting_for().join(", ")
        );
    }
    // Waiting for their module, the roots are only their patterns yet.
    let roots = match recorder.roots().is_empty() {
        true => command.options.roots.as_slice(),
        false => recorder.roots(),
    };
    say!(
        "recording {} in process {} (scheme {}) {}",
        names_summary(roots),
        recorder.pid(),
        match (command.options.gross_only, command.options.scheme) {
            (true, _) => "gross times only".to_string(),
            (false, Scheme::A) => "A".to_string(),
            (false, Scheme::B) => "B".to_string(),
        },
        how_long(command.duration)
    );
    let pid = recorder.pid();
    // Gone for good (a zombie is told apart when the agent's connection closes).
    let gone = move || !std::path::Path::new(&format!("/proc/{pid}")).exists();
    let profile = record_until_done(recorder, command.duration, gone)?;
    if profile.roots.is_empty() {
        say!(
            "no root was recorded: process {pid} loaded no module that {} names",
            command.options.roots.join(", ")
        );
    }
    write_profile(output, &profile)
}

/// Writes the profile and says where, in a line the user may copy (nothing is said
/// for stdout).
pub fn write_profile(output: ProfileOutput, profile: &Profile) -> anyhow::Result<()> {
    let written = output
        .path()
        .map(|path| absolute(path).display().to_string());
    output.write(profile)?;
    if let Some(path) = written {
        say!("profile written to {path} (tendril report {path})");
    }
    Ok(())
}

/// `path` from the root, for a message the user may copy.
fn absolute(path: &std::path::Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Starts `--trace` and says what it keeps.
pub fn start_trace(recorder: &mut Recorder, trace: Option<Duration>) {
    if let Some(seconds) = trace {
        recorder.start_trace(seconds.as_secs_f64());
        say!(
            "tracing the first {} s (at most {MAX_TRACE_EVENTS} events) for timelines",
            format_seconds(seconds)
        );
    }
}

/// Drains the rings until the duration ends, Ctrl-C, or the target exits (`gone`
/// says so); then finishes the recording and prints the summary.
pub fn record_until_done(
    mut recorder: Recorder,
    duration: Option<Duration>,
    mut gone: impl FnMut() -> bool,
) -> anyhow::Result<Profile> {
    let recording_began = Instant::now();
    let deadline = duration.map(|d| recording_began + d);
    let pid = recorder.pid();
    let mut departure = None;
    let mut progress = Progress::new();
    interrupt::wait(deadline, POLL_INTERVAL, || {
        recorder.poll();
        progress.update(|| {
            let counters = recorder.agent_counters();
            format!(
                "{} events, {} functions instrumented",
                thousands(recorder.events()),
                thousands(counters.instrumented + recorder.instrumented_up_front())
            )
        });
        if gone() {
            departure = Some(Departure::Exited);
        } else if recorder.agent_gone() {
            // The target exited, exec'd, or was detached by another tendril.
            departure = Some(agent_departure(pid, EXIT_GRACE, &mut gone));
        }
        departure.is_none()
    });
    progress.clear();
    let elapsed = recorder.elapsed();
    let times = Times {
        recorded: recording_began.elapsed(),
        with_attach: elapsed,
    };
    match &departure {
        None => {}
        Some(Departure::Detached) => say!(
            "another tendril detached process {pid} after {:.1} s; the profile covers only that time",
            elapsed.as_secs_f64()
        ),
        Some(execed @ Departure::Execed { .. }) => {
            say!("{}; profile written up to the exec", execed.headline(pid))
        }
        Some(exited) => say!(
            "{}; the profile covers it up to its end",
            exited.headline(pid)
        ),
    }
    let Finished {
        profile,
        refused,
        hooks_left_in,
    } = recorder.finish(departure.is_some())?;
    print_summary(&profile, times, &refused);
    if let Some(left_in) = hooks_left_in {
        say!("{left_in}");
    }
    note_roots_never_called(&profile);
    Ok(profile)
}

/// Root names for a one-line message: all of them up to [`NAMES_SHOWN`], else their
/// count and the first few.
pub fn names_summary(names: &[String]) -> String {
    if names.len() <= NAMES_SHOWN {
        names.join(", ")
    } else {
        format!("{} roots: {}", names.len(), first_names(names))
    }
}

/// The first [`NAMES_SHOWN`] names, and "and N more" for the rest.
fn first_names(names: &[String]) -> String {
    if names.len() <= NAMES_SHOWN {
        return names.join(", ");
    }
    format!(
        "{} and {} more",
        names[..NAMES_SHOWN].join(", "),
        names.len() - NAMES_SHOWN
    )
}

/// Says which roots never ran while recording (their profile is empty), so an empty
/// profile is not taken for a broken one.
fn note_roots_never_called(profile: &Profile) {
    let mut reached: HashSet<&str> = HashSet::new();
    let mut pending: Vec<&Node> = profile.merged.roots.iter().collect();
    while let Some(node) = pending.pop() {
        reached.insert(&node.name);
        pending.extend(&node.children);
    }
    reached.extend(
        profile
            .gross
            .iter()
            .filter(|g| g.calls > 0)
            .map(|g| g.root.as_str()),
    );
    let never: Vec<String> = profile
        .roots
        .iter()
        .filter(|root| !reached.contains(root.as_str()))
        .cloned()
        .collect();
    if profile.stats.events == 0 && !profile.roots.is_empty() {
        let all = match profile.roots.as_slice() {
            [one] => format!("{one} was"),
            many => format!("{} were", names_summary(many)),
        };
        say!(
            "{all} never called during the recording, so the profile is empty \
             (record longer, or choose a root the program runs)"
        );
    } else if let [one] = never.as_slice() {
        say!("{one} was never called during the recording");
    } else if !never.is_empty() && never.len() < profile.roots.len() {
        say!(
            "{} of the {} roots were never called during the recording: {}",
            never.len(),
            profile.roots.len(),
            first_names(&never)
        );
    }
}

/// How long a recording took: recording (what `--duration` asks for), and in all
/// since tendril began attaching.
#[derive(Debug, Clone, Copy)]
struct Times {
    recorded: Duration,
    with_attach: Duration,
}

impl Times {
    /// "3.0 s", or "3.0 s (4.2 s with the attach)" when attaching and instrumenting
    /// took a tenth of a second or more.
    fn describe(self) -> String {
        let recorded = format_elapsed(self.recorded);
        if self.with_attach.saturating_sub(self.recorded) < Duration::from_millis(100) {
            format!("{recorded} s")
        } else {
            format!(
                "{recorded} s ({} s with attaching and instrumenting)",
                format_elapsed(self.with_attach)
            )
        }
    }
}

fn print_summary(profile: &Profile, times: Times, refused: &[(String, String)]) {
    let stats = &profile.stats;
    let overhead = profile.estimated_overhead_percent();
    say!(
        "{} events from {} thread{} in {}; {} functions instrumented, {} invoked; \
         {} lost events; estimated overhead {overhead:.1}% (removed from the times)",
        stats.events,
        profile.threads.len(),
        if profile.threads.len() == 1 { "" } else { "s" },
        times.describe(),
        stats.instrumented_functions,
        stats.invoked_functions,
        stats.lost_events,
    );
    if let Some(warning) = crate::profile::stack_switch_warning(profile) {
        say!("{warning}");
    }
    if let Some(note) = crate::profile::library_churn_note(stats) {
        say!("{note}");
    }
    if let Some(trace) = &profile.trace {
        say!("{}", trace.summary());
    }
    for (name, reason) in refused.iter().take(REFUSALS_SHOWN) {
        say!("not instrumented: {name} — {reason}");
    }
    if refused.len() > REFUSALS_SHOWN {
        say!(
            "... and {} more callees not instrumented (their time counts as their callers' own)",
            refused.len() - REFUSALS_SHOWN
        );
    }
}

#[cfg(test)]
mod tests {
    use super::Times;
    use std::time::Duration;

    #[test]
    fn the_summary_states_the_recording_and_the_attach_apart() {
        let times = |recorded, with_attach| Times {
            recorded: Duration::from_millis(recorded),
            with_attach: Duration::from_millis(with_attach),
        };
        assert_eq!(
            times(3_000, 4_200).describe(),
            "3.0 s (4.2 s with attaching and instrumenting)"
        );
        assert_eq!(times(3_000, 3_050).describe(), "3.0 s");
    }
}
