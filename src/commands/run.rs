//! `tendril run [--root SYM]... [--scheme a|b] [--duration SECS] [-o FILE] [--gross-only]
//! -- CMD ARGS...`: start a program and record it from its first instruction.
//!
//! The one idea: the program is started traced, and stopped at its entry point (the
//! auxiliary vector's `AT_ENTRY`) — the dynamic loader has mapped its libraries by
//! then, but none of the program's own code has run. There tendril loads its agent on
//! the held thread, connects to it, patches the roots, and only then lets the program
//! run. tendril exits with the program's exit status.

use crate::commands::record::{record_until_done, write_profile};
use crate::interrupt;
use crate::recording::{RecordOptions, Recorder, Scheme};
use anyhow::{Context, bail};
use nix::sys::ptrace;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::time::Duration;

/// `AT_ENTRY` in the auxiliary vector: the program's entry point.
const AT_ENTRY: u64 = 9;
const INT3: u8 = 0xcc;

/// What `tendril run` was asked for.
#[derive(Debug, Clone)]
pub struct RunCommand {
    pub program: Vec<String>,
    /// Root patterns; `main` when none are given.
    pub roots: Vec<String>,
    pub scheme: Scheme,
    pub gross_only: bool,
    pub duration: Option<Duration>,
    pub output: Option<PathBuf>,
}

/// Runs the program under recording; returns its exit status (128 + signal when a
/// signal ended it).
pub fn run(command: &RunCommand) -> anyhow::Result<u8> {
    let Some((program, arguments)) = command.program.split_first() else {
        bail!("no program to run — give one after `--`, e.g. `tendril run -- ./server`");
    };
    interrupt::install();
    let child = start_stopped_at_entry(program, arguments)?;
    let pid = child.as_raw();
    // The agent starts while the program is held at its entry point; the program runs
    // once the roots are patched (dropping the held thread lets it go).
    let held = crate::inject::load_agent_before_start(pid).inspect_err(|_| {
        let _ = kill(child, Signal::SIGKILL);
    })?;
    let roots = if command.roots.is_empty() {
        vec!["main".to_string()]
    } else {
        command.roots.clone()
    };
    let recorder = Recorder::start(&RecordOptions {
        pid,
        roots,
        scheme: command.scheme,
        gross_only: command.gross_only,
    });
    let recorder = match recorder {
        Ok(recorder) => recorder,
        Err(error) => {
            // Nothing is patched: let the program go, without us.
            drop(held);
            return Err(error.into());
        }
    };
    eprintln!(
        "tendril: running {program} (pid {pid}) and recording {}",
        recorder.roots().join(", ")
    );
    drop(held);
    let mut status = None;
    let profile = record_until_done(recorder, command.duration, || {
        status = status.or_else(|| exit_status(child));
        status.is_some()
    })?;
    write_profile(&profile, command.output.as_deref())?;
    let status = status.or_else(|| exit_status(child));
    if let Some(status) = status {
        eprintln!("tendril: {program} exited with status {status}");
    }
    Ok(status.unwrap_or(0))
}

/// Starts `program` traced and leaves it stopped (traced by tendril) at its entry
/// point, with no instruction of its own executed.
fn start_stopped_at_entry(program: &str, arguments: &[String]) -> anyhow::Result<Pid> {
    let mut command = std::process::Command::new(program);
    command.args(arguments);
    // SAFETY: runs in the child between fork and exec; ptrace(TRACEME) is a single
    // async-signal-safe system call.
    unsafe {
        command.pre_exec(|| ptrace::traceme().map_err(std::io::Error::from));
    }
    let child = command
        .spawn()
        .with_context(|| format!("cannot start {program}"))?;
    let pid = Pid::from_raw(child.id() as i32);
    // The first stop is the exec's SIGTRAP.
    expect_trap(pid, program)?;
    let entry = entry_point(pid)?;
    let memory = format!("/proc/{pid}/mem");
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&memory)
        .with_context(|| format!("cannot open {memory}"))?;
    use std::os::unix::fs::FileExt;
    let mut original = [0u8];
    mem.read_exact_at(&mut original, entry)?;
    mem.write_all_at(&[INT3], entry)?;
    ptrace::cont(pid, None)?;
    expect_trap(pid, program)?;
    mem.write_all_at(&original, entry)?;
    let mut registers = ptrace::getregs(pid)?;
    registers.rip = entry;
    ptrace::setregs(pid, registers)?;
    // `child` is only a handle: the process is reaped by `exit_status`.
    std::mem::forget(child);
    Ok(pid)
}

/// Waits for the traced child's next stop, which must be a SIGTRAP.
fn expect_trap(pid: Pid, program: &str) -> anyhow::Result<()> {
    match waitpid(pid, None)? {
        WaitStatus::Stopped(_, Signal::SIGTRAP) => Ok(()),
        WaitStatus::Exited(_, code) => {
            bail!("{program} exited with status {code} before it started")
        }
        WaitStatus::Signaled(_, signal, _) => {
            bail!("{program} was killed by {signal} before it started")
        }
        other => {
            let _ = kill(pid, Signal::SIGKILL);
            bail!("{program} stopped unexpectedly while starting ({other:?})")
        }
    }
}

/// The program's entry point, from `/proc/PID/auxv`.
fn entry_point(pid: Pid) -> anyhow::Result<u64> {
    let auxv = std::fs::read(format!("/proc/{pid}/auxv"))?;
    auxv.chunks_exact(16)
        .map(|pair| {
            let word = |i: usize| u64::from_le_bytes(pair[i..i + 8].try_into().unwrap());
            (word(0), word(8))
        })
        .find(|&(key, _)| key == AT_ENTRY)
        .map(|(_, value)| value)
        .context("the program has no entry point in its auxiliary vector")
}

/// Reaps the child if it has exited; its exit status (128 + signal number if a signal
/// ended it), or `None` while it runs (if the recording ends first, it goes on alone).
fn exit_status(pid: Pid) -> Option<u8> {
    use nix::sys::wait::WaitPidFlag;
    match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::Exited(_, code)) => Some(code as u8),
        Ok(WaitStatus::Signaled(_, signal, _)) => Some(128 + signal as u8),
        _ => None,
    }
}
