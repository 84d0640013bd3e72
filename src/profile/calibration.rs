//! Removing tendril's own cost from measured times (JFluid §5.3).
//!
//! The one idea: every completed invocation is charged
//! `t_exact = t_meas − t_I − Σ t_O`, where `t_meas` is the time from its
//! entry event to its exit event minus the pauses tendril caused inside it, `t_I` (inner)
//! is the part of one call's own hook cost that falls between those two timestamps, `t_O`
//! (outer) is the whole cost one instrumented call adds to its caller, and the sum runs
//! over the instrumented calls made inside the invocation — at any depth, since every
//! hook below it runs inside its time (JFluid states the formula for a method's own
//! time, with its direct calls, as `m·t_O`; charged to totals, it takes all of them).
//! The self time of a node, its total minus its children's totals, is then JFluid's.
//! Each call inside is counted with the `t_O` of the correction in force when it
//! returned, not the one in force when the invocation ends: the in-situ calibration
//! follows the hooks' cost as it moves (`recording/recorder/in_situ.rs`), and a long
//! invocation spans such moves. Everything here is in TSC ticks; nanoseconds appear
//! only when a profile is produced.
//!
//! A charge is not clamped at 0: a call shorter than the error of `t_I` and `t_O`
//! (a leaf of a nanosecond) may come out negative, and clamping each one would bias the
//! sum upwards. A node's sum is what is compared with its children's when the tree is
//! settled (`CallArena::settle`), which marks what is below resolution.

use super::model::Calibration;
use tendril_wire::events::{HOOK_SHAPES, HookShape};

/// The share of the cost removed that a node's error adds for the hooks' cost moving
/// away from its calibration (see [`Correction::error_ns`]).
pub const SYSTEMATIC_SHARE: f64 = 0.25;

/// The share of the untimed hook's calibrated cost that one untimed call is taken to add
/// to its caller. The calibration loop calls a function that does nothing, so the
/// hook's work (a table increment in the thread's state) is all it waits for; in a
/// caller that has work of its own, the core runs that work beside the hook's: on the
/// tight-call fixture an untimed call cost 1.0 ns end to end against 2.3 ns in the loop
/// (BENCHMARKS.md). So the cost is taken as half the loop's, give or take that half
/// ([`UNTIMED_SYSTEMATIC_SHARE`] of it): its truth lies between none and all of it.
pub const UNTIMED_COST_SHARE: f64 = 0.5;

/// The share of the untimed hooks' cost removed that a node's error adds (see
/// [`UNTIMED_COST_SHARE`]).
pub const UNTIMED_SYSTEMATIC_SHARE: f64 = 1.0;

/// Why a calibration cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CalibrationError {
    #[error("the TSC frequency is 0 Hz; the agent's calibration did not run")]
    ZeroFrequency,
    #[error("calibration {which} time {value} ns is not a number ≥ 0")]
    BadOverhead { which: &'static str, value: f64 },
}

/// The calibration in ticks, ready for the builder's hot loop: `t_I` and `t_O` per hook
/// shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Correction {
    inner_ticks: [f64; HOOK_SHAPES],
    outer_ticks: [f64; HOOK_SHAPES],
    ns_per_tick: f64,
    /// The calibration's largest spreads (median − minimum) over the shapes, in ns per
    /// call.
    inner_spread_ns: f64,
    outer_spread_ns: f64,
    /// What one untimed call is taken to add to its caller ([`UNTIMED_COST_SHARE`] of
    /// the calibration's), and the calibration's spread.
    untimed_ticks: f64,
    untimed_spread_ns: f64,
}

impl Correction {
    pub fn new(calibration: &Calibration) -> Result<Correction, CalibrationError> {
        if calibration.tsc_hz == 0 {
            return Err(CalibrationError::ZeroFrequency);
        }
        let ticks_per_ns = calibration.tsc_hz as f64 / 1e9;
        let mut correction = Correction {
            inner_ticks: [0.0; HOOK_SHAPES],
            outer_ticks: [0.0; HOOK_SHAPES],
            ns_per_tick: 1.0 / ticks_per_ns,
            inner_spread_ns: 0.0,
            outer_spread_ns: 0.0,
            untimed_ticks: 0.0,
            untimed_spread_ns: 0.0,
        };
        for (which, value) in [
            ("untimed", calibration.untimed_ns),
            ("untimed spread", calibration.untimed_spread_ns),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(CalibrationError::BadOverhead { which, value });
            }
        }
        correction.untimed_ticks = UNTIMED_COST_SHARE * calibration.untimed_ns * ticks_per_ns;
        correction.untimed_spread_ns = calibration.untimed_spread_ns;
        for shape in HookShape::ALL {
            let values = calibration.for_shape(shape);
            for (which, value) in [
                ("inner", values.inner_ns),
                ("outer", values.outer_ns),
                ("inner spread", values.inner_spread_ns),
                ("outer spread", values.outer_spread_ns),
            ] {
                if !(value.is_finite() && value >= 0.0) {
                    return Err(CalibrationError::BadOverhead { which, value });
                }
            }
            correction.inner_ticks[shape as usize] = values.inner_ns * ticks_per_ns;
            correction.outer_ticks[shape as usize] = values.outer_ns * ticks_per_ns;
            correction.inner_spread_ns = correction.inner_spread_ns.max(values.inner_spread_ns);
            correction.outer_spread_ns = correction.outer_spread_ns.max(values.outer_spread_ns);
        }
        Ok(correction)
    }

    /// The estimated error of a context's corrected total: what the cost removed may be
    /// off by. Two parts, added:
    /// - the calibration's spread per call times the calls it was removed for (the
    ///   context's own `calls` for `t_I`, the `timed_below` calls below it for `t_O`, the
    ///   `untimed_below` calls for the untimed hook's cost), with the largest spread of
    ///   the hook shapes;
    /// - a systematic part: [`SYSTEMATIC_SHARE`] of the timed hooks' cost removed and
    ///   [`UNTIMED_SYSTEMATIC_SHARE`] of the untimed hook's, for what moves the hooks'
    ///   real cost away from the calibration's (caches shared with other work, another
    ///   process on the core, a full ring).
    ///
    /// `None` when the calibration gave no spread (an older agent's).
    pub fn error_ns(&self, calls: u64, timed_below: u64, untimed_below: u64) -> Option<u64> {
        (self.inner_spread_ns > 0.0 || self.outer_spread_ns > 0.0).then(|| {
            let spread = calls as f64 * self.inner_spread_ns
                + timed_below as f64 * self.outer_spread_ns
                + untimed_below as f64 * self.untimed_spread_ns;
            let timed_removed = calls as f64 * self.largest(&self.inner_ticks)
                + timed_below as f64 * self.largest(&self.outer_ticks);
            let untimed_removed = untimed_below as f64 * self.untimed_ticks;
            let systematic =
                SYSTEMATIC_SHARE * timed_removed + UNTIMED_SYSTEMATIC_SHARE * untimed_removed;
            (spread + systematic * self.ns_per_tick).round() as u64
        })
    }

    fn largest(&self, per_shape: &[f64; HOOK_SHAPES]) -> f64 {
        per_shape.iter().copied().fold(0.0, f64::max)
    }

    /// `t_exact` in ticks of one invocation of a function hooked as `shape` that
    /// measured `measured_ticks` (pauses already removed), inside which the
    /// instrumented calls, at any depth, added `outer_inside_ticks` (the sum of their
    /// [`Correction::outer_ticks`]); negative when the call was shorter than the cost
    /// removed (see the module comment).
    #[inline]
    pub fn charge(&self, measured_ticks: u64, shape: HookShape, outer_inside_ticks: f64) -> f64 {
        measured_ticks as f64 - self.inner_ticks[shape as usize] - outer_inside_ticks
    }

    /// `t_I` in ticks of a hook of `shape`.
    pub fn inner_ticks(&self, shape: HookShape) -> f64 {
        self.inner_ticks[shape as usize]
    }

    /// `t_O` in ticks of a hook of `shape`.
    #[inline]
    pub fn outer_ticks(&self, shape: HookShape) -> f64 {
        self.outer_ticks[shape as usize]
    }

    /// What one untimed call adds to its caller's measured time, in ticks.
    #[inline]
    pub fn untimed_ticks(&self) -> f64 {
        self.untimed_ticks
    }

    /// Whole nanoseconds, rounded to nearest, for a (corrected) number of ticks; 0 for
    /// a negative number.
    pub fn ticks_to_ns(&self, ticks: f64) -> u64 {
        (ticks * self.ns_per_tick).round().max(0.0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::cct::CctBuilder;
    use crate::profile::model::{Node, Profile, ShapeCalibration};
    use crate::profile::tests_support::{entry, exit, info, names, pause, unwind};
    use tendril_wire::events::Event;

    /// 1 tick = 1 ns, `t_I` = 2 ns, `t_O` = 5 ns.
    fn calibration() -> Calibration {
        Calibration {
            tsc_hz: 1_000_000_000,
            inner_ns: 2.0,
            outer_ns: 5.0,
            inner_spread_ns: 0.0,
            outer_spread_ns: 0.0,
            ..Default::default()
        }
    }

    fn merged(events: &[Event]) -> Vec<Node> {
        let mut builder = CctBuilder::new(calibration()).unwrap();
        builder.push_events(1, events);
        let profile: Profile = builder.snapshot(&info(), &names(&["root", "mid", "leaf"]));
        profile.merged.roots
    }

    /// The `t_O` of `calls` hooks of each shape, at `correction`.
    fn outer_of(correction: &Correction, calls: [u64; HOOK_SHAPES]) -> f64 {
        HookShape::ALL
            .iter()
            .map(|&shape| calls[shape as usize] as f64 * correction.outer_ticks(shape))
            .sum()
    }

    #[test]
    fn charge_is_measured_minus_inner_minus_the_calls_outer() {
        let correction = Correction::new(&calibration()).unwrap();
        let jump = HookShape::Jump;
        assert_eq!(
            correction.charge(100, jump, outer_of(&correction, [0, 0, 0])),
            98.0
        );
        assert_eq!(
            correction.charge(100, jump, outer_of(&correction, [3, 0, 0])),
            83.0
        );
        assert_eq!(
            correction.charge(10, jump, outer_of(&correction, [3, 0, 0])),
            -7.0,
            "not clamped"
        );
        assert_eq!(correction.ticks_to_ns(83.0), 83);
        // No shape measured on its own: every shape is corrected as a jump.
        assert_eq!(
            correction.charge(100, HookShape::CallThunk, outer_of(&correction, [1, 1, 1])),
            83.0
        );
    }

    #[test]
    fn each_hook_shape_is_charged_its_own_cost() {
        let shape = |inner_ns, outer_ns| ShapeCalibration {
            inner_ns,
            outer_ns,
            inner_spread_ns: 0.5,
            outer_spread_ns: 1.5,
            in_situ_batches: 9,
        };
        let correction = Correction::new(&Calibration {
            pad_jump: Some(shape(3.0, 7.0)),
            call_thunk: Some(shape(1.0, 4.0)),
            ..calibration()
        })
        .unwrap();
        // A pad-jump function: 100 − 3 − (2·5 + 1·7 + 3·4).
        assert_eq!(
            correction.charge(100, HookShape::PadJump, outer_of(&correction, [2, 1, 3])),
            68.0
        );
        // A call thunk's: 100 − 1 − 1·7.
        assert_eq!(
            correction.charge(100, HookShape::CallThunk, outer_of(&correction, [0, 1, 0])),
            92.0
        );
        // The largest spread of the shapes bounds the error (2·0.5 + 4·1.5), and a
        // quarter of the cost removed is added, with the largest cost of the shapes
        // (0.25 · (2·3 + 4·7)): 15.5.
        assert_eq!(correction.error_ns(2, 4, 0), Some(16));
    }

    #[test]
    fn counted_calls_remove_half_their_calibrated_cost_and_add_that_half_to_the_error() {
        let correction = Correction::new(&Calibration {
            inner_spread_ns: 0.5,
            untimed_ns: 2.0,
            untimed_spread_ns: 0.5,
            ..calibration()
        })
        .unwrap();
        // 1 tick per ns: half of 2 ns.
        assert_eq!(correction.untimed_ticks(), 1.0);
        // Spread 10 · 0.5, and the half removed, 10 · 1: the truth between 0 and 2 ns
        // a call.
        assert_eq!(correction.error_ns(0, 0, 10), Some(15));
    }

    #[test]
    fn ticks_become_ns_with_the_tsc_frequency() {
        let correction = Correction::new(&Calibration {
            tsc_hz: 3_000_000_000,
            inner_ns: 1.0,
            outer_ns: 2.0,
            inner_spread_ns: 0.0,
            outer_spread_ns: 0.0,
            ..Default::default()
        })
        .unwrap();
        // 3 ticks per ns: t_I = 3 ticks, t_O = 6 ticks.
        assert_eq!(
            correction.charge(300, HookShape::Jump, outer_of(&correction, [2, 0, 0])),
            285.0
        );
        assert_eq!(correction.ticks_to_ns(285.0), 95);
        assert_eq!(correction.ticks_to_ns(4.0), 1, "1.33 ns rounds to 1");
        assert_eq!(correction.ticks_to_ns(5.0), 2, "1.67 ns rounds to 2");
    }

    #[test]
    fn bad_calibrations_are_refused() {
        let mut zero = calibration();
        zero.tsc_hz = 0;
        assert_eq!(
            Correction::new(&zero).unwrap_err().to_string(),
            "the TSC frequency is 0 Hz; the agent's calibration did not run"
        );
        let mut negative = calibration();
        negative.outer_ns = -1.0;
        assert_eq!(
            Correction::new(&negative).unwrap_err().to_string(),
            "calibration outer time -1 ns is not a number ≥ 0"
        );
    }

    #[test]
    fn a_stream_is_charged_per_invocation() {
        // root [0, 100] calls mid twice: mid [10, 40] calls leaf twice ([15,20], [25,31]),
        // mid [50, 60] calls nothing.
        let events = [
            entry(0, 0),
            entry(1, 10),
            entry(2, 15),
            exit(2, 20),
            entry(2, 25),
            exit(2, 31),
            exit(1, 40),
            entry(1, 50),
            exit(1, 60),
            exit(0, 100),
        ];
        let roots = merged(&events);
        let root = &roots[0];
        let mid = &root.children[0];
        let leaf = &mid.children[0];
        // leaf: (5 − 2) + (6 − 2) = 7
        assert_eq!((leaf.calls, leaf.total_ns, leaf.self_ns), (2, 7, 7));
        // mid: (30 − 2 − 2·5) + (10 − 2) = 18 + 8 = 26; self = 26 − 7 = 19
        assert_eq!((mid.calls, mid.total_ns, mid.self_ns), (2, 26, 19));
        // root: 100 − 2 − 4·5 = 78 (two mids and two leaves ran inside it); self = 52
        assert_eq!((root.calls, root.total_ns, root.self_ns), (1, 78, 52));
    }

    #[test]
    fn each_call_inside_is_charged_the_cost_in_force_when_it_returned() {
        // root [0, 100] calls mid [10, 60], which calls leaf [20, 30]; then leaf [70, 80].
        // The correction goes from t_I/t_O = 2/5 to 3/8 (as the in-situ calibration
        // moves) after mid returns.
        let mut builder = CctBuilder::new(calibration()).unwrap();
        let early = [
            entry(0, 0),
            entry(1, 10),
            entry(2, 20),
            exit(2, 30),
            exit(1, 60),
        ];
        builder.push_events(1, &early);
        let later = Calibration {
            inner_ns: 3.0,
            outer_ns: 8.0,
            ..calibration()
        };
        builder.set_calibration(later).unwrap();
        let open = builder.snapshot(&info(), &names(&["root", "mid", "leaf"]));
        // Open at 60: 60 − 3 − (5 + 5), the two calls' costs when they returned.
        assert_eq!(open.merged.roots[0].total_ns, 47);
        builder.push_events(1, &[entry(2, 70), exit(2, 80), exit(0, 100)]);
        let profile = builder.snapshot(&info(), &names(&["root", "mid", "leaf"]));
        let root = &profile.merged.roots[0];
        let mid = &root.children[0];
        // mid: 50 − 2 − 5 = 43; root: 100 − 3 − (5 + 5 + 8) = 79; self 79 − 43 − 7.
        // Counting mid's leaf at the later cost, as a frame that counted its calls and
        // charged them at its end would, takes 3 more from root's self time, for a
        // change made after that leaf returned.
        assert_eq!((mid.total_ns, root.total_ns, root.self_ns), (43, 79, 29));
        assert_eq!(profile.calibration, later);
    }

    #[test]
    fn a_frame_still_open_counts_every_call_made_inside_it() {
        // root [0, ..) calls mid [10, ..), which has called leaf twice ([15,20], [25,31]).
        let events = [
            entry(0, 0),
            entry(1, 10),
            entry(2, 15),
            exit(2, 20),
            entry(2, 25),
            exit(2, 31),
        ];
        let roots = merged(&events);
        let (root, mid) = (&roots[0], &roots[0].children[0]);
        // Up to the latest event (31). mid: 21 − 2 − 2·5 = 9.
        assert_eq!(mid.total_ns, 9);
        // root: 31 − 2 − 3·5 = 14 (mid and both leaves ran inside it); self = 5.
        assert_eq!((root.total_ns, root.self_ns), (14, 5));
    }

    #[test]
    fn pauses_are_removed_from_every_open_frame() {
        // A 30-tick pause while root and mid are open, a 7-tick pause inside root only.
        let events = [
            entry(0, 0),
            entry(1, 10),
            pause(30),
            exit(1, 60),
            pause(7),
            exit(0, 100),
        ];
        let roots = merged(&events);
        let (root, mid) = (&roots[0], &roots[0].children[0]);
        // mid: 50 − 30 − 2 = 18
        assert_eq!(mid.total_ns, 18);
        // root: 100 − 37 − 2 − 5 = 56
        assert_eq!(root.total_ns, 56);
        assert_eq!(root.self_ns, 38);
    }

    #[test]
    fn unwound_frames_are_charged_like_returns() {
        // leaf throws; mid catches nothing and is unwound too; root catches.
        let events = [
            entry(0, 0),
            entry(1, 10),
            entry(2, 20),
            unwind(2, 30),
            unwind(1, 35),
            exit(0, 50),
        ];
        let roots = merged(&events);
        let (root, mid) = (&roots[0], &roots[0].children[0]);
        assert_eq!(mid.children[0].total_ns, 8); // 10 − 2
        assert_eq!(mid.total_ns, 18); // 25 − 2 − 5
        assert_eq!(root.total_ns, 38); // 50 − 2 − 2·5
    }

    #[test]
    fn what_the_correction_takes_below_zero_is_marked_not_hidden() {
        // root [0, 12] calls mid [1, 11], which calls leaf [5, 6]: leaf 1 − 2 = −1,
        // mid 10 − 2 − 5 = 3, root 12 − 2 − 2·5 = 0.
        let events = [
            entry(0, 0),
            entry(1, 1),
            entry(2, 5),
            exit(2, 6),
            exit(1, 11),
            exit(0, 12),
        ];
        let roots = merged(&events);
        let (root, mid) = (&roots[0], &roots[0].children[0]);
        let leaf = &mid.children[0];
        assert_eq!(
            (leaf.total_ns, leaf.self_ns, leaf.below_resolution),
            (0, 0, true)
        );
        assert_eq!(
            (mid.total_ns, mid.self_ns, mid.below_resolution),
            (3, 3, false)
        );
        // root's 0 is below its child's 3: it takes its child's total, and says so.
        assert_eq!(
            (root.total_ns, root.self_ns, root.below_resolution),
            (3, 0, true)
        );
    }

    #[test]
    fn short_calls_are_summed_before_anything_is_judged_below_resolution() {
        // leaf [10, 11] charges −1, leaf [20, 24] charges 2: together 1, measured.
        let events = [
            entry(0, 0),
            entry(1, 10),
            exit(1, 11),
            entry(1, 20),
            exit(1, 24),
            exit(0, 100),
        ];
        let roots = merged(&events);
        let leaf = &roots[0].children[0];
        assert_eq!((leaf.total_ns, leaf.below_resolution), (1, false));
        // root: 100 − 2 − 2·5 = 88.
        assert_eq!((roots[0].total_ns, roots[0].self_ns), (88, 87));
    }
}
