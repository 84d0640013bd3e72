//! A sampling session over every thread of one process: open the events, drain their
//! rings, walk and name each sample, and hand out the trees or a profile.
//!
//! The one idea: the target is never stopped, signalled or written to. Each thread has
//! its own event and ring (a per-thread event cannot follow threads it starts, so the
//! thread list is read again every [`RESCAN_INTERVAL`] and new threads get events of
//! their own); the controller waits in `poll` on all rings at once, and everything after
//! that — unwinding, symbolising, building trees — happens here, on the controller's
//! core. If the target loads a library while it is sampled, the first frame found
//! outside every known module makes the symbol and unwind tables be read again (at most
//! once every [`RELOAD_INTERVAL`]).

use std::collections::BTreeMap;
use std::io;
use std::time::{Duration, Instant};

use thiserror::Error;

use super::perf::{EventKind, OpenError, PerfEvent, Ring, page_size};
use super::records::{Record, Switch, parse};
use super::tree::SampledTrees;
use super::unwind::StackUnwinder;
use super::walker::SampleWalker;
use crate::process::{self, AttachError};
use crate::profile::{
    Calibration, MergedProfile, ModuleMapping, Profile, SamplingInfo, Stats, ThreadProfile,
};
use crate::symbols::{ProcessSymbols, SymbolError};

/// How often the thread list is read again for threads started meanwhile.
pub const RESCAN_INTERVAL: Duration = Duration::from_millis(100);
/// The smallest ring tried when the locked-memory limit refuses larger ones.
pub const MIN_RING_PAGES: usize = 16;

/// Which time a sample stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// Each thread's CPU time: a sample every 1/rate s that the thread runs.
    Cpu,
    /// CPU time plus the time each thread is switched out (asleep, blocked, waiting for
    /// a core), charged to the stack where it went to sleep.
    Wall,
}

impl Clock {
    pub fn name(self) -> &'static str {
        match self {
            Clock::Cpu => "cpu",
            Clock::Wall => "wall",
        }
    }
}

/// How to sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SamplerOptions {
    /// Samples per second of each thread's CPU time.
    pub rate_hz: u32,
    pub clock: Clock,
    /// How much of the stack each sample copies (a multiple of 8, at most 65528).
    pub stack_bytes: u32,
    /// Data pages of each thread's ring (a power of two).
    pub ring_pages: usize,
}

impl Default for SamplerOptions {
    fn default() -> Self {
        SamplerOptions {
            rate_hz: 499,
            clock: Clock::Cpu,
            stack_bytes: 32 * 1024,
            ring_pages: 128,
        }
    }
}

/// Why sampling could not start. Each message is one line for the user.
#[derive(Debug, Error)]
pub enum SampleError {
    #[error(transparent)]
    Target(#[from] AttachError),
    /// The kernel refused perf events; the message says what to change.
    #[error("{0}")]
    Refused(String),
    #[error("cannot sample process {pid}: {source}")]
    Perf { pid: i32, source: io::Error },
    #[error(transparent)]
    Symbols(#[from] SymbolError),
    #[error("process {0} has no threads left to sample")]
    NoThreads(i32),
}

/// One thread's events and ring.
struct ThreadEvents {
    clock: PerfEvent,
    /// Wall clock only: the switch event, whose records go to `clock`'s ring.
    switches: Option<PerfEvent>,
    ring: Ring,
    /// Wall clock: the stack where the thread last went to sleep, and when.
    asleep: Option<(Vec<u32>, u64)>,
    /// The kernel said the thread is gone (POLLHUP); dropped after a last drain.
    hung_up: bool,
}

/// A running sampling session.
pub struct Sampler {
    pid: i32,
    options: SamplerOptions,
    threads: BTreeMap<u32, ThreadEvents>,
    names: BTreeMap<u32, String>,
    work: SampleWalker,
    started: Instant,
    stopped_after: Option<Duration>,
    last_scan: Instant,
    exe: String,
}

impl Sampler {
    /// Opens events on every thread of `pid` and starts them.
    pub fn start(pid: i32, options: SamplerOptions) -> Result<Sampler, SampleError> {
        check_target(pid)?;
        let symbols = ProcessSymbols::load(pid)?;
        Sampler::start_with_symbols(pid, options, symbols)
    }

    /// As [`Sampler::start`], with the process's symbols already read (the live UI has
    /// them for its root picker).
    pub fn start_with_symbols(
        pid: i32,
        options: SamplerOptions,
        symbols: ProcessSymbols,
    ) -> Result<Sampler, SampleError> {
        check_target(pid)?;
        let unwinder = StackUnwinder::for_process(pid)?;
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let now = Instant::now();
        let mut sampler = Sampler {
            pid,
            options,
            threads: BTreeMap::new(),
            names: BTreeMap::new(),
            work: SampleWalker::new(
                pid,
                symbols,
                unwinder,
                1_000_000_000 / u64::from(options.rate_hz.max(1)),
            ),
            started: now,
            stopped_after: None,
            last_scan: now,
            exe,
        };
        sampler.scan_threads()?;
        if sampler.threads.is_empty() {
            return Err(SampleError::NoThreads(pid));
        }
        sampler.started = Instant::now();
        Ok(sampler)
    }

    /// The process sampled.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn options(&self) -> SamplerOptions {
        self.options
    }

    /// Threads sampled right now.
    pub fn thread_count(&self) -> usize {
        self.threads.len()
    }

    /// Samples the kernel dropped so far (the rings were full).
    pub fn lost_samples(&self) -> u64 {
        self.work.lost
    }

    /// What the samples built so far.
    pub fn trees(&self) -> &SampledTrees {
        &self.work.trees
    }

    /// What could not be read of the names of the process's JIT code, and why (each
    /// said once).
    pub fn take_notes(&mut self) -> Vec<String> {
        self.work.take_notes()
    }

    /// Where the names of JIT code came from: `N pieces of JIT code named from FILES`,
    /// if any file named some.
    pub fn jit_summary(&self) -> Option<String> {
        let sources = self.work.jit_sources();
        if sources.is_empty() {
            return None;
        }
        let files: Vec<String> = sources
            .iter()
            .map(|(path, _)| path.display().to_string())
            .collect();
        Some(format!(
            "{} pieces of JIT code named from {} (as the process sees them)",
            self.work.jit().len(),
            files.join(", ")
        ))
    }

    /// How long sampling has run.
    pub fn elapsed(&self) -> Duration {
        self.stopped_after.unwrap_or_else(|| self.started.elapsed())
    }

    /// Whether the process has exited (every thread's event hung up and none is left).
    pub fn target_exited(&self) -> bool {
        self.threads.is_empty() && process::is_gone_or_exiting(self.pid)
    }

    /// Waits up to `timeout` for samples, then reads every ring. Also picks up threads
    /// started meanwhile and drops threads that ended.
    pub fn poll(&mut self, timeout: Duration) -> Result<(), SampleError> {
        let mut fds: Vec<libc::pollfd> = self
            .threads
            .values()
            .map(|t| libc::pollfd {
                fd: t.clock.raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        if fds.is_empty() {
            std::thread::sleep(timeout);
        } else {
            let millis = timeout.as_millis().min(i32::MAX as u128) as i32;
            // SAFETY: fds is a valid array of pollfd of the length given, alive for the
            // call; poll only writes revents.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, millis) };
            if ready < 0 {
                let error = io::Error::last_os_error();
                if error.kind() != io::ErrorKind::Interrupted {
                    return Err(SampleError::Perf {
                        pid: self.pid,
                        source: error,
                    });
                }
            }
            for (thread, fd) in self.threads.values_mut().zip(&fds) {
                if fd.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                    thread.hung_up = true;
                }
            }
        }
        self.drain();
        self.threads.retain(|_, thread| !thread.hung_up);
        if self.last_scan.elapsed() >= RESCAN_INTERVAL {
            self.last_scan = Instant::now();
            if !process::is_gone_or_exiting(self.pid) {
                self.scan_threads()?;
            }
        }
        self.work.reload_tables_if_needed();
        Ok(())
    }

    /// Reads every ring once.
    pub fn drain(&mut self) {
        let work = &mut self.work;
        for (&tid, thread) in self.threads.iter_mut() {
            let clock_id = thread.clock.id;
            let switch_id = thread.switches.as_ref().map(|e| e.id);
            let ThreadEvents { ring, asleep, .. } = thread;
            ring.drain(|bytes| match parse(bytes) {
                Record::Sample(sample) if sample.event_id == clock_id => {
                    if let Some(stack) = work.stack_of(&sample) {
                        work.trees.add(sample.tid, &stack, work.period_ns);
                    }
                }
                Record::Sample(sample) if Some(sample.event_id) == switch_id => {
                    *asleep = work.stack_of(&sample).map(|stack| (stack, sample.time_ns));
                }
                Record::Switch(Switch {
                    out: false,
                    time_ns,
                    ..
                }) => {
                    if let Some((stack, since)) = asleep.take() {
                        work.trees.add(tid, &stack, time_ns.saturating_sub(since));
                    }
                }
                Record::Lost { count } => work.lost += count,
                _ => {}
            });
        }
    }

    /// Stops every event, reads what is left and returns the profile. A wall-clock
    /// thread still asleep is charged up to now.
    pub fn finish(mut self) -> Profile {
        for thread in self.threads.values() {
            let _ = thread.clock.disable();
            if let Some(switches) = &thread.switches {
                let _ = switches.disable();
            }
        }
        self.stopped_after = Some(self.started.elapsed());
        self.drain();
        let now = monotonic_ns();
        for (&tid, thread) in self.threads.iter_mut() {
            if let Some((stack, since)) = thread.asleep.take() {
                self.work.trees.add(tid, &stack, now.saturating_sub(since));
            }
        }
        self.profile()
    }

    /// The profile of what was sampled so far.
    pub fn profile(&self) -> Profile {
        let trees = &self.work.trees;
        let threads = trees
            .threads
            .iter()
            .map(|(&tid, tree)| ThreadProfile {
                tid,
                name: self.names.get(&tid).cloned().unwrap_or_default(),
                roots: tree.to_nodes(&trees.functions),
                stack_switches: 0,
                dropped_frames: 0,
            })
            .collect();
        let modules = self
            .work
            .symbols()
            .modules()
            .iter()
            .map(|m| ModuleMapping {
                name: m.name.clone(),
                path: m.path.display().to_string(),
                start: m.start,
                end: m.end,
            })
            .collect();
        Profile {
            format: Profile::FORMAT.to_owned(),
            version: Profile::VERSION,
            pid: self.pid as u32,
            exe: self.exe.clone(),
            roots: Vec::new(),
            scheme: "sampled".to_owned(),
            calibration: Calibration {
                tsc_hz: 0,
                inner_ns: 0.0,
                outer_ns: 0.0,
                inner_spread_ns: 0.0,
                outer_spread_ns: 0.0,
                ..Default::default()
            },
            stats: Stats {
                events: trees.samples,
                lost_events: self.work.lost,
                ..Stats::default()
            },
            threads,
            merged: MergedProfile {
                roots: trees.merged.to_nodes(&trees.functions),
            },
            duration_ns: self.elapsed().as_nanos() as u64,
            discovery: None,
            gross: Vec::new(),
            modules,
            trace: None,
            sampling: Some(SamplingInfo {
                clock: self.options.clock.name().to_owned(),
                rate_hz: u64::from(self.options.rate_hz),
                samples: trees.samples,
                lost_samples: self.work.lost,
                truncated_stacks: self.work.truncated,
                stack_bytes: u64::from(self.options.stack_bytes),
            }),
        }
    }

    /// Opens events on threads not sampled yet.
    fn scan_threads(&mut self) -> Result<(), SampleError> {
        let tids = match process::thread_ids(self.pid) {
            Ok(tids) => tids,
            Err(_) if !self.threads.is_empty() => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        for tid in tids {
            if self.threads.contains_key(&(tid as u32)) {
                continue;
            }
            match self.open_thread(tid) {
                Ok(Some(events)) => {
                    self.names
                        .insert(tid as u32, process::thread_name(self.pid, tid));
                    self.threads.insert(tid as u32, events);
                }
                Ok(None) => {} // the thread ended meanwhile
                Err(e) => {
                    // A later thread refused while others are sampled: keep going.
                    if self.threads.is_empty() {
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }

    fn open_thread(&self, tid: i32) -> Result<Option<ThreadEvents>, SampleError> {
        let options = self.options;
        let ring_bytes = page_size() * options.ring_pages;
        let wakeup = (ring_bytes / 4) as u32;
        let open = |kind, with_kernel| {
            PerfEvent::open(tid, kind, options.stack_bytes, with_kernel, wakeup)
        };
        let period_ns = 1_000_000_000 / u64::from(options.rate_hz.max(1));
        let failed = |error: OpenError, with_kernel: bool| match error {
            OpenError::Gone => Ok(None),
            OpenError::Refused(e) => Err(SampleError::Refused(refusal_message(
                self.pid,
                with_kernel,
                &e,
            ))),
            OpenError::Other(e) => Err(SampleError::Perf {
                pid: self.pid,
                source: e,
            }),
        };
        let clock = match open(EventKind::CpuClock { period_ns }, false) {
            Ok(event) => event,
            Err(e) => return failed(e, false),
        };
        let switches = match options.clock {
            Clock::Cpu => None,
            Clock::Wall => match open(EventKind::ContextSwitches, true) {
                Ok(event) => Some(event),
                Err(e) => return failed(e, true),
            },
        };
        let perf_error = |source| SampleError::Perf {
            pid: self.pid,
            source,
        };
        let ring = map_ring(&clock, options.ring_pages).map_err(|e| {
            if e.raw_os_error() == Some(libc::EPERM) {
                SampleError::Refused(format!(
                    "cannot sample process {}: the kernel refused the sample buffers \
                     (kernel.perf_event_mlock_kb) — run as root, raise \
                     kernel.perf_event_mlock_kb, or sample fewer threads",
                    self.pid
                ))
            } else {
                perf_error(e)
            }
        })?;
        if let Some(switches) = &switches {
            switches.redirect_to(&clock).map_err(perf_error)?;
            switches.enable().map_err(perf_error)?;
        }
        clock.enable().map_err(perf_error)?;
        Ok(Some(ThreadEvents {
            clock,
            switches,
            ring,
            asleep: None,
            hung_up: false,
        }))
    }
}

/// Maps `event`'s ring with `pages` data pages, or fewer (down to [`MIN_RING_PAGES`])
/// where the kernel's limit on locked sample buffers refuses that many.
fn map_ring(event: &PerfEvent, pages: usize) -> io::Result<Ring> {
    let mut pages = pages;
    loop {
        match Ring::map(event, pages) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) && pages > MIN_RING_PAGES => {
                pages /= 2;
            }
            other => return other,
        }
    }
}

/// The checks `inspect` makes that matter for sampling (sampling needs no ptrace, so a
/// traced or statically linked process is fine).
fn check_target(pid: i32) -> Result<(), AttachError> {
    if pid <= 0 {
        return Err(AttachError::NoSuchProcess(pid));
    }
    if pid == std::process::id() as i32 {
        return Err(AttachError::OwnProcess(pid));
    }
    let status = crate::process::read_proc_text(format!("/proc/{pid}/status"))
        .map_err(|e| process::io_to_attach_error(pid, &e))?;
    let tgid: i32 = process::status_field(&status, "Tgid")
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(pid);
    if tgid != pid {
        return Err(AttachError::ThreadNotProcess { tid: pid, tgid });
    }
    if process::status_field(&status, "State")
        .is_some_and(|s| s.starts_with('Z') || s.starts_with('X'))
    {
        return Err(AttachError::Zombie(pid));
    }
    let stat = crate::process::read_proc_text(format!("/proc/{pid}/stat"))
        .map_err(|e| process::io_to_attach_error(pid, &e))?;
    if process::StatLine::parse(&stat).is_some_and(|s| s.is_kernel_thread()) {
        return Err(AttachError::KernelThread(pid));
    }
    Ok(())
}

/// The one line that says why perf events were refused and what to change.
fn refusal_message(pid: i32, with_kernel: bool, error: &io::Error) -> String {
    let paranoid: Option<i32> = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse().ok());
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let needed = if with_kernel { 1 } else { 2 };
    match paranoid {
        Some(level) if level > needed && !root => format!(
            "cannot sample process {pid}: perf events are refused (kernel.perf_event_paranoid \
             = {level}) — run as root, or allow them with `sysctl kernel.perf_event_paranoid={needed}`{}",
            if with_kernel {
                " (wall-clock sampling sees context switches, which happen in the kernel)"
            } else {
                ""
            }
        ),
        _ if !root && error.raw_os_error() == Some(libc::EACCES) => format!(
            "cannot sample process {pid}: permission denied — run as the process's user or \
             as root"
        ),
        Some(level) => format!(
            "cannot sample process {pid}: perf_event_open is refused ({error}) although \
             kernel.perf_event_paranoid = {level} — in a container, allow the perf_event_open \
             system call (CAP_PERFMON, or a seccomp profile that permits it)"
        ),
        None => format!(
            "cannot sample process {pid}: perf_event_open is refused ({error}) — this kernel \
             or container does not allow perf events; allow the perf_event_open system call"
        ),
    }
}

/// `CLOCK_MONOTONIC` now, in ns: the clock the events stamp their records with.
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}
