//! `tendril edges <PID> <FUNC> [--duration SECS] [--json] [-o FILE]`: exact counts of
//! one function's control-flow edges — blocks, conditional branches, jump-table
//! entries, loop trips — printed as its annotated disassembly (or JSON).
//!
//! The one idea: the agent copies the whole function with a counter on every block,
//! every taken branch and every table entry, and points the entry at the copy; this
//! side waits, restores the entry, and only then reads the counters, as `count` does
//! (`commands::counters`: whatever ends the wait, the code is restored first). The
//! function's bytes are read before the copy goes in — they are what the layout
//! describes, and a target that exits meanwhile still gets its listing. Every other
//! number follows from the counters, and the Ball–Larus path numbers the copy counted
//! decode into their blocks (`edge_analysis`, which the live UI's annotated code uses
//! too).

use crate::agent_connection::{AgentConnection, AgentConnectionError};
use crate::commands::counters::{self, CounterWait};
use crate::commands::output::ProfileOutput;
use crate::commands::progress::{amount, thousands};
use crate::edge_analysis::derived::{About, EdgeProfile};
use crate::edge_analysis::listing::{self, Listing};
use crate::edge_analysis::{cold_bytes, name_of, returns_twice_callee, summed};
use crate::symbols::{Function, ProcessSymbols};
use crate::terminal_text::{say, write_json};
use crate::{inject, interrupt, refusals, targets};
use anyhow::{anyhow, bail};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;
use tendril_wire::edges::EdgeLayout;
use tendril_wire::{Hook, Request, Response};

/// Most functions named when a pattern matches several.
const NAMES_SHOWN: usize = 5;

/// What `tendril edges` was asked for.
#[derive(Debug, Clone, clap::Args)]
pub struct EdgesOptions {
    /// Process id of the target.
    pub pid: i32,
    /// The function: exact name, `module:name`, a glob that matches one function, or
    /// its address (`0x…`).
    #[arg(value_name = "FUNC")]
    pub function: String,
    /// Stop after this many seconds (default: until Ctrl-C).
    #[arg(
        long,
        value_name = "SECS",
        allow_negative_numbers = true,
        value_parser = crate::commands::duration::parse_seconds
    )]
    pub duration: Option<Duration>,
    /// Print JSON instead of the annotated disassembly.
    #[arg(long)]
    pub json: bool,
    /// Count blocks and edges only, without path numbers (a little cheaper per edge).
    #[arg(long)]
    pub no_paths: bool,
    /// Write the output to FILE instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

pub fn run(options: &EdgesOptions) -> anyhow::Result<()> {
    edges(options).map_err(|error| counters::said_as_departure(options.pid, error))
}

fn edges(options: &EdgesOptions) -> anyhow::Result<()> {
    let pid = options.pid;
    // Checked before the target is touched, as `record` does.
    let output = ProfileOutput::open(options.output.as_deref())?;
    crate::process::inspect(pid)?;
    let symbols = ProcessSymbols::load(pid)?;
    let named = one_function(&symbols, &options.function)?;
    refuse_before_attaching(named, &named.name)?;
    let (_, mut session) = inject::attach(pid)?;
    // An IFUNC (`memcpy`) is profiled at the implementation the loader chose.
    let chosen = targets::choose(&symbols, &[named], &mut session)?.remove(0);
    let (name, function) = (&chosen.display_name, &chosen.function);
    refuse_before_attaching(function, name)?;
    let code = crate::symbols::maps::read_memory(pid, function.addr, function.end())
        .map_err(|e| anyhow!("cannot read the code of {name} in process {pid}: {e}"))?;
    let twice = returns_twice_callee(pid, &symbols, function.addr, &code);
    let cold = cold_bytes(pid, &symbols, function);
    interrupt::install();
    let count_paths = !options.no_paths && twice.is_none();
    let mut layout = install(&mut session, &symbols, function, name, count_paths)?;
    if let Some(callee) = twice
        && !options.no_paths
    {
        layout.paths = Err(format!(
            "it calls {callee}, which returns twice; a path register cannot follow that"
        ));
    }
    let ids = layout.counters();
    let mut unloaded = false;
    let waited = counters::wait_then_restore(
        &mut session,
        CounterWait {
            pid,
            ids: &ids,
            duration: options.duration,
            counting: format!(
                "edges of {name} ({})",
                amount(layout.blocks.len() as u64, "block", "blocks")
            ),
            what: "edge count",
        },
        Vec::new(),
        // The calls counter comes first.
        |latest| format!("{} calls of {name} so far", thousands(summed(latest, 0))),
        |session| {
            unloaded = restore(session, layout.address)?;
            Ok(())
        },
    )?;
    if unloaded {
        say!(
            "{name} was unloaded with {} during the edge count; the counts are of \
             its calls before that (nothing was written where it had been)",
            function.module
        );
    }
    let counts: HashMap<u32, u64> = ids
        .iter()
        .enumerate()
        .map(|(index, &id)| (id, summed(&waited.latest, index)))
        .collect();
    let profile = EdgeProfile::derive(&layout, |id| counts.get(&id).copied().unwrap_or(0));
    let about = About {
        function: name.clone(),
        module: function.module.to_string(),
        pid,
        size: function.size,
        elapsed: waited.elapsed,
        threads: waited
            .latest
            .iter()
            .filter(|thread| thread.calls.first().is_some_and(|&calls| calls > 0))
            .count(),
    };
    let mut text = Vec::new();
    if options.json {
        write_json(&mut text, &profile.to_json(&about))?;
        text.push(b'\n');
    } else {
        let name_of = |address: u64| name_of(&symbols, address);
        let listing = Listing {
            about: &about,
            code: &code,
            cold: &cold,
            name_of: &name_of,
        };
        listing::write_text(&mut text, &listing, &profile)?;
    }
    write_output(output, &text, pid, options.json)?;
    match waited.failure {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// The one function `pattern` names (aliases at one address are one function).
fn one_function<'a>(symbols: &'a ProcessSymbols, pattern: &str) -> anyhow::Result<&'a Function> {
    let mut distinct: Vec<&Function> = Vec::new();
    for function in targets::match_patterns(symbols, &[pattern.to_string()])? {
        if !distinct.iter().any(|f| f.addr == function.addr) {
            distinct.push(function);
        }
    }
    // A glob that also matches `.cold` parts (never profiled) names their owner.
    if distinct.len() > 1 {
        let profilable: Vec<&Function> = distinct
            .iter()
            .copied()
            .filter(|f| refusals::reason(f, false).is_none())
            .collect();
        if profilable.len() == 1 {
            distinct = profilable;
        }
    }
    match distinct[..] {
        [one] => Ok(one),
        ref several => {
            // Functions that share a name and module are told apart by address.
            let names: Vec<String> = several
                .iter()
                .take(NAMES_SHOWN)
                .map(|f| {
                    let twins = several
                        .iter()
                        .any(|g| g.addr != f.addr && g.name == f.name && g.module == f.module);
                    if twins {
                        format!("{} ({} at {:#x})", f.name, f.module, f.addr)
                    } else {
                        format!("{} ({})", f.name, f.module)
                    }
                })
                .collect();
            let more = match several.len().saturating_sub(NAMES_SHOWN) {
                0 => String::new(),
                more => format!(" and {more} more"),
            };
            bail!(
                "'{pattern}' matches {} functions in pid {}: {}{more} — name one function \
                 (its exact name, module:name, or its address)",
                several.len(),
                symbols.pid(),
                names.join(", ")
            )
        }
    }
}

/// What is refused by name or size, before anything is asked of the agent.
fn refuse_before_attaching(function: &Function, name: &str) -> anyhow::Result<()> {
    if let Some(reason) = refusals::reason(function, false) {
        bail!("cannot profile {name}'s edges: {reason}");
    }
    if function.size == 0 {
        bail!(
            "cannot profile {name}'s edges: its size is unknown (no symbol size and no unwind \
             information)"
        );
    }
    Ok(())
}

/// Has the agent copy `function` with counters (and the path register if `paths`) and
/// point its entry at the copy.
fn install(
    session: &mut AgentConnection,
    symbols: &ProcessSymbols,
    function: &Function,
    name: &str,
    paths: bool,
) -> anyhow::Result<EdgeLayout> {
    // The same neighbourhood `count` sends: code that might branch into the entry.
    let Request::Patch { code_ranges, .. } =
        targets::patch_request(symbols, &[(function, Hook::Count)])
    else {
        unreachable!("patch_request makes a Patch request")
    };
    let request = Request::CopyWithCounters {
        address: function.addr,
        size: function.size,
        code_ranges,
        cold_parts: targets::cold_parts(symbols, function),
        paths,
    };
    match session.request(&request) {
        Ok(Response::EdgesInstalled { layout }) => Ok(layout),
        Ok(other) => bail!("unexpected answer from the agent: {other:?}"),
        Err(AgentConnectionError::Refused(reason)) => {
            bail!("cannot profile {name}'s edges: {reason}")
        }
        Err(error) => bail!("cannot profile {name}'s edges: {error}"),
    }
}

/// Points the entry back at the original code; says whether the function had been
/// unloaded with its library instead (its code gone, nothing to restore).
fn restore(session: &mut AgentConnection, address: u64) -> anyhow::Result<bool> {
    match session
        .request(&Request::Unpatch {
            addresses: vec![address],
        })
        .map_err(|e| anyhow!("cannot restore the target's code: {e}"))?
    {
        Response::Unpatched { unloaded, .. } => Ok(unloaded.contains(&address)),
        other => bail!("unexpected answer from the agent: {other:?}"),
    }
}

/// Writes the output to its file (and says where) or to stdout.
fn write_output(output: ProfileOutput, text: &[u8], pid: i32, json: bool) -> anyhow::Result<()> {
    let path = output.path().map(std::path::Path::to_path_buf);
    // The counts cannot be taken again: if the file fails, they are saved elsewhere.
    output.write_unrepeatable(&crate::commands::rescue::Rescued {
        prefix: format!("tendril-edges-{pid}"),
        extension: if json { "json" } else { "txt" },
        write: &|out| out.write_all(text),
    })?;
    if let Some(path) = path {
        let shown = std::path::absolute(&path).unwrap_or(path);
        say!("edge profile written to {}", shown.display());
    }
    Ok(())
}
