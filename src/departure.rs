//! Why a target's agent closed its connection in the middle of a count or a recording.
//!
//! The one idea: the agent's end of the connection closes in exactly three ways, and
//! `/proc` tells them apart once it has: the process exited (it is gone, or a zombie
//! its parent has not reaped yet), it replaced its program with `execve` (it runs on,
//! but the agent's library is no longer mapped: it went with the old program image), or
//! another tendril's `detach` ended the session (the process runs on with the agent in
//! it). An exiting process closes its files a moment after releasing its memory and a
//! moment before it shows as a zombie, so the answer is awaited for a short grace time.
//! A zombie still carries how it ended (its wait status, field 52 of `/proc/PID/stat`),
//! so the message says it: killed by signal N, or exited with status N.

use crate::agent_bundle::is_agent_module;
use crate::process::StatLine;
use std::time::{Duration, Instant};

/// How the agent went away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Departure {
    /// The process has exited and is gone (reaped).
    Exited,
    /// The process has exited; its parent has not reaped it yet. How it ended, when
    /// the kernel shows it.
    Zombie { ending: Option<Ending> },
    /// The process exec'd `program`: the agent is gone with the old program image.
    Execed { program: String },
    /// The process runs on with the agent loaded: another tendril detached it.
    Detached,
}

impl Departure {
    /// What happened to process `pid`, as the start of a one-line message.
    pub fn headline(&self, pid: i32) -> String {
        match self {
            Departure::Exited => format!("process {pid} ended"),
            Departure::Zombie { ending: None } => {
                format!("process {pid} exited (zombie, not yet reaped by its parent)")
            }
            Departure::Zombie {
                ending: Some(ending),
            } => format!("process {pid} {ending} (a zombie its parent has not reaped yet)"),
            Departure::Execed { program } => format!(
                "process {pid} exec'd {program}: the agent is gone with the old program image"
            ),
            Departure::Detached => format!("another tendril detached process {pid}"),
        }
    }

    /// The process has exited (gone or a zombie).
    pub fn exited(&self) -> bool {
        matches!(self, Departure::Exited | Departure::Zombie { .. })
    }
}

/// How a process ended, as its wait status says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// It exited with this status.
    Exited(i32),
    /// Signal `signal` killed it.
    Killed { signal: i32, core_dumped: bool },
}

impl Ending {
    /// The ending a wait status (`waitpid`'s, or `exit_code` in `/proc/PID/stat`) holds.
    pub fn from_wait_status(status: i32) -> Ending {
        match status & 0x7f {
            0 => Ending::Exited((status >> 8) & 0xff),
            signal => Ending::Killed {
                signal,
                core_dumped: status & 0x80 != 0,
            },
        }
    }

    /// The exit status a shell would give: the process's, or 128 + the signal number.
    pub fn shell_status(self) -> u8 {
        match self {
            Ending::Exited(code) => code as u8,
            Ending::Killed { signal, .. } => 128u8.wrapping_add(signal as u8),
        }
    }
}

impl std::fmt::Display for Ending {
    /// `exited with status 3`, `was killed by signal 9 (SIGKILL)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Ending::Exited(code) => write!(f, "exited with status {code}"),
            Ending::Killed {
                signal,
                core_dumped,
            } => {
                write!(f, "was killed by signal {signal}")?;
                if let Ok(name) = nix::sys::signal::Signal::try_from(signal) {
                    write!(f, " ({})", name.as_str())?;
                }
                if core_dumped {
                    write!(f, " (core dumped)")?;
                }
                Ok(())
            }
        }
    }
}

/// How often the state is read while waiting for it to become clear.
const RECHECK: Duration = Duration::from_millis(5);

/// Why the agent in process `pid` closed its connection, waiting up to `grace` for the
/// process to show it. `reaped` says whether the process is gone for the caller (e.g.
/// `tendril run` reaps its own child); it is asked first each time.
pub fn agent_departure(pid: i32, grace: Duration, mut reaped: impl FnMut() -> bool) -> Departure {
    let deadline = Instant::now() + grace;
    loop {
        if reaped() {
            return Departure::Exited;
        }
        if let Some(departure) = visible_departure(pid) {
            return departure;
        }
        if Instant::now() >= deadline {
            return Departure::Detached;
        }
        std::thread::sleep(RECHECK);
    }
}

/// The departure `/proc` shows now, if it is clear yet.
fn visible_departure(pid: i32) -> Option<Departure> {
    let Ok(stat) = crate::process::read_proc_text(format!("/proc/{pid}/stat")) else {
        return Some(Departure::Exited);
    };
    let stat = StatLine::parse(&stat)?;
    match stat.state {
        'Z' => {
            let ending = stat.exit_code.map(Ending::from_wait_status);
            return Some(Departure::Zombie { ending });
        }
        'X' | 'x' => return Some(Departure::Exited),
        _ => {}
    }
    // An exiting process has no memory any more (nor an executable link): not clear yet.
    let program = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let maps = crate::process::read_proc_text(format!("/proc/{pid}/maps")).ok()?;
    if maps.is_empty() {
        return None;
    }
    let agent_mapped = maps.lines().any(|line| {
        line.split_whitespace()
            .nth(5)
            .and_then(|path| path.rsplit('/').next())
            .is_some_and(is_agent_module)
    });
    if agent_mapped {
        // Still the image the agent was loaded into: unless it exits within the grace
        // time, another tendril detached it.
        None
    } else {
        Some(Departure::Execed {
            program: program.display().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_process_without_an_agent_reads_as_execed() {
        // This test process never loaded an agent: to the check, it is a process whose
        // agent went with an older program image.
        let departure = agent_departure(std::process::id() as i32, Duration::ZERO, || false);
        let exe = std::env::current_exe().unwrap().display().to_string();
        assert_eq!(departure, Departure::Execed { program: exe });
    }

    #[test]
    fn a_missing_process_has_exited() {
        assert_eq!(visible_departure(i32::MAX), Some(Departure::Exited));
        assert!(
            Departure::Zombie { ending: None }
                .headline(7)
                .contains("zombie, not yet reaped")
        );
        let killed = Departure::Zombie {
            ending: Some(Ending::from_wait_status(9)),
        };
        assert_eq!(
            killed.headline(7),
            "process 7 was killed by signal 9 (SIGKILL) (a zombie its parent has not reaped yet)"
        );
        assert_eq!(
            Ending::from_wait_status(3 << 8).to_string(),
            "exited with status 3"
        );
        assert_eq!(
            Ending::from_wait_status(0x80 | 11).to_string(),
            "was killed by signal 11 (SIGSEGV) (core dumped)"
        );
        assert_eq!(Ending::from_wait_status(9).shell_status(), 137);
    }
}
