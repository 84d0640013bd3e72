//! `tendril run [--root SYM]... [--scheme a|b] [--duration SECS] [-o FILE] [--gross-only]
//! -- CMD ARGS...`: start a program and record it from its first instruction.
//!
//! The one idea: the program is started traced, and stopped at its entry point (the
//! auxiliary vector's `AT_ENTRY`) — the dynamic loader has mapped its libraries by
//! then, but none of the program's own code has run. There tendril loads its agent on
//! the held thread, connects to it, patches the roots, and only then lets the program
//! run. If anything before that fails, tendril kills the program it started (it has not
//! run) and says so. tendril exits with the program's exit status, or 128 + the signal
//! that killed it, as a shell does.

use crate::commands::output::ProfileOutput;
use crate::commands::record::record_until_done;
use crate::departure::Ending;
use crate::interrupt;
use crate::process::AttachError;
use crate::recording::{RecordError, RecordOptions, Recorder, Scheme, TimingOptions};
use crate::targets::SelectError;
use crate::terminal_text::say;
use anyhow::{Context, anyhow, bail};
use nix::sys::ptrace;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;
use std::io::ErrorKind;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
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
    pub timing: TimingOptions,
    /// `--pointer-candidates`.
    pub pointer_candidates: bool,
    pub duration: Option<Duration>,
    pub output: Option<PathBuf>,
    /// `--trace`: keep the raw events of this first stretch.
    pub trace: Option<Duration>,
}

/// Runs the program under recording; returns the exit status to exit with.
pub fn run(command: &RunCommand) -> anyhow::Result<u8> {
    let Some((program, arguments)) = command.program.split_first() else {
        bail!("no program to run — give one after `--`, e.g. `tendril run -- ./server`");
    };
    // `-o FILE` is checked before the program starts; nothing is written unless a
    // profile is.
    let chosen = match command.output.as_deref() {
        Some(path) => Some(ProfileOutput::open(Some(path))?),
        None => None,
    };
    interrupt::install();
    let child = start_traced(program, arguments)?;
    let pid = child.as_raw();
    // Without -o, a new file named after the program's pid, as `record` writes; made
    // while the program is held at its exec, before it runs its first instruction.
    let output = match chosen.map_or_else(|| ProfileOutput::open_or_fresh(None, pid), Ok) {
        Ok(output) => output,
        Err(error) => {
            kill_and_reap(child);
            bail!("{error:#}; killed {program} (pid {pid}) before it started");
        }
    };
    let mut recorder = match prepare(command, program, child) {
        Ok(recorder) => recorder,
        Err(reason) => {
            // Held at its start (or still in the exec): it has not run its own code.
            kill_and_reap(child);
            bail!("{reason:#}; killed {program} (pid {pid}) before it started");
        }
    };
    crate::commands::record::start_trace(&mut recorder, command.trace);
    let mut ended = None;
    let profile = record_until_done(recorder, command.duration, || {
        ended = ended.or_else(|| ended_status(child));
        ended.is_some()
    })?;
    crate::commands::record::write_profile(output, &profile)?;
    let ended = ended.or_else(|| final_status(child));
    if let Some(ending) = ended {
        say!("{program} {ending}");
    }
    Ok(ended.map_or(0, Ending::shell_status))
}

/// Everything between the exec and the program's first instruction: stop at the entry
/// point, check the program, load the agent, patch the roots; then let it run. On an
/// error the program is still held (traced, stopped), for the caller to kill.
fn prepare(command: &RunCommand, program: &str, child: Pid) -> anyhow::Result<Recorder> {
    let pid = child.as_raw();
    // The first stop is the exec's SIGTRAP; the executable is mapped, nothing ran.
    expect_trap(child, program)?;
    let exe = check_program(pid, program)?;
    stop_at_entry(child, program)?;
    // The agent starts while the program is held at its entry point; the program runs
    // once the roots are patched (dropping the held thread lets it go).
    let held = crate::inject::load_agent_before_start(pid)?;
    let default_root = command.roots.is_empty();
    let roots = if default_root {
        vec!["main".to_string()]
    } else {
        command.roots.clone()
    };
    let recorder = Recorder::start(&RecordOptions {
        pid,
        roots,
        scheme: command.scheme,
        gross_only: command.gross_only,
        timing: command.timing.clone(),
        pointer_candidates: command.pointer_candidates,
    });
    let recorder = match recorder {
        Ok(recorder) => recorder,
        Err(error) => {
            // Killed before the held thread is let go, so the program never runs.
            let _ = kill(child, Signal::SIGKILL);
            drop(held);
            return Err(root_error(error, program, &exe, default_root));
        }
    };
    if recorder.waiting_for().is_empty() {
        say!(
            "running {program} (pid {pid}) and recording {}",
            super::record::names_summary(recorder.roots())
        );
    } else {
        say!(
            "running {program} (pid {pid}); recording {} once it loads {}",
            super::record::names_summary(&command.roots),
            recorder.waiting_for().join(", ")
        );
    }
    drop(held);
    Ok(recorder)
}

/// Starts `program` with `PTRACE_TRACEME`: it stops, traced by tendril, right after
/// its exec. A program that cannot be started is one line with the reason.
fn start_traced(program: &str, arguments: &[String]) -> anyhow::Result<Pid> {
    let mut command = std::process::Command::new(program);
    command.args(arguments);
    // SAFETY: runs in the child between fork and exec; ptrace(TRACEME) is a single
    // async-signal-safe system call.
    unsafe {
        command.pre_exec(|| ptrace::traceme().map_err(std::io::Error::from));
    }
    let child = command
        .spawn()
        .map_err(|e| anyhow!("cannot start {program}: {}", why_not_started(program, &e)))?;
    // `child` is only a handle: the process is reaped through its pid.
    let pid = Pid::from_raw(child.id() as i32);
    std::mem::forget(child);
    Ok(pid)
}

/// Why `program` could not be executed, in words.
fn why_not_started(program: &str, error: &std::io::Error) -> String {
    let path = find_program(program);
    let metadata = path.as_deref().and_then(|p| std::fs::metadata(p).ok());
    match error.kind() {
        ErrorKind::NotFound if !program.contains('/') && path.is_none() => {
            "no such program in PATH".into()
        }
        ErrorKind::NotFound if metadata.is_some() => {
            "the interpreter it names (its #! line or ELF loader) does not exist".into()
        }
        ErrorKind::NotFound => "no such file or directory".into(),
        ErrorKind::PermissionDenied if metadata.as_ref().is_some_and(|m| m.is_dir()) => {
            "it is a directory, not a program".into()
        }
        ErrorKind::PermissionDenied
            if metadata
                .as_ref()
                .is_some_and(|m| m.permissions().mode() & 0o111 == 0) =>
        {
            "permission denied: it is not executable (no x permission)".into()
        }
        ErrorKind::PermissionDenied => "permission denied".into(),
        _ if error.raw_os_error() == Some(libc::ENOEXEC) => {
            "it is not a program this system can run (neither an x86-64 ELF nor a #! script)".into()
        }
        _ => error.to_string(),
    }
}

/// Where `program` is: itself if it has a `/`, else the first match in `PATH`.
fn find_program(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// Checks the executable the program runs (for a script, its interpreter) as `status`
/// would; returns its path.
fn check_program(pid: i32, program: &str) -> anyhow::Result<PathBuf> {
    match crate::process::inspect(pid) {
        Ok(target) => Ok(target.exe),
        Err(AttachError::WrongArchitecture { exe, what, .. }) => bail!(
            "{} is not an x86-64 program ({what}); tendril supports 64-bit x86-64 programs only",
            runs(program, Path::new(&exe))
        ),
        Err(AttachError::StaticallyLinked { exe, .. }) => bail!(
            "{} is statically linked: it has no dynamic loader, so tendril cannot load its agent into it",
            runs(program, Path::new(&exe))
        ),
        Err(other) => Err(other.into()),
    }
}

/// `program`, or `program runs EXE, which` when the program is a script whose
/// interpreter is `exe` — the subject of a sentence about `exe`.
fn runs(program: &str, exe: &Path) -> String {
    let same = find_program(program)
        .and_then(|p| p.canonicalize().ok())
        .is_none_or(|p| p == exe);
    if same {
        program.to_string()
    } else {
        format!("{program} runs {}, which", exe.display())
    }
}

/// The error for roots that could not be set up; the default root `main` missing is
/// said as such (a stripped program), and no pid is named (the process is killed).
fn root_error(error: RecordError, program: &str, exe: &Path, default_root: bool) -> anyhow::Error {
    match error {
        RecordError::Select(SelectError::NoMatch { .. }) if default_root => anyhow!(
            "{} has no `main` symbol (stripped?) — name the function to record with --root SYM",
            runs(program, exe)
        ),
        RecordError::Select(SelectError::NoMatch { pattern, hint, .. }) => {
            let hint = if hint.starts_with("did you mean") {
                hint
            } else {
                format!(
                    "`nm -C {program}` lists the program's own functions (a root in a \
                     library it loads later: name it with its module, `LIB:FUNC`, and \
                     tendril waits for the library)"
                )
            };
            anyhow!("no function matches '{pattern}' in {program} or its libraries — {hint}")
        }
        other => other.into(),
    }
}

/// Lets the exec-stopped program run up to its entry point, and stops it there
/// (restoring the byte the breakpoint took).
fn stop_at_entry(pid: Pid, program: &str) -> anyhow::Result<()> {
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
    Ok(())
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
        other => bail!("{program} stopped unexpectedly while starting ({other:?})"),
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

/// Kills the held child and waits until it is gone.
fn kill_and_reap(pid: Pid) {
    let _ = kill(pid, Signal::SIGKILL);
    while let Ok(status) = waitpid(pid, None) {
        if matches!(status, WaitStatus::Exited(..) | WaitStatus::Signaled(..)) {
            break;
        }
    }
}

/// Reaps the child if it has ended; how, or `None` while it runs (if the recording
/// ends first, it goes on alone).
fn ended_status(pid: Pid) -> Option<Ending> {
    use nix::sys::wait::WaitPidFlag;
    ending_of(waitpid(pid, Some(WaitPidFlag::WNOHANG)))
}

/// How the child ended, once the recording is over. A process whose main thread shows
/// as exited (a zombie) may still have threads on their way out (the agent's among
/// them), and until the last is gone `waitpid` says it still runs: then it is waited
/// for, as it cannot run on. A child that does run on goes on alone: `None`.
fn final_status(pid: Pid) -> Option<Ending> {
    ended_status(pid).or_else(|| {
        crate::process::is_gone_or_exiting(pid.as_raw())
            .then(|| ending_of(waitpid(pid, None)))
            .flatten()
    })
}

/// The ending a `waitpid` result reports, if it reports one.
fn ending_of(status: nix::Result<WaitStatus>) -> Option<Ending> {
    match status {
        Ok(WaitStatus::Exited(_, code)) => Some(Ending::Exited(code)),
        Ok(WaitStatus::Signaled(_, signal, core_dumped)) => Some(Ending::Killed {
            signal: signal as i32,
            core_dumped,
        }),
        _ => None,
    }
}
