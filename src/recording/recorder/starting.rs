//! Starting a recording: the roots chosen, the agent's start (its function table sent,
//! the hooks' cost measured, the rings mapped), the trees, the functions patched, and
//! what the patch made of the roots.

use super::*;
use crate::symbols::SymbolError;
use tendril_wire::PatchOutcome;

impl Recorder {
    /// The functions the root patterns match, chosen for patching: those that can be
    /// patched, and those refused (with a reason, see `refusals::reason`).
    pub(super) fn choose_roots(&mut self) -> Result<(Vec<Chosen>, Vec<Chosen>), RecordError> {
        // Roots in a module not loaded yet: none until it is.
        let matched = match targets::match_patterns(&self.symbols, &self.root_patterns) {
            Err(_) if !self.waiting_for.is_empty() => Vec::new(),
            matched => matched?,
        };
        Ok(targets::choose(&self.symbols, &matched, &mut self.session)?
            .into_iter()
            .partition(|c| refusals::reason(&c.function, true).is_none()))
    }

    /// Asks the agent to start recording (its function table sent, the hooks' cost
    /// measured there) and maps the rings it answers with; the calibration.
    pub(super) fn start_in_agent(&mut self) -> Result<Calibration, RecordError> {
        let pid = self.target.pid;
        let session_error = |source| RecordError::Session { pid, source };
        let discover = self.scheme == Scheme::B && !self.gross_only;
        let follow_pointers = discover && !self.pointer_candidates;
        if !self.gross_only && self.indirect.is_none() {
            self.indirect = Some(match follow_pointers {
                true => IndirectTargets::default(),
                false => IndirectTargets::find(&self.symbols),
            });
        }
        let no_targets = IndirectTargets::default();
        let table = match &self.indirect {
            Some(indirect) => function_table::encode(&self.symbols, &indirect.taken),
            None => function_table::encode(&self.symbols, &no_targets.taken),
        };
        let started = self.session.request_with_payload(
            &Request::StartRecording {
                table_bytes: table.len() as u64,
                discover,
                follow_pointers,
            },
            &table,
        );
        let cost = match started.map_err(session_error)? {
            Response::RecordingStarted {
                inner_ticks,
                outer_ticks,
                inner_spread_ticks,
                outer_spread_ticks,
                untimed_ticks,
                untimed_spread_ticks,
                loader,
            } => {
                self.late_modules.started(loader);
                let ns = |ticks: f64| ticks * 1e9 / self.tsc_hz as f64;
                Calibration {
                    tsc_hz: self.tsc_hz,
                    inner_ns: ns(inner_ticks),
                    outer_ns: ns(outer_ticks),
                    inner_spread_ns: ns(inner_spread_ticks),
                    outer_spread_ns: ns(outer_spread_ticks),
                    untimed_ns: ns(untimed_ticks),
                    untimed_spread_ns: ns(untimed_spread_ticks),
                    ..Default::default()
                }
            }
            other => {
                return Err(session_error(AgentConnectionError::Protocol(format!(
                    "{other:?}"
                ))));
            }
        };
        let rings_memory = self.session.take_received_descriptor();
        self.recording = true;
        self.stopped_at = None;
        if self.rings.is_none() {
            let refused = |message: String| RecordError::Refused { pid, message };
            let memory = rings_memory
                .ok_or_else(|| refused("the agent sent no rings with its answer".into()))?;
            let rings = Rings::from_descriptor(memory)
                .map_err(|e| refused(format!("cannot map the rings: {e}")))?;
            self.rings = Some(rings);
        }
        self.rings().skip_to_now();
        Ok(cost)
    }

    /// Sets up the trees for calibration `cost`, unless a paused recording resumes
    /// (returns whether it does).
    pub(super) fn start_trees(&mut self, cost: Calibration) -> Result<bool, RecordError> {
        let pid = self.target.pid;
        let resumed = self.builder.is_some();
        if !resumed {
            let builder = CctBuilder::new(cost).map_err(|e| RecordError::Refused {
                pid,
                message: format!("the hooks' calibration is unusable: {e}"),
            })?;
            self.adaptive.restart(&cost);
            self.builder = Some(builder);
            self.watch_off_cpu();
            let inner_ticks = cost.inner_ns * self.tsc_hz as f64 / 1e9;
            self.gross = self
                .gross_only
                .then(|| GrossTimes::new(self.tsc_hz, inner_ticks));
        }
        Ok(resumed)
    }
}

/// Scheme A's static call graph below the `chosen` roots, when `follow` (empty
/// otherwise), with the candidate targets of calls through pointers in it.
pub(super) fn static_graph<'a>(
    symbols: &'a ProcessSymbols,
    indirect_targets: &IndirectTargets,
    chosen: &[Chosen],
    exe: &str,
    follow: bool,
) -> closure::Closure<'a> {
    if follow {
        let roots: Vec<&Function> = chosen.iter().map(|c| &c.function).collect();
        // The same cap as the candidates patched up front (the executable's first);
        // the rest are noted as not followed below.
        let mut candidates = indirect::functions_at(symbols, &indirect_targets.taken.addresses);
        candidates.sort_by_key(|f| f.module != exe);
        candidates.truncate(indirect::MAX_UP_FRONT);
        closure::static_closure(symbols, &roots, &candidates)
    } else {
        closure::Closure::default()
    }
}

/// What the recording patches, unwinders aside: the `chosen` roots, the functions of
/// their static graph (`closure`), those at `known` (addresses) and the candidate
/// targets of calls through pointers.
pub(super) fn functions_to_patch<'a>(
    symbols: &'a ProcessSymbols,
    indirect_targets: &mut IndirectTargets,
    chosen: &'a [Chosen],
    closure: &closure::Closure<'a>,
    known: &[u64],
    exe: &str,
) -> Vec<(&'a Function, Hook)> {
    let mut patched: Vec<(&Function, Hook)> = chosen
        .iter()
        .map(|c| (&c.function, Hook::RecordRoot))
        .collect();
    patched.extend(
        closure
            .functions
            .iter()
            .filter(|f| !chosen.iter().any(|c| c.function.addr == f.addr))
            .map(|&f| (f, Hook::Record)),
    );
    let again: Vec<&Function> = known
        .iter()
        .filter_map(|&address| symbols.lookup(address).filter(|f| f.addr == address))
        .filter(|f| !patched.iter().any(|(p, _)| p.addr == f.addr))
        .collect();
    patched.extend(again.into_iter().map(|f| (f, Hook::Record)));
    let candidates = indirect_targets.to_patch(symbols, &patched, exe);
    patched.extend(candidates.into_iter().map(|f| (f, Hook::Record)));
    patched
}

/// What the recording's patch made of its roots: the roots instrumented (names and
/// addresses), those refused with the reason, the functions recorded up front, and
/// why the recording cannot start, if it cannot.
pub(super) struct PatchedRoots<'a> {
    pub names: Vec<String>,
    pub addresses: Vec<u64>,
    pub refusals: Vec<(String, &'a str)>,
    pub recorded: u64,
    pub failure: Option<String>,
}

/// Reads the agent's `outcomes` of `patched` (and the roots `refused_roots` refused
/// before asking).
pub(super) fn patched_roots<'a>(
    patched: &[(&Function, Hook)],
    outcomes: &'a [PatchOutcome],
    refused_roots: &'a [Chosen],
    waiting: bool,
) -> PatchedRoots<'a> {
    let mut root_names = Vec::new();
    let mut root_addresses = Vec::new();
    let mut refusals: Vec<(String, &str)> = refused_roots
        .iter()
        .filter_map(|c| {
            Some((
                module_qualified(&c.function),
                refusals::reason(&c.function, true)?,
            ))
        })
        .collect();
    let mut unwinder_refused = None;
    let recorded = outcomes
        .iter()
        .zip(patched)
        .filter(|(o, (_, hook))| {
            o.refused.is_none() && matches!(hook, Hook::RecordRoot | Hook::Record)
        })
        .count() as u64;
    for ((function, hook), outcome) in patched.iter().zip(outcomes) {
        match (&outcome.refused, hook) {
            (None, Hook::RecordRoot) => {
                root_names.push(function.name.to_string());
                root_addresses.push(function.addr);
            }
            (Some(reason), Hook::RecordRoot) => {
                refusals.push((module_qualified(function), reason.as_str()))
            }
            (Some(reason), Hook::UnwinderStarts | Hook::ExceptionCaught | Hook::Backtrace) => {
                unwinder_refused = Some(format!(
                    "cannot hook returns safely: the unwinder function {} ({}) cannot be patched ({reason})",
                    function.name, function.module
                ));
            }
            _ => {}
        }
    }
    let failure = unwinder_refused.or_else(|| {
        (root_names.is_empty() && !waiting)
            .then(|| format!("no root could be instrumented — {}", summarize(&refusals)))
    });
    PatchedRoots {
        names: root_names,
        addresses: root_addresses,
        refusals,
        recorded,
        failure,
    }
}

/// Checks the root `patterns` before anything in the process is touched: `Ok` with no
/// module when they match functions that can be patched; `Ok` with the modules they
/// name when the process has loaded none of those yet (a root in a library the program
/// loads later, `dlopen`, is named with its module, and the recording waits for it);
/// the matching's or the refusal's error otherwise.
pub fn check_roots(
    symbols: &ProcessSymbols,
    patterns: &[String],
) -> Result<Vec<String>, SelectError> {
    match targets::match_patterns(symbols, patterns) {
        Ok(matched) => {
            targets::refuse_if_none_patchable(symbols, &matched, true)?;
            Ok(Vec::new())
        }
        Err(error) => match modules_not_loaded_yet(symbols, patterns) {
            modules if modules.is_empty() => Err(error),
            modules => Ok(modules),
        },
    }
}

/// The modules that `patterns` name (`MODULE:FUNCTION`) and the process has not loaded
/// yet, when every pattern names one; empty otherwise.
fn modules_not_loaded_yet(symbols: &ProcessSymbols, patterns: &[String]) -> Vec<String> {
    let mut modules = Vec::new();
    for pattern in patterns {
        match targets::match_patterns(symbols, std::slice::from_ref(pattern)) {
            Err(SelectError::Symbols(SymbolError::NoModule { module, .. })) => {
                if !modules.contains(&module) {
                    modules.push(module);
                }
            }
            _ => return Vec::new(),
        }
    }
    modules
}

impl Recorder {
    /// Patches the roots once a module they name is loaded (see
    /// [`Recorder::waiting_for`]); called after new modules were followed.
    pub(super) fn start_roots_now_loaded(&mut self) {
        if self.waiting_for.is_empty()
            || targets::match_patterns(&self.symbols, &self.root_patterns).is_err()
        {
            return;
        }
        let waited = std::mem::take(&mut self.waiting_for);
        let patterns = self.root_patterns.clone();
        match self.set_roots(&patterns) {
            Ok(()) => say!(
                "{} loaded: recording {}",
                waited.join(", "),
                self.root_names.join(", ")
            ),
            Err(error) => say!(
                "{} loaded, but its roots cannot be recorded: {error}",
                waited.join(", ")
            ),
        }
    }
}
