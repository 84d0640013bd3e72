//! `tendril demo`: the README's main job on the bundled demo target.
//!
//! Starts the demo workload (`tendril demo-target`, a child process: worker threads,
//! a few levels of calls, a recursive function, a hot leaf, libc calls), attaches to it
//! as to any running process and opens the live view with its natural root,
//! `demo_handle_request`, already chosen. Without a terminal on stdout (a script, a CI
//! log) it records the demo for a few seconds instead and prints the call tree.
//!
//! The one idea: the demo process is always detached first and then stopped, however
//! `run` ends — `q`, Ctrl-C, an error or a panic.

use crate::demo_workload;
use crate::live::{self, Start};
use crate::profile::{ReportFormat, write_report};
use crate::recording::{RecordOptions, Recorder, Scheme};
use crate::terminal_text::say;
use std::io::{IsTerminal, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long the demo runs before tendril attaches (its threads start).
const WARM_UP: Duration = Duration::from_millis(200);
/// How long the demo is recorded without a terminal.
const REPORT_DURATION: Duration = Duration::from_secs(3);

/// The demo child; killed and reaped however `run` ends (after the recorder, declared
/// later, has detached from it).
struct DemoProcess(Child);

impl Drop for DemoProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn run() -> anyhow::Result<()> {
    let interactive = std::io::stdout().is_terminal();
    let demo = start_demo(interactive)?;
    let pid = demo.0.id() as i32;
    // Let the workers start, as with any process one attaches to.
    std::thread::sleep(WARM_UP);
    let target = crate::process::inspect(pid)?;
    if interactive {
        live::run(Start::Attach {
            target: &target,
            roots: vec![demo_workload::DEMO_ROOT.to_string()],
            timing: Default::default(),
        })?;
        drop(demo);
        say!("the demo (pid {pid}) is detached and stopped");
        return Ok(());
    }
    crate::interrupt::install();
    say!(
        "demo target started: pid {pid}, {} worker threads; recording {} for {} s \
         (run `tendril demo` in a terminal for the live view)",
        demo_workload::DEMO_WORKERS,
        demo_workload::DEMO_ROOT,
        REPORT_DURATION.as_secs()
    );
    let recorder = Recorder::start(&RecordOptions {
        pid,
        roots: vec![demo_workload::DEMO_ROOT.to_string()],
        scheme: Scheme::B,
        gross_only: false,
        timing: Default::default(),
        pointer_candidates: false,
    })?;
    let gone = move || crate::process::is_gone_or_exiting(pid);
    let profile = super::record::record_until_done(recorder, Some(REPORT_DURATION), gone)?;
    let mut out = std::io::stdout().lock();
    write_report(&profile, ReportFormat::Tree, &mut out)?;
    out.flush()?;
    drop(demo);
    Ok(())
}

/// Starts `tendril demo-target` in a process group of its own (so a Ctrl-C typed at
/// tendril reaches only tendril, which then detaches and stops the demo) that dies with
/// tendril even if tendril is killed.
fn start_demo(interactive: bool) -> anyhow::Result<DemoProcess> {
    let exe = std::env::current_exe()?;
    let mut command = Command::new(exe);
    command
        .arg("demo-target")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // In the UI, a stray line from the demo would tear the screen.
        .stderr(if interactive {
            Stdio::null()
        } else {
            Stdio::inherit()
        })
        .process_group(0);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the child between fork and exec and only makes
    // async-signal-safe system calls (prctl, getppid, raise); it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::raise(libc::SIGKILL); // tendril died before prctl
            }
            Ok(())
        });
    }
    let child = command
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start the demo target: {e}"))?;
    Ok(DemoProcess(child))
}
