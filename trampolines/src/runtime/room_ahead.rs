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
//! each thread not registered yet (`thread_state` hands them out, one atomic add
//! each; a thread beyond them maps its own as before), and enough segments of rings.
//! Nothing is touched: the memory is the kernel's to commit only when a thread that
//! records writes it, as before. What is made ahead is bounded: at most
//! [`MOST_SEGMENTS_AHEAD`] segments (each a descriptor in the target), and no regions
//! at all when the process's address space is limited (`RLIMIT_AS`).

use crate::runtime::recording;
use crate::runtime::ring_segments;
use crate::runtime::state::STATE;
use crate::runtime::thread_state;
use crate::sys::tasks;
use std::sync::atomic::Ordering;
use tendril_wire::rings::{MAX_RINGS, header};

/// Regions made ahead at most (their address space only: 5 MiB each).
const MOST_REGIONS: usize = 4096;
/// Segments of rings made ahead at most (1,024 rings): each is a descriptor and 2 GiB
/// of address space in the target, and a process of tens of thousands of threads,
/// most of which never enter the roots, must not get hundreds of them. A thread that
/// finds every ring taken adds one, as before.
const MOST_SEGMENTS_AHEAD: usize = 4;
/// Below this many threads, the first calls' own mappings cost little: no room is
/// made ahead.
const FROM_THREADS: usize = 64;
/// Rings made ahead beyond one per thread, for threads started soon after.
const SPARE_RINGS: usize = 16;

/// Makes room for the threads the process has now (see the module comment). Once per
/// process for the regions; the rings as many as the threads need each time. Runs on
/// an agent thread.
pub fn make_room_for_threads() {
    let threads = tasks::thread_count();
    if threads < FROM_THREADS {
        return;
    }
    if !address_space_limited() {
        let registered = STATE.registered_count.load(Ordering::Acquire);
        thread_state::reserve_regions(threads.saturating_sub(registered).min(MOST_REGIONS));
    }
    add_rings_for(threads + SPARE_RINGS);
}

/// Whether the process's address space is limited (`RLIMIT_AS`): gigabytes reserved
/// for threads that may never record could then make its own mappings fail.
fn address_space_limited() -> bool {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct it is given.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } == 0;
    !read || limit.rlim_cur != libc::RLIM_INFINITY
}

/// Adds segments of rings until there are `rings` in all (or [`MOST_SEGMENTS_AHEAD`]
/// were added, or no more may be).
fn add_rings_for(rings: usize) {
    let most = ring_segments::segment_count() + MOST_SEGMENTS_AHEAD;
    while ring_segments::ring_count() < rings.min(MAX_RINGS) {
        let seen = ring_segments::segment_count();
        if seen >= most {
            return;
        }
        let publish = |count| recording::set_header(header::SEGMENTS, count);
        if !ring_segments::add_segment(seen, publish) {
            return;
        }
    }
}
