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
//!
//! A function known to call nothing (`discovery` scans each callee it patches) has
//! nothing to discover: its first calls mark it invoked and go straight on, with no
//! turn to wait for. With a thousand threads entering a root at once, each leaf below
//! it would otherwise hold them all, asleep, then wake them all together.

use crate::runtime::recording;
use crate::runtime::state::STATE;
use crate::sys;
use std::sync::atomic::Ordering;

/// The longest a thread sleeps before it looks at the function again by itself (a
/// wake-up is missed only if the discovering thread dies).
const DISCOVERY_NAP_NS: u64 = 5_000_000;

/// A function's `discovering` flag: free (0), a thread discovers it (1), or it is known
/// to have nothing to discover.
const NOTHING_TO_DISCOVER: u8 = 2;

#[derive(Debug, PartialEq, Eq)]
pub enum Turn {
    /// This thread discovers the function (it holds its `discovering` flag).
    Discover,
    /// Another thread discovered it while this one slept.
    Waited,
    /// It has nothing to discover: marked invoked, with no wait.
    NothingToDiscover,
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
        if flag.load(Ordering::Acquire) == NOTHING_TO_DISCOVER {
            recording::mark_invoked(id);
            return Turn::NothingToDiscover;
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

/// Notes that function `id` calls nothing, so has nothing to discover (unless a thread
/// is discovering it already).
pub fn note_nothing_to_discover(id: u32) {
    if let Some(flag) = STATE.discovering.get(id as usize) {
        let _ = flag.compare_exchange(0, NOTHING_TO_DISCOVER, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// Forgets what [`note_nothing_to_discover`] noted of id `id`: its hooks go in again,
/// maybe for another function.
pub fn forget_nothing_to_discover(id: u32) {
    if let Some(flag) = STATE.discovering.get(id as usize) {
        let _ = flag.compare_exchange(NOTHING_TO_DISCOVER, 0, Ordering::AcqRel, Ordering::Acquire);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_function_with_nothing_to_discover_is_no_ones_turn_until_forgotten() {
        // An id no other test uses.
        let id = 200_001;
        note_nothing_to_discover(id);
        assert_eq!(turn_to_discover(id), Turn::NothingToDiscover);
        assert_eq!(turn_to_discover(id), Turn::NothingToDiscover);
        forget_nothing_to_discover(id);
        assert_eq!(turn_to_discover(id), Turn::Discover);
        // Taken by a discovering thread, it is not noted over that thread's turn.
        note_nothing_to_discover(id);
        assert_eq!(STATE.discovering[id as usize].load(Ordering::Acquire), 1);
        drop(DiscoveryTurn(id));
        note_nothing_to_discover(id);
        assert_eq!(turn_to_discover(id), Turn::NothingToDiscover);
        forget_nothing_to_discover(id);
    }
}
