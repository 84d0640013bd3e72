//! The hooks' cost measured where they run (agent `runtime/in_situ.rs`): the agent
//! calibrates now and then on the target's own threads, into their own rings, one
//! function per hook shape (a 5-byte jump, a pad jump, a call thunk), and keeps each
//! shape's batches in the rings' header. The recorder reads the new batches as it
//! polls and, once the 5-byte jump's number [`MIN_BATCHES`], corrects with their median
//! in place of the calibration made at the start (which ran on an agent thread, into a
//! private ring, and sees none of what the target's threads pay: a ring drained close
//! behind them, a core shared with the controller, caches the program fills); each
//! other shape gets its own median once it has as many batches. Every Entry event says
//! its hook's shape, so each call is corrected with its own shape's cost. The
//! calibration functions' own events are left out of the trees.

use super::Recorder;
use crate::profile::{Calibration, ShapeCalibration};
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use tendril_wire::events::{HOOK_SHAPES, HookShape};

/// Batches needed before their median replaces the start calibration.
const MIN_BATCHES: usize = 5;
/// Batches kept (the most recent), per hook shape.
const KEPT_BATCHES: usize = 4096;
/// The medians are worked out again at most this often once they rest on many batches:
/// over thousands of batches they move slowly, and sorting them all at each poll (every
/// few ms) took 4–18% of the controller's core. While the batches are few they are
/// worked out again as soon as the count has doubled, so that a short recording (fib(25)
/// six times: 50 ms, some 45 batches) is not corrected with its first five alone.
const RECOMPUTE_EVERY: Duration = Duration::from_millis(100);

/// The batches read so far, `(inner, outer)` ticks per call, per hook shape.
#[derive(Debug, Default)]
pub(super) struct InSituBatches {
    /// The agent's sample count already read in the current start, per shape.
    read: [u64; HOOK_SHAPES],
    batches: [VecDeque<(f64, f64)>; HOOK_SHAPES],
    /// The start calibration, kept while the in-situ one is used.
    at_start: Option<Calibration>,
    /// When the in-situ calibration was last worked out, and from how many of the
    /// 5-byte jump's batches.
    computed_at: Option<Instant>,
    computed_from: usize,
    /// Batches read over the whole recording, per shape (`batches` keeps the latest).
    read_in_all: [u64; HOOK_SHAPES],
}

impl Recorder {
    /// The batches of `shape` read so far in this recording, and the most recent of
    /// them (up to the last 4,096), oldest first, as `(inner, outer)` ns per call: for
    /// comparing what the batches measure with what the program's own calls pay
    /// (`ONLY=phases cargo bench --bench accuracy`).
    pub fn in_situ_batches(&self, shape: HookShape) -> (u64, Vec<(f64, f64)>) {
        let Some(builder) = self.builder.as_ref() else {
            return (0, Vec::new());
        };
        let ns_per_tick = 1e9 / builder.calibration().tsc_hz.max(1) as f64;
        let batches = &self.in_situ.batches[shape as usize];
        let in_ns = batches
            .iter()
            .map(|&(inner, outer)| (inner * ns_per_tick, outer * ns_per_tick));
        (self.in_situ.read_in_all[shape as usize], in_ns.collect())
    }

    /// After the agent started recording: its sample counts begin again, and the
    /// calibration functions' events are left out of the trees.
    pub(super) fn note_in_situ_start(&mut self) {
        self.in_situ.read = [0; HOOK_SHAPES];
        let Some(functions) = self.rings.as_ref().map(|rings| rings.in_situ_functions()) else {
            return;
        };
        if let Some(builder) = self.builder.as_mut() {
            builder.ignore_functions(functions);
        }
    }

    /// Reads the batches the agent made since the last call, and corrects each hook
    /// shape with the median of its batches once there are enough (the 5-byte jump's
    /// first: until it has enough, the start calibration serves every shape).
    pub(super) fn follow_in_situ(&mut self) {
        let (Some(rings), Some(builder)) = (self.rings.as_ref(), self.builder.as_mut()) else {
            return;
        };
        let mut any_new = false;
        for shape in HookShape::ALL {
            let (count, new) = rings.in_situ_batches(shape, self.in_situ.read[shape as usize]);
            self.in_situ.read[shape as usize] = count;
            let batches = &mut self.in_situ.batches[shape as usize];
            any_new |= !new.is_empty();
            self.in_situ.read_in_all[shape as usize] += new.len() as u64;
            batches.extend(new);
            while batches.len() > KEPT_BATCHES {
                batches.pop_front();
            }
        }
        let jump_batches = self.in_situ.batches[HookShape::Jump as usize].len();
        let since_last = self.in_situ.computed_at.map(|at| at.elapsed());
        if !any_new || !recompute_due(since_last, jump_batches, self.in_situ.computed_from) {
            return;
        }
        let at_start = *self.in_situ.at_start.get_or_insert(builder.calibration());
        let ns = |ticks: f64| ticks * 1e9 / at_start.tsc_hz as f64;
        let measured = |shape: HookShape| {
            let batches = &self.in_situ.batches[shape as usize];
            if batches.len() < MIN_BATCHES {
                return None;
            }
            let (inner, inner_sigma) = median_and_sigma(batches.iter().map(|b| b.0));
            let (outer, outer_sigma) = median_and_sigma(batches.iter().map(|b| b.1));
            Some(ShapeCalibration {
                inner_ns: ns(inner),
                outer_ns: ns(outer),
                inner_spread_ns: ns(inner_sigma),
                outer_spread_ns: ns(outer_sigma),
                in_situ_batches: batches.len() as u64,
            })
        };
        let Some(jump) = measured(HookShape::Jump) else {
            return;
        };
        let calibration = Calibration {
            inner_ns: jump.inner_ns,
            outer_ns: jump.outer_ns,
            inner_spread_ns: jump.inner_spread_ns,
            outer_spread_ns: jump.outer_spread_ns,
            in_situ_batches: jump.in_situ_batches,
            start_inner_ns: at_start.inner_ns,
            start_outer_ns: at_start.outer_ns,
            pad_jump: measured(HookShape::PadJump),
            call_thunk: measured(HookShape::CallThunk),
            ..at_start
        };
        // Values from the agent's fixed-point words are finite and ≥ 0.
        let _ = builder.set_calibration(calibration);
        self.in_situ.computed_at = Some(Instant::now());
        self.in_situ.computed_from = jump_batches;
    }
}

/// Whether the medians are worked out again, `since_last` after the last time (`None`:
/// never yet), which used `computed_from` of the 5-byte jump's `batches` now read.
fn recompute_due(since_last: Option<Duration>, batches: usize, computed_from: usize) -> bool {
    since_last.is_none_or(|elapsed| elapsed >= RECOMPUTE_EVERY || batches >= 2 * computed_from)
}

/// The median (the upper one of an even count) of `values` (at least one), and their
/// spread around it as a robust standard deviation: 1.4826 × the median absolute
/// deviation, which is σ for normally distributed values and is not moved by the few
/// batches an interrupt or a signal stretched. Linear time.
///
/// The spread stands for how far the cost removed per call may be off: on the
/// tight-call root and fib, the error per call was within it in 9 of 12 runs, as a
/// standard deviation's should be (BENCHMARKS.md, "Leaves timed against bare twins").
fn median_and_sigma(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let mut values: Vec<f64> = values.collect();
    let median = upper_median(&mut values);
    for value in &mut values {
        *value = (*value - median).abs();
    }
    (median, 1.4826 * upper_median(&mut values))
}

/// The median of `values` (the upper one of an even count), reordering them.
fn upper_median(values: &mut [f64]) -> f64 {
    let middle = values.len() / 2;
    *values.select_nth_unstable_by(middle, f64::total_cmp).1
}

#[cfg(test)]
mod tests {
    use super::{RECOMPUTE_EVERY, median_and_sigma, recompute_due};
    use std::time::Duration;

    #[test]
    fn the_medians_follow_the_batches_while_they_are_few_and_then_every_100_ms() {
        assert!(recompute_due(None, 5, 0), "the first time");
        let soon = Some(Duration::from_millis(3));
        assert!(!recompute_due(soon, 9, 5));
        assert!(recompute_due(soon, 10, 5), "twice as many batches");
        assert!(
            !recompute_due(soon, 4096, 4096),
            "the kept batches are full"
        );
        assert!(recompute_due(Some(RECOMPUTE_EVERY), 4096, 4096));
    }

    #[test]
    fn the_spread_is_the_median_absolute_deviation_scaled_to_a_standard_deviation() {
        assert_eq!(median_and_sigma([3.0].into_iter()), (3.0, 0.0));
        // Deviations from 5: 4 and 0; the upper median of them is 4.
        assert_eq!(
            median_and_sigma([5.0, 1.0].into_iter()),
            (5.0, 1.4826 * 4.0)
        );
        // Median 4.5; deviations 4.5, 2.5, 2.5, 0.5, 0: their median is 2.5.
        let (median, sigma) = median_and_sigma([9.0, 2.0, 7.0, 4.0, 4.5].into_iter());
        assert_eq!(median, 4.5);
        assert!((sigma - 1.4826 * 2.5).abs() < 1e-12);
        // One batch stretched a hundredfold moves neither.
        let (median, sigma) = median_and_sigma([10.0, 11.0, 9.0, 10.0, 1000.0].into_iter());
        assert_eq!((median, sigma), (10.0, 1.4826));
    }
}
