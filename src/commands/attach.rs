//! `tendril attach <PID> [--root SYM]...`: the live terminal UI on a running process.
//!
//! The one idea: everything that can be checked without touching the target (the pid,
//! permissions, the executable, the root patterns) is checked before the UI appears —
//! and before asking for a terminal, so a bad pid is reported as such even in a script;
//! attaching itself happens when the roots are chosen. A root named with a module the
//! process has not loaded yet (`libplug*:plugfn`) is waited for, as `record` waits.

use crate::live::{self, Start};
use crate::recording::TimingOptions;
use crate::recording::recorder::check_roots;
use crate::symbols::ProcessSymbols;
use crate::terminal_text::say;

pub fn run(pid: i32, roots: Vec<String>, timing: TimingOptions) -> anyhow::Result<()> {
    let target = crate::process::inspect(pid)?;
    if !roots.is_empty() {
        // Roots in a library not loaded yet are waited for, as `record` waits.
        check_roots(&ProcessSymbols::load(pid)?, &roots)?;
    }
    let root_arguments = if roots.is_empty() {
        " --root SYM".to_string()
    } else {
        roots.iter().map(|root| format!(" --root {root}")).collect()
    };
    live::require_terminal(&format!(
        "record without it: `tendril record {pid}{root_arguments} --duration SECS`"
    ))?;
    let note = live::run(Start::Attach {
        target: &target,
        roots,
        timing,
    })?;
    if let Some(note) = note {
        say!("{note}");
    }
    Ok(())
}
