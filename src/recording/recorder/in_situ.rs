//! The hooks' cost measured where they run (agent `runtime/in_situ.rs`): the agent
//! calibrates now and then on the target's own threads, into their own rings, and
//! keeps each batch in the rings' header. The recorder reads the new batches as it
//! polls and, once it has [`MIN_BATCHES`], corrects with their median in place of the
//! calibration made at the start (which ran on an agent thread, into a private ring,
//! and sees none of what the target's threads pay: a ring drained close behind them,
//! a core shared with the controller, caches the program fills). The calibration
//! function's own events are left out of the trees.

use super::Recorder;
use crate::profile::Calibration;
use std::collections::VecDeque;

/// Batches needed before their median replaces the start calibration.
const MIN_BATCHES: usize = 5;
/// Batches kept (the most recent).
const KEPT_BATCHES: usize = 4096;

/// The batches read so far, `(inner, outer)` ticks per call.
#[derive(Debug, Default)]
pub(super) struct InSituBatches {
    /// The agent's batch count already read in the current start.
    read: u64,
    batches: VecDeque<(f64, f64)>,
    /// The start calibration, kept while the in-situ one is used.
    at_start: Option<Calibration>,
}

impl Recorder {
    /// After the agent started recording: its batch count begins again, and the
    /// calibration function's events are left out of the trees.
    pub(super) fn note_in_situ_start(&mut self) {
        self.in_situ.read = 0;
        let Some(id) = self
            .rings
            .as_ref()
            .and_then(|rings| rings.in_situ_function())
        else {
            return;
        };
        if let Some(builder) = self.builder.as_mut() {
            builder.ignore_function(id);
        }
    }

    /// Reads the batches the agent made since the last call, and corrects with the
    /// median of all of them once there are enough.
    pub(super) fn follow_in_situ(&mut self) {
        let (Some(rings), Some(builder)) = (self.rings.as_ref(), self.builder.as_mut()) else {
            return;
        };
        let (count, new) = rings.in_situ_batches(self.in_situ.read);
        if new.is_empty() {
            return;
        }
        self.in_situ.read = count;
        let batches = &mut self.in_situ.batches;
        batches.extend(new);
        while batches.len() > KEPT_BATCHES {
            batches.pop_front();
        }
        if batches.len() < MIN_BATCHES {
            return;
        }
        let at_start = *self.in_situ.at_start.get_or_insert(builder.calibration());
        let ns = |ticks: f64| ticks * 1e9 / at_start.tsc_hz as f64;
        let (inner, inner_min) = median_and_min(batches.iter().map(|b| b.0));
        let (outer, outer_min) = median_and_min(batches.iter().map(|b| b.1));
        let calibration = Calibration {
            inner_ns: ns(inner),
            outer_ns: ns(outer),
            inner_spread_ns: ns(inner - inner_min),
            outer_spread_ns: ns(outer - outer_min),
            in_situ_batches: batches.len() as u64,
            start_inner_ns: at_start.inner_ns,
            start_outer_ns: at_start.outer_ns,
            ..at_start
        };
        // Values from the agent's fixed-point words are finite and ≥ 0.
        let _ = builder.set_calibration(calibration);
    }
}

/// The median and the minimum of `values` (at least one).
fn median_and_min(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let mut sorted: Vec<f64> = values.collect();
    sorted.sort_by(f64::total_cmp);
    (sorted[sorted.len() / 2], sorted[0])
}
