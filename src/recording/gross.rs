//! `--gross-only`: the distribution of each root's gross time (JFluid's code-region
//! profiling). Only the roots are instrumented, so every entry/exit pair is one call of
//! a root; its time is exit − entry, less the pauses tendril caused inside it and the
//! hooks' calibrated inner time.

use crate::profile::GrossTime;
use std::collections::HashMap;
use tendril_wire::events::{Event, EventKind};

/// A frame open on a thread: function id, entry timestamp, pauses before it.
type OpenRoot = (u32, u64, u64);

/// Root durations, collected per root from the event streams.
pub struct GrossTimes {
    tsc_hz: u64,
    inner_ticks: f64,
    open: HashMap<i32, Vec<OpenRoot>>,
    paused: HashMap<i32, u64>,
    durations: HashMap<u32, Vec<u64>>,
}

impl GrossTimes {
    pub fn new(tsc_hz: u64, inner_ticks: f64) -> GrossTimes {
        GrossTimes {
            tsc_hz: tsc_hz.max(1),
            inner_ticks,
            open: HashMap::new(),
            paused: HashMap::new(),
            durations: HashMap::new(),
        }
    }

    /// The hooks' inner time this was made with.
    pub fn inner_ticks(&self) -> f64 {
        self.inner_ticks
    }

    pub fn push_events(&mut self, tid: i32, events: &[Event]) {
        let open = self.open.entry(tid).or_default();
        let paused = self.paused.entry(tid).or_default();
        for event in events {
            match event.kind() {
                Some(EventKind::Entry) => open.push((event.function, event.value, *paused)),
                Some(EventKind::Exit | EventKind::Unwind) => {
                    let Some(position) = open.iter().rposition(|&(id, ..)| id == event.function)
                    else {
                        continue;
                    };
                    let (id, entered, paused_before) = open[position];
                    open.truncate(position);
                    let measured = event
                        .value
                        .saturating_sub(entered)
                        .saturating_sub(*paused - paused_before);
                    let corrected = (measured as f64 - self.inner_ticks).max(0.0) as u64;
                    self.durations.entry(id).or_default().push(corrected);
                }
                Some(EventKind::Adjust) => *paused += event.value,
                Some(EventKind::Resumed | EventKind::Call) | None => {}
            }
        }
    }

    /// Forgets frames still open (the recording ended inside them: not whole calls).
    pub fn finish(&mut self) {
        self.open.clear();
    }

    /// One summary per root, named by `name_of(id)`.
    pub fn summaries(&self, name_of: &dyn Fn(u32) -> String) -> Vec<GrossTime> {
        let ns = |ticks: u64| (ticks as f64 * 1e9 / self.tsc_hz as f64).round() as u64;
        let mut summaries: Vec<GrossTime> = self
            .durations
            .iter()
            .map(|(&id, durations)| {
                let mut sorted = durations.clone();
                sorted.sort_unstable();
                let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
                GrossTime {
                    root: name_of(id),
                    calls: sorted.len() as u64,
                    total_ns: ns(sorted.iter().sum()),
                    min_ns: ns(sorted[0]),
                    median_ns: ns(at(0.5)),
                    p99_ns: ns(at(0.99)),
                    max_ns: ns(*sorted.last().unwrap()),
                }
            })
            .collect();
        summaries.sort_by_key(|summary| std::cmp::Reverse(summary.total_ns));
        summaries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_lose_pauses_and_the_inner_time() {
        // 1 GHz: a tick is a nanosecond.
        let mut gross = GrossTimes::new(1_000_000_000, 10.0);
        gross.push_events(
            7,
            &[
                Event::new(EventKind::Entry, 3, 1000),
                Event::new(EventKind::Adjust, 0, 200),
                Event::new(EventKind::Exit, 3, 2210),
                Event::new(EventKind::Entry, 3, 3000),
                Event::new(EventKind::Exit, 3, 3110),
            ],
        );
        let summary = gross.summaries(&|id| format!("f{id}"));
        assert_eq!(summary.len(), 1);
        let root = &summary[0];
        assert_eq!((root.root.as_str(), root.calls), ("f3", 2));
        assert_eq!((root.min_ns, root.max_ns), (100, 1000));
        assert_eq!(root.total_ns, 1100);
    }
}
