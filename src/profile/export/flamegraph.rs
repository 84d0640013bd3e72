//! SVG flame graph export, drawn by the `inferno` crate from the folded stacks.
//!
//! The one idea: `report --format folded` already is inferno's input (one
//! `root;caller;callee <self ns>` line per context, names escaped, depth capped), so the
//! SVG is those lines handed to `inferno::flamegraph`, titled with the root, the
//! process and the total time. The file is self-contained: open it in a browser to
//! zoom and search.

use crate::profile::folded::write_folded;
use crate::profile::model::Profile;
use crate::profile::names::printable;
use inferno::flamegraph::{self, Options};
use std::io::{self, Write};

/// The flame graph's title: the roots, the process and the total (corrected) time.
pub fn title(profile: &Profile) -> String {
    format!(
        "{} — pid {} ({}) — total {:.3} ms",
        printable(&profile.roots.join(", ")),
        profile.pid,
        printable(&profile.exe),
        profile.merged_total_ns() as f64 / 1e6
    )
}

/// Writes the profile's merged tree as an SVG flame graph. A profile with no time at
/// all has nothing to draw: that is an error (`InvalidData`) saying so.
pub fn write_svg(profile: &Profile, out: &mut impl Write) -> io::Result<()> {
    let mut folded = Vec::new();
    write_folded(profile, &mut folded)?;
    let folded = String::from_utf8(folded).map_err(io::Error::other)?;
    if folded.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the profile has no time in it, so there is no flame graph to draw (record \
             while the roots run)",
        ));
    }
    let mut options = Options::default();
    options.title = title(profile);
    options.subtitle = Some(format!(
        "{} events; self times in ns, corrected for tendril's own cost; all threads merged",
        profile.stats.events
    ));
    options.count_name = "ns".to_owned();
    options.name_type = "Function:".to_owned();
    flamegraph::from_lines(&mut options, folded.lines(), out)
}
