//! Whose turn it is to discover a function: the first thread that calls it in the
//! graph discovers it (`discovery`), and every other thread that calls it meanwhile
//! sleeps until it is marked invoked.
//!
//! The one idea: a thousand threads may call a function of the graph for the first
//! time at once (every thread of a server entering a root that just went in). Queued on
//! the loader's lock, which a discovery holds, they were let through one at a time,
//! each after a wake-up that a loaded machine makes take a while: 0.6–1 s for the last.
//! Asleep on one futex word, they wake together when any discovery ends, and each looks
//! at its own function again.

use crate::runtime::recording;
use crate::runtime::state::STATE;
use crate::sys;
use std::sync::atomic::Ordering;

/// The longest a thread sleeps before it looks at the function again by itself (a
/// wake-up is missed only if the discovering thread dies).
const DISCOVERY_NAP_NS: u64 = 5_000_000;

#[derive(Debug, PartialEq, Eq)]
pub enum Turn {
    /// This thread discovers the function (it holds its `discovering` flag).
    Discover,
    /// Another thread discovered it while this one slept.
    Waited,
}

/// Whether this thread discovers function `id`, or waits, asleep, while another does.
///
/// A thousand threads call a function of the graph for the first time at once (every
/// thread of a server entering a root that just went in): all but one wait here for
/// the one that discovers it, and wake together when it is done. They used to queue
/// on the loader's lock, which the discovery holds, and be let through one at a time,
/// each after a wake-up that a loaded machine makes take a while: 0.6–1 s for the last.
pub fn turn_to_discover(id: u32) -> Turn {
    let Some(flag) = STATE.discovering.get(id as usize) else {
        return Turn::Discover;
    };
    loop {
        // Read before looking: a discovery ending from now on changes it.
        let ended = STATE.discoveries_ended.load(Ordering::Acquire);
        if recording::is_invoked(id) {
            return Turn::Waited;
        }
        if flag
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return Turn::Discover;
        }
        sys::futex_wait_timeout(&STATE.discoveries_ended, ended, DISCOVERY_NAP_NS);
    }
}

/// This thread's turn to discover function `.0`: ended when dropped, which wakes the
/// threads waiting for it.
pub struct DiscoveryTurn(pub u32);

impl Drop for DiscoveryTurn {
    fn drop(&mut self) {
        if let Some(flag) = STATE.discovering.get(self.0 as usize) {
            flag.store(0, Ordering::Release);
        }
        STATE.discoveries_ended.fetch_add(1, Ordering::AcqRel);
        sys::futex_wake_all(&STATE.discoveries_ended);
    }
}
