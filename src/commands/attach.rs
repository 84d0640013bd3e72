//! `tendril attach <PID> [--root SYM]...`: the live terminal UI on a running process.
//!
//! The one idea: everything that can be checked without touching the target (the pid,
//! permissions, the executable) is checked before the UI appears, so a bad pid is one
//! line on the normal screen; attaching itself happens when the roots are chosen.

use crate::live::{self, Start};

pub fn run(pid: i32, roots: Vec<String>) -> anyhow::Result<()> {
    live::require_terminal(&format!(
        "record without it: `tendril record {pid} --root SYM --duration SECS`"
    ))?;
    let target = crate::process::inspect(pid)?;
    let note = live::run(Start::Attach {
        target: &target,
        roots,
    })?;
    if let Some(note) = note {
        eprintln!("tendril: {note}");
    }
    Ok(())
}
