//! `tendril report <FILE> [--format FORMAT] [-o OUT] [--threshold PCT] [--depth N]
//! [--thread TID] [--clock wall|cpu] [-v]`: a saved profile as text, or in a format another
//! tool reads (pprof, speedscope, chrome, svg), cut down as asked (`profile::prune`),
//! in wall-clock or on-CPU time (`profile::clock`).
//!
//! The one idea: the output is made in memory first, then written, so a profile that
//! cannot be read or drawn leaves no half-written file; an output path that cannot be
//! written is refused before the profile is even read. On a terminal, the tree's and the
//! hot spots' long names are cut in the middle to its width (`profile::names`).

use crate::commands::output::OutputFile;
use crate::profile::report::{MAX_STACK_DEPTH, TextOptions, subtrees_cut, write_report_with};
use crate::profile::{Clock, Profile, Prune, ReportFormat};
use crate::terminal_text::say;
use std::io::{IsTerminal, Write};
use std::path::Path;

pub fn run(
    file: &Path,
    format: ReportFormat,
    output: Option<&Path>,
    prune: Prune,
    clock: Clock,
    details: bool,
) -> anyhow::Result<()> {
    let destination = output.map(OutputFile::open).transpose()?;
    if destination.is_none() && format.is_binary() && std::io::stdout().is_terminal() {
        anyhow::bail!(
            "{format} output is binary and stdout is a terminal — give -o FILE (e.g. -o \
             profile.pb.gz) or redirect stdout"
        );
    }
    let mut profile = Profile::load(file)?;
    match format {
        // The profile format carries both clocks; pprof carries both and opens on
        // the one asked for.
        ReportFormat::Json if clock == Clock::Cpu => anyhow::bail!(
            "--clock cpu does not apply to --format json: the JSON profile carries both \
             times (cpu_ns and self_cpu_ns beside total_ns and self_ns)"
        ),
        ReportFormat::Pprof => {
            if clock == Clock::Cpu && !profile.has_cpu_time() {
                profile
                    .show_clock(clock)
                    .map_err(|e| anyhow::anyhow!("{}: no CPU times: {e}", file.display()))?;
            }
        }
        _ => profile
            .show_clock(clock)
            .map_err(|e| anyhow::anyhow!("{}: no CPU times: {e}", file.display()))?,
    }
    prune
        .apply(&mut profile)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    say_what_is_cut(&profile, format);
    if let Some(trace) = &profile.trace
        && matches!(format, ReportFormat::Chrome | ReportFormat::Speedscope)
    {
        say!("{}", trace.summary());
    }
    if format == ReportFormat::Pprof && clock == Clock::Cpu {
        let mut bytes = Vec::new();
        crate::profile::export::pprof::write_opening_on_cpu(&profile, &mut bytes)?;
        return match destination {
            Some(destination) => destination.write_bytes(&bytes),
            None => Ok(std::io::stdout()
                .lock()
                .write_all(&bytes)
                .map_err(|e| anyhow::anyhow!("cannot write to stdout: {e}"))?),
        };
    }
    let Some(destination) = destination else {
        // On a terminal, long names are cut in the middle to its width; a pipe or a
        // file gets them whole.
        let columns = std::io::stdout()
            .is_terminal()
            .then(|| tendril_tui::crossterm::terminal::size().ok())
            .flatten()
            .map(|(columns, _)| usize::from(columns));
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        let options = TextOptions { columns, details };
        let written = write_report_with(&profile, format, options, &mut out);
        return match written.and_then(|()| out.flush()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => Err(e.into()),
            other => Ok(other.map_err(|e| anyhow::anyhow!("cannot write to stdout: {e}"))?),
        };
    };
    let mut bytes = Vec::new();
    let options = TextOptions {
        columns: None,
        details,
    };
    write_report_with(&profile, format, options, &mut bytes)?;
    destination.write_bytes(&bytes)
}

/// Says on stderr when a stack format draws the tree cut (`profile::depth_cut`).
fn say_what_is_cut(profile: &Profile, format: ReportFormat) {
    use ReportFormat::{Folded, Pprof, Speedscope, Svg};
    let cut = subtrees_cut(&profile.merged.roots);
    if cut == 0 || !matches!(format, Folded | Svg | Speedscope | Pprof) {
        return;
    }
    let level = MAX_STACK_DEPTH - 1;
    let what = if cut == 1 {
        format!(
            "1 subtree below level {level} is drawn as one '[N levels cut]' frame, holding its time"
        )
    } else {
        format!(
            "{cut} subtrees below level {level} are each drawn as one '[N levels cut]' frame, \
             holding their time"
        )
    };
    say!("the call tree is deeper than {MAX_STACK_DEPTH} levels: {what}");
}
