//! `tendril symbols <PID> [PATTERN] [--json]`: list the functions of a running process.
//!
//! Text output is one function per line, address-sorted and aligned:
//! `0x<addr:016x> <size:>8> <module padded> <name>`. JSON output is one array of
//! `{addr, size, module, name, raw_name, source}` objects. A closed pipe (`| head`) ends
//! the listing quietly.

use std::io::{self, BufWriter, Write};

use anyhow::anyhow;
use serde_json::json;

use super::{Function, ProcessSymbols, SymbolError};

/// Loads the symbols of `pid`, selects those matching `pattern` (all if `None`) and
/// writes them to `out`. A pattern that matches nothing is an error whose one-line
/// message names the pid and suggests close names.
pub fn run_symbols_command(
    pid: i32,
    pattern: Option<&str>,
    json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let symbols = ProcessSymbols::load(pid)?;
    let functions: Vec<&Function> = match pattern {
        None => symbols.functions().iter().collect(),
        Some(p) => symbols.find(p).map_err(|e| no_match_error(e, pid))?,
    };
    let mut out = BufWriter::new(out);
    let written = if json {
        write_json(&functions, &mut out)
    } else {
        write_text(&functions, &mut out)
    };
    match written.and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

fn no_match_error(e: SymbolError, pid: i32) -> anyhow::Error {
    match e {
        SymbolError::NoMatch {
            pattern,
            suggestions,
        } if suggestions.is_empty() => anyhow!(
            "no function matches '{pattern}' in pid {pid} — list them all with `tendril symbols {pid}`"
        ),
        SymbolError::NoMatch {
            pattern,
            suggestions,
        } => anyhow!(
            "no function matches '{pattern}' in pid {pid} — did you mean: {}?",
            suggestions.join(", ")
        ),
        other => other.into(),
    }
}

fn write_text(functions: &[&Function], out: &mut dyn Write) -> io::Result<()> {
    let width = functions.iter().map(|f| f.module.len()).max().unwrap_or(0);
    for f in functions {
        writeln!(
            out,
            "{:#018x} {:>8} {:<width$} {}",
            f.addr, f.size, f.module, f.name
        )?;
    }
    Ok(())
}

fn write_json(functions: &[&Function], out: &mut dyn Write) -> io::Result<()> {
    let items: Vec<serde_json::Value> = functions
        .iter()
        .map(|f| {
            json!({
                "addr": f.addr,
                "size": f.size,
                "module": f.module,
                "name": f.name,
                "raw_name": f.raw_name,
                "source": f.source.as_str(),
            })
        })
        .collect();
    serde_json::to_writer_pretty(&mut *out, &items)?;
    writeln!(out)
}
