//! `tendril diff A.json B.json [--format text|folded]`: how each call path's time
//! changed from one profile to another.
//!
//! The one idea: both files are read (any error names its file) before anything is
//! printed; the comparison itself is `profile::diff`.

use crate::profile::Profile;
use crate::profile::diff::{compare, write_diff_folded, write_diff_text};
use std::io::Write;
use std::path::Path;

/// What `tendril diff` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiffFormat {
    /// A table: change in total and self time per call path.
    Text,
    /// `path selfA selfB` lines for inferno's differential flame graph.
    Folded,
}

pub fn run(a: &Path, b: &Path, format: DiffFormat) -> anyhow::Result<()> {
    let profile_a = Profile::load(a)?;
    let profile_b = Profile::load(b)?;
    let rows = compare(&profile_a, &profile_b);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = match format {
        DiffFormat::Text => write_diff_text(
            &rows,
            (&a.display().to_string(), &profile_a),
            (&b.display().to_string(), &profile_b),
            &mut out,
        ),
        DiffFormat::Folded => write_diff_folded(&rows, &mut out),
    };
    match written.and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}
