//! `tendril` without arguments: the process picker, then the root picker, then the live
//! view — the whole terminal UI, starting from a list of running processes.
//!
//! The one idea: with no arguments at all there is nothing to do without a terminal, so
//! that case is a usage error pointing at `--help`.

use crate::live::{self, Start};
use crate::terminal_text::say;

pub fn run() -> anyhow::Result<()> {
    live::require_terminal("give a command (see `tendril --help`)")?;
    if let Some(note) = live::run(Start::ProcessPicker)? {
        say!("{note}");
    }
    Ok(())
}
