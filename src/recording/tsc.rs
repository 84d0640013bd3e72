//! The time-stamp counter's frequency, measured against `CLOCK_MONOTONIC`.
//!
//! The one idea: event timestamps are raw TSC reads (the cheapest clock there is, and
//! the same in every process of the machine when the TSC is invariant), so the
//! controller converts ticks to nanoseconds with a frequency it measures itself.

use std::time::{Duration, Instant};

/// How long the measurement runs: long enough that reading the clocks is noise.
const WINDOW: Duration = Duration::from_millis(50);

/// The TSC's frequency in Hz.
pub fn measure_hz() -> u64 {
    let (started_at, started_tsc) = (Instant::now(), read());
    std::thread::sleep(WINDOW);
    let (ended_tsc, ended_at) = (read(), Instant::now());
    let seconds = ended_at.duration_since(started_at).as_secs_f64();
    ((ended_tsc - started_tsc) as f64 / seconds).round() as u64
}

/// Whether the cpu says its TSC runs at a constant rate through every power state.
pub fn is_invariant() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|info| {
        info.lines()
            .find(|line| line.starts_with("flags"))
            .is_some_and(|flags| flags.contains(" constant_tsc") && flags.contains(" nonstop_tsc"))
    })
}

/// The TSC now.
pub fn read() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86-64.
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_frequency_is_plausible() {
        let hz = super::measure_hz();
        assert!((100_000_000..20_000_000_000).contains(&hz), "{hz} Hz");
    }
}
