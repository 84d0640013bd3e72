//! A recording of a live process, from its start to the profile: the glue between the
//! agent's rings and the calling context trees.
//!
//! [`Recorder::start`] attaches, hands the agent the function table, lets it calibrate
//! its hooks and patches the roots (and for Scheme A the whole static closure);
//! [`Recorder::poll`] drains the rings into the [`CctBuilder`]; [`Recorder::finish`]
//! restores the code, drains what is left and makes the [`Profile`].
//!
//! The one idea: the target only writes raw events; everything else — names, trees,
//! the cost correction — happens here, at the controller's pace, so a recording can be
//! shown live and saved at any moment ([`Recorder::snapshot`]).

use super::closure;
use super::function_table;
use super::gross::GrossTimes;
use super::rings::{AgentCounters, Rings};
use super::tsc;
use crate::inject;
use crate::process::{AttachError, TargetProcess};
use crate::profile::{
    Calibration, CctBuilder, FunctionName, FunctionNames, Profile, RecordingInfo,
};
use crate::session::{AgentSession, SessionError};
use crate::symbols::{Function, ProcessSymbols};
use crate::targets::{self, SelectError};
use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Instant;
use tendril_wire::events::EventKind;
use tendril_wire::{Hook, Request, Response};

/// How the call graph below the roots is instrumented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// JFluid's Scheme A: the whole static call graph of the roots, before anything runs.
    A,
    /// JFluid's Scheme B: a function's callees when it first runs in the graph.
    B,
}

/// What to record.
#[derive(Debug, Clone)]
pub struct RecordOptions {
    pub pid: i32,
    /// Patterns naming the roots.
    pub roots: Vec<String>,
    pub scheme: Scheme,
    /// Only the roots, for their time distribution (JFluid's code-region profiling).
    pub gross_only: bool,
}

/// Why a recording could not start or go on.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(transparent)]
    Attach(#[from] AttachError),
    #[error(transparent)]
    Inject(#[from] inject::InjectError),
    #[error(transparent)]
    Select(#[from] SelectError),
    #[error(transparent)]
    Symbols(#[from] crate::symbols::SymbolError),
    #[error("process {pid}: {source}")]
    Session { pid: i32, source: SessionError },
    #[error("process {pid}: {message}")]
    Refused { pid: i32, message: String },
}

/// A recording in progress.
pub struct Recorder {
    target: TargetProcess,
    session: AgentSession,
    symbols: ProcessSymbols,
    rings: Rings,
    builder: CctBuilder,
    root_names: Vec<String>,
    scheme: Scheme,
    gross: Option<GrossTimes>,
    /// Function names by id, filled as ids appear.
    names: Vec<FunctionName>,
    /// The thread each ring last belonged to, and its latest timestamp.
    ring_threads: HashMap<usize, i32>,
    last_timestamps: HashMap<i32, u64>,
    started: Instant,
    started_tsc: u64,
    events: u64,
}

/// A finished recording.
pub struct Finished {
    pub profile: Profile,
    /// Callees the agent could not instrument: (name, reason).
    pub refused: Vec<(String, String)>,
}

impl Recorder {
    /// Attaches to the process and starts recording from the roots.
    pub fn start(options: &RecordOptions) -> Result<Recorder, RecordError> {
        let pid = options.pid;
        crate::process::inspect(pid)?;
        let symbols = ProcessSymbols::load(pid)?;
        let matched = targets::match_patterns(&symbols, &options.roots)?;
        let (target, mut session) = inject::attach(pid)?;
        let chosen = targets::choose(&symbols, &matched, &mut session)?;
        let symbols = targets::unwinder_symbols_after_attach(&symbols)?.unwrap_or(symbols);
        let tsc_hz = tsc::measure_hz();
        let discover = options.scheme == Scheme::B && !options.gross_only;
        let token = u64::from(std::process::id()) << 20 ^ tsc::read() & 0xfffff;
        let (table_path, table_in_target) = function_table::write(&target, &symbols, token)?;
        let session_error = |source| RecordError::Session { pid, source };
        let started = session.request(&Request::StartRecording {
            functions_file: table_in_target,
            discover,
        });
        let _ = std::fs::remove_file(&table_path);
        let (rings_file, inner_ticks, outer_ticks) = match started.map_err(session_error)? {
            Response::RecordingStarted {
                rings_file,
                inner_ticks,
                outer_ticks,
            } => (rings_file, inner_ticks, outer_ticks),
            other => {
                return Err(session_error(SessionError::Protocol(format!("{other:?}"))));
            }
        };
        let rings_path = target.path_in_target(std::path::Path::new(&rings_file));
        let rings = Rings::open(&rings_path).map_err(|e| RecordError::Refused {
            pid,
            message: format!("cannot map {}: {e}", rings_path.display()),
        })?;
        rings.skip_to_now();
        let ns = |ticks: f64| ticks * 1e9 / tsc_hz as f64;
        let builder = CctBuilder::new(Calibration {
            tsc_hz,
            inner_ns: ns(inner_ticks),
            outer_ns: ns(outer_ticks),
        })
        .map_err(|e| RecordError::Refused {
            pid,
            message: format!("the hooks' calibration is unusable: {e}"),
        })?;

        let mut patched: Vec<(&Function, Hook)> = chosen
            .iter()
            .map(|c| (&c.function, Hook::RecordRoot))
            .collect();
        let closure_functions = if options.scheme == Scheme::A && !options.gross_only {
            let roots: Vec<&Function> = chosen.iter().map(|c| &c.function).collect();
            closure::static_closure(&symbols, &roots)
        } else {
            Vec::new()
        };
        patched.extend(
            closure_functions
                .iter()
                .filter(|f| !chosen.iter().any(|c| c.function.addr == f.addr))
                .map(|&f| (f, Hook::Record)),
        );
        let unwinders: Vec<(Function, Hook)> = targets::unwinder_targets(&symbols)
            .into_iter()
            .filter(|(f, _)| !patched.iter().any(|(p, _)| p.addr == f.addr))
            .collect();
        patched.extend(unwinders.iter().map(|(f, hook)| (f, *hook)));
        let outcomes = match session
            .request(&targets::patch_request(&symbols, &patched))
            .map_err(session_error)?
        {
            Response::Patched { outcomes } => outcomes,
            other => return Err(session_error(SessionError::Protocol(format!("{other:?}")))),
        };
        let mut root_names = Vec::new();
        let mut refusals = Vec::new();
        for ((function, hook), outcome) in patched.iter().zip(&outcomes) {
            match (&outcome.refused, hook) {
                (None, Hook::RecordRoot) => root_names.push(function.name.clone()),
                (Some(reason), Hook::RecordRoot) => {
                    refusals.push(format!("{}: {reason}", function.name))
                }
                (Some(reason), Hook::UnwinderStarts | Hook::ExceptionCaught | Hook::Backtrace) => {
                    let _ = session.request(&Request::StopRecording);
                    return Err(RecordError::Refused {
                        pid,
                        message: format!(
                            "cannot hook returns safely: the unwinder function {} ({}) cannot be patched ({reason})",
                            function.name, function.module
                        ),
                    });
                }
                _ => {}
            }
        }
        if root_names.is_empty() {
            let _ = session.request(&Request::StopRecording);
            return Err(RecordError::Refused {
                pid,
                message: format!("no root could be instrumented — {}", refusals.join("; ")),
            });
        }
        for refusal in &refusals {
            eprintln!("tendril: root not instrumented: {refusal}");
        }
        Ok(Recorder {
            gross: options
                .gross_only
                .then(|| GrossTimes::new(tsc_hz, inner_ticks)),
            target,
            session,
            symbols,
            rings,
            builder,
            root_names,
            scheme: options.scheme,
            names: Vec::new(),
            ring_threads: HashMap::new(),
            last_timestamps: HashMap::new(),
            started: Instant::now(),
            started_tsc: tsc::read(),
            events: 0,
        })
    }

    pub fn pid(&self) -> i32 {
        self.target.pid
    }

    /// The roots being recorded.
    pub fn roots(&self) -> &[String] {
        &self.root_names
    }

    pub fn elapsed(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// Events processed so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    pub fn agent_counters(&self) -> AgentCounters {
        self.rings.counters()
    }

    /// Moves the rings' new events into the trees. Returns the number of events.
    pub fn poll(&mut self) -> u64 {
        let builder = &mut self.builder;
        let ring_threads = &mut self.ring_threads;
        let last_timestamps = &mut self.last_timestamps;
        let gross = &mut self.gross;
        let pid = self.target.pid;
        let drained = self.rings.drain(|ring, tid, events| {
            if let Some(old) = ring_threads.insert(ring, tid)
                && old != tid
                && let Some(&at) = last_timestamps.get(&old)
            {
                // The ring changed hands: its old thread has exited.
                builder.finish_thread(old as u32, at);
            }
            if !last_timestamps.contains_key(&tid) {
                builder.set_thread_name(tid as u32, crate::process::thread_name(pid, tid));
            }
            if let Some(last) = events
                .iter()
                .rev()
                .find(|e| e.kind() != Some(EventKind::Adjust))
            {
                last_timestamps.insert(tid, last.value);
            }
            builder.push_events(tid as u32, events);
            if let Some(gross) = gross.as_mut() {
                gross.push_events(tid, events);
            }
        });
        self.events += drained;
        drained
    }

    /// The profile as it stands (frames still open count up to their thread's latest
    /// event).
    pub fn snapshot(&mut self) -> Profile {
        self.refresh_names();
        let counters = self.rings.counters();
        let info = self.recording_info(&counters);
        let mut profile = self.builder.snapshot(&info, &Names(&self.names));
        self.add_extras(&mut profile, &counters);
        profile
    }

    /// Ends the recording: restores the code, reads the last events and returns the
    /// profile.
    pub fn finish(mut self) -> Result<Finished, RecordError> {
        let pid = self.target.pid;
        let stopped = self.session.request(&Request::StopRecording);
        self.poll();
        let end = tsc::read();
        self.builder.finish_all(end);
        if let Some(gross) = self.gross.as_mut() {
            gross.finish();
        }
        let refused = match stopped.map_err(|source| RecordError::Session { pid, source })? {
            Response::RecordingStopped { refused, .. } => refused
                .into_iter()
                .map(|(address, reason)| {
                    let name = self
                        .symbols
                        .lookup(address)
                        .map_or_else(|| format!("{address:#x}"), |f| f.name.clone());
                    (name, reason)
                })
                .collect(),
            other => {
                return Err(RecordError::Session {
                    pid,
                    source: SessionError::Protocol(format!("{other:?}")),
                });
            }
        };
        Ok(Finished {
            profile: self.snapshot(),
            refused,
        })
    }

    fn recording_info(&self, counters: &AgentCounters) -> RecordingInfo {
        RecordingInfo {
            pid: self.target.pid as u32,
            exe: self.target.exe.display().to_string(),
            roots: self.root_names.clone(),
            scheme: match self.scheme {
                Scheme::A => "A".into(),
                Scheme::B => "B".into(),
            },
            instrumented_functions: counters.instrumented + self.root_names.len() as u64,
            invoked_functions: counters.invoked,
            lost_events: counters.lost_events,
            indirect_call_sites: counters.indirect_call_sites,
        }
    }

    /// Fields beyond the builder's: pauses, the gross-time distribution, the duration.
    fn add_extras(&self, profile: &mut Profile, counters: &AgentCounters) {
        let hz = profile.calibration.tsc_hz.max(1) as f64;
        profile.stats.pause_ns = (counters.pause_ticks as f64 * 1e9 / hz) as u64;
        profile.duration_ns =
            ((tsc::read().saturating_sub(self.started_tsc)) as f64 * 1e9 / hz) as u64;
        profile.discovery = Some(crate::profile::DiscoveryStats {
            discoveries: counters.discoveries,
            mean_pause_ns: if counters.discoveries == 0 {
                0
            } else {
                (counters.discovery_ticks as f64 * 1e9 / hz / counters.discoveries as f64) as u64
            },
            refused_callees: counters.refused_callees,
        });
        if let Some(gross) = &self.gross {
            profile.gross = gross.summaries(&|id| self.name_of(id));
        }
    }

    fn name_of(&self, id: u32) -> String {
        self.names
            .get(id as usize)
            .map_or_else(|| format!("function #{id}"), |n| n.name.clone())
    }

    /// Names every id the registry has an address for, up to the highest id seen.
    fn refresh_names(&mut self) {
        let mut id = self.names.len() as u32;
        while let Some(address) = self.rings.function_address(id) {
            let (name, module) = match self.symbols.lookup(address) {
                Some(function) if function.addr == address => {
                    (function.name.clone(), function.module.clone())
                }
                _ => (format!("{address:#x}"), "?".to_string()),
            };
            self.names.push(FunctionName { name, module });
            id += 1;
        }
    }
}

/// Names by id for the snapshot.
struct Names<'a>(&'a [FunctionName]);

impl FunctionNames for Names<'_> {
    fn name(&self, id: u32) -> Cow<'_, str> {
        self.0.get(id as usize).map_or_else(
            || Cow::Owned(format!("function #{id}")),
            |n| Cow::Borrowed(n.name.as_str()),
        )
    }

    fn module(&self, id: u32) -> Cow<'_, str> {
        self.0
            .get(id as usize)
            .map_or(Cow::Borrowed("?"), |n| Cow::Borrowed(n.module.as_str()))
    }
}
