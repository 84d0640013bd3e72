//! The wait of `count` and `edges`: the agent's counters read while the target runs,
//! then the code restored, then the counters read for the last time.
//!
//! The one idea: counters live in the target, per thread, and only grow, so numbers
//! read after the code is restored are final — no hook can add to them any more.
//! Whatever ends the wait (the duration, Ctrl-C, the target exiting or exec'ing,
//! another tendril's detach), the code is restored first and the report comes after;
//! the readings taken while waiting are what a target that went away leaves behind.

use crate::agent_connection::{AgentConnection, AgentConnectionError};
use crate::commands::duration::how_long;
use crate::commands::progress::Progress;
use crate::departure::Departure;
use crate::terminal_text::say;
use crate::{inject, interrupt};
use anyhow::bail;
use std::time::{Duration, Instant};
use tendril_wire::{Request, Response, ThreadCounters};

/// How often counters are read while waiting, so a target that exits still gets a
/// report of what it did up to its last reading.
const READ_INTERVAL: Duration = Duration::from_millis(250);
/// How long an agent that stopped answering waits to be explained by the process exiting.
const EXIT_GRACE: Duration = Duration::from_millis(100);
/// How long a command that lost its connection waits for the agent to restore the
/// code: the agent does so once it sees the connection closed, which a loaded machine
/// or a stopped target may delay.
const RESTORE_WAIT: Duration = Duration::from_secs(20);

/// What is waited for.
pub struct CounterWait<'a> {
    pub pid: i32,
    /// The counters to read.
    pub ids: &'a [u32],
    pub duration: Option<Duration>,
    /// What is counted, for the line that says the counters run: `calls of 3
    /// functions`, `edges of classify (3 blocks)`.
    pub counting: String,
    /// What the command does, for messages: `count`, `edge count`.
    pub what: &'a str,
}

/// How the wait ended.
pub struct Waited {
    /// The last reading: after the restore, or the last one taken while waiting.
    pub latest: Vec<ThreadCounters>,
    pub elapsed: Duration,
    /// What to report as the command's error once its output is printed: the code's
    /// restore could not be confirmed, or the command ended early.
    pub failure: Option<anyhow::Error>,
}

/// Says on stderr that the counters run (the line tests and scripts wait for), then
/// reads them every [`READ_INTERVAL`] until the wait ends, drawing the progress line
/// with `describe(latest reading)`; then restores the code with `restore` and reads the
/// counters once more. `latest` is the reading to report if none is taken. If the
/// connection is lost meanwhile, says why on stderr and waits for the agent to have
/// restored the code.
pub fn wait_then_restore(
    session: &mut AgentConnection,
    wait: CounterWait,
    mut latest: Vec<ThreadCounters>,
    mut describe: impl FnMut(&[ThreadCounters]) -> String,
    restore: impl FnOnce(&mut AgentConnection) -> anyhow::Result<()>,
) -> anyhow::Result<Waited> {
    let started = Instant::now();
    say!(
        "counting {} in process {} {}",
        wait.counting,
        wait.pid,
        how_long(wait.duration)
    );
    let mut lost: Option<AgentConnectionError> = None;
    let mut progress = Progress::new();
    interrupt::wait(
        wait.duration.map(|d| started + d),
        READ_INTERVAL,
        || match read_counters(session, wait.ids) {
            Ok(reading) => {
                latest = reading;
                progress.update(|| describe(&latest));
                true
            }
            Err(error) => {
                lost = Some(error);
                false
            }
        },
    );
    progress.clear();
    let elapsed = started.elapsed();
    let failure = match lost {
        Some(error) => explain_loss(&wait, error, elapsed),
        None => {
            restore(session)?;
            latest = read_counters(session, wait.ids)?;
            None
        }
    };
    Ok(Waited {
        latest,
        elapsed,
        failure,
    })
}

/// Says on stderr why the connection was lost and what the counts cover; returns the
/// error the command ends with, if it must end with one.
fn explain_loss(
    wait: &CounterWait,
    error: AgentConnectionError,
    elapsed: Duration,
) -> Option<anyhow::Error> {
    use crate::commands::duration::format_elapsed;
    let pid = wait.pid;
    match crate::departure::agent_departure(pid, EXIT_GRACE, || false) {
        // The agent ended the connection: another tendril's detach did.
        Departure::Detached if matches!(error, AgentConnectionError::Io(_)) => {
            say!(
                "another tendril detached process {pid} after {:.1} s; counts are from the last reading before that",
                elapsed.as_secs_f64()
            );
            restored_after_losing(wait).err()
        }
        // This side gave up on the connection (no answer in time, or an answer it
        // cannot read): the agent restores the code once it sees it closed.
        Departure::Detached => {
            say!(
                "{error}; counts are from the last reading, {} s in",
                format_elapsed(elapsed)
            );
            Some(match restored_after_losing(wait) {
                Ok(()) => anyhow::anyhow!(
                    "the {} of process {pid} ended early; its code is restored",
                    wait.what
                ),
                Err(not_restored) => not_restored,
            })
        }
        execed @ Departure::Execed { .. } => {
            say!(
                "{}; counts are from the last reading before the exec, {} s in",
                execed.headline(pid),
                format_elapsed(elapsed)
            );
            None
        }
        exited => {
            say!(
                "{} after {} s; counts are from its last reading",
                exited.headline(pid),
                format_elapsed(elapsed)
            );
            None
        }
    }
}

/// After the connection was lost: waits until the agent reports nothing patched and
/// nothing pending, so tendril never leaves a target patched while saying it is done.
fn restored_after_losing(wait: &CounterWait) -> anyhow::Result<()> {
    let pid = wait.pid;
    let deadline = Instant::now() + RESTORE_WAIT;
    loop {
        let state = inject::connect_existing(pid).map(|found| {
            found.map(|(_, session)| session.status.patched + session.status.pending_restore)
        });
        match state {
            Ok(None | Some(0)) => return Ok(()),
            _ if crate::process::is_gone_or_exiting(pid) => return Ok(()),
            _ if Instant::now() >= deadline => bail!(
                "process {pid} still has code patched {} s after the {} ended; the agent restores it once it runs again (`tendril status {pid}` shows what is patched)",
                RESTORE_WAIT.as_secs(),
                wait.what
            ),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The counters `ids`, per thread.
pub fn read_counters(
    session: &mut AgentConnection,
    ids: &[u32],
) -> Result<Vec<ThreadCounters>, AgentConnectionError> {
    match session.request(&Request::ReadCounters { ids: ids.to_vec() })? {
        Response::Counters { threads, .. } => Ok(threads),
        other => Err(AgentConnectionError::Protocol(format!("{other:?}"))),
    }
}

/// `error`, said as what happened to process `pid` when the agent's end of the
/// connection went away because the process ended (killed by a signal, say) while
/// tendril was patching or restoring it; any other error as it is.
pub fn said_as_departure(pid: i32, error: anyhow::Error) -> anyhow::Error {
    if !matches!(
        error.downcast_ref::<AgentConnectionError>(),
        Some(AgentConnectionError::Io(_))
    ) {
        return error;
    }
    let departure = crate::departure::agent_departure(pid, EXIT_GRACE, || false);
    if !departure.exited() {
        return error;
    }
    anyhow::anyhow!(
        "{} while tendril was patching or restoring it ({error})",
        departure.headline(pid)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_connection_is_said_as_the_targets_death_when_it_died() {
        let mut child = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let lost = || -> anyhow::Error {
            AgentConnectionError::Io(std::io::ErrorKind::UnexpectedEof.into()).into()
        };
        // Alive: the error stays as it is.
        assert!(
            said_as_departure(pid, lost())
                .to_string()
                .starts_with("lost the connection")
        );
        child.kill().unwrap();
        // Killed, and not reaped yet: a zombie that says how it ended.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut said = said_as_departure(pid, lost()).to_string();
        while !said.contains("SIGKILL") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            said = said_as_departure(pid, lost()).to_string();
        }
        assert!(
            said.starts_with(&format!("process {pid} was killed by signal 9 (SIGKILL)")),
            "{said}"
        );
        // Another error is left alone.
        let refused = AgentConnectionError::Refused("no".into()).into();
        assert_eq!(said_as_departure(pid, refused).to_string(), "no");
        child.wait().unwrap();
    }
}
