//! The Sampled view's sampler, on a thread of its own: it samples the target from the
//! outside (`sampling::Sampler`, nothing loaded into it) and hands the event loop a
//! fresh sampled profile and its view-model a few times a second.
//!
//! The one idea: walking and naming samples is the controller's whole cost of sampling,
//! and it grows with the target's stacks, so none of it runs on the event loop — the
//! loop only picks up the latest update, never waits. Stopping (a root is instrumented
//! now, the session ends) is a flag: the thread reads what is left in the rings, sends
//! the final tree and ends, closing every perf event.

use super::convert::sampled_snapshot;
use crate::profile::Profile;
use crate::profile::overlap::PathWeights;
use crate::sampling::{Sampler, SamplerOptions};
use crate::symbols::ProcessSymbols;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tendril_tui::ProfileSnapshot;

/// How often the sampled tree is handed to the UI (or less often, if building it takes
/// long: at most a fifth of the thread's time goes to that).
pub const UPDATE_INTERVAL: Duration = Duration::from_millis(500);
/// The longest wait for samples before the stop flag is looked at again.
const POLL_TIMEOUT: Duration = Duration::from_millis(50);

/// The thread's orders: go on, stop and send the last tree, or just end (nobody will
/// look at the tree: the session is over).
const RUN: u8 = 0;
const STOP: u8 = 1;
const ABANDON: u8 = 2;

/// The sampling side of a live session (its methods are in `sampled.rs`).
#[derive(Default)]
pub struct Sampling {
    /// The sampler's thread while it runs.
    pub job: Option<SamplingJob>,
    /// The newest sampled profile.
    pub profile: Option<Profile>,
    /// The sampled tree's path weights below the roots they were computed for.
    pub weights: Option<(Vec<String>, PathWeights)>,
    /// The last overlap computed, and when the next is due.
    pub overlap: Option<f64>,
    pub next_overlap: Option<Instant>,
}

/// One sampled tree, as profile (for the overlap and saving) and as view-model.
pub struct SampledTree {
    pub profile: Profile,
    pub snapshot: ProfileSnapshot,
    /// Sampling has ended: this is the last tree.
    pub last: bool,
    /// It ended because the target exited.
    pub target_exited: bool,
}

/// What the sampling thread reports.
pub enum SamplingUpdate {
    Tree(Box<SampledTree>),
    /// Sampling could not start, or stopped on an error: one line for the user.
    Failed(String),
}

/// The sampling thread, seen from the event loop.
pub struct SamplingJob {
    updates: Receiver<SamplingUpdate>,
    orders: Arc<AtomicU8>,
    thread: Option<JoinHandle<()>>,
}

impl SamplingJob {
    /// Starts sampling `pid` (with its `symbols`) on a new thread; `target` names it in
    /// the status bar.
    pub fn start(
        pid: i32,
        symbols: ProcessSymbols,
        target: String,
    ) -> std::io::Result<SamplingJob> {
        let (sender, updates) = mpsc::channel();
        let orders = Arc::new(AtomicU8::new(RUN));
        let thread_orders = orders.clone();
        let thread = std::thread::Builder::new()
            .name("tendril-sampler".into())
            .spawn(move || {
                let options = SamplerOptions::default();
                match Sampler::start_with_symbols(pid, options, symbols) {
                    Ok(sampler) => sample(sampler, &target, &thread_orders, |update| {
                        sender.send(update).is_ok()
                    }),
                    Err(error) => {
                        let _ = sender.send(SamplingUpdate::Failed(error.to_string()));
                    }
                }
            })?;
        Ok(SamplingJob {
            updates,
            orders,
            thread: Some(thread),
        })
    }

    /// Asks the thread to stop; it sends the last tree and ends.
    pub fn stop(&self) {
        let _ = self
            .orders
            .compare_exchange(RUN, STOP, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// The updates sent since the last call, without waiting: every failure, and only
    /// the newest tree (older ones are superseded). `None` once the thread has ended and
    /// everything it sent was taken.
    pub fn take_updates(&self) -> Option<Vec<SamplingUpdate>> {
        let mut updates: Vec<SamplingUpdate> = Vec::new();
        loop {
            match self.updates.try_recv() {
                Ok(SamplingUpdate::Tree(tree)) => {
                    updates.retain(|update| !matches!(update, SamplingUpdate::Tree(_)));
                    updates.push(SamplingUpdate::Tree(tree));
                }
                Ok(failed) => updates.push(failed),
                Err(TryRecvError::Empty) => return Some(updates),
                Err(TryRecvError::Disconnected) if updates.is_empty() => return None,
                Err(TryRecvError::Disconnected) => return Some(updates),
            }
        }
    }
}

impl Drop for SamplingJob {
    /// Ends the thread and waits for it (at most one poll timeout), so no perf event
    /// outlives the session.
    fn drop(&mut self) {
        self.orders.store(ABANDON, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The thread's loop: poll the rings, send a tree every [`UPDATE_INTERVAL`] (the first
/// at once), and the last one when stopped, when the target exits or on an error.
/// `send` returns false once nobody listens.
fn sample(
    mut sampler: Sampler,
    target: &str,
    orders: &AtomicU8,
    mut send: impl FnMut(SamplingUpdate) -> bool,
) {
    let tree = |sampler: &Sampler, profile: Profile, last: bool, target_exited: bool| {
        let snapshot = sampled_snapshot(&profile, target, sampler.thread_count(), last);
        SamplingUpdate::Tree(Box::new(SampledTree {
            profile,
            snapshot,
            last,
            target_exited,
        }))
    };
    let mut next_update = Instant::now();
    loop {
        match orders.load(Ordering::SeqCst) {
            RUN => {}
            ABANDON => return,
            _ => {
                let threads = sampler.thread_count();
                let profile = sampler.finish();
                let snapshot = sampled_snapshot(&profile, target, threads, true);
                send(SamplingUpdate::Tree(Box::new(SampledTree {
                    profile,
                    snapshot,
                    last: true,
                    target_exited: false,
                })));
                return;
            }
        }
        if let Err(error) = sampler.poll(POLL_TIMEOUT) {
            let last = tree(&sampler, sampler.profile(), true, false);
            if send(last) {
                send(SamplingUpdate::Failed(format!("sampling stopped: {error}")));
            }
            return;
        }
        if sampler.target_exited() {
            send(tree(&sampler, sampler.profile(), true, true));
            return;
        }
        let now = Instant::now();
        if now >= next_update {
            let update = tree(&sampler, sampler.profile(), false, false);
            let took = now.elapsed();
            if !send(update) {
                return;
            }
            next_update = Instant::now() + UPDATE_INTERVAL.max(took * 4);
        }
    }
}
