//! `tendril report <FILE> [--format tree|hot|folded|json] [--threshold PCT] [--depth N]
//! [--thread TID]`: a saved profile as text, cut down as asked (`profile::prune`).

use crate::profile::report::{MAX_FOLDED_FRAMES, folded_stacks_elided};
use crate::profile::{Profile, Prune, ReportFormat, write_report};
use std::io::Write;
use std::path::Path;

pub fn run(file: &Path, format: ReportFormat, prune: Prune) -> anyhow::Result<()> {
    let mut profile = Profile::load(file)?;
    prune
        .apply(&mut profile)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    if format == ReportFormat::Folded {
        let elided = folded_stacks_elided(&profile);
        if elided > 0 {
            eprintln!(
                "tendril: {elided} stack{} deeper than {MAX_FOLDED_FRAMES} frames {} cut to \
                 {} innermost {MAX_FOLDED_FRAMES}, below a '[N frames elided]' frame",
                if elided == 1 { "" } else { "s" },
                if elided == 1 { "is" } else { "are" },
                if elided == 1 { "its" } else { "their" },
            );
        }
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    match write_report(&profile, format, &mut out).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}
