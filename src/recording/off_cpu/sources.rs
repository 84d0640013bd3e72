//! Where the off-CPU watch's context-switch records come from: one perf event per core,
//! or one per thread.
//!
//! The one idea: the kernel pays for a per-thread event at every switch of its thread
//! (it schedules the thread's perf context out and in), and a busy server switches
//! hundreds of thousands of times a second. On a 1,000-thread target switching about
//! 100,000 times a second, per-thread events cost it 43% of a core, one event per core
//! 20% (`benches/scripts/switch_events_cost.sh`); on a 2-core machine already busy,
//! that difference is the time every thread then waits for a core. But a core's
//! records are every thread's switches on it, other processes' too (the watch keeps
//! the target's and tendril's own): the kernel then writes a record at every switch on
//! the machine. So the watch opens one event per core for a target of many threads,
//! when it may (root, or `CAP_PERFMON`), and one per thread of the target otherwise.

use crate::sampling::perf::{OpenError, PerfEvent, Ring, SwitchScope};
use crate::sampling::records::{self, Record, Switch};
use std::collections::HashMap;
use std::io;

/// Data pages of each thread's ring: 64 KiB, about 2,700 switches between two drains.
const THREAD_RING_PAGES: usize = 16;
/// Data pages of each core's ring: 4 MiB, about 100,000 records of 40 bytes (a switch
/// is two: out, then in), a third of a second of a core that switches 150,000 times a
/// second, between two drains; fewer on machines of many cores, down to
/// [`MIN_CORE_RING_PAGES`].
const CORE_RING_PAGES: usize = 1024;
/// All the cores' rings together stay within this many pages (64 MiB).
const ALL_CORE_RING_PAGES: usize = 16_384;
const MIN_CORE_RING_PAGES: usize = 64;

/// An open switch event and its ring.
pub struct Watched {
    _event: PerfEvent,
    ring: Ring,
}

impl Watched {
    fn open(scope: SwitchScope, data_pages: usize) -> Result<Watched, OpenError> {
        // Nothing waits on the rings (the recorder reads them when it polls): a wake-up
        // only when one is half full, as each costs the core an interrupt.
        let wakeup_bytes = (data_pages * crate::sampling::perf::page_size() / 2) as u32;
        let event = PerfEvent::open_switch_records(scope, wakeup_bytes)?;
        let ring = Ring::map(&event, data_pages).map_err(OpenError::Other)?;
        Ok(Watched {
            _event: event,
            ring,
        })
    }

    /// Appends the ring's switches to `switches`, and counts the records the kernel
    /// dropped in `lost`.
    fn read(&mut self, switches: &mut Vec<Switch>, lost: &mut u64) {
        self.ring
            .drain(|bytes| match records::parse_switch_records(bytes) {
                Record::Switch(switch) => switches.push(switch),
                Record::Lost { count } => *lost += count,
                _ => {}
            });
    }
}

/// The events the records are read from.
pub enum Sources {
    /// One per core: every thread's switches.
    Cores(Vec<Watched>),
    /// One per watched thread.
    Threads(HashMap<i32, Watched>),
}

impl Sources {
    /// One event on each online core; an error if the kernel refuses one (the caller
    /// then watches threads).
    pub fn on_cores() -> Result<Sources, OpenError> {
        let cores = online_cores().map_err(OpenError::Other)?;
        let share =
            (ALL_CORE_RING_PAGES / cores.len().max(1)).clamp(MIN_CORE_RING_PAGES, CORE_RING_PAGES);
        // A power of two, as the kernel wants.
        let pages = 1 << share.ilog2();
        let watched = cores
            .into_iter()
            .map(|core| Watched::open(SwitchScope::Core(core), pages))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Sources::Cores(watched))
    }

    /// No thread yet: each is added with [`Sources::watch_thread`].
    pub fn on_threads() -> Sources {
        // One descriptor per thread: a process of thousands of threads needs more than
        // the usual soft limit of 1,024.
        raise_open_files_limit();
        Sources::Threads(HashMap::new())
    }

    pub fn per_core(&self) -> bool {
        matches!(self, Sources::Cores(_))
    }

    /// Opens thread `tid`'s records, if they are read per thread and it has none yet.
    pub fn watch_thread(&mut self, tid: i32) -> Result<(), OpenError> {
        match self {
            Sources::Threads(threads) if !threads.contains_key(&tid) => {
                let watched = Watched::open(SwitchScope::Thread(tid), THREAD_RING_PAGES)?;
                threads.insert(tid, watched);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Whether thread `tid` has records of its own.
    pub fn watches_thread(&self, tid: i32) -> bool {
        match self {
            Sources::Threads(threads) => threads.contains_key(&tid),
            Sources::Cores(_) => true,
        }
    }

    /// Lets go of the threads `alive` says have ended.
    pub fn retain_threads(&mut self, alive: impl Fn(i32) -> bool) {
        if let Sources::Threads(threads) = self {
            threads.retain(|&tid, _| alive(tid));
        }
    }

    /// Appends every switch written since the last read, ring by ring, and counts the
    /// records the kernel dropped in `lost`.
    pub fn read(&mut self, switches: &mut Vec<Switch>, lost: &mut u64) {
        match self {
            Sources::Cores(cores) => cores.iter_mut().for_each(|w| w.read(switches, lost)),
            Sources::Threads(threads) => threads.values_mut().for_each(|w| w.read(switches, lost)),
        }
    }
}

/// The online cores' numbers (`/sys/devices/system/cpu/online`, such as `0-3,6`).
fn online_cores() -> io::Result<Vec<u32>> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online")?;
    parse_core_list(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unreadable list of online cores {text:?}"),
        )
    })
}

fn parse_core_list(text: &str) -> Option<Vec<u32>> {
    let mut cores = Vec::new();
    for part in text.trim().split(',') {
        match part.split_once('-') {
            Some((first, last)) => cores.extend(first.parse::<u32>().ok()?..=last.parse().ok()?),
            None => cores.push(part.parse().ok()?),
        }
    }
    (!cores.is_empty()).then_some(cores)
}

/// Raises this process's soft limit of open files to its hard limit (as `perf` does).
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read or write one rlimit through a valid pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_online_cores_list_reads_ranges_and_single_cores() {
        assert_eq!(parse_core_list("0-3,6\n"), Some(vec![0, 1, 2, 3, 6]));
        assert_eq!(parse_core_list("0"), Some(vec![0]));
        assert_eq!(parse_core_list(""), None);
        assert_eq!(parse_core_list("a-b"), None);
    }
}
