//! When each of the target's threads was off the CPU, from the kernel's context-switch
//! records, in TSC ticks like the agent's events.
//!
//! The one idea: a perf event that counts nothing and only reports context switches
//! (`PERF_RECORD_SWITCH`: out, then in): one per thread, or for a target of many
//! threads one per core when tendril may open those ([`sources`] says why). Between a
//! thread's switch out and its next switch in the thread did not run: it waited in a
//! system call, on a lock, or for a CPU. The kernel stamps the records with
//! `CLOCK_MONOTONIC`; each drain reads the TSC and that clock together ([`ClockAnchor`])
//! and converts the records it reads — all from the last moments — from there, so the
//! conversion's error is the frequency's error over milliseconds (nanoseconds), and each
//! interval lands between the thread's own event timestamps. (The perf page's own TSC conversion,
//! `cap_user_time_zero`, would be exact, but kernels under a hypervisor clock do not
//! offer it.) The calling context trees take these intervals out of the frames they
//! fell in, as they take out pauses, and that is CPU time per node. A thread's switches
//! may sit in two cores' rings (it moved): each drain orders what it read by time, and
//! with per-core events keeps what came after its start for the next drain, as another
//! core's ring, read earlier, may not have had the switch before it yet.
//!
//! A wait for a core that tendril itself held is a pause tendril caused. On a machine
//! of few cores the kernel can leave the thread that drains the rings and a target
//! thread on one core for milliseconds while another stays idle, and the drain then
//! preempts the target in the middle of the calls it times. So the draining thread
//! watches its own switches too ([`OffCpuWatch::watch_own_thread`]): where a target
//! thread was preempted on a core (`PERF_RECORD_MISC_SWITCH_OUT_PREEMPT`) and one of
//! tendril's watched threads ran on that core before the target ran again, the overlap is
//! [`OffCpuInterval::held_by_tendril`], which the trees remove from wall time like any
//! pause.
//!
//! Nothing is loaded into the target and nothing in it changes. Per core, every thread is
//! watched from its first switch. Per thread, a thread started later is watched from
//! when the recorder first sees it in the agent's rings ([`OffCpuWatch::watch_thread`])
//! or in `/proc/PID/task` (every [`RESCAN_INTERVAL`]), whichever comes first; until then
//! its time counts as on-CPU. (An inherited event would follow new threads from their
//! first instruction, but the kernel maps no ring of an inherited per-thread event.)

use crate::recording::tsc;
use crate::sampling::perf::OpenError;
use crate::sampling::records::Switch;
use sources::Sources;
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};
use switch_cost::SwitchCount;

mod sources;
pub mod switch_cost;

/// How often the thread list is read again for new threads.
pub const RESCAN_INTERVAL: Duration = Duration::from_millis(100);

/// From this many threads, the target's switches are read from one event per core
/// rather than one per thread ([`sources`]): the kernel's cost per switch is several
/// times lower, but every process's switches on the machine are then written (and
/// read back). A target of few threads pays the per-thread cost alone.
const PER_CORE_FROM_THREADS: usize = 64;
/// The agent's own threads switch too, but never run inside a recorded frame.
const AGENT_THREAD_PREFIX: &str = "tendril-";

/// Most intervals kept of tendril's own threads on a core, waiting for a preempted
/// target thread to run again (about 2 per poll of the drain).
const MAX_OWN_INTERVALS: usize = 4096;

/// One interval a thread spent off the CPU, in TSC ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffCpuInterval {
    pub tid: u32,
    pub out_tsc: u64,
    pub in_tsc: u64,
    /// Of those ticks, the ones the thread waited for a core that a watched thread of
    /// tendril's held (it was preempted on that core, and tendril's thread ran there).
    pub held_by_tendril: u64,
}

/// A thread's latest switch out, until the switch in that ends it.
#[derive(Debug, Clone, Copy)]
struct SwitchedOut {
    at: u64,
    /// The core it was preempted on; None if it went to sleep (or the core is unknown).
    preempted_on: Option<u32>,
}

/// A time one of tendril's own threads ran on a core, in TSC ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OnCore {
    cpu: u32,
    from: u64,
    to: u64,
}

/// When tendril's own watched threads ran, and on which cores.
#[derive(Default)]
struct OwnThreads {
    watched: HashSet<u32>,
    /// Each running thread's core and switch in.
    running: HashMap<u32, (u32, u64)>,
    /// Times they ran, oldest first.
    ran: VecDeque<OnCore>,
}

impl OwnThreads {
    /// The ticks of `from..to` in which one of the threads ran on `cpu` (one still
    /// running counts until `to`). Two approximations, both at most a turn long: a
    /// target thread that moved to another core while it waited is charged the turns
    /// on the core it left, and a draining thread preempted in the middle of a drain
    /// counts as running until then (its switch out is read at the next drain).
    fn held(&self, cpu: u32, from: u64, to: u64) -> u64 {
        let overlap = |start: u64, end: u64| end.min(to).saturating_sub(start.max(from));
        let finished: u64 = (self.ran.iter())
            .filter(|on| on.cpu == cpu)
            .map(|on| overlap(on.from, on.to))
            .sum();
        let running: u64 = (self.running.values())
            .filter(|(on, _)| *on == cpu)
            .map(|&(_, since)| overlap(since, to))
            .sum();
        (finished + running).min(to.saturating_sub(from))
    }

    /// Takes one switch of one of tendril's threads (others are ignored), at TSC `at`.
    fn note(&mut self, switch: &Switch, at: u64) {
        let Some(cpu) = switch.cpu.filter(|_| self.watched.contains(&switch.tid)) else {
            return;
        };
        if !switch.out {
            self.running.insert(switch.tid, (cpu, at));
        } else if let Some((cpu, from)) = self.running.remove(&switch.tid) {
            if self.ran.len() >= MAX_OWN_INTERVALS {
                self.ran.pop_front();
            }
            self.ran.push_back(OnCore {
                cpu,
                from,
                to: at.max(from),
            });
        }
    }

    /// Lets go of the threads that ended, and their last turns with them (an exit may
    /// leave no switch out to close it).
    fn let_go_of_ended(&mut self) {
        self.watched
            .retain(|tid| std::path::Path::new(&format!("/proc/self/task/{tid}")).exists());
        let watched = &self.watched;
        self.running.retain(|tid, _| watched.contains(tid));
    }

    /// Forgets the times that ended before `oldest`, the earliest moment a target thread
    /// still waiting was preempted (everything, if none is).
    fn forget_before(&mut self, oldest: Option<u64>) {
        match oldest {
            Some(oldest) => self.ran.retain(|on| on.to >= oldest),
            None => self.ran.clear(),
        }
    }
}

/// The TSC and `CLOCK_MONOTONIC` read together, and the TSC's rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClockAnchor {
    tsc: u64,
    monotonic_ns: u64,
    ticks_per_ns: f64,
}

impl ClockAnchor {
    /// Reads both clocks now, keeping the tightest of a few tries.
    pub fn now(tsc_hz: u64) -> ClockAnchor {
        let mut best = (u64::MAX, 0, 0);
        for _ in 0..5 {
            let before = tsc::read();
            let monotonic_ns = monotonic_ns();
            let after = tsc::read();
            let spread = after.wrapping_sub(before);
            if spread < best.0 {
                best = (spread, before + spread / 2, monotonic_ns);
            }
        }
        ClockAnchor {
            tsc: best.1,
            monotonic_ns: best.2,
            ticks_per_ns: tsc_hz as f64 / 1e9,
        }
    }

    /// The TSC at `CLOCK_MONOTONIC` time `monotonic_ns`.
    pub fn tsc_at(&self, monotonic_ns: u64) -> u64 {
        let delta = monotonic_ns as f64 - self.monotonic_ns as f64;
        (self.tsc as f64 + delta * self.ticks_per_ns).max(0.0) as u64
    }
}

fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// Context-switch records of every thread of one process.
pub struct OffCpuWatch {
    pid: i32,
    tsc_hz: u64,
    sources: Sources,
    /// Per thread, tendril's own watched threads' events (per core, `sources` has their
    /// switches).
    own_sources: Option<Sources>,
    /// Per core, the switches read that came after the drain began, for the next one.
    later: Vec<Switch>,
    /// Per core, whether each thread of the target seen switching is one of the
    /// agent's (which never runs inside a recorded frame).
    agent_threads: HashMap<u32, bool>,
    scanned_at: Instant,
    /// Each thread's last switch out, until the switch in that ends it.
    out_since: HashMap<u32, SwitchedOut>,
    /// Tendril's own threads that drain (see the module comment).
    own: OwnThreads,
    /// Switch records the kernel dropped because a ring was full.
    lost: u64,
}

/// Why the off-CPU watch did not open: one line for the profile.
#[derive(Debug)]
pub struct Unwatched {
    pub why: String,
    /// The target switches too often for the watch's cost (rather than the kernel
    /// refusing it): worth saying when the recording starts.
    pub too_costly: bool,
}

impl OffCpuWatch {
    /// Opens the switch records of every thread of `pid`: one event per core if the
    /// kernel allows it, else one per thread. With `switches_before` (counted before
    /// the recording started), refuses first if the target switches so often that the
    /// records would cost it more than [`switch_cost::CPU_TIME_BUDGET`] of a core. An
    /// error is one line saying why CPU time cannot be measured, and what to change
    /// where that is possible. `tsc_hz` is the TSC's measured frequency.
    pub fn start(
        pid: i32,
        tsc_hz: u64,
        switches_before: Option<&SwitchCount>,
    ) -> Result<OffCpuWatch, Unwatched> {
        let threads = crate::process::thread_ids(pid).map_or(0, |tids| tids.len());
        let cores = (threads >= PER_CORE_FROM_THREADS)
            .then(Sources::on_cores)
            .and_then(Result::ok);
        let now = switches_before.and_then(|_| SwitchCount::take(pid));
        if let (Some(before), Some(now)) = (switches_before, now)
            && let Some(why) = switch_cost::over_budget(now.rate_since(before), cores.is_some())
        {
            return Err(Unwatched {
                why,
                too_costly: true,
            });
        }
        OffCpuWatch::start_with(pid, tsc_hz, cores).map_err(|why| Unwatched {
            why,
            too_costly: false,
        })
    }

    /// [`OffCpuWatch::start`] with the cores' events if `cores` has them, else per
    /// thread.
    fn start_with(pid: i32, tsc_hz: u64, cores: Option<Sources>) -> Result<OffCpuWatch, String> {
        let (sources, own_sources) = match cores {
            Some(cores) => (cores, None),
            None => (Sources::on_threads(), Some(Sources::on_threads())),
        };
        let mut watch = OffCpuWatch {
            pid,
            tsc_hz,
            sources,
            own_sources,
            later: Vec::new(),
            agent_threads: HashMap::new(),
            scanned_at: Instant::now(),
            out_since: HashMap::new(),
            own: OwnThreads::default(),
            lost: 0,
        };
        if !watch.sources.per_core() {
            let tids = crate::process::thread_ids(pid).map_err(|e| e.to_string())?;
            for tid in tids {
                watch.open(tid)?;
            }
        }
        Ok(watch)
    }

    /// Whether thread `tid` is one of the agent's.
    fn is_agent_thread(&self, tid: i32) -> bool {
        crate::process::thread_name(self.pid, tid).starts_with(AGENT_THREAD_PREFIX)
    }

    /// Opens thread `tid`'s switch records (per thread). A thread that is gone already
    /// is skipped.
    fn open(&mut self, tid: i32) -> Result<(), String> {
        if self.sources.watches_thread(tid) || self.is_agent_thread(tid) {
            return Ok(());
        }
        match self.sources.watch_thread(tid) {
            Ok(()) | Err(OpenError::Gone) => Ok(()),
            Err(OpenError::Refused(error)) => Err(format!(
                "CPU time is not measured: the kernel refused perf events ({error}); \
                 as root, or with kernel.perf_event_paranoid ≤ 1 \
                 (sysctl kernel.perf_event_paranoid=1), it is"
            )),
            Err(OpenError::Other(error)) => Err(format!(
                "CPU time is not measured: perf events cannot be opened or mapped ({error})"
            )),
        }
    }

    /// Watches thread `tid` from now on, if it is not watched yet (the recorder calls
    /// this for each thread it sees for the first time).
    pub fn watch_thread(&mut self, tid: i32) {
        // A refusal now would have been one at the start: nothing new to say.
        let _ = self.open(tid);
    }

    /// Watches the calling thread, one of tendril's own, from now on, if it is not
    /// watched yet: a target thread's wait for a core it held is then told apart (the
    /// recorder calls this from the thread that drains). A refusal leaves it unwatched.
    pub fn watch_own_thread(&mut self) {
        let tid = nix::unistd::gettid().as_raw();
        if self.own.watched.contains(&(tid as u32)) {
            return;
        }
        let opened = match self.own_sources.as_mut() {
            Some(own_sources) => own_sources.watch_thread(tid).is_ok(),
            None => true,
        };
        if opened {
            self.own.watched.insert(tid as u32);
        }
    }

    /// Picks up threads started since the last scan (at most every [`RESCAN_INTERVAL`])
    /// and lets go of those that ended (their records were read just before).
    fn rescan(&mut self) {
        if self.scanned_at.elapsed() < RESCAN_INTERVAL {
            return;
        }
        self.scanned_at = Instant::now();
        let Ok(tids) = crate::process::thread_ids(self.pid) else {
            return;
        };
        let alive: HashSet<i32> = tids.iter().copied().collect();
        self.sources.retain_threads(|tid| alive.contains(&tid));
        // A thread that ended while switched out never switches in: forget it, or the
        // oldest wait would keep tendril's turns from being forgotten.
        (self.out_since).retain(|tid, _| alive.contains(&(*tid as i32)));
        (self.agent_threads).retain(|tid, _| alive.contains(&(*tid as i32)));
        if !self.sources.per_core() {
            for tid in tids {
                self.watch_thread(tid);
            }
        }
    }

    /// The switches to take now, in time order: all those read, and per core, those
    /// kept from the last drain, but only up to `began_ns` (the others are kept).
    fn read_switches(&mut self, began_ns: u64) -> Vec<Switch> {
        let mut switches = std::mem::take(&mut self.later);
        self.sources.read(&mut switches, &mut self.lost);
        if let Some(own_sources) = self.own_sources.as_mut() {
            // Records lost of tendril's own threads only make "held by tendril" smaller.
            own_sources.read(&mut switches, &mut 0);
        }
        switches.sort_by_key(|switch| switch.time_ns);
        if self.sources.per_core() {
            let now = switches.partition_point(|switch| switch.time_ns <= began_ns);
            self.later = switches.split_off(now);
        }
        switches
    }

    /// Hands every off-CPU interval completed since the last call to `visit`, each
    /// thread's in time order. Drain these before the agent's rings: a thread is
    /// switched in before it runs, so every interval that precedes an event read
    /// afterwards has been handed over by then.
    pub fn drain(&mut self, mut visit: impl FnMut(OffCpuInterval)) {
        let clock = ClockAnchor::now(self.tsc_hz);
        let switches = self.read_switches(monotonic_ns());
        // Tendril's own switches first: a target thread's wait that ends by now was
        // spent while they ran, or did not.
        let own_pid = std::process::id();
        for switch in switches.iter().filter(|switch| switch.pid == own_pid) {
            self.own.note(switch, clock.tsc_at(switch.time_ns));
        }
        self.own.let_go_of_ended();
        let pid = self.pid as u32;
        for switch in switches.iter().filter(|switch| switch.pid == pid) {
            if self.sources.per_core() && self.skip_agent_thread(switch.tid) {
                continue;
            }
            let at = clock.tsc_at(switch.time_ns);
            if switch.out {
                let preempted_on = switch.cpu.filter(|_| switch.preempted);
                (self.out_since).insert(switch.tid, SwitchedOut { at, preempted_on });
            } else if let Some(switched_out) = self.out_since.remove(&switch.tid) {
                let in_tsc = at.max(switched_out.at);
                let held_by_tendril = switched_out
                    .preempted_on
                    .map_or(0, |cpu| self.own.held(cpu, switched_out.at, in_tsc));
                visit(OffCpuInterval {
                    tid: switch.tid,
                    out_tsc: switched_out.at,
                    in_tsc,
                    held_by_tendril,
                });
            }
        }
        let oldest_wait = (self.out_since.values())
            .filter(|out| out.preempted_on.is_some())
            .map(|out| out.at)
            .min();
        self.own.forget_before(oldest_wait);
        self.rescan();
    }

    /// Whether thread `tid` of the target is one of the agent's, looked up once.
    fn skip_agent_thread(&mut self, tid: u32) -> bool {
        if let Some(&agent) = self.agent_threads.get(&tid) {
            return agent;
        }
        let agent = self.is_agent_thread(tid as i32);
        self.agent_threads.insert(tid, agent);
        agent
    }

    /// Switch records lost to full rings (their intervals count as on-CPU).
    pub fn lost(&self) -> u64 {
        self.lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// This test process's own thread sleeps: the interval it was off the CPU is found,
    /// inside the TSC reads around the sleep, and at least as long as the sleep; with
    /// the cores' events (this test runs as root) and with the threads' own.
    fn a_sleep_is_an_interval_off_the_cpu(per_core: bool) {
        let (sleeper_tid_tx, sleeper_tid_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let sleeper = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            sleeper_tid_tx.send(unsafe { libc::gettid() }).unwrap();
            go_rx.recv().unwrap();
            let before = tsc::read();
            std::thread::sleep(Duration::from_millis(30));
            (before, tsc::read())
        });
        let tid = sleeper_tid_rx.recv().unwrap();
        let hz = tsc::measure_hz();
        let cores = per_core.then(|| Sources::on_cores().expect("the cores' switch events"));
        let mut watch = match OffCpuWatch::start_with(std::process::id() as i32, hz, cores) {
            Ok(watch) => watch,
            Err(why) => panic!("{why}"),
        };
        assert_eq!(watch.sources.per_core(), per_core);
        go_tx.send(()).unwrap();
        let (before, after) = sleeper.join().unwrap();
        let mut found = Vec::new();
        watch.drain(|interval| {
            if interval.tid == tid as u32 {
                found.push(interval);
            }
        });
        let slept = found
            .iter()
            .find(|i| i.in_tsc - i.out_tsc >= hz / 1000 * 25)
            .unwrap_or_else(|| panic!("no interval of 25 ms or more among {found:?}"));
        assert!(
            before <= slept.out_tsc && slept.in_tsc <= after,
            "{slept:?} outside the sleep's TSC reads {before}..{after}"
        );
    }

    #[test]
    fn a_sleep_is_an_interval_off_the_cpu_from_the_cores_switches() {
        a_sleep_is_an_interval_off_the_cpu(true);
    }

    #[test]
    fn a_sleep_is_an_interval_off_the_cpu_from_the_threads_own_switches() {
        a_sleep_is_an_interval_off_the_cpu(false);
    }

    #[test]
    fn only_tendrils_time_on_the_core_a_thread_waited_for_counts() {
        let mut own = OwnThreads::default();
        own.ran.push_back(OnCore {
            cpu: 0,
            from: 100,
            to: 200,
        });
        own.ran.push_back(OnCore {
            cpu: 1,
            from: 150,
            to: 300,
        });
        own.running.insert(7, (0, 400));
        // Waiting on core 0 from 150 to 450: 50 ticks of the finished turn there, and
        // 50 of the one still running.
        assert_eq!(own.held(0, 150, 450), 100);
        assert_eq!(own.held(1, 150, 450), 150);
        assert_eq!(own.held(2, 0, 1000), 0);
        assert_eq!(own.held(0, 200, 400), 0);
        own.forget_before(Some(250));
        assert_eq!(own.ran.len(), 1);
        own.forget_before(None);
        assert!(own.ran.is_empty());
    }

    #[test]
    fn an_anchor_converts_monotonic_time_to_the_tsc_it_was_read_with() {
        let hz = tsc::measure_hz();
        let anchor = ClockAnchor::now(hz);
        let (before, now, after) = (tsc::read(), monotonic_ns(), tsc::read());
        let converted = anchor.tsc_at(now);
        // Within 20 µs: the frequency's error over a moment, and the reads' spread.
        let slack = hz / 50_000;
        assert!(
            before.saturating_sub(slack) <= converted && converted <= after + slack,
            "{converted} outside {before}..{after}"
        );
    }
}
