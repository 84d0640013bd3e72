//! `Target`: a running fixture process that a test talks to and that never outlives it.
//!
//! The one idea: the fixture's stdout is read by a background thread into a channel, so a
//! test waits for a line with a timeout instead of blocking forever on a silent process;
//! dropping the `Target` kills (SIGKILL) and reaps the process.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use super::fixture;

/// How long `Target::spawn` waits for the fixture's `ready ...` line.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long `Drop` waits for the killed process to be reaped (a tracer may hold it).
const REAP_TIMEOUT: Duration = Duration::from_secs(10);

/// One `round <R> <key> <value> ...` line of a fixture, e.g.
/// `round 3 thrown 358 caught 358 checksum 1499193236324442815`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Round {
    /// R, counting from 1.
    pub number: u64,
    /// The `<key> <value>` pairs that follow, in order.
    pub values: Vec<(String, u64)>,
}

impl Round {
    /// Parses a `round ...` line; `None` for any other line.
    pub fn parse(line: &str) -> Option<Round> {
        let mut words = line.split_whitespace();
        if words.next()? != "round" {
            return None;
        }
        let number = words.next()?.parse().ok()?;
        let mut values = Vec::new();
        while let Some(key) = words.next() {
            values.push((key.to_string(), words.next()?.parse().ok()?));
        }
        Some(Round { number, values })
    }

    /// The value that follows `key`, if the line has one.
    pub fn get(&self, key: &str) -> Option<u64> {
        self.values.iter().find(|(k, _)| k == key).map(|&(_, v)| v)
    }
}

/// A running fixture process.
///
/// Its stdin and stdout are pipes; its stderr is the test's stderr. Lines a filtered
/// wait (`expect_line`, `rounds`, `checksum_lines`) passes over are kept, in order, for
/// later reads. Dropping it kills the process with SIGKILL and reaps it. The process also
/// gets SIGKILL if the thread that spawned it dies (`PR_SET_PDEATHSIG`), so a test process
/// killed by a timeout leaves nothing running; keep a `Target` on the thread that made it.
pub struct Target {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    pending: VecDeque<String>,
    ready_line: Option<String>,
}

impl Target {
    /// Starts fixture `name` with `args` and waits (up to `READY_TIMEOUT`) for its
    /// `ready ...` line. Panics if the fixture cannot start, exits, or stays silent.
    pub fn spawn(name: &str, args: &[&str]) -> Target {
        Target::start(name, args, None, true)
    }

    /// Like `spawn`, for a program built elsewhere than `fixtures/` (a generated one).
    pub fn spawn_program(program: &std::path::Path, args: &[&str]) -> Target {
        let mut command = Command::new(program);
        command.args(args);
        let name = program
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        Target::start_command(&name, command, None, true)
    }

    /// Starts fixture `name` without waiting for a `ready` line (`i386_loop` prints none).
    pub fn spawn_no_ready(name: &str, args: &[&str]) -> Target {
        Target::start(name, args, None, false)
    }

    /// Like `spawn`, but runs the fixture as user `uid` and group `gid` (for example
    /// nobody, 65534), with no supplementary groups. The test must run as root.
    pub fn spawn_as_user(name: &str, args: &[&str], uid: u32, gid: u32) -> Target {
        Target::start(name, args, Some((uid, gid)), true)
    }

    /// Like `spawn_as_user`, but through `wrapper` (a command that ends by running the
    /// command line after it, such as `unshare -Ur` or `sh -c '...; exec "$0" "$@"'`),
    /// which must not fork: the fixture keeps the wrapper's pid.
    pub fn spawn_wrapped(
        name: &str,
        args: &[&str],
        wrapper: &[&str],
        user: Option<(u32, u32)>,
    ) -> Target {
        let mut command = Command::new(wrapper[0]);
        command.args(&wrapper[1..]).arg(fixture(name)).args(args);
        Target::start_command(name, command, user, true)
    }

    /// Like `spawn`, but the fixture runs with a real-time priority (`SCHED_FIFO` 1),
    /// so other work on a busy machine cannot take the CPU from it while it runs: its
    /// timings are its own. Falls back to a normal priority (saying so) where real-time
    /// priorities are not allowed.
    pub fn spawn_realtime(name: &str, args: &[&str]) -> Target {
        let mut command = Command::new(fixture(name));
        command.args(args);
        let parameters = libc::sched_param { sched_priority: 1 };
        // SAFETY: sched_setscheduler is a plain system call on this (child) process,
        // reading a valid sched_param; async-signal-safe, allocates nothing.
        unsafe {
            command.pre_exec(move || {
                if libc::sched_setscheduler(0, libc::SCHED_FIFO, &parameters) != 0 {
                    let note = b"fixture: no real-time priority; timings may be disturbed\n";
                    libc::write(2, note.as_ptr().cast(), note.len());
                }
                Ok(())
            });
        }
        Target::start_command(name, command, None, true)
    }

    fn start(name: &str, args: &[&str], user: Option<(u32, u32)>, wait_ready: bool) -> Target {
        let mut command = Command::new(fixture(name));
        command.args(args);
        Target::start_command(name, command, user, wait_ready)
    }

    fn start_command(
        name: &str,
        mut command: Command,
        user: Option<(u32, u32)>,
        wait_ready: bool,
    ) -> Target {
        let program = std::path::PathBuf::from(command.get_program());
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some((uid, gid)) = user {
            command.uid(uid).gid(gid);
        }
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the child between fork and exec; it only makes
        // async-signal-safe system calls (prctl, getppid, raise) and allocates nothing.
        unsafe {
            command.pre_exec(move || {
                // This runs after the uid change, which would clear the setting again.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    libc::raise(libc::SIGKILL); // the parent died before prctl
                }
                Ok(())
            });
        }
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start fixture {name} ({}): {e}", program.display()));

        let stdout = child.stdout.take().expect("stdout is piped");
        let (sender, lines) = mpsc::channel();
        thread::Builder::new()
            .name(format!("{name}-stdout"))
            .spawn(move || {
                let mut reader = BufReader::new(stdout);
                let mut line = Vec::new();
                loop {
                    line.clear();
                    match reader.read_until(b'\n', &mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            let text = String::from_utf8_lossy(&line);
                            if sender
                                .send(text.trim_end_matches(['\n', '\r']).to_string())
                                .is_err()
                            {
                                break;
                            }
                        }
                    }
                }
            })
            .expect("cannot start a reader thread");

        let mut target = Target {
            name: name.to_string(),
            stdin: child.stdin.take(),
            child,
            lines,
            pending: VecDeque::new(),
            ready_line: None,
        };
        if wait_ready {
            target.wait_ready();
        }
        target
    }

    fn wait_ready(&mut self) {
        let line = match self.next_line(READY_TIMEOUT) {
            Some(line) => line,
            None => match self.child.try_wait() {
                Ok(Some(status)) => {
                    panic!("fixture {} exited before it was ready: {status}", self.name)
                }
                _ => panic!(
                    "fixture {} printed no `ready` line within {READY_TIMEOUT:?}",
                    self.name
                ),
            },
        };
        let expected = format!("pid={}", self.pid());
        assert!(
            line.starts_with("ready") && line.split_whitespace().any(|w| w == expected),
            "fixture {}: expected `ready {expected} ...` as its first line, got {line:?}",
            self.name
        );
        self.ready_line = Some(line);
    }

    /// The fixture's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The `ready ...` line, if `spawn` waited for one.
    pub fn ready_line(&self) -> Option<&str> {
        self.ready_line.as_deref()
    }

    /// The next stdout line (without its newline), or `None` if none comes within
    /// `timeout` or stdout is closed.
    pub fn next_line(&mut self, timeout: Duration) -> Option<String> {
        if let Some(line) = self.pending.pop_front() {
            return Some(line);
        }
        self.lines.recv_timeout(timeout).ok()
    }

    /// Everything printed so far and not yet read, without waiting.
    pub fn drain(&mut self) -> Vec<String> {
        let mut lines: Vec<String> = self.pending.drain(..).collect();
        lines.extend(self.lines.try_iter());
        lines
    }

    /// The first line, read from now on, that starts with `prefix`; the lines before it
    /// are kept for later reads. Panics if none comes within `timeout`.
    pub fn expect_line(&mut self, prefix: &str, timeout: Duration) -> String {
        let found = self.take_matching(timeout, 1, |line| {
            line.starts_with(prefix).then(|| line.to_string())
        });
        found.into_iter().next().unwrap_or_else(|| {
            panic!(
                "fixture {}: no line starting with {prefix:?} within {timeout:?}",
                self.name
            )
        })
    }

    /// The next `n` `round ...` lines; other lines are kept for later reads. Panics if
    /// they do not all come within `timeout`.
    pub fn rounds(&mut self, n: usize, timeout: Duration) -> Vec<Round> {
        let rounds = self.take_matching(timeout, n, Round::parse);
        if rounds.len() < n {
            panic!(
                "fixture {}: only {} of {n} `round` lines within {timeout:?}: {rounds:?}",
                self.name,
                rounds.len()
            );
        }
        rounds
    }

    /// The checksums C of the next `n` `round <R> ... checksum <C>` lines; see `rounds`.
    pub fn checksum_lines(&mut self, n: usize, timeout: Duration) -> Vec<u64> {
        self.rounds(n, timeout)
            .iter()
            .map(|round| {
                round.get("checksum").unwrap_or_else(|| {
                    panic!(
                        "fixture {}: a `round` line without a checksum: {round:?}",
                        self.name
                    )
                })
            })
            .collect()
    }

    /// Waits until every worker of `calltree` has started and finished `n` whole rounds
    /// after this call, however long load makes them take, and returns the checksums of
    /// the lines read. Lines already received are dropped first. Panics if a `round` line
    /// lacks `finished <F>`, or if no line comes within `line_timeout`.
    pub fn whole_rounds(&mut self, n: u64, line_timeout: Duration) -> Vec<u64> {
        self.drain();
        let mut checksums = Vec::new();
        let mut finished = || {
            let round = self.rounds(1, line_timeout).remove(0);
            checksums.push(round.get("checksum").unwrap_or(0));
            round
                .get("finished")
                .unwrap_or_else(|| panic!("fixture: a `round` line without `finished`: {round:?}"))
        };
        // The first line read may have been printed just before this call, while a worker
        // was already inside round F + 1; rounds F + 3 and later begin after the call.
        let goal = finished() + n + 2;
        while finished() < goal {}
        checksums
    }

    /// The checksum the fixture prints, checked to be the same on `rounds` consecutive
    /// lines.
    pub fn steady_checksum(&mut self, rounds: usize, timeout: Duration) -> u64 {
        let checksums = self.checksum_lines(rounds, timeout);
        assert!(
            checksums.windows(2).all(|w| w[0] == w[1]),
            "checksums differ: {checksums:?}"
        );
        checksums[0]
    }

    /// Reads lines until `n` of them give a value through `pick`, or `timeout` passes;
    /// the lines that give none go back, in order, in front of the unread ones.
    fn take_matching<T>(
        &mut self,
        timeout: Duration,
        n: usize,
        mut pick: impl FnMut(&str) -> Option<T>,
    ) -> Vec<T> {
        let deadline = Instant::now() + timeout;
        let mut picked = Vec::new();
        let mut passed_over = Vec::new();
        let mut queued = std::mem::take(&mut self.pending);
        while picked.len() < n {
            let line = match queued.pop_front() {
                Some(line) => line,
                None => match self
                    .lines
                    .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                {
                    Ok(line) => line,
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
                },
            };
            match pick(&line) {
                Some(value) => picked.push(value),
                None => passed_over.push(line),
            }
        }
        passed_over.extend(queued);
        self.pending = passed_over.into();
        picked
    }

    /// Runs `n` rounds of a fixture that runs one round per line read on its stdin
    /// (`branches stdin`, `throw_through 0`, `exceptions 0`) and returns their `round`
    /// lines; see `rounds`.
    pub fn rounds_on_demand(&mut self, n: usize, timeout: Duration) -> Vec<Round> {
        for _ in 0..n {
            self.write_stdin("go\n");
        }
        self.rounds(n, timeout)
    }

    /// The checksums C of `n` rounds run on demand; see `rounds_on_demand`.
    pub fn checksums_on_demand(&mut self, n: usize, timeout: Duration) -> Vec<u64> {
        for _ in 0..n {
            self.write_stdin("go\n");
        }
        self.checksum_lines(n, timeout)
    }

    /// Writes `text` to the fixture's stdin and flushes it.
    pub fn write_stdin(&mut self, text: &str) {
        let stdin = self.stdin.as_mut().expect("stdin is already closed");
        stdin
            .write_all(text.as_bytes())
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("cannot write to the stdin of fixture {}: {e}", self.name));
    }

    /// Closes the fixture's stdin, so that it reads end of file.
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Sends signal `signal` (e.g. `libc::SIGUSR1`) to the process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory-safety preconditions; the child is not reaped yet, so
        // its pid cannot have been reused.
        let result = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(
            result,
            0,
            "cannot signal fixture {}: {}",
            self.name,
            std::io::Error::last_os_error()
        );
    }

    /// Whether the process is still running (it is reaped if it has exited).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits up to `timeout` for the process to exit; its status, or `None` if it still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if !self.is_running() {
            return;
        }
        let _ = self.child.kill(); // SIGKILL
        if self.wait_exit(REAP_TIMEOUT).is_none() {
            eprintln!(
                "fixture {} (pid {}) was killed but not reaped within {REAP_TIMEOUT:?}; \
                 is a tracer still attached to it?",
                self.name,
                self.pid()
            );
        }
    }
}

/// The number that follows the word `key` in a fixture's reply `line` (its replies are
/// words and numbers: `run 300 parent 160954`). Panics, naming both, if there is none.
pub fn number_after<T: std::str::FromStr>(line: &str, key: &str) -> T {
    let mut words = line.split_whitespace();
    words.find(|word| *word == key);
    words
        .next()
        .and_then(|word| word.parse().ok())
        .unwrap_or_else(|| panic!("no number after {key:?} in {line:?}"))
}
