//! The calibration a profile carries: what tendril's own hooks cost in the target,
//! as measured at the start of the recording and on the target's threads while it
//! ran, per hook shape (`profile/calibration.rs` turns it into the correction).

use serde::{Deserialize, Serialize};
use tendril_wire::events::HookShape;

/// The cost of tendril's own hooks, measured in the target (JFluid §5.3): at the start
/// of the recording, then on the target's own threads while it ran (in situ).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Calibration {
    /// TSC ticks per second.
    pub tsc_hz: u64,
    /// `t_I`: the hook time that falls inside a call's own measured time.
    pub inner_ns: f64,
    /// `t_O`: the whole time one instrumented call adds to its caller's measured time.
    pub outer_ns: f64,
    /// The uncertainty of `t_I` and `t_O` per call (0 if unknown): how far the batches
    /// spread around the value used. At the start, whose value is the batches'
    /// minimum, their median − minimum; in situ, whose value is the median, a robust
    /// standard deviation (1.4826 × the median absolute deviation).
    #[serde(default)]
    pub inner_spread_ns: f64,
    #[serde(default)]
    pub outer_spread_ns: f64,
    /// What one call through the untimed hook (`"timing": "in_caller"`) adds to its
    /// caller's time, and the spread of that (0 if unknown: an older profile).
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub untimed_ns: f64,
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub untimed_spread_ns: f64,
    /// In-situ batches the values above come from (their median, and the spreads around
    /// it); 0 when they are the start calibration's.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub in_situ_batches: u64,
    /// The start calibration's `t_I` and `t_O`, when the in-situ values replaced them.
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub start_inner_ns: f64,
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub start_outer_ns: f64,
    /// The values above are those of a hook reached by a 5-byte jump. Hooks reached
    /// through a pad (a 2-byte jump to a jump placed in padding) and call thunks (an
    /// entry that was a `call`) are measured in situ on functions of their own; until
    /// they are (and in profiles of older builds), the values above serve them too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_jump: Option<ShapeCalibration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_thunk: Option<ShapeCalibration>,
}

/// One hook shape's in-situ calibration (see [`Calibration`]).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ShapeCalibration {
    pub inner_ns: f64,
    pub outer_ns: f64,
    pub inner_spread_ns: f64,
    pub outer_spread_ns: f64,
    pub in_situ_batches: u64,
}

impl Calibration {
    /// The values that serve hooks of `shape`.
    pub fn for_shape(&self, shape: HookShape) -> ShapeCalibration {
        let own = match shape {
            HookShape::Jump => None,
            HookShape::PadJump => self.pad_jump,
            HookShape::CallThunk => self.call_thunk,
        };
        own.unwrap_or(ShapeCalibration {
            inner_ns: self.inner_ns,
            outer_ns: self.outer_ns,
            inner_spread_ns: self.inner_spread_ns,
            outer_spread_ns: self.outer_spread_ns,
            in_situ_batches: self.in_situ_batches,
        })
    }
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

fn is_zero_f64(value: &f64) -> bool {
    *value == 0.0
}
