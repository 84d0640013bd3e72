//! `tendril report <FILE> [--format tree|hot|folded|json]`: a saved profile as text.

use crate::profile::{Profile, ReportFormat, write_report};
use std::io::Write;
use std::path::Path;

pub fn run(file: &Path, format: ReportFormat) -> anyhow::Result<()> {
    let profile = Profile::load(file)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    match write_report(&profile, format, &mut out).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}
