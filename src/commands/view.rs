//! `tendril view <FILE>`: browse a saved profile with the live UI's views (read-only).
//!
//! The one idea: a saved profile is just a snapshot that never changes, so the same
//! call tree, hot spots and threads views show it; keys that need a target are off.
//! The file is read before a terminal is asked for, so a bad file is reported as such.

use crate::live::{self, Start};
use crate::profile::Profile;
use std::path::Path;

pub fn run(path: &Path) -> anyhow::Result<()> {
    let profile = Profile::load(path)?;
    live::require_terminal(&format!(
        "print it instead: `tendril report {}`",
        path.display()
    ))?;
    live::run(Start::View {
        profile: &profile,
        path,
    })?;
    Ok(())
}
