//! `tendril count <PID> <PATTERN>... [--duration SECS] [--json] [--returns]`: exact call
//! counts of the matching functions, per function (and per thread in JSON).
//!
//! The one idea: patch, wait, restore, *then* read. Counters live in the target, per
//! thread, and only grow; the agent sets a function's counters to zero just before its
//! hooks go in (a function counted by an earlier session starts from zero again), and
//! reading them after the code is restored gives numbers no hook can add to any more:
//! every call since the hooks went in, and only the returns of those calls. Whatever
//! ends the wait — the duration, Ctrl-C, the target exiting — the code is restored
//! first (`commands::counters`, shared with `edges`).

use crate::agent_connection::AgentConnection;
use crate::commands::counters::{self, CounterWait};
use crate::commands::duration::format_elapsed;
use crate::commands::progress::{amount, thousands};
use crate::refusals;
use crate::symbols::ProcessSymbols;
use crate::targets::{self, Chosen};
use crate::terminal_text::{self, printable, say};
use crate::{inject, interrupt};
use anyhow::bail;
use serde_json::json;
use std::io::Write;
use std::time::Duration;
use tendril_wire::{Hook, LoaderCounts, PatchOutcome, Request, Response, ThreadCounters};

/// Frames the agent's per-thread return stack holds (`trampolines/src/thread_state.rs`).
const SHADOW_FRAMES: u64 = 32 * 1024;

/// What `tendril count` was asked for.
#[derive(Debug, Clone)]
pub struct CountOptions {
    pub pid: i32,
    pub patterns: Vec<String>,
    pub duration: Option<Duration>,
    pub json: bool,
    /// Also hook returns and count them.
    pub returns: bool,
}

/// A counted function: what was patched, its id, and its counts.
struct Counted {
    chosen: Chosen,
    id: u32,
    calls: u64,
    returns: u64,
    per_thread: Vec<(i32, String, u64, u64)>,
    /// Its library was unloaded during the count (its later calls are not counted).
    unloaded: bool,
}

/// Libraries the process loaded and unloaded during the count (the loader's own counts).
#[derive(Debug, Default, Clone, Copy)]
struct LibraryChurn {
    loaded: u64,
    unloaded: u64,
}

impl LibraryChurn {
    fn between(start: LoaderCounts, end: LoaderCounts) -> LibraryChurn {
        LibraryChurn {
            loaded: end.loads.saturating_sub(start.loads),
            unloaded: end.unloads.saturating_sub(start.unloads),
        }
    }
}

pub fn run(options: &CountOptions) -> anyhow::Result<()> {
    count(options).map_err(|error| counters::said_as_departure(options.pid, error))
}

fn count(options: &CountOptions) -> anyhow::Result<()> {
    let pid = options.pid;
    crate::process::inspect(pid)?;
    let symbols = ProcessSymbols::load(pid)?;
    let matched = targets::match_patterns(&symbols, &options.patterns)?;
    targets::refuse_if_none_patchable(&symbols, &matched, options.returns)?;
    let (_, mut session) = inject::attach(pid)?;
    let (chosen, refused_by_name): (Vec<Chosen>, Vec<Chosen>) =
        targets::choose(&symbols, &matched, &mut session)?
            .into_iter()
            .partition(|c| refusals::reason(&c.function, options.returns).is_none());
    let reloaded = if options.returns {
        targets::unwinder_symbols_after_attach(&symbols)?
    } else {
        None
    };
    let symbols = reloaded.as_ref().unwrap_or(&symbols);
    interrupt::install();
    let Patched {
        outcomes,
        mut counted,
        refused,
    } = patch_for_counting(&mut session, symbols, &chosen, &refused_by_name, options)?;
    let ids: Vec<u32> = counted.iter().map(|c| c.id).collect();
    // Only the threads' overflow counters need a starting point.
    let baseline = counters::read_counters(&mut session, &ids)?;
    let loader_at_start = session.loader_counts()?;
    let mut unloaded: Vec<u64> = Vec::new();
    let waited = counters::wait_then_restore(
        &mut session,
        CounterWait {
            pid,
            ids: &ids,
            duration: options.duration,
            counting: format!(
                "calls of {}",
                amount(counted.len() as u64, "function", "functions")
            ),
            what: "count",
        },
        baseline.clone(),
        |latest| {
            let calls: u64 = latest.iter().flat_map(|t| t.calls.iter()).sum();
            format!(
                "{} calls of {} functions so far",
                thousands(calls),
                thousands(ids.len() as u64)
            )
        },
        |session| {
            unloaded = unpatch_all(session, &outcomes, pid)?;
            Ok(())
        },
    )?;
    let (latest, elapsed, failure) = (waited.latest, waited.elapsed, waited.failure);
    // The session may be gone (another tendril's detach ended it): no counts then.
    let libraries = session
        .loader_counts()
        .map(|now| LibraryChurn::between(loader_at_start, now))
        .unwrap_or_default();
    fill_counts(&mut counted, &latest);
    for c in counted.iter_mut() {
        c.unloaded = unloaded.contains(&c.chosen.function.addr);
    }
    let overflows = latest
        .iter()
        .map(|t| t.shadow_overflows)
        .sum::<u64>()
        .saturating_sub(baseline.iter().map(|t| t.shadow_overflows).sum());
    counted.sort_by(|a, b| {
        b.calls
            .cmp(&a.calls)
            .then_with(|| a.chosen.display_name.cmp(&b.chosen.display_name))
    });
    let refused: Vec<(&Chosen, &str)> = refused.iter().map(|(c, r)| (*c, r.as_str())).collect();
    let counts = Counts {
        pid,
        elapsed,
        overflows,
        counted: &counted,
        refused: &refused,
        libraries,
    };
    print_counts(options, &counts)?;
    match failure {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// What `patch_for_counting` put in: the agent's outcomes (the chosen functions', then
/// the unwinder's), the functions counted, and those refused with the reason.
struct Patched<'c> {
    outcomes: Vec<PatchOutcome>,
    counted: Vec<Counted>,
    refused: Vec<(&'c Chosen, String)>,
}

/// Patches the chosen functions with the counting hook (and, for `--returns`, the
/// unwinder's functions so that returns are hooked safely); refuses with the reason
/// when the unwinder or every chosen function cannot be patched, with nothing left in.
fn patch_for_counting<'c>(
    session: &mut AgentConnection,
    symbols: &ProcessSymbols,
    chosen: &'c [Chosen],
    refused_by_name: &'c [Chosen],
    options: &CountOptions,
) -> anyhow::Result<Patched<'c>> {
    let pid = options.pid;
    let hook = if options.returns {
        Hook::CountReturns
    } else {
        Hook::Count
    };
    let unwinders: Vec<(crate::symbols::Function, Hook)> = if options.returns {
        targets::unwinder_targets(symbols)
            .into_iter()
            .filter(|(f, _)| !chosen.iter().any(|c| c.function.addr == f.addr))
            .collect()
    } else {
        Vec::new()
    };
    let mut patched: Vec<(&crate::symbols::Function, Hook)> =
        chosen.iter().map(|c| (&c.function, hook)).collect();
    patched.extend(unwinders.iter().map(|(f, hook)| (f, *hook)));
    let outcomes = match session.request(&targets::patch_request(symbols, &patched))? {
        Response::Patched { outcomes } => outcomes,
        other => bail!("unexpected answer from the agent in {pid}: {other:?}"),
    };
    let (user, internal) = outcomes.split_at(chosen.len());
    if let Some((failed, reason)) = internal
        .iter()
        .zip(&unwinders)
        .find_map(|(o, (f, _))| o.refused.as_ref().map(|r| (f, r)))
    {
        unpatch_all(session, &outcomes, pid)?;
        bail!(
            "cannot hook returns safely in {pid}: the unwinder function {} ({}) cannot be patched ({reason}); count without --returns",
            failed.name,
            failed.module
        );
    }
    let mut counted: Vec<Counted> = Vec::new();
    let mut refused: Vec<(&Chosen, String)> = refused_by_name
        .iter()
        .filter_map(|c| {
            refusals::reason(&c.function, options.returns).map(|reason| (c, reason.to_string()))
        })
        .collect();
    for (chosen, outcome) in chosen.iter().zip(user) {
        match (outcome.id, &outcome.refused) {
            (Some(id), _) => counted.push(Counted {
                chosen: chosen.clone(),
                id,
                calls: 0,
                returns: 0,
                per_thread: Vec::new(),
                unloaded: false,
            }),
            (None, reason) => {
                refused.push((chosen, reason.as_deref().unwrap_or("refused").to_string()))
            }
        }
    }
    if counted.is_empty() {
        unpatch_all(session, &outcomes, pid)?;
        let reasons = targets::summarize_refusals(
            refused
                .iter()
                .map(|(c, r)| (c.display_name.as_str(), r.as_str())),
        );
        bail!(
            "none of the {} matching functions could be patched — {reasons}",
            refused.len()
        );
    }
    Ok(Patched {
        outcomes,
        counted,
        refused,
    })
}

/// A finished count, for printing.
struct Counts<'a> {
    pid: i32,
    elapsed: Duration,
    /// Calls whose returns went uncounted (deeper than the return stack).
    overflows: u64,
    counted: &'a [Counted],
    refused: &'a [(&'a Chosen, &'a str)],
    libraries: LibraryChurn,
}

/// Prints the counts as text or JSON on stdout.
fn print_counts(options: &CountOptions, counts: &Counts) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let Counts {
        pid,
        elapsed,
        overflows,
        counted,
        refused,
        libraries,
    } = *counts;
    if options.json {
        let returns = options.returns.then_some(overflows);
        write_json(&mut out, pid, elapsed, returns, counted, refused, libraries)?;
    } else {
        write_text(&mut out, elapsed, options.returns, counted, refused)?;
        write_unloaded_note(&mut out, counted, libraries)?;
        if options.returns && overflows > 0 {
            writeln!(
                out,
                "note: {overflows} calls ran deeper than tendril's return stack ({} frames \
                 per thread); their returns are not counted",
                SHADOW_FRAMES
            )?;
        }
    }
    Ok(())
}

/// Restores every patched function; returns those whose library was unloaded while
/// they were patched (nothing was written where they had been).
fn unpatch_all(
    session: &mut AgentConnection,
    outcomes: &[PatchOutcome],
    pid: i32,
) -> anyhow::Result<Vec<u64>> {
    let addresses: Vec<u64> = outcomes
        .iter()
        .filter(|o| o.id.is_some())
        .map(|o| o.address)
        .collect();
    match session
        .request(&Request::Unpatch { addresses })
        .map_err(|e| anyhow::anyhow!("cannot restore the target's code: {e}"))?
    {
        Response::Unpatched {
            pending,
            pending_reason,
            unloaded,
            ..
        } => {
            if pending > 0 {
                say!(
                    "the counted functions are restored; {pending} of tendril's own \
                     hooks on the unwinder are still in ({}), and come out by themselves \
                     once it leaves (`tendril status {pid}` shows them)",
                    pending_reason
                        .as_deref()
                        .unwrap_or("a thread is inside tendril's hooks")
                );
            }
            Ok(unloaded)
        }
        other => bail!("unexpected answer from the agent: {other:?}"),
    }
}

/// Counts since the hooks went in, per function and per thread.
fn fill_counts(counted: &mut [Counted], latest: &[ThreadCounters]) {
    for (index, function) in counted.iter_mut().enumerate() {
        for thread in latest {
            let (calls, returns) = (thread.calls[index], thread.returns[index]);
            if calls > 0 || returns > 0 {
                function
                    .per_thread
                    .push((thread.tid, thread.name.clone(), calls, returns));
                function.calls += calls;
                function.returns += returns;
            }
        }
    }
}

/// The calls that count towards the total: a call through a PLT stub reaches the
/// function the stub leads to, so when that function is counted too, the stub's calls
/// are already in its count and are left out of the total.
fn total_calls(counted: &[Counted]) -> u64 {
    counted
        .iter()
        .filter(|c| !stub_of_a_counted_function(c, counted))
        .map(|c| c.calls)
        .sum()
}

fn stub_of_a_counted_function(stub: &Counted, counted: &[Counted]) -> bool {
    stub.chosen.function.plt_target().is_some_and(|target| {
        counted.iter().any(|c| {
            c.chosen.function.plt_target().is_none() && c.chosen.function.raw_name == target
        })
    })
}

/// A row's name, with where it is when that tells it apart: a PLT stub says which
/// module's stub it is (each module has its own), a name another row has too says its
/// module, and its address as well when the module is the same (two `static` functions
/// of two files). Exact: the caller escapes it where it prints it.
fn row_name(c: &Counted, counted: &[Counted]) -> String {
    let (name, function) = (&c.chosen.display_name, &c.chosen.function);
    let shared_with = |same_module: bool| {
        counted.iter().any(|other| {
            other.chosen.function.addr != function.addr
                && other.chosen.display_name == *name
                && (!same_module || other.chosen.function.module == function.module)
        })
    };
    if shared_with(true) {
        format!("{name} ({} at {:#x})", function.module, function.addr)
    } else if function.plt_target().is_some() || shared_with(false) {
        format!("{name} ({})", function.module)
    } else {
        name.clone()
    }
}

fn write_text(
    out: &mut impl Write,
    elapsed: Duration,
    returns: bool,
    counted: &[Counted],
    refused: &[(&Chosen, &str)],
) -> std::io::Result<()> {
    let total = total_calls(counted);
    let all_rows: u64 = counted.iter().map(|c| c.calls).sum();
    let width = all_rows.to_string().len().max(5);
    if returns {
        writeln!(out, "{:>width$} {:>width$}  FUNCTION", "CALLS", "RETURNS")?;
    } else {
        writeln!(out, "{:>width$}  FUNCTION", "CALLS")?;
    }
    for c in counted {
        if returns {
            writeln!(
                out,
                "{:>width$} {:>width$}  {}",
                c.calls,
                c.returns,
                printable(&row_name(c, counted))
            )?;
        } else {
            writeln!(
                out,
                "{:>width$}  {}",
                c.calls,
                printable(&row_name(c, counted))
            )?;
        }
    }
    let through_stubs = if total < all_rows {
        "; calls through a PLT stub to a function counted here are in the total once"
    } else {
        ""
    };
    let summary = format!(
        "total ({} function{}, {} s{through_stubs})",
        counted.len(),
        if counted.len() == 1 { "" } else { "s" },
        format_elapsed(elapsed)
    );
    if returns {
        let total_returns: u64 = counted
            .iter()
            .filter(|c| !stub_of_a_counted_function(c, counted))
            .map(|c| c.returns)
            .sum();
        writeln!(out, "{total:>width$} {total_returns:>width$}  {summary}")?;
    } else {
        writeln!(out, "{total:>width$}  {summary}")?;
    }
    for (chosen, reason) in refused {
        writeln!(
            out,
            "not counted: {} ({}) — {}",
            printable(&chosen.display_name),
            printable(&chosen.function.module),
            printable(reason)
        )?;
    }
    Ok(())
}

/// Says which counted functions were unloaded with their library during the count, and
/// that calls after that (into a copy loaded again too) are not in their counts.
fn write_unloaded_note(
    out: &mut impl Write,
    counted: &[Counted],
    libraries: LibraryChurn,
) -> std::io::Result<()> {
    let gone: Vec<String> = counted
        .iter()
        .filter(|c| c.unloaded)
        .map(|c| row_name(c, counted))
        .collect();
    if gone.is_empty() {
        return Ok(());
    }
    let modules: std::collections::BTreeSet<&str> = counted
        .iter()
        .filter(|c| c.unloaded)
        .map(|c| c.chosen.function.module.as_str())
        .collect();
    let modules: Vec<&str> = modules.into_iter().collect();
    writeln!(
        out,
        "note: {} {} unloaded with {} during the count (the process loaded {} and unloaded {} \
         libraries meanwhile); calls after the unload are not counted, including calls into \
         a copy loaded again",
        printable(&gone.join(", ")),
        if gone.len() == 1 { "was" } else { "were" },
        printable(&modules.join(", ")),
        libraries.loaded,
        libraries.unloaded,
    )
}

/// `returns`: with return hooks, the calls whose returns went uncounted (too deep).
fn write_json(
    out: &mut impl Write,
    pid: i32,
    elapsed: Duration,
    returns: Option<u64>,
    counted: &[Counted],
    refused: &[(&Chosen, &str)],
    libraries: LibraryChurn,
) -> std::io::Result<()> {
    let functions: Vec<serde_json::Value> = counted
        .iter()
        .map(|c| {
            let threads: Vec<serde_json::Value> = c
                .per_thread
                .iter()
                .map(|(tid, name, calls, thread_returns)| {
                    let mut thread = json!({ "tid": tid, "name": name, "calls": calls });
                    if returns.is_some() {
                        thread["returns"] = json!(thread_returns);
                    }
                    thread
                })
                .collect();
            let mut function = json!({
                "name": c.chosen.display_name,
                "module": c.chosen.function.module,
                "address": c.chosen.function.addr,
                "calls": c.calls,
                "threads": threads,
            });
            if returns.is_some() {
                function["returns"] = json!(c.returns);
            }
            if c.unloaded {
                function["unloaded"] = json!(true);
            }
            function
        })
        .collect();
    let refused: Vec<serde_json::Value> = refused
        .iter()
        .map(|(chosen, reason)| {
            json!({
                "name": chosen.display_name,
                "module": chosen.function.module,
                "address": chosen.function.addr,
                "reason": reason,
            })
        })
        .collect();
    let mut report = json!({
        "pid": pid,
        "duration_s": elapsed.as_secs_f64(),
        "total_calls": total_calls(counted),
        "functions": functions,
        "refused": refused,
        "libraries_loaded": libraries.loaded,
        "libraries_unloaded": libraries.unloaded,
    });
    if let Some(overflows) = returns {
        report["returns_not_counted"] = json!(overflows);
    }
    terminal_text::write_json(&mut *out, &report)?;
    writeln!(out)
}
