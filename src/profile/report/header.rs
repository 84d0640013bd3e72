//! The lines above a text report's tree or hot spots: what was recorded, and every
//! notice a reader needs to trust the numbers below.
//!
//! The one idea: each kind of notice is one summary line; its details (the pauses'
//! causes, the calibration's parts, the functions not followed by reason) are detail
//! lines, written only with `report -v`. When some are left out, a last line says so.
//! The profile's JSON holds all of it either way.

use super::notes::{library_churn_note, ring_pauses_line, stack_switch_warning};
use super::{NOT_FOLLOWED_SHOWN, ms, plural, timing_marks};
use crate::profile::model::{Calibration, NotFollowed, Profile, SamplingInfo};
use crate::profile::names::printable;
use std::io::{self, Write};

/// The header's lines, each a summary or a detail of the summary above it.
struct HeaderLines {
    lines: Vec<(String, bool)>,
}

impl HeaderLines {
    fn summary(&mut self, line: impl Into<String>) {
        self.lines.push((line.into(), false));
    }

    fn detail(&mut self, line: impl Into<String>) {
        self.lines.push((format!("  {}", line.into()), true));
    }

    /// Writes the summaries, and the details when `details` (else one line saying
    /// they were left out, if any was).
    fn write(self, details: bool, out: &mut impl Write) -> io::Result<()> {
        let mut left_out = 0;
        for (line, is_detail) in &self.lines {
            if *is_detail && !details {
                left_out += 1;
            } else {
                writeln!(out, "{line}")?;
            }
        }
        if left_out > 0 {
            writeln!(
                out,
                "({} of details left out: `tendril report -v` shows them)",
                plural(left_out, "line", "lines")
            )?;
        }
        Ok(())
    }
}

/// Writes the header of `profile`; with `details`, every notice's details too.
pub(super) fn write_header(
    profile: &Profile,
    details: bool,
    out: &mut impl Write,
) -> io::Result<()> {
    if let Some(sampling) = &profile.sampling {
        return write_sampled_header(profile, sampling, out);
    }
    let mut lines = HeaderLines { lines: Vec::new() };
    recording_lines(profile, &mut lines);
    pause_lines(profile, &mut lines);
    if let Some(policy) = timing_marks::policy_lines(&profile.stats) {
        lines.summary(policy.summary);
        lines.detail(policy.detail);
    }
    for (label, items) in not_followed(profile) {
        not_followed_lines(label, items, &mut lines);
    }
    if let Some(warning) = stack_switch_warning(profile) {
        lines.summary(warning);
    }
    if let Some(trace) = &profile.trace {
        lines.summary(trace.summary());
    }
    calibration_lines(&profile.calibration, &mut lines);
    clock_lines(profile, &mut lines);
    lines.write(details, out)
}

/// What was recorded: the process, its events, the functions instrumented.
fn recording_lines(profile: &Profile, lines: &mut HeaderLines) {
    let stats = &profile.stats;
    lines.summary(format!(
        "tendril profile of pid {} ({}), scheme {}, roots: {}",
        profile.pid,
        printable(&profile.exe),
        printable(&profile.scheme),
        printable(&profile.roots.join(", "))
    ));
    lines.summary(format!(
        "events: {} ({} lost, {} unmatched exits, {} unwound by an exception, longjmp, \
         thread exit or the end)",
        stats.events, stats.lost_events, stats.unmatched_exits, stats.unwound_exits,
    ));
    lines.summary(format!(
        "functions: {} instrumented, {} invoked",
        stats.instrumented_functions, stats.invoked_functions
    ));
    let sites = plural(
        stats.indirect_call_sites,
        "indirect call site",
        "indirect call sites",
    );
    // Followed from the call graph (no candidates), or through the address-taken
    // functions instrumented up front (`--pointer-candidates`, scheme a).
    lines.summary(match stats.indirect_candidates {
        0 => format!(
            "calls through pointers: {sites}, {} seen taken, reaching {}",
            stats.indirect_sites_followed,
            plural(stats.indirect_targets, "function", "functions"),
        ),
        candidates => format!(
            "calls through pointers: {sites}, {} seen taken, reaching {} of the {candidates} \
             address-taken functions instrumented",
            stats.indirect_sites_followed, stats.indirect_targets,
        ),
    });
    if let Some(note) = library_churn_note(stats) {
        lines.summary(note);
    }
}

/// The pauses tendril caused and removed, and (details) where they came from.
fn pause_lines(profile: &Profile, lines: &mut HeaderLines) {
    let stats = &profile.stats;
    lines.summary(format!(
        "pauses removed: {:.3} ms (tendril's waits in the target, summed over threads)",
        ms(stats.pause_ns)
    ));
    if stats.core_wait_ns > 0 {
        lines.detail(format!(
            "of those pauses, {:.3} ms were the target's threads waiting for a core that \
             tendril's draining held",
            ms(stats.core_wait_ns)
        ));
    }
    if let Some(line) = ring_pauses_line(stats) {
        lines.detail(line);
    }
}

/// The two lists of what a recording did not follow, with their labels.
fn not_followed(profile: &Profile) -> Vec<(&'static str, &[NotFollowed])> {
    let Some(discovery) = profile.discovery.as_ref() else {
        return Vec::new();
    };
    vec![
        (
            "not followed through pointers",
            &discovery.indirect_not_followed,
        ),
        ("not followed", &discovery.not_followed),
    ]
}

/// "LABEL: 15 functions (the profile's "discovery" lists them all)", then a detail per
/// reason, most frequent first: "shorter than the 5-byte patch: 15 (a, b, c, …)";
/// nothing for no function.
fn not_followed_lines(label: &str, items: &[NotFollowed], lines: &mut HeaderLines) {
    if items.is_empty() {
        return;
    }
    // By reason, the details in parentheses (byte counts) left out, most frequent first.
    let mut by_reason: Vec<(&str, Vec<&str>)> = Vec::new();
    for item in items {
        let reason = item.reason.split(" (").next().unwrap_or(&item.reason);
        match by_reason.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, names)) => names.push(&item.target),
            None => by_reason.push((reason, vec![&item.target])),
        }
    }
    by_reason.sort_by_key(|(_, names)| std::cmp::Reverse(names.len()));
    lines.summary(format!(
        "{label}: {}, for {} (the profile's \"discovery\" lists them all)",
        plural(items.len() as u64, "function", "functions"),
        plural(by_reason.len() as u64, "reason", "reasons"),
    ));
    for (reason, names) in &by_reason {
        let shown: Vec<&str> = names.iter().take(NOT_FOLLOWED_SHOWN).copied().collect();
        let more = if names.len() > shown.len() {
            ", …"
        } else {
            ""
        };
        lines.detail(format!(
            "{}: {} ({}{more})",
            printable(reason),
            names.len(),
            printable(&shown.join(", "))
        ));
    }
}

/// The hooks' cost removed: per timed call (and its spread, from which each node's
/// `error_ns` follows); details: per counted call, where it was measured, and per hook
/// shape.
fn calibration_lines(calibration: &Calibration, lines: &mut HeaderLines) {
    let mut first = format!(
        "calibration: TSC {:.3} GHz; removed per call: {:.1} ns inner, {:.1} ns outer",
        calibration.tsc_hz as f64 / 1e9,
        calibration.inner_ns,
        calibration.outer_ns
    );
    if calibration.inner_spread_ns > 0.0 || calibration.outer_spread_ns > 0.0 {
        first += &format!(
            ", give or take {:.1} and {:.1} ns",
            calibration.inner_spread_ns, calibration.outer_spread_ns
        );
    }
    lines.summary(first);
    if calibration.untimed_ns > 0.0 {
        lines.detail(format!(
            "per counted call: {:.1} ns, give or take {:.1} ns",
            calibration.untimed_ns, calibration.untimed_spread_ns
        ));
    }
    if calibration.in_situ_batches > 0 {
        lines.detail(format!(
            "measured in situ: the median of {} batches on the target's threads (at the \
             start, on tendril's: {:.1} and {:.1} ns)",
            calibration.in_situ_batches, calibration.start_inner_ns, calibration.start_outer_ns
        ));
    }
    let shapes: Vec<String> = [
        ("pad-jump", calibration.pad_jump),
        ("call-thunk", calibration.call_thunk),
    ]
    .into_iter()
    .filter_map(|(name, shape)| {
        let shape = shape?;
        Some(format!(
            "{name} hooks: {:.1} and {:.1} ns ({} batches)",
            shape.inner_ns, shape.outer_ns, shape.in_situ_batches
        ))
    })
    .collect();
    if !shapes.is_empty() {
        lines.detail(shapes.join("; "));
    }
}

/// Which time the report shows, and whether the other is there.
fn clock_lines(profile: &Profile, lines: &mut HeaderLines) {
    if profile.stats.off_cpu_lost > 0 {
        lines.summary(format!(
            "{} context-switch records lost (a full ring): those waits count as on-CPU",
            profile.stats.off_cpu_lost
        ));
    }
    if profile.stats.shows_cpu_time {
        lines.summary(
            "times: on-CPU (--clock cpu): waiting in system calls, on locks and for a CPU \
             left out",
        );
        return;
    }
    match &profile.stats.cpu_unmeasured {
        Some(why) => lines.summary(format!("times: wall-clock; {}", printable(why))),
        None if profile.has_cpu_time() => {
            lines.summary("times: wall-clock, waiting included (--clock cpu shows on-CPU time)")
        }
        None => {}
    }
}

/// The header of a sampled profile (`tendril sample`): how it was sampled, and that
/// its times are estimates.
fn write_sampled_header(
    profile: &Profile,
    sampling: &SamplingInfo,
    out: &mut impl Write,
) -> io::Result<()> {
    writeln!(
        out,
        "tendril profile of pid {} ({}), sampled: {} samples at {} Hz of {} time over {:.3} s",
        profile.pid,
        printable(&profile.exe),
        sampling.samples,
        sampling.rate_hz,
        printable(&sampling.clock),
        profile.duration_ns as f64 / 1e9
    )?;
    writeln!(
        out,
        "{} lost (the buffer was full), {} stacks truncated (under [truncated stack]); times are \
         estimates: samples × {:.3} ms",
        sampling.lost_samples,
        sampling.truncated_stacks,
        1e3 / sampling.rate_hz.max(1) as f64
    )
}
