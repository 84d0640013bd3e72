//! Whether the off-CPU watch would cost the target too much: its thread switches are
//! counted before a recording starts and again when the watch would open.
//!
//! The one idea: the kernel writes a record at every switch the watch sees, in the
//! context of the thread that switches, so the watch's cost grows with the target's
//! switch rate, not with its calls. On a target of 1,000 threads each sleeping
//! 250 times a second (290,000 switches a second), the records took 0.57 of a core
//! with one event per core and a whole core with one per thread
//! (`benches/scripts/switch_events_cost.sh 3 250`): the machine had no time left, and
//! the target's threads waited hundreds of milliseconds for a core. So when the watch
//! would cost more than [`CPU_TIME_BUDGET`] of a core, CPU time is not measured, and
//! the profile says why; `--cpu-time` measures it anyway.

use std::collections::HashMap;
use std::time::Instant;

/// The most of one core the off-CPU watch may cost the target, unless `--cpu-time`.
pub const CPU_TIME_BUDGET: f64 = 0.10;
/// What one switch's record costs the target with one event per core, in seconds of
/// CPU: 0.57 of a core at 290,000 switches a second on the 2-core test machine.
const PER_CORE_SWITCH_COST: f64 = 2.0e-6;
/// The same with one event per thread: the kernel also moves the thread's perf context
/// out and in (1.0 core at 290,000 switches a second).
const PER_THREAD_SWITCH_COST: f64 = 3.5e-6;

/// The target's threads' switches so far, each thread's on its own (a thread that ends
/// between two counts takes its switches with it).
pub struct SwitchCount {
    taken: Instant,
    per_thread: HashMap<i32, u64>,
}

impl SwitchCount {
    /// Counts process `pid`'s switches now (`voluntary_ctxt_switches` and
    /// `nonvoluntary_ctxt_switches` of each thread's `status`); `None` if it is gone.
    pub fn take(pid: i32) -> Option<SwitchCount> {
        let tids = crate::process::thread_ids(pid).ok()?;
        let per_thread = tids
            .into_iter()
            .filter_map(|tid| {
                let status =
                    crate::process::read_proc_text(format!("/proc/{pid}/task/{tid}/status"));
                Some((tid, switches_in_status(&status.ok()?)?))
            })
            .collect();
        Some(SwitchCount {
            taken: Instant::now(),
            per_thread,
        })
    }

    /// The switches per second from `earlier` to this count: each thread's since then,
    /// all of them for a thread that started meanwhile.
    pub fn rate_since(&self, earlier: &SwitchCount) -> f64 {
        let seconds = self.taken.duration_since(earlier.taken).as_secs_f64();
        let switches: u64 = (self.per_thread.iter())
            .map(|(tid, &now)| {
                now.saturating_sub(earlier.per_thread.get(tid).copied().unwrap_or(0))
            })
            .sum();
        if seconds > 0.0 {
            switches as f64 / seconds
        } else {
            0.0
        }
    }
}

/// The share of a core that watching `rate` switches a second costs the target, with
/// one event per core or one per thread.
pub fn watch_cost(rate: f64, per_core: bool) -> f64 {
    let each = if per_core {
        PER_CORE_SWITCH_COST
    } else {
        PER_THREAD_SWITCH_COST
    };
    rate * each
}

/// Why CPU time is not measured when watching `rate` switches a second would cost more
/// than [`CPU_TIME_BUDGET`]; `None` when it costs less.
pub fn over_budget(rate: f64, per_core: bool) -> Option<String> {
    let cost = watch_cost(rate, per_core);
    (cost > CPU_TIME_BUDGET).then(|| {
        format!(
            "CPU time is not measured: the target switched threads {} times a second, and \
             recording each switch would cost it about {:.0}% of a core, over the {:.0}% \
             tendril allows itself (--cpu-time measures it anyway)",
            crate::quantities::thousands(rate.round() as u64),
            cost * 100.0,
            CPU_TIME_BUDGET * 100.0
        )
    })
}

/// The sum of the two switch counts of a thread's `status` text.
fn switches_in_status(status: &str) -> Option<u64> {
    let count = |key| {
        crate::process::status_field(status, key)?
            .parse::<u64>()
            .ok()
    };
    Some(count("voluntary_ctxt_switches")? + count("nonvoluntary_ctxt_switches")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_gives_both_switch_counts_summed() {
        let status = "Name:\tworker\nState:\tS (sleeping)\nvoluntary_ctxt_switches:\t1200\n\
                      nonvoluntary_ctxt_switches:\t34\n";
        assert_eq!(switches_in_status(status), Some(1234));
        assert_eq!(switches_in_status("Name:\tworker\n"), None);
    }

    #[test]
    fn the_rate_counts_each_thread_since_the_earlier_count_and_a_new_one_whole() {
        let at = Instant::now();
        let earlier = SwitchCount {
            taken: at,
            per_thread: HashMap::from([(1, 100), (2, 500)]),
        };
        // Thread 2 ended; thread 3 started with 50 switches.
        let later = SwitchCount {
            taken: at + std::time::Duration::from_millis(500),
            per_thread: HashMap::from([(1, 1100), (3, 50)]),
        };
        assert_eq!(later.rate_since(&earlier), 2100.0);
    }

    #[test]
    fn a_busy_switcher_is_over_budget_and_a_quiet_one_is_not() {
        // The thousand-thread fixture: 290,000 switches a second.
        let why = over_budget(290_000.0, true).expect("over budget");
        assert!(why.contains("290,000 times a second"), "{why}");
        assert!(why.contains("58% of a core"), "{why}");
        assert!(why.contains("--cpu-time"), "{why}");
        // 20,000 a second: 4% of a core per core, 7% per thread.
        assert_eq!(over_budget(20_000.0, true), None);
        assert_eq!(over_budget(20_000.0, false), None);
        // 40,000 a second: within budget per core, not per thread.
        assert_eq!(over_budget(40_000.0, true), None);
        assert!(over_budget(40_000.0, false).is_some());
    }
}
