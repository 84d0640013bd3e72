//! Room made ahead for the threads a recording is about to meet: their state regions
//! and their rings, made by the agent's thread when the recording starts rather than
//! by each thread in its first hooked call.
//!
//! The one idea: when a root goes in on a busy thousand-thread target, every thread
//! enters it within milliseconds, and each one's first call used to map its own state
//! region (`mmap`, which takes the memory map's lock for writing while the other
//! threads fault pages in under it) and, past the rings there were, wait for one of
//! them to add a segment of rings. Those first calls were held 25–75 ms each (issue
//! 31's benchmark). So at the start the agent's thread, which runs raised, counts the
//! process's threads and makes room for them: one mapping holding a state region for
//! each thread not registered yet ([`take_region`] hands them out, one atomic add
//! each; a thread beyond them maps its own as before), and enough segments of rings.
//! Nothing is touched: the memory is the kernel's to commit only when a thread that
//! records writes it, as before.

use crate::hooks::thread_layout::REGION_BYTES;
use crate::runtime::recording;
use crate::runtime::ring_segments;
use crate::runtime::state::STATE;
use crate::sys::tasks;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use tendril_wire::rings::{MAX_RINGS, header};

/// Regions made ahead at most (their address space only: 5 MiB each).
const MOST_REGIONS: usize = 4096;
/// Below this many threads, the first calls' own mappings cost little: no room is
/// made ahead.
const FROM_THREADS: usize = 64;
/// Rings made ahead beyond one per thread, for threads started soon after.
const SPARE_RINGS: usize = 16;

/// The regions made ahead (see the module comment).
static POOL: RegionPool = RegionPool::new();

/// One mapping of regions made ahead (base 0 before), how many it holds, and how many
/// were handed out.
struct RegionPool {
    base: AtomicU64,
    regions: AtomicUsize,
    taken: AtomicUsize,
}

/// Makes room for the threads the process has now (see the module comment). Once per
/// process for the regions; the rings as many as the threads need each time. Runs on
/// an agent thread.
pub fn make_room_for_threads() {
    let mut threads = 0;
    tasks::for_each_thread(|_| threads += 1);
    if threads < FROM_THREADS {
        return;
    }
    let registered = STATE.registered_count.load(Ordering::Acquire);
    POOL.reserve(threads.saturating_sub(registered).min(MOST_REGIONS));
    add_rings_for(threads + SPARE_RINGS);
}

/// Adds segments of rings until there are `rings` in all (or no more may be added).
fn add_rings_for(rings: usize) {
    while ring_segments::ring_count() < rings.min(MAX_RINGS) {
        let seen = ring_segments::segment_count();
        let publish = |count| recording::set_header(header::SEGMENTS, count);
        if !ring_segments::add_segment(seen, publish) {
            return;
        }
    }
}

/// A zeroed region made ahead for the calling thread, if one is left. No system call:
/// the thread may be anywhere.
pub fn take_region() -> Option<*mut u8> {
    POOL.take()
}

impl RegionPool {
    const fn new() -> RegionPool {
        RegionPool {
            base: AtomicU64::new(0),
            regions: AtomicUsize::new(0),
            taken: AtomicUsize::new(0),
        }
    }

    /// Maps `count` regions in one mapping, unless it holds regions already.
    fn reserve(&self, count: usize) {
        if count == 0 || self.base.load(Ordering::Acquire) != 0 {
            return;
        }
        // SAFETY: an anonymous private mapping with no address hint; the result is
        // checked against MAP_FAILED. Never unmapped, as every thread's region.
        let mapped = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                count * REGION_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if mapped == libc::MAP_FAILED {
            return;
        }
        self.regions.store(count, Ordering::Release);
        self.base.store(mapped as u64, Ordering::Release);
    }

    /// The next region not handed out, if one is left.
    fn take(&self) -> Option<*mut u8> {
        let base = self.base.load(Ordering::Acquire);
        let regions = self.regions.load(Ordering::Acquire);
        if base == 0 || self.taken.load(Ordering::Relaxed) >= regions {
            return None;
        }
        let index = self.taken.fetch_add(1, Ordering::AcqRel);
        (index < regions).then(|| (base + (index * REGION_BYTES) as u64) as *mut u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_made_ahead_are_handed_out_once_each_then_none() {
        let pool = RegionPool::new();
        assert_eq!(pool.take(), None);
        pool.reserve(3);
        let taken: Vec<u64> = (0..3)
            .map(|_| pool.take().expect("a region made ahead") as u64)
            .collect();
        let base = pool.base.load(Ordering::Acquire);
        assert_eq!(
            taken,
            vec![
                base,
                base + REGION_BYTES as u64,
                base + 2 * REGION_BYTES as u64
            ]
        );
        assert_eq!(pool.take(), None);
        // Made once: a second reservation adds none.
        pool.reserve(3);
        assert_eq!(pool.take(), None);
        // The memory is zeroed and writable.
        // SAFETY: the region was mapped above, readable and writable, never unmapped.
        unsafe {
            let first = taken[0] as *mut u64;
            assert_eq!(*first, 0);
            *first = 7;
            assert_eq!(*first, 7);
        }
    }
}
