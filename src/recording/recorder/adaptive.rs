//! Adaptive timing (issue 32): a function whose calls are too short to time truly is
//! switched, live, to the untimed hook, which counts each call in its context and
//! leaves its time in its caller's.
//!
//! The one idea: the judge looks at the trees every [`JUDGE_EVERY`]. A function
//! qualifies once it has made [`CALLS_TO_JUDGE`] calls and its mean time per call, its
//! callees included, is under the threshold — over the recording so far, or over one
//! judging window of at least that many calls ([`JudgeWindows`]: a call that a stop or
//! an unseen preemption held for a second raises the mean of 50,000 calls of 2 ns to
//! 20 µs; the windows without one show the calls' own time), or as the median of the
//! threads' own means (a thousand threads on a busy machine: some thread is always
//! preempted inside some call, and every window holds such a wait when the recording
//! has no CPU time, `off_cpu::switch_cost`) — and only if every
//! function it calls is untimed or qualifies too: a timed call below an untimed one
//! would have no timed caller to nest under. The threshold follows from the
//! calibration: the hooks' cost is removed from each call with an error of about its
//! spread, and a call whose spread would exceed [`MAX_ERROR_SHARE`] of it, or that is
//! shorter than its hooks' cost, is not timed ([`threshold_ns`]). A root is switched to
//! its outermost-timed hook (its calls inside its own graph, a recursion, are counted);
//! its outermost calls stay timed. An untimed function stays so until a reset or a new
//! recording. What the agent refuses stays timed, and so do its callers. While a trace
//! (`--trace`) runs, nothing is switched: its timeline shows every call.

use super::Recorder;
use crate::agent_connection::AgentConnectionError;
use crate::profile::per_function::FunctionSums;
use crate::profile::{Calibration, TimingPolicy};
use crate::recording::{RecordError, tsc};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use tendril_wire::{Request, Response};

/// How often the judge looks at the trees.
const JUDGE_EVERY: Duration = Duration::from_millis(200);

/// Calls a function makes before it is judged.
pub const CALLS_TO_JUDGE: u64 = 1000;

/// Names listed when functions are switched.
const NAMES_SHOWN: usize = 8;

/// A call is timed only if the spread of its correction stays under this share of it.
const MAX_ERROR_SHARE: f64 = 0.05;

/// The default threshold's ceiling: a call of this long is timed to within a few
/// percent on any machine measured (BENCHMARKS.md), however busy.
const MAX_THRESHOLD_NS: f64 = 150.0;

/// What the user chose (`--time-all`, `--time PATTERN`, `--min-time NS`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TimingOptions {
    /// Time every call (`--time-all`).
    pub time_all: bool,
    /// Patterns of functions that stay timed (`--time`).
    pub keep_timed: Vec<String>,
    /// The threshold in nanoseconds, instead of the calibration's (`--min-time`).
    pub min_time_ns: Option<f64>,
    /// Measure CPU time however often the target switches threads (`--cpu-time`; see
    /// `off_cpu::switch_cost`).
    pub cpu_time_always: bool,
}

/// The judge's state for one recording (see the module comment).
#[derive(Debug, Default)]
pub(super) struct AdaptiveTiming {
    options: TimingOptions,
    /// Entry addresses of the functions `--time` names.
    kept_timed: HashSet<u64>,
    threshold_ns: f64,
    /// Function ids switched to the untimed hook.
    untimed: HashSet<u32>,
    /// Function ids the agent would not switch.
    refused: HashSet<u32>,
    last_judged: Option<Instant>,
    /// The agent failed a switch: no more are tried in this recording.
    gave_up: bool,
    windows: JudgeWindows,
}

/// Per function, the judging windows of at least [`CALLS_TO_JUDGE`] calls: where the
/// current one began (calls and ticks at that judgement), and the lowest mean per call
/// of one so far.
#[derive(Debug, Default)]
struct JudgeWindows {
    by_function: HashMap<u32, JudgeWindow>,
}

#[derive(Debug, Default, Clone, Copy)]
struct JudgeWindow {
    start_calls: u64,
    start_ticks: f64,
    lowest_mean_ticks: Option<f64>,
}

impl JudgeWindows {
    /// A judgement with `sums` (the recording's so far): each function that made
    /// [`CALLS_TO_JUDGE`] calls since its window began closes the window, and starts
    /// the next.
    fn close(&mut self, sums: &HashMap<u32, FunctionSums>) {
        for (&id, sums) in sums {
            let window = self.by_function.entry(id).or_default();
            let calls = sums.calls.saturating_sub(window.start_calls);
            if calls < CALLS_TO_JUDGE {
                continue;
            }
            let mean = (sums.outermost_ticks - window.start_ticks).max(0.0) / calls as f64;
            window.lowest_mean_ticks = Some(window.lowest_mean_ticks.map_or(mean, |m| m.min(mean)));
            window.start_calls = sums.calls;
            window.start_ticks = sums.outermost_ticks;
        }
    }

    /// The lowest mean per call of a closed window of `id`.
    fn lowest_mean_ticks(&self, id: u32) -> Option<f64> {
        self.by_function.get(&id)?.lowest_mean_ticks
    }
}

/// The threshold a calibration gives (see the module comment): where the spread of
/// the cost removed from a call reaches [`MAX_ERROR_SHARE`] of it, but never under the
/// hooks' cost itself (a call shorter than what its hooks add is not timed truly) and
/// never over [`MAX_THRESHOLD_NS`].
pub fn threshold_ns(calibration: &Calibration) -> f64 {
    let spread = calibration.inner_spread_ns + calibration.outer_spread_ns;
    let cost = calibration.inner_ns + calibration.outer_ns;
    (spread / MAX_ERROR_SHARE).max(cost).min(MAX_THRESHOLD_NS)
}

impl AdaptiveTiming {
    pub(super) fn new(options: TimingOptions, kept_timed: HashSet<u64>) -> AdaptiveTiming {
        AdaptiveTiming {
            options,
            kept_timed,
            ..Default::default()
        }
    }

    /// A new recording (or a reset) starts with every function timed.
    pub(super) fn restart(&mut self, calibration: &Calibration) {
        self.threshold_ns = self
            .options
            .min_time_ns
            .unwrap_or_else(|| threshold_ns(calibration));
        self.untimed.clear();
        self.refused.clear();
        self.last_judged = None;
        self.gave_up = false;
        self.windows = JudgeWindows::default();
    }

    pub(super) fn untimed(&self) -> impl Iterator<Item = u32> + '_ {
        self.untimed.iter().copied()
    }

    /// What the profile says of the policy; `None` with `--time-all`.
    pub(super) fn policy(&self) -> Option<TimingPolicy> {
        (!self.options.time_all).then_some(TimingPolicy {
            threshold_ns: self.threshold_ns,
            untimed_functions: self.untimed.len() as u64,
            untimed_calls: 0,
            refused: self.refused.len() as u64,
        })
    }

    fn due(&mut self) -> bool {
        if self.options.time_all || self.gave_up {
            return false;
        }
        let now = Instant::now();
        match self.last_judged {
            Some(at) if now.duration_since(at) < JUDGE_EVERY => false,
            _ => {
                self.last_judged = Some(now);
                true
            }
        }
    }
}

/// `chosen` in an order in which a function comes after the functions it calls (the
/// agent switches them in that order): while the switch is under way, an untimed call
/// then always has its caller's frame, timed or untimed, to go under. Functions that
/// call each other come in id order.
fn callees_first(mut chosen: HashSet<u32>, sums: &HashMap<u32, FunctionSums>) -> Vec<u32> {
    let mut ordered = Vec::with_capacity(chosen.len());
    while !chosen.is_empty() {
        let mut ready: Vec<u32> = chosen
            .iter()
            .copied()
            .filter(|id| {
                sums[id]
                    .callees
                    .iter()
                    .all(|callee| !chosen.contains(callee))
            })
            .collect();
        if ready.is_empty() {
            ready = chosen.iter().copied().collect();
        }
        ready.sort_unstable();
        for id in &ready {
            chosen.remove(id);
        }
        ordered.extend(ready);
    }
    ordered
}

impl Recorder {
    /// Switches the functions that qualify now to their untimed hooks (see the module
    /// comment); at most every [`JUDGE_EVERY`].
    pub(super) fn judge_timing(&mut self) {
        // A trace shows every call on its timeline: nothing is switched while it runs.
        let tracing = (self.trace.as_ref()).is_some_and(|trace| !trace.is_over(tsc::read()));
        // A closed connection (another tendril detached) is the recording's to report.
        // Nor is a stopped target asked (its agent cannot answer; the next poll judges).
        if !self.recording
            || tracing
            || !self.adaptive.due()
            || self.agent_gone()
            || crate::process::is_halted(self.target.pid)
        {
            return;
        }
        let chosen = self.functions_to_untime();
        if chosen.is_empty() {
            return;
        }
        if let Err(error) = self.untime(chosen) {
            // The recording goes on timed; the next poll finds the agent gone if it is.
            crate::terminal_text::say!(
                "adaptive timing stopped, the functions still timed stay timed: {error}"
            );
            self.adaptive.gave_up = true;
        }
    }

    /// The functions that qualify now, their callees closed over.
    fn functions_to_untime(&mut self) -> Vec<u32> {
        let (Some(builder), Some(rings)) = (self.builder.as_ref(), self.rings.as_ref()) else {
            return Vec::new();
        };
        let sums = builder.function_sums(CALLS_TO_JUDGE);
        self.adaptive.windows.close(&sums);
        let adaptive = &self.adaptive;
        let threshold_ticks = adaptive.threshold_ns * self.tsc_hz as f64 / 1e9;
        let short = |id: u32, sums: &FunctionSums| {
            let under = |mean: Option<f64>| mean.is_some_and(|mean| mean < threshold_ticks);
            under(sums.mean_ticks())
                || under(adaptive.windows.lowest_mean_ticks(id))
                || under(sums.median_thread_mean_ticks())
        };
        let mut candidates: HashSet<u32> = sums
            .iter()
            .filter(|(id, sums)| {
                !adaptive.untimed.contains(id)
                    && !adaptive.refused.contains(id)
                    && sums.calls >= CALLS_TO_JUDGE
                    && short(**id, sums)
                    && rings
                        .function_address(**id)
                        .is_some_and(|address| !adaptive.kept_timed.contains(&address))
            })
            .map(|(&id, _)| id)
            .collect();
        // Only a function whose every callee is untimed (or goes with it) goes.
        loop {
            let staying: Vec<u32> = candidates
                .iter()
                .copied()
                .filter(|id| {
                    sums[id].callees.iter().any(|callee| {
                        !adaptive.untimed.contains(callee) && !candidates.contains(callee)
                    })
                })
                .collect();
            if staying.is_empty() {
                break;
            }
            for id in staying {
                candidates.remove(&id);
            }
        }
        callees_first(candidates, &sums)
    }

    /// Switches `chosen` to their untimed hooks; what the agent refuses stays timed,
    /// and so does every chosen function above it.
    fn untime(&mut self, chosen: Vec<u32>) -> Result<(), AgentConnectionError> {
        let switched = self.set_timing(&chosen, false)?;
        let mut now_untimed: HashSet<u32> = HashSet::new();
        for (id, refused) in chosen.iter().zip(switched) {
            if refused {
                self.adaptive.refused.insert(*id);
            } else {
                now_untimed.insert(*id);
            }
        }
        // A function whose callee stays timed must be timed again.
        let sums = self
            .builder
            .as_ref()
            .map(|b| b.function_sums(CALLS_TO_JUDGE))
            .unwrap_or_default();
        loop {
            let back: Vec<u32> = now_untimed
                .iter()
                .copied()
                .filter(|id| {
                    sums.get(id).is_some_and(|s| {
                        s.callees.iter().any(|callee| {
                            !now_untimed.contains(callee) && !self.adaptive.untimed.contains(callee)
                        })
                    })
                })
                .collect();
            if back.is_empty() {
                break;
            }
            // Switching back cannot be refused for a site that was just switched; if it
            // is, the function stays untimed and its callee's calls nest under its
            // caller: said by the refusal count.
            self.set_timing(&back, true)?;
            for id in back {
                now_untimed.remove(&id);
                self.adaptive.refused.insert(id);
            }
        }
        self.refresh_names();
        self.say_untimed(&now_untimed);
        self.adaptive.untimed.extend(now_untimed);
        let untimed: Vec<u32> = self.adaptive.untimed().collect();
        if let Some(builder) = self.builder.as_mut() {
            builder.set_untimed(untimed);
        }
        Ok(())
    }

    /// Says which functions are counted, not timed, from now on.
    fn say_untimed(&self, ids: &HashSet<u32>) {
        if ids.is_empty() {
            return;
        }
        let mut names: Vec<&str> = ids
            .iter()
            .filter_map(|&id| self.names.get(id as usize))
            .map(|name| name.name.as_str())
            .collect();
        names.sort_unstable();
        let shown = names.len().min(NAMES_SHOWN);
        let more = match names.len() - shown {
            0 => String::new(),
            more => format!(" and {more} more"),
        };
        crate::terminal_text::say!(
            "counting, not timing, {} function{} too short to time (under {:.0} ns a call, \
             callees included; --time-all times every call): {}{more}",
            ids.len(),
            if ids.len() == 1 { "" } else { "s" },
            self.adaptive.threshold_ns,
            names[..shown].join(", ")
        );
    }

    /// Asks the agent to switch `ids` to their (un)timed hooks; per id, whether it
    /// refused.
    fn set_timing(&mut self, ids: &[u32], timed: bool) -> Result<Vec<bool>, AgentConnectionError> {
        let rings = self.rings.as_ref().expect("a recording has begun");
        let addresses: Vec<u64> = ids
            .iter()
            .map(|&id| rings.function_address(id).unwrap_or(0))
            .collect();
        match self
            .session
            .request(&Request::SetTiming { addresses, timed })?
        {
            Response::TimingSet { refused } => {
                Ok(refused.iter().map(|reason| reason.is_some()).collect())
            }
            other => Err(AgentConnectionError::Protocol(format!("{other:?}"))),
        }
    }

    /// A reset: every untimed function is timed again, to be judged anew.
    pub(super) fn retime_all(&mut self) {
        let ids: Vec<u32> = self.adaptive.untimed().collect();
        if self.recording
            && !ids.is_empty()
            && let Err(error) = self.set_timing(&ids, true)
        {
            crate::terminal_text::say!("the untimed functions could not be timed again: {error}");
        }
        if let Some(builder) = self.builder.as_mut() {
            self.adaptive.restart(&builder.calibration());
            builder.set_untimed([]);
        }
    }

    /// After a resume the code was patched anew, every function timed: the untimed
    /// ones go back to their untimed hooks.
    pub(super) fn untime_again(&mut self) -> Result<(), RecordError> {
        let ids: Vec<u32> = self.adaptive.untimed().collect();
        if ids.is_empty() {
            return Ok(());
        }
        let pid = self.target.pid;
        let refused = self
            .set_timing(&ids, false)
            .map_err(|source| RecordError::Session { pid, source })?;
        for (id, refused) in ids.iter().zip(refused) {
            if refused {
                self.adaptive.untimed.remove(id);
                self.adaptive.refused.insert(*id);
            }
        }
        let untimed: Vec<u32> = self.adaptive.untimed().collect();
        if let Some(builder) = self.builder.as_mut() {
            builder.set_untimed(untimed);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sums(calls: u64, ticks: f64) -> HashMap<u32, FunctionSums> {
        HashMap::from([(
            7,
            FunctionSums {
                calls,
                outermost_ticks: ticks,
                ..Default::default()
            },
        )])
    }

    #[test]
    fn a_window_without_the_one_long_call_shows_the_calls_own_time() {
        let mut windows = JudgeWindows::default();
        // 1,000 calls of 5 ticks, one of which was held for 10^9 ticks...
        windows.close(&sums(1000, 5_000.0 + 1e9));
        assert_eq!(windows.lowest_mean_ticks(7), Some((5_000.0 + 1e9) / 1000.0));
        // ...then 500 calls: too few to close the window...
        windows.close(&sums(1500, 7_500.0 + 1e9));
        assert_eq!(windows.lowest_mean_ticks(7), Some((5_000.0 + 1e9) / 1000.0));
        // ...and 1,000 more: the window of 1,500 calls without the held one.
        windows.close(&sums(2500, 12_500.0 + 1e9));
        assert_eq!(windows.lowest_mean_ticks(7), Some(5.0));
        assert_eq!(windows.lowest_mean_ticks(8), None);
    }
}
