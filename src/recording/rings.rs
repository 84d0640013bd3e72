//! Reading a recording's rings: the agent's counters, the function registry, and
//! the events of every thread's ring (layout in `tendril_wire::rings`).
//!
//! The one idea: the controller is each ring's only consumer. It reads the producer's
//! `head`, copies the events up to it, and publishes its `tail`, which is all the
//! producer ever needs from it; a full ring makes the producer wait, so nothing is lost
//! as long as the controller keeps draining.

use crate::profile::OwnFunctions;
use memmap2::MmapMut;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use tendril_wire::events::{Event, HookShape};
use tendril_wire::rings::{self, header, ring};

/// The agent's counters for the recording (header fields).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AgentCounters {
    pub instrumented: u64,
    pub invoked: u64,
    pub indirect_call_sites: u64,
    pub lost_events: u64,
    pub pause_ticks: u64,
    pub refused_callees: u64,
    pub discoveries: u64,
    pub discovery_ticks: u64,
    pub discovery_waits: u64,
    pub discovery_wait_ticks: u64,
    pub ring_wait_ticks: u64,
    pub ring_fault_ticks: u64,
    pub indirect_sites_followed: u64,
    pub indirect_targets: u64,
}

/// A mapped rings file, and the extra segments of rings mapped so far.
pub struct Rings {
    map: MmapMut,
    segments: Vec<MmapMut>,
}

/// One ring's memory: its header, then its events.
struct Ring<'a> {
    bytes: &'a [u8],
    /// The events it holds ([`rings::ring_capacity`]).
    capacity: usize,
}

impl Rings {
    /// Checks and maps the rings' memory the agent handed over.
    pub fn from_descriptor(fd: OwnedFd) -> std::io::Result<Rings> {
        let map = map_sealed(fd, rings::FILE_BYTES, "rings")?;
        let rings = Rings {
            map,
            segments: Vec::new(),
        };
        if rings.word(header::MAGIC).load(Ordering::Acquire) != rings::MAGIC {
            return Err(std::io::Error::other(
                "the agent's rings are not tendril rings",
            ));
        }
        Ok(rings)
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= self.map.len());
        // SAFETY: in bounds and aligned (checked above); the mapping lives as long as
        // `self`, and the agent only writes this word atomically.
        unsafe { &*(self.map.as_ptr().add(offset) as *const AtomicU64) }
    }

    /// The TSC at which the agent stopped recording, once it has.
    pub fn stopped_at(&self) -> Option<u64> {
        let ticks = self.word(header::STOPPED_AT_TICKS).load(Ordering::Acquire);
        (ticks != 0).then_some(ticks)
    }

    pub fn counters(&self) -> AgentCounters {
        let read = |field| self.word(field).load(Ordering::Relaxed);
        AgentCounters {
            instrumented: read(header::INSTRUMENTED),
            invoked: read(header::INVOKED),
            indirect_call_sites: read(header::INDIRECT_CALL_SITES),
            lost_events: read(header::LOST_EVENTS),
            pause_ticks: read(header::PAUSE_TICKS),
            refused_callees: read(header::REFUSED_CALLEES),
            discoveries: read(header::DISCOVERIES),
            discovery_ticks: read(header::DISCOVERY_TICKS),
            discovery_waits: read(header::DISCOVERY_WAITS),
            discovery_wait_ticks: read(header::DISCOVERY_WAIT_TICKS),
            ring_wait_ticks: read(header::RING_WAIT_TICKS),
            ring_fault_ticks: read(header::RING_FAULT_TICKS),
            indirect_sites_followed: read(header::INDIRECT_SITES_FOLLOWED),
            indirect_targets: read(header::INDIRECT_TARGETS),
        }
    }

    /// The most recent discovery pauses, in TSC ticks (up to the header's capacity).
    pub fn discovery_samples(&self) -> Vec<u64> {
        let next = self
            .word(header::DISCOVERY_SAMPLE_NEXT)
            .load(Ordering::Acquire) as usize;
        (0..next.min(header::DISCOVERY_SAMPLES))
            .map(|i| {
                self.word(header::DISCOVERY_SAMPLE_WORDS + i * 8)
                    .load(Ordering::Relaxed)
            })
            .collect()
    }

    /// The in-situ calibration's functions, one per hook shape (see
    /// `header::IN_SITU_FUNCTIONS`).
    pub fn in_situ_functions(&self) -> OwnFunctions {
        let mut functions = OwnFunctions::default();
        for shape in HookShape::ALL {
            let word = self.word(header::in_situ_function(shape as usize));
            match word.load(Ordering::Acquire) {
                0 => {}
                id => functions.set(shape, (id - 1) as u32),
            }
        }
        functions
    }

    /// The agent's in-situ sample count for hook shape `shape`, and the `(inner,
    /// outer)` ticks per call of the samples after the first `read` (those still in
    /// the header's sample ring). A thread counts its sample before it writes it: a
    /// word still 0 is left out.
    pub fn in_situ_batches(&self, shape: HookShape, read: u64) -> (u64, Vec<(f64, f64)>) {
        let shape = shape as usize;
        let count = self
            .word(header::in_situ_sample_next(shape))
            .load(Ordering::Acquire);
        let first = read.max(count.saturating_sub(header::IN_SITU_SAMPLES as u64));
        let batches = (first..count)
            .map(|i| {
                let word = self.word(header::in_situ_sample(shape, i));
                word.load(Ordering::Relaxed)
            })
            .filter(|&word| word != 0)
            .map(rings::in_situ_ticks)
            .collect();
        (count, batches)
    }

    /// The address registered for function `id`.
    pub fn function_address(&self, id: u32) -> Option<u64> {
        ((id as usize) < rings::MAX_FUNCTIONS)
            .then(|| {
                self.word(rings::REGISTRY_OFFSET + id as usize * 8)
                    .load(Ordering::Acquire)
            })
            .filter(|&address| address != 0)
    }

    /// Extra segments of rings the agent has added (see `tendril_wire::rings`); those
    /// past [`Rings::mapped_segments`] are to be asked for.
    pub fn published_segments(&self) -> usize {
        (self.word(header::SEGMENTS).load(Ordering::Acquire) as usize).min(rings::MAX_SEGMENTS)
    }

    /// Extra segments mapped here.
    pub fn mapped_segments(&self) -> usize {
        self.segments.len()
    }

    /// Checks and maps the next extra segment, whose memory the agent handed over.
    pub fn add_segment(&mut self, fd: OwnedFd) -> std::io::Result<()> {
        let map = map_sealed(fd, rings::SEGMENT_BYTES, "ring segment")?;
        // The rings of a segment the controller has not read from yet start afresh.
        self.segments.push(map);
        Ok(())
    }

    /// Every ring mapped here.
    fn rings(&self) -> impl Iterator<Item = (usize, Ring<'_>)> {
        let count = rings::RING_COUNT + self.segments.len() * rings::SEGMENT_RINGS;
        (0..count).map(|index| {
            let (segment, offset) = rings::ring_place(index);
            let memory: &[u8] = match segment {
                0 => &self.map,
                k => &self.segments[k - 1],
            };
            let bytes = &memory[offset..offset + rings::RING_BYTES];
            let capacity = rings::ring_capacity(index);
            (index, Ring { bytes, capacity })
        })
    }

    /// Skips every event written so far: a recording reads only what comes after it
    /// started (frames of an earlier recording may still write their exits).
    pub fn skip_to_now(&self) {
        for (_, ring) in self.rings() {
            let head = ring.word(ring::HEAD).load(Ordering::Acquire);
            ring.word(ring::TAIL).store(head, Ordering::Release);
        }
    }

    /// Hands the new events of every ring from index `first` on to `sink(ring index,
    /// tid, events)` (in one or two slices, in order) and marks them read; stops early
    /// once `until` passes. Returns the number of events, and the ring to go on from
    /// when it stopped early.
    pub fn drain_from(
        &self,
        first: usize,
        until: std::time::Instant,
        mut sink: impl FnMut(usize, i32, &[Event]),
    ) -> (u64, Option<usize>) {
        let mut total = 0;
        for (index, ring) in self.rings().skip(first) {
            if total > 0 && std::time::Instant::now() >= until {
                return (total, Some(index));
            }
            if ring.word32(ring::STATE).load(Ordering::Acquire) != rings::RING_ACTIVE {
                continue;
            }
            let tid = ring.word32(ring::TID).load(Ordering::Acquire) as i32;
            let head = ring.word(ring::HEAD).load(Ordering::Acquire);
            let tail_word = ring.word(ring::TAIL);
            let tail = tail_word.load(Ordering::Relaxed);
            if head <= tail {
                continue;
            }
            let capacity = ring.capacity as u64;
            let events = ring.events();
            let (start, end) = ((tail % capacity) as usize, (head % capacity) as usize);
            if head - tail >= capacity || end <= start {
                // Wrapped: the tail's end of the ring first, then its start.
                sink(index, tid, &events[start..]);
                if end > 0 {
                    sink(index, tid, &events[..end]);
                }
            } else {
                sink(index, tid, &events[start..end]);
            }
            total += head - tail;
            tail_word.store(head, Ordering::SeqCst);
            ring.wake_its_thread();
        }
        (total, None)
    }
}

impl Ring<'_> {
    fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= rings::RING_HEADER_BYTES);
        // SAFETY: in the ring's header and aligned (the layout's offsets are); the
        // mapping outlives `self`, and the agent writes this word only atomically.
        unsafe { &*(self.bytes.as_ptr().add(offset) as *const AtomicU64) }
    }

    fn word32(&self, offset: usize) -> &AtomicU32 {
        assert!(offset.is_multiple_of(4) && offset + 4 <= rings::RING_HEADER_BYTES);
        // SAFETY: as in `word`.
        unsafe { &*(self.bytes.as_ptr().add(offset) as *const AtomicU32) }
    }

    fn events(&self) -> &[Event] {
        let events = &self.bytes[rings::RING_HEADER_BYTES..];
        assert!(events.len() >= self.capacity * Event::SIZE);
        // SAFETY: the ring's events, in bounds (checked above) and 16-byte aligned (the
        // layout's offsets are); `Event` is plain data. The producer writes only slots
        // past `head`, which the caller does not read.
        unsafe { std::slice::from_raw_parts(events.as_ptr() as *const Event, self.capacity) }
    }

    /// Wakes the ring's thread if it waits for room (the agent's `wait_for_the_drain`:
    /// it sleeps on the tail's low half, and says so in `WAITING`). Call it after the
    /// tail moved, with a store at least as strong as `SeqCst`, so that either the
    /// thread sees the new tail or this sees it waiting.
    fn wake_its_thread(&self) {
        if self.word32(ring::WAITING).load(Ordering::SeqCst) == 0 {
            return;
        }
        let tail_low = self.word32(ring::TAIL);
        // SAFETY: FUTEX_WAKE on an aligned u32 of the shared mapping (not private: the
        // waiter is in another process, mapping the same memory).
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                tail_low.as_ptr(),
                libc::FUTEX_WAKE,
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
            );
        }
    }
}

/// Checks that `fd` is memory sealed at its full size of `len` bytes, and maps it.
fn map_sealed(fd: OwnedFd, len: usize, what: &str) -> std::io::Result<MmapMut> {
    let refuse = |why: String| std::io::Error::other(format!("the agent's {what} {why}"));
    let seals = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GET_SEALS)
        .map_err(|e| refuse(format!("is not sealed memory ({e})")))?;
    let required = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    if seals & required != required {
        return Err(refuse("may change size (not sealed)".into()));
    }
    let file = std::fs::File::from(fd);
    let metadata = file.metadata()?;
    if !metadata.is_file() || metadata.len() != len as u64 {
        return Err(refuse(format!("is {} bytes, not {len}", metadata.len())));
    }
    // SAFETY: a shared mapping of memory sealed at its full size, so no page can
    // disappear under it; all shared words are accessed as atomics, events with reads
    // behind the producer's published head.
    unsafe { MmapMut::map_mut(&file) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd};

    /// Rings as the agent makes them: sealed memory with the magic; rings `active`
    /// each hold `events` unread events (`head` past `tail`).
    fn rings_holding(active: &[usize], events: u64) -> Rings {
        // SAFETY: memfd_create with a valid name and flags; the result is checked.
        let raw = unsafe { libc::memfd_create(c"rings".as_ptr(), libc::MFD_ALLOW_SEALING) };
        assert!(raw >= 0);
        // SAFETY: a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let file = std::fs::File::from(fd.try_clone().unwrap());
        file.set_len(rings::FILE_BYTES as u64).unwrap();
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        // SAFETY: F_ADD_SEALS on an open memfd.
        let sealed = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) };
        assert_eq!(sealed, 0);
        {
            // SAFETY: a shared mapping of the sealed memory, written before it is read.
            let mut memory = unsafe { MmapMut::map_mut(&file) }.unwrap();
            let mut put = |offset: usize, value: u64| {
                memory[offset..offset + 8].copy_from_slice(&value.to_ne_bytes());
            };
            put(header::MAGIC, rings::MAGIC);
            for &index in active {
                let (_, at) = rings::ring_place(index);
                put(
                    at + ring::TID,
                    (1000 + index as u64) | ((rings::RING_ACTIVE as u64) << 32),
                );
                put(at + ring::HEAD, events);
            }
            Rings::from_descriptor(fd).unwrap()
        }
    }

    #[test]
    fn a_drain_cut_short_says_where_to_go_on_and_reads_every_ring_once() {
        let rings = rings_holding(&[3, 7, 90], 5);
        let mut seen = Vec::new();
        // A deadline already past: one ring with events, then it stops.
        let (events, next) = rings.drain_from(0, std::time::Instant::now(), |ring, tid, e| {
            seen.push((ring, tid, e.len()))
        });
        assert_eq!((events, next), (5, Some(4)));
        let far = std::time::Instant::now() + std::time::Duration::from_secs(3600);
        let (events, next) =
            rings.drain_from(4, far, |ring, tid, e| seen.push((ring, tid, e.len())));
        assert_eq!((events, next), (10, None));
        assert_eq!(seen, [(3, 1003, 5), (7, 1007, 5), (90, 1090, 5)]);
        // Read: nothing more.
        let (events, next) = rings.drain_from(0, far, |_, _, _| panic!("read twice"));
        assert_eq!((events, next), (0, None));
    }
}
