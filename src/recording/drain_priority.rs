//! The thread that reads the rings runs ahead of the target's threads.
//!
//! A recording is lossless: a thread whose ring is full waits until the controller
//! has read it. On a machine the target keeps busy (a thousand threads on two cores),
//! the controller's one reading thread got a thousandth of the CPU like any of them:
//! in a 3 s recording of such a target it ran 2.6 s and waited 10.9 s for a core, and
//! the target's threads waited for it in turn, 1,194 s summed over the threads of
//! another (`BENCHMARKS.md`). So the reading thread asks for a higher priority
//! ([`READING_NICE`]) when it first reads. Its work is what the target's events make,
//! and it sleeps when the rings are empty: it takes from the target only the time the
//! target would otherwise spend waiting for it. The priority is nice −20, the highest:
//! at −10 (a weight of about nine threads at the default) it still got so little of a
//! core among hundreds of runnable target threads that a 3 s recording took 22–97 s to
//! read; at −20 (about 87 threads' weight), 5–12 s (`BENCHMARKS.md`).
//!
//! Only the reading thread; only when tendril has the right (root, or
//! `CAP_SYS_NICE`), else it reads at the priority it has; and only from the default
//! priority (a user who runs `nice tendril` asked for less).

/// The nice value of the thread that reads the rings (the default is 0; lower runs
/// first).
pub const READING_NICE: i32 = crate::inject::agent_priority::AGENT_NICE;

/// Gives the calling thread [`READING_NICE`] the first time it asks, if it runs at the
/// default priority and may have a higher one; otherwise it stays as it is. The
/// thread that attached has it already (`agent_priority::run_ahead_of_the_target`).
pub fn read_ahead_of_the_target() {
    crate::inject::agent_priority::run_ahead_of_the_target();
}
