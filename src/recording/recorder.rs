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

mod adaptive;
mod call_sites;
mod code_copy;
mod code_reading;
mod controls;
mod go_callees;
mod in_situ;
mod jit_callees;
mod late_modules;
mod polling;
mod snapshot;
mod starting;
mod tail_calls;
mod tracing;

pub use starting::check_roots;
use starting::{PatchedRoots, functions_to_patch, patched_roots, static_graph};

pub use adaptive::{CALLS_TO_JUDGE, TimingOptions, threshold_ns};
pub use code_copy::HookedCopy;
pub use tracing::TraceStatus;

use super::closure;
use super::function_table;
use super::gross::GrossTimes;
use super::indirect::{self, IndirectTargets};
use super::off_cpu::OffCpuWatch;
use super::off_cpu::switch_cost::SwitchCount;
use super::rings::{AgentCounters, Rings};
use super::tsc;
use crate::agent_connection::{AgentConnection, AgentConnectionError};
use crate::inject;
use crate::process::{AttachError, TargetProcess};
use crate::profile::{Calibration, CctBuilder, FunctionName, Profile, RecordingInfo};
use crate::refusals;
use crate::symbols::{Function, ProcessSymbols};
use crate::targets::{self, Chosen, SelectError};
use crate::terminal_text::say;
use std::collections::HashMap;
use std::time::Instant;
use tendril_wire::events::Event;
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
    /// Adaptive timing's options.
    pub timing: TimingOptions,
    /// Follow calls through pointers by instrumenting every address-taken function up
    /// front (`--pointer-candidates`), instead of from the call graph as they are made.
    /// Scheme A always does.
    pub pointer_candidates: bool,
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
    Session {
        pid: i32,
        source: AgentConnectionError,
    },
    #[error("process {pid}: {message}")]
    Refused { pid: i32, message: String },
}

/// A recording in progress.
pub struct Recorder {
    target: TargetProcess,
    session: AgentConnection,
    symbols: ProcessSymbols,
    /// Mapped at the first recording (the agent keeps one file for its lifetime).
    rings: Option<Rings>,
    /// Created at the first recording, with its calibration.
    builder: Option<CctBuilder>,
    tsc_hz: u64,
    root_patterns: Vec<String>,
    /// The modules the roots name that are not loaded yet: until one is, the recording
    /// runs with no root (`starting::start_roots_now_loaded`).
    waiting_for: Vec<String>,
    root_names: Vec<String>,
    /// The function ids of the instrumented roots (every builder is told them).
    root_ids: Vec<u32>,
    scheme: Scheme,
    gross_only: bool,
    /// Calls through pointers are followed through the address-taken functions,
    /// instrumented up front (`indirect`); otherwise from the call graph, as they are made
    /// (the agent checks them in copies of the functions that make them).
    pointer_candidates: bool,
    gross: Option<GrossTimes>,
    /// Function names by id, filled as ids appear.
    names: Vec<FunctionName>,
    /// The thread each ring last belonged to, and its latest timestamp.
    ring_threads: HashMap<usize, i32>,
    last_timestamps: HashMap<i32, u64>,
    /// Once the agent has stopped: the TSC it stopped at. Later events (the code is
    /// restored one function after another after it) are dropped.
    stopped_at: Option<u64>,
    /// After the last stop: tendril's unwinder hooks the agent had to leave in for now
    /// (they come out by themselves), said as a sentence.
    hooks_left_in: Option<String>,
    started: Instant,
    started_tsc: u64,
    events: u64,
    /// The agent is recording (not paused).
    recording: bool,
    /// Functions patched when the recording began (roots, and Scheme A's graph).
    instrumented_up_front: u64,
    /// The pointer calls' summary said last: a resumed recording says it again only if
    /// it changed.
    indirect_summary_said: Option<String>,
    /// Indirect call sites Scheme A's static graph holds.
    static_indirect_call_sites: u64,
    /// Callees the agent could not instrument: (name, reason).
    refused: Vec<(String, String)>,
    /// The raw events of a trace, once one is started.
    trace: Option<crate::profile::trace::TraceCapture>,
    /// The targets of calls through pointers (found at the first start; not with
    /// `--gross-only`).
    indirect: Option<IndirectTargets>,
    /// Modules loaded after the recording started are looked for now and then.
    late_modules: late_modules::Watch,
    /// The threads' context switches, for CPU time (not with `--gross-only`).
    off_cpu: Option<OffCpuWatch>,
    /// Why CPU time is not measured, if it is not.
    cpu_unmeasured: Option<String>,
    /// The target's thread switches counted right after the attach, to tell what the
    /// off-CPU watch would cost it (`None` with `--cpu-time` or `--gross-only`).
    switches_before: Option<SwitchCount>,
    /// Events read but not yet given to the trees: those after the moment the off-CPU
    /// intervals were last read, whose intervals may not be in yet (see `polling`).
    held_back: HashMap<i32, Vec<Event>>,
    /// The in-situ calibration's batches (see `in_situ`).
    in_situ: in_situ::InSituBatches,
    /// The Go functions the recorded code calls (never followed).
    go_callees: go_callees::GoCallees,
    /// The JIT code the recorded code calls (never patched).
    jit_callees: jit_callees::JitCallees,
    /// The tail calls of the recorded functions, marked on the profile's nodes.
    tail_calls: tail_calls::TailCalls,
    /// The callers of untimed calls, by return address.
    call_sites: call_sites::CallSites,
    /// Which functions are untimed, and the judge that chooses them.
    adaptive: adaptive::AdaptiveTiming,
}

/// `name (module)`, for a refusal.
fn module_qualified(function: &Function) -> String {
    format!("{} ({})", function.name, function.module)
}

/// Refused roots `(name (module), reason)` as one line, grouped by reason.
fn summarize(refusals: &[(String, &str)]) -> String {
    targets::summarize_refusals(
        refusals
            .iter()
            .map(|(name, reason)| (name.as_str(), *reason)),
    )
}

/// A finished recording.
pub struct Finished {
    pub profile: Profile,
    /// Callees the agent could not instrument: (name, reason).
    pub refused: Vec<(String, String)>,
    /// tendril's hooks on the unwinder the agent had to leave in for a moment, said as a
    /// sentence (`Recorder::hooks_left_in`); `None` when every byte is back.
    pub hooks_left_in: Option<String>,
}

impl Recorder {
    /// Attaches to the process and starts recording from the roots.
    pub fn start(options: &RecordOptions) -> Result<Recorder, RecordError> {
        let pid = options.pid;
        crate::process::inspect(pid)?;
        let symbols = ProcessSymbols::load(pid)?;
        let waiting_for = check_roots(&symbols, &options.roots)?;
        // Before the attach: a pattern that names nothing leaves the target untouched.
        let kept_timed = match options.timing.keep_timed.is_empty() {
            true => Default::default(),
            false => targets::match_patterns(&symbols, &options.timing.keep_timed)?
                .iter()
                .map(|function| function.addr)
                .collect(),
        };
        let (target, session) = inject::attach(pid)?;
        let switches_before = (!options.gross_only && !options.timing.cpu_time_always)
            .then(|| SwitchCount::take(pid))
            .flatten();
        let symbols = targets::unwinder_symbols_after_attach(&symbols)?.unwrap_or(symbols);
        let tsc_hz = tsc::measure_hz();
        let go_callees = go_callees::GoCallees::new(&symbols);
        let adaptive = adaptive::AdaptiveTiming::new(options.timing.clone(), kept_timed);
        let mut recorder = Recorder {
            target,
            session,
            symbols,
            rings: None,
            builder: None,
            tsc_hz,
            root_patterns: options.roots.clone(),
            root_names: Vec::new(),
            root_ids: Vec::new(),
            scheme: options.scheme,
            gross_only: options.gross_only,
            pointer_candidates: options.pointer_candidates || options.scheme == Scheme::A,
            gross: None,
            names: Vec::new(),
            ring_threads: HashMap::new(),
            last_timestamps: HashMap::new(),
            stopped_at: None,
            hooks_left_in: None,
            started: Instant::now(),
            started_tsc: tsc::read(),
            events: 0,
            recording: false,
            instrumented_up_front: 0,
            indirect_summary_said: None,
            static_indirect_call_sites: 0,
            refused: Vec::new(),
            trace: None,
            indirect: None,
            late_modules: late_modules::Watch::default(),
            off_cpu: None,
            cpu_unmeasured: None,
            switches_before,
            held_back: HashMap::new(),
            in_situ: Default::default(),
            go_callees,
            jit_callees: jit_callees::JitCallees::new(pid),
            tail_calls: tail_calls::TailCalls::default(),
            call_sites: Default::default(),
            adaptive,
            waiting_for,
        };
        recorder.begin()?;
        Ok(recorder)
    }

    /// Starts a recording in the agent and patches the roots (and for Scheme A, their
    /// static call graph).
    fn begin(&mut self) -> Result<(), RecordError> {
        self.begin_with(&[])
    }

    /// The functions that ran inside the roots so far (not the roots themselves), to
    /// patch again at once when recording resumes: Scheme B would otherwise find them
    /// again one by one, stopping the threads each time while they run.
    fn functions_seen(&self) -> Vec<u64> {
        let (Some(builder), Some(rings)) = (self.builder.as_ref(), self.rings.as_ref()) else {
            return Vec::new();
        };
        builder
            .functions_seen()
            .into_iter()
            .filter(|id| !self.root_ids.contains(id))
            .filter_map(|id| rings.function_address(id))
            .collect()
    }

    /// [`Recorder::begin`], also patching the functions at `known` (addresses).
    fn begin_with(&mut self, known: &[u64]) -> Result<(), RecordError> {
        let pid = self.target.pid;
        let session_error = |source| RecordError::Session { pid, source };
        let (chosen, refused_roots) = self.choose_roots()?;
        let cost = self.start_in_agent()?;
        let resumed = self.start_trees(cost)?;
        self.note_in_situ_start();

        let mut no_targets = IndirectTargets::default();
        let symbols = &self.symbols;
        let indirect_targets = self.indirect.as_mut().unwrap_or(&mut no_targets);
        let exe = (self.target.exe.file_name())
            .and_then(|n| n.to_str())
            .unwrap_or("");
        let follow_static_graph = self.scheme == Scheme::A && !self.gross_only;
        let closure = static_graph(symbols, indirect_targets, &chosen, exe, follow_static_graph);
        let mut patched =
            functions_to_patch(symbols, indirect_targets, &chosen, &closure, known, exe);
        let unwinders: Vec<(Function, Hook)> = targets::unwinder_targets(symbols)
            .into_iter()
            .filter(|(f, _)| !patched.iter().any(|(p, _)| p.addr == f.addr))
            .collect();
        patched.extend(unwinders.iter().map(|(f, hook)| (f, *hook)));
        let outcomes = match self
            .session
            .request(&targets::patch_request(symbols, &patched))
            .map_err(session_error)?
        {
            Response::Patched { outcomes } => outcomes,
            other => {
                return Err(session_error(AgentConnectionError::Protocol(format!(
                    "{other:?}"
                ))));
            }
        };
        let PatchedRoots {
            names: root_names,
            addresses: root_addresses,
            refusals,
            recorded,
            failure,
        } = patched_roots(
            &patched,
            &outcomes,
            &refused_roots,
            !self.waiting_for.is_empty(),
        );
        if let Some(message) = failure {
            let _ = self.end();
            return Err(RecordError::Refused { pid, message });
        }
        if !refusals.is_empty() {
            say!("roots not instrumented: {}", summarize(&refusals));
        }
        if let Some(indirect) = self.indirect.as_mut()
            && self.pointer_candidates
        {
            indirect.forget_outcomes();
            indirect.note_outcomes(&patched, &outcomes);
            let summary = indirect.summary();
            if self.indirect_summary_said.as_ref() != Some(&summary) {
                say!("{summary}");
                self.indirect_summary_said = Some(summary);
            }
        }
        self.late_modules
            .instrumented(&self.symbols, &patched, &outcomes);
        self.root_names = root_names;
        self.instrumented_up_front = recorded;
        self.static_indirect_call_sites = closure.indirect_call_sites;
        self.root_ids = self.ids_of(&root_addresses);
        let root_ids = self.root_ids.clone();
        self.builder().set_root_functions(root_ids);
        if resumed {
            self.untime_again()?;
        }
        Ok(())
    }

    /// Ends every thread's open frames where the agent stopped: their exits come (if at
    /// all) while nobody watches, or after the next start, without their entries. What
    /// the threads record after that starts afresh at a root, never under those frames.
    fn stop_watching(&mut self) {
        self.give_held_back();
        let at = self.stopped_at.unwrap_or_else(tsc::read);
        if let Some(builder) = self.builder.as_mut() {
            builder.stop_watching(at);
        }
        if let Some(gross) = self.gross.as_mut() {
            gross.finish();
        }
    }

    /// The ids the agent gave the functions at `addresses` (ids are the agent's, kept
    /// for the life of the process; its registry maps them back to addresses).
    fn ids_of(&self, addresses: &[u64]) -> Vec<u32> {
        let Some(rings) = self.rings.as_ref() else {
            return Vec::new();
        };
        (0..)
            .map_while(|id| Some((id, rings.function_address(id)?)))
            .filter(|(_, address)| addresses.contains(address))
            .map(|(id, _)| id)
            .collect()
    }

    /// Whether the agent has ended this recording's session by itself: another
    /// tendril detached the process (or it is gone). The rings still hold everything
    /// it wrote; [`Recorder::finish`] with `agent_gone` reads them.
    pub fn agent_gone(&self) -> bool {
        self.session.closed_by_agent()
    }

    /// Whether events are being collected now.
    pub fn is_recording(&self) -> bool {
        self.recording
    }

    /// Opens the threads' context-switch records, so the trees get CPU times; if the
    /// kernel refuses, the reason is kept for the profile and times stay wall-clock.
    fn watch_off_cpu(&mut self) {
        if self.gross_only {
            self.cpu_unmeasured = Some("CPU time is not measured with --gross-only".into());
            return;
        }
        if self.off_cpu.is_some() || self.cpu_unmeasured.is_some() {
            return;
        }
        let switches_before = self.switches_before.take();
        match OffCpuWatch::start(self.target.pid, self.tsc_hz, switches_before.as_ref()) {
            Ok(watch) => {
                self.off_cpu = Some(watch);
                self.builder().measure_cpu();
            }
            Err(unwatched) => {
                if unwatched.too_costly {
                    crate::terminal_text::say!("{}", unwatched.why);
                }
                self.cpu_unmeasured = Some(unwatched.why);
            }
        }
    }

    /// Every function of the target, for a root picker.
    pub fn symbols(&self) -> &ProcessSymbols {
        &self.symbols
    }

    fn rings(&self) -> &Rings {
        self.rings.as_ref().expect("a recording has begun")
    }

    fn builder(&mut self) -> &mut CctBuilder {
        self.builder.as_mut().expect("a recording has begun")
    }

    pub fn pid(&self) -> i32 {
        self.target.pid
    }

    /// The roots being recorded.
    pub fn roots(&self) -> &[String] {
        &self.root_names
    }

    /// The modules the roots name that the process has not loaded yet (the recording
    /// patches the roots once one is).
    pub fn waiting_for(&self) -> &[String] {
        &self.waiting_for
    }

    pub fn elapsed(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// The number of threads with at least `depth` frames open in the tree now (a
    /// test's way to act in the middle of calls).
    pub fn threads_at_depth(&self, depth: usize) -> usize {
        self.builder
            .as_ref()
            .map_or(0, |b| b.threads_at_depth(depth))
    }

    /// Functions patched up front by this recording (roots, Scheme A's graph, and on
    /// resume what ran before); the agent counts those Scheme B adds.
    pub fn instrumented_up_front(&self) -> u64 {
        self.instrumented_up_front
    }

    /// Events processed so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    pub fn agent_counters(&self) -> AgentCounters {
        self.rings().counters()
    }

    /// Ends the recording: restores the code, reads the last events and returns the
    /// profile. With `agent_gone`, the process has exited or its agent has ended the
    /// session ([`Recorder::agent_gone`]): there is no agent left to ask, and the rings
    /// hold everything it wrote.
    pub fn finish(mut self, agent_gone: bool) -> Result<Finished, RecordError> {
        if agent_gone {
            self.recording = false;
            // Set if another tendril's detach stopped the recording.
            self.stopped_at = self.rings.as_ref().and_then(Rings::stopped_at);
            self.poll();
        } else {
            self.end()?;
        }
        self.give_held_back();
        // Frames still open end where the recording did.
        let end = self.stopped_at.unwrap_or_else(tsc::read);
        self.builder().finish_all(end);
        if let Some(gross) = self.gross.as_mut() {
            gross.finish();
        }
        let refused = std::mem::take(&mut self.refused);
        let mut profile = self.snapshot();
        tracing::add_modules(&mut profile, &self.symbols);
        let hooks_left_in = self.hooks_left_in.take();
        Ok(Finished {
            profile,
            refused,
            hooks_left_in,
        })
    }
}
