//! `tendril sample <PID> [--duration S] [--rate HZ] [--wall] [-o FILE]`: sample every
//! thread of a running process from the outside and write a sampled profile.
//!
//! The one idea: nothing is loaded into the target and nothing in it changes, so this
//! is the safe first look at any process; the profile (`"scheme": "sampled"`) shows
//! where the time goes, and `report`, `view`, `compare` and the exports read it. The
//! output file is checked before sampling starts, as `record` does.

use crate::commands::duration::{format_elapsed, format_seconds};
use crate::commands::output::ProfileOutput;
use crate::commands::progress::{Progress, thousands};
use crate::interrupt;
use crate::profile::Profile;
use crate::sampling::{Sampler, SamplerOptions};
use crate::terminal_text::say;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long one wait for samples may last (Ctrl-C and the duration are checked after).
const POLL_TIMEOUT: Duration = Duration::from_millis(20);

/// What `tendril sample` was asked for.
#[derive(Debug, Clone)]
pub struct SampleCommand {
    pub pid: i32,
    pub options: SamplerOptions,
    pub duration: Option<Duration>,
    pub output: Option<PathBuf>,
}

pub fn run(command: &SampleCommand) -> anyhow::Result<()> {
    let output = ProfileOutput::open_or_fresh(command.output.as_deref(), command.pid)?;
    interrupt::install();
    let sampler = Sampler::start(command.pid, command.options)?;
    say!(
        "sampling {} thread{} of process {} at {} Hz ({} time) {}",
        sampler.thread_count(),
        if sampler.thread_count() == 1 { "" } else { "s" },
        command.pid,
        command.options.rate_hz,
        command.options.clock.name(),
        match command.duration {
            Some(d) => format!("for {} s (Ctrl-C ends early)", format_seconds(d)),
            None => "until Ctrl-C".to_string(),
        }
    );
    let profile = sample_until_done(sampler, command.duration)?;
    let written = output
        .path()
        .map(|path| std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()));
    output.write(&profile)?;
    if let Some(path) = written {
        let path = path.display();
        say!("profile written to {path} (tendril report {path})");
    }
    Ok(())
}

/// Samples until the duration ends, Ctrl-C, or the process exits; then the profile.
pub fn sample_until_done(
    mut sampler: Sampler,
    duration: Option<Duration>,
) -> anyhow::Result<Profile> {
    let deadline = duration.map(|d| Instant::now() + d);
    let mut progress = Progress::new();
    let mut exited = false;
    while !interrupt::requested() && deadline.is_none_or(|d| Instant::now() < d) {
        let wait = deadline.map_or(POLL_TIMEOUT, |d| {
            POLL_TIMEOUT.min(d.saturating_duration_since(Instant::now()))
        });
        sampler.poll(wait)?;
        progress.update(|| {
            format!(
                "{} samples, {} threads",
                thousands(sampler.trees().samples),
                sampler.thread_count()
            )
        });
        if sampler.target_exited() {
            exited = true;
            break;
        }
    }
    progress.clear();
    for note in sampler.take_notes() {
        say!("{note}");
    }
    if let Some(summary) = sampler.jit_summary() {
        say!("{summary}");
    }
    let pid = sampler.pid();
    let elapsed = sampler.elapsed();
    let profile = sampler.finish();
    if exited {
        say!(
            "process {pid} exited after {} s; the profile covers it up to its end",
            format_elapsed(elapsed)
        );
    }
    print_summary(&profile, elapsed);
    Ok(profile)
}

fn print_summary(profile: &Profile, elapsed: Duration) {
    let Some(sampling) = &profile.sampling else {
        return;
    };
    say!(
        "{} samples from {} thread{} in {} s; {} lost; {} stacks truncated",
        thousands(sampling.samples),
        profile.threads.len(),
        if profile.threads.len() == 1 { "" } else { "s" },
        format_elapsed(elapsed),
        sampling.lost_samples,
        sampling.truncated_stacks,
    );
    if sampling.samples == 0 {
        say!(
            "no samples: the process used no CPU time while it was sampled \
             (try --wall to see where its threads wait)"
        );
    }
}
