//! `tendril symbols <PID> [PATTERN] [--json]`: list the functions of a running process.
//!
//! Text output is one function per line, address-sorted and aligned:
//! `0x<addr:016x> <size:>8> <module padded> <name>`, names and modules escaped
//! (`terminal_text`). JSON output is one array of `{addr, size, module, name,
//! raw_name, source}` objects, its strings exact. A closed pipe (`| head`) ends the
//! listing quietly.

use std::io::{self, BufWriter, Write};

use anyhow::anyhow;
use serde_json::json;

use super::error::module_hint;
use super::{Function, ProcessSymbols, SymbolError};
use crate::process::{AttachError, TargetProcess};
use crate::terminal_text::{self, printable};

/// Loads the symbols of `pid`, selects those matching `pattern` (all if `None`) and
/// writes them to `out`. A pattern that matches nothing is an error whose one-line
/// message names the pid and suggests close names; a process that is not x86-64 is
/// refused as `status` refuses it.
pub fn run_symbols_command(
    pid: i32,
    pattern: Option<&str>,
    json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    refuse_what_has_no_symbols(pid)?;
    refuse_other_architectures(pid)?;
    let symbols = ProcessSymbols::load(pid)?;
    let functions: Vec<&Function> = match pattern {
        None => {
            symbols.demangle_all();
            symbols.functions().iter().collect()
        }
        Some(p) => without_the_agent(&symbols, p, symbols.find(p).map_err(|e| no_match_error(e, pid))?)
            .ok_or_else(|| {
                anyhow!(
                    "no function matches '{p}' in pid {pid} but tendril's own agent's — name                      its module to list them (`{}*:{p}`)",
                    crate::agent_bundle::AGENT_LIBRARY_PREFIX
                )
            })?,
    };
    let mut out = BufWriter::new(out);
    let written = if json {
        write_json(&functions, &mut out)
    } else {
        write_text(&functions, &mut out)
    };
    match written.and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(anyhow!("cannot write the listing: {e}")),
        Ok(()) => Ok(()),
    }
}

/// `found` without the functions of tendril's own agent (loaded into the process by an
/// earlier attach), unless `pattern` names its module: a glob lists the program's
/// functions, not tendril's. `None` if only the agent's matched.
fn without_the_agent<'a>(
    symbols: &ProcessSymbols,
    pattern: &str,
    mut found: Vec<&'a Function>,
) -> Option<Vec<&'a Function>> {
    let is_agent = crate::agent_bundle::is_agent_module;
    let named = symbols
        .modules()
        .iter()
        .any(|m| is_agent(&m.name) && symbols.pattern_names_module(pattern, m));
    if named {
        return Some(found);
    }
    let before = found.len();
    found.retain(|f| !is_agent(&f.module));
    (!found.is_empty() || before == 0).then_some(found)
}

/// A 32-bit (or other non-x86-64) program is refused with the message `status` gives,
/// rather than listed as having no functions. Everything else about the process (gone,
/// not readable) is left to the symbol loader to say.
/// A pid with no program to list, said as every other command says it (a kernel
/// thread, a zombie, no such process). Being traced, or being tendril, is no reason not
/// to list a program's functions.
fn refuse_what_has_no_symbols(pid: i32) -> anyhow::Result<()> {
    match crate::process::inspect(pid) {
        Err(
            error @ (AttachError::NoSuchProcess(_)
            | AttachError::Zombie(_)
            | AttachError::KernelThread(_)),
        ) => Err(error.into()),
        _ => Ok(()),
    }
}

fn refuse_other_architectures(pid: i32) -> anyhow::Result<()> {
    let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else {
        return Ok(());
    };
    // Only the pid and the executable are read by the check.
    let target = TargetProcess {
        pid,
        ns_pid: pid,
        uid: 0,
        gid: 0,
        exe,
    };
    match crate::process::check_executable(&target) {
        Err(error @ AttachError::WrongArchitecture { .. }) => Err(error.into()),
        _ => Ok(()),
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
        SymbolError::NoModule {
            module,
            suggestions,
            modules,
        } => anyhow!(
            "no module matches '{module}' in pid {pid} — {}",
            module_hint(&suggestions, &modules)
        ),
        other => other.into(),
    }
}

/// Aligned lines; names and modules come from the target's files, so each is escaped
/// ([`printable`]).
fn write_text(functions: &[&Function], out: &mut dyn Write) -> io::Result<()> {
    let width = functions
        .iter()
        .map(|f| printable(&f.module).chars().count())
        .max()
        .unwrap_or(0);
    for f in functions {
        writeln!(
            out,
            "{:#018x} {:>8} {:<width$} {}",
            f.addr,
            f.size,
            printable(&f.module),
            printable(&f.name)
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
    terminal_text::write_json(&mut *out, &items)?;
    writeln!(out)
}
