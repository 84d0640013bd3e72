//! Rings beyond the rings file's own: extra segments, added when every ring is taken.
//!
//! The one idea: a thread that records needs a ring of its own, and a server may have
//! a thousand threads in the call graph at once. The rings file has room for
//! [`RING_COUNT`] rings; when a thread finds every one of them (and of the segments
//! added so far) taken by a live thread, it adds a segment of [`SEGMENT_RINGS`] more —
//! a memfd, sized, sealed and mapped with raw system calls (the thread may be anywhere,
//! inside a signal handler or holding the allocator's lock) — and publishes it in the
//! rings' header. The controller sees the count grow and asks for the segment's
//! memory (`Request::RingSegment`). One thread adds a segment at a time; the others
//! sleep until it is done (a futex), and look again.
//!
//! [`RING_COUNT`]: tendril_wire::rings::RING_COUNT
//! [`SEGMENT_RINGS`]: tendril_wire::rings::SEGMENT_RINGS

use crate::runtime::state::STATE;
use crate::sys;
use std::sync::atomic::Ordering;
use tendril_wire::rings::{self, MAX_SEGMENTS, SEGMENT_BYTES};

/// How long a thread waits for another to add a segment (a few system calls, done
/// within microseconds unless the machine keeps that thread from a core).
const WAIT_NS: u64 = 2_000_000_000;

/// Rings there are now: the file's and every extra segment's.
pub fn ring_count() -> usize {
    rings_in(segment_count())
}

/// Extra segments there are now.
pub fn segment_count() -> usize {
    STATE.segment_count.load(Ordering::Acquire)
}

/// Rings there are with `segments` extra segments.
pub fn rings_in(segments: usize) -> usize {
    rings::RING_COUNT + segments * rings::SEGMENT_RINGS
}

/// The address of ring `index`'s header (see `tendril_wire::rings::ring_place`), if
/// its memory is mapped.
pub fn ring_address(file: *mut u8, index: usize) -> Option<u64> {
    let (segment, offset) = rings::ring_place(index);
    let base = match segment {
        0 => file,
        k if k <= STATE.segment_count.load(Ordering::Acquire) => {
            STATE.segments[k - 1].load(Ordering::Acquire)
        }
        _ => return None,
    };
    (!base.is_null()).then(|| base as u64 + offset as u64)
}

/// Adds one segment to the `seen` segments the caller found full, unless another
/// thread added one since or is adding one (then waits for it a moment); `publish`
/// gets the new count for the rings' header. Returns whether there may be new rings to
/// look at. Signal-safe: raw system calls only, no allocation.
pub fn add_segment(seen: usize, publish: impl Fn(u64)) -> bool {
    let before = seen;
    if STATE.segment_count.load(Ordering::Acquire) != before {
        return true;
    }
    if STATE
        .adding_segment
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        // The other thread makes a few system calls; on a loaded machine it may wait for
        // a core meanwhile, so the wait is long enough for that, not a number of turns.
        // Asleep, not yielding: hundreds of threads calling `sched_yield` in a loop took
        // the cores from the very thread they waited for.
        let give_up = sys::monotonic_ns() + WAIT_NS;
        loop {
            let ended = STATE.segment_adds_ended.load(Ordering::Acquire);
            if STATE.segment_count.load(Ordering::Acquire) != before
                || !STATE.adding_segment.load(Ordering::Acquire)
            {
                return true;
            }
            let now = sys::monotonic_ns();
            if now >= give_up {
                return false;
            }
            sys::futex_wait_timeout(&STATE.segment_adds_ended, ended, give_up - now);
        }
    }
    let added = before < MAX_SEGMENTS
        && STATE.segment_count.load(Ordering::Acquire) == before
        && map_new_segment(before);
    if added {
        publish(before as u64 + 1);
    }
    STATE.adding_segment.store(false, Ordering::Release);
    STATE.segment_adds_ended.fetch_add(1, Ordering::Release);
    sys::futex_wake_all(&STATE.segment_adds_ended);
    added || STATE.segment_count.load(Ordering::Acquire) != before
}

/// Makes segment number `index + 1`: a sealed memfd of [`SEGMENT_BYTES`], mapped.
fn map_new_segment(index: usize) -> bool {
    // SAFETY: the name is a valid NUL-terminated string; memfd_create returns a new
    // descriptor or a negative errno.
    let fd = unsafe {
        sys::syscall4(
            libc::SYS_memfd_create,
            c"tendril-rings".as_ptr() as u64,
            (libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) as u64,
            0,
            0,
        )
    };
    if fd < 0 {
        return false;
    }
    let seals = (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL) as u64;
    // SAFETY: plain system calls on the descriptor just made.
    let ready = unsafe {
        sys::syscall4(libc::SYS_ftruncate, fd as u64, SEGMENT_BYTES as u64, 0, 0) == 0
            && sys::syscall4(
                libc::SYS_fcntl,
                fd as u64,
                libc::F_ADD_SEALS as u64,
                seals,
                0,
            ) == 0
    };
    // SAFETY: maps the whole memfd, sized above and sealed against shrinking, shared so
    // the controller sees the writes; never unmapped (as the rings file).
    let mapped = ready.then(|| unsafe {
        sys::syscall6(
            libc::SYS_mmap,
            0,
            SEGMENT_BYTES as u64,
            (libc::PROT_READ | libc::PROT_WRITE) as u64,
            libc::MAP_SHARED as u64,
            fd as u64,
            0,
        )
    });
    match mapped {
        Some(address) if address > 0 => {
            STATE.segments[index].store(address as *mut u8, Ordering::Release);
            STATE.segment_fds[index].store(fd as i32, Ordering::Release);
            STATE.segment_count.store(index + 1, Ordering::Release);
            true
        }
        _ => {
            sys::close_fd(fd as i32);
            false
        }
    }
}

/// A new descriptor of extra segment `index` (1-based), for the controller.
pub fn segment_descriptor(index: usize) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::BorrowedFd;
    if index == 0 || index > STATE.segment_count.load(Ordering::Acquire) {
        return None;
    }
    let fd = STATE.segment_fds[index - 1].load(Ordering::Acquire);
    if fd < 0 {
        return None;
    }
    // SAFETY: the descriptor stays open for the life of the process (never closed
    // once published).
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    borrowed.try_clone_to_owned().ok()
}

/// In a forked child: the segments are the parent's too; the child writes none.
pub fn forget_in_forked_child() {
    STATE.segment_count.store(0, Ordering::Release);
}

/// Gives back the memory of every ring's events, once no recording runs and the
/// controller that drained them is gone (a session ended): a recording of a few threads
/// for a second left megabytes in the target for good. The events' pages are punched
/// out of the memfds (`fallocate(PUNCH_HOLE)`: the mappings stay, and a hook that still
/// writes an exit finds fresh zeroed memory there); each ring is marked unpopulated and
/// each thread's ring limit brought down to its head, so its next event takes the slow
/// path, which faults the memory in again ahead of it. Returns the bytes given back.
pub fn release_ring_memory() -> u64 {
    use std::os::fd::AsRawFd;
    if STATE.recording_active.load(Ordering::Acquire) != 0 {
        return 0;
    }
    let file = STATE.rings.load(Ordering::Acquire);
    let held = STATE.rings_fd.lock().unwrap_or_else(|p| p.into_inner());
    let Some(file_fd) = held.as_ref().map(|fd| fd.as_raw_fd()) else {
        return 0;
    };
    if file.is_null() {
        return 0;
    }
    let mut released = 0;
    for index in 0..ring_count() {
        let (segment, offset) = rings::ring_place(index);
        let fd = match segment {
            0 => file_fd,
            k => STATE.segment_fds[k - 1].load(Ordering::Acquire),
        };
        let page = 4096;
        let start = (offset + rings::RING_HEADER_BYTES).next_multiple_of(page);
        let end = (offset + rings::RING_BYTES) / page * page;
        // SAFETY: punches whole pages of the ring's events out of a memfd this agent
        // made and keeps open; the mapping stays valid (the pages read as zeros).
        let punched = unsafe {
            libc::fallocate(
                fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                start as libc::off_t,
                (end - start) as libc::off_t,
            )
        };
        if punched == 0 {
            released += (end - start) as u64;
            if let Some(ring) = ring_address(file, index) {
                // SAFETY: the ring's header word, in mapped memory; the agent's alone.
                let populated = unsafe {
                    &*((ring + tendril_wire::rings::ring::POPULATED as u64)
                        as *const std::sync::atomic::AtomicU64)
                };
                populated.store(0, Ordering::Release);
                // SAFETY: as above, the ring's populate request word.
                let wanted = unsafe {
                    &*((ring + tendril_wire::rings::ring::POPULATE_WANTED as u64)
                        as *const std::sync::atomic::AtomicU64)
                };
                wanted.store(0, Ordering::Release);
            }
        }
    }
    drop(held);
    for state in crate::runtime::thread_state::registered_threads() {
        // Nothing is written past the head without the slow path now: it has no memory.
        state.ring_room_limit().store(0, Ordering::Relaxed);
        state
            .ring_limit()
            .store(state.ring_head().load(Ordering::Relaxed), Ordering::Relaxed);
    }
    released
}
