//! One profiling session as the live UI drives it: which process, its functions, and the
//! recording, from "nothing chosen yet" to "detached, data kept".
//!
//! The one idea: everything the UI shows about the target passes through this state
//! machine, and every way out of it — quit, detach, the target exiting, an error, a
//! panic unwinding through it — ends in [`crate::recording::Recorder::finish`], so the
//! target is always left running its original code. Slow steps (loading symbols,
//! attaching, writing a saved profile) run as background [`Job`]s; `tick` picks up
//! their results, and an attach in progress is always waited for — never abandoned
//! halfway through its ptrace calls — so that the recorder it makes can be finished.
//! The UI's [`tendril_tui::Action`]s are carried out in `actions.rs`.

use super::code_counts::CodeWatch;
use super::convert::{EventRate, snapshot_of, target_label};
use super::job::{Job, JobState};
use super::processes::list_processes;
use super::roots::function_entries;
use super::sampler_thread::Sampling;
use super::stage::Recording;
use crate::departure::{Departure, agent_departure};
use crate::process::{self, TargetProcess};
use crate::profile::{Profile, ProfileError};
use crate::recording::{Finished, RecordError, RecordOptions, Recorder, Scheme, TimingOptions};
use crate::symbols::{ProcessSymbols, SymbolError};
use crate::terminal_text::say;
use anyhow::anyhow;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tendril_tui::{App, FunctionEntry, ProfileSnapshot, Status};

mod ending;

/// How often the session checks that the target still exists.
const ALIVE_CHECK_INTERVAL: Duration = Duration::from_millis(250);
/// While quitting waits for an attach in progress (to detach afterwards), its note is
/// updated this often.
const ATTACH_NOTE_INTERVAL: Duration = Duration::from_secs(1);
/// How long an agent that closed the connection waits to be explained by the target
/// exiting.
const EXIT_GRACE: Duration = Duration::from_millis(100);
/// The note shown while the target is being detached.
pub(super) const DETACHING_NOTE: &str = "detaching: restoring the target's code…";

/// A profile being written to a file: the file, and how the write went.
pub(super) type SaveJob = Job<(PathBuf, Result<(), ProfileError>)>;

/// The target's functions, for the root picker.
pub(super) enum Symbols {
    NotLoaded,
    Loading(Job<Result<ProcessSymbols, SymbolError>>),
    Loaded(ProcessSymbols),
}

/// What to do with the functions once they are loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WhenLoaded {
    Nothing,
    /// Open the root picker on them (after attaching to a process).
    ShowRootPicker,
    /// Hand them to the root picker that asked for them.
    SetFunctions,
    /// Start sampling the process: the Sampled view (after picking a process, or
    /// `tendril attach` without a root).
    ShowSampled,
}

/// Whether the event loop goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Quit,
}

/// One profiling session's state: see the module comment.
pub struct ProfilingState {
    /// Attach errors end the program (`tendril attach`, `tendril demo`) rather than
    /// becoming a message (the process picker, where another process can be chosen).
    pub(super) errors_are_fatal: bool,
    pub(super) pid: Option<i32>,
    /// "pid 4242 calltree".
    pub(super) target: String,
    pub(super) symbols: Symbols,
    pub(super) when_loaded: WhenLoaded,
    pub(super) entries: Option<Vec<FunctionEntry>>,
    /// The entries being made once the symbols are loaded (every name demangled, off
    /// the UI's thread; sampling does not wait for it).
    entries_job: Option<Job<Vec<FunctionEntry>>>,
    /// What the root picker says when it opens once the entries are made, if not the
    /// usual invitation (why sampling is not possible).
    pub(super) picker_note: Option<String>,
    pub(super) recording: Recording,
    /// Sampling from the outside, before a root is instrumented (`sampled.rs`).
    pub(super) sampling: Sampling,
    /// Roots asked for while attaching, applied when the recorder is ready:
    /// (patterns, names).
    pub(super) pending_roots: Option<(Vec<String>, Vec<String>)>,
    pub(super) rate: EventRate,
    /// A profile being written (`w`); one at a time.
    pub(super) saving: Option<SaveJob>,
    next_alive_check: Instant,
    /// The target has exited: nothing more to check or detach.
    pub(super) target_gone: bool,
    /// The annotated code being counted (`e`).
    pub(super) code: CodeWatch,
    /// Adaptive timing's options for every recording this session starts.
    timing: TimingOptions,
}

impl ProfilingState {
    fn new(errors_are_fatal: bool, recording: Recording) -> ProfilingState {
        ProfilingState {
            errors_are_fatal,
            pid: None,
            target: String::new(),
            symbols: Symbols::NotLoaded,
            when_loaded: WhenLoaded::Nothing,
            entries: None,
            entries_job: None,
            picker_note: None,
            recording,
            sampling: Sampling::default(),
            pending_roots: None,
            rate: EventRate::default(),
            saving: None,
            next_alive_check: Instant::now(),
            target_gone: false,
            code: CodeWatch::Closed,
            timing: TimingOptions::default(),
        }
    }

    /// A session that starts at the process picker.
    pub fn for_process_picker() -> ProfilingState {
        ProfilingState::new(false, Recording::NotStarted)
    }

    /// A session on a target already checked with [`process::inspect`].
    pub fn for_target(target: &TargetProcess, timing: TimingOptions) -> ProfilingState {
        let mut session = ProfilingState::new(true, Recording::NotStarted);
        session.timing = timing;
        session.choose_target(target);
        session
    }

    /// A session browsing a saved profile.
    pub fn for_saved_profile() -> ProfilingState {
        ProfilingState::new(false, Recording::Saved)
    }

    pub(super) fn choose_target(&mut self, target: &TargetProcess) {
        self.pid = Some(target.pid);
        let comm = process::thread_name(target.pid, target.pid);
        self.target = target_label(target.pid as u32, &target.exe.to_string_lossy(), &comm);
    }

    /// Whether events are flowing in: the loop then drains the rings every few
    /// milliseconds and takes snapshots. Paused, nothing changes.
    pub fn is_collecting(&self) -> bool {
        matches!(&self.recording, Recording::Live(recorder) if recorder.is_recording())
    }

    /// Forgets the chosen process (it exited before a root was profiled), so another
    /// can be chosen.
    fn forget_target(&mut self) {
        self.pid = None;
        self.target.clear();
        self.symbols = Symbols::NotLoaded;
        self.when_loaded = WhenLoaded::Nothing;
        self.entries = None;
        self.entries_job = None;
        self.picker_note = None;
        self.pending_roots = None;
        self.sampling = Sampling::default();
        self.target_gone = false;
    }

    /// Starts loading the target's functions in the background.
    pub(super) fn load_symbols(&mut self, when_loaded: WhenLoaded) -> anyhow::Result<()> {
        let pid = self.pid.ok_or_else(|| anyhow!("no process chosen"))?;
        self.when_loaded = when_loaded;
        if matches!(self.symbols, Symbols::NotLoaded) {
            let job = Job::spawn("tendril-symbols", move || ProcessSymbols::load(pid))?;
            self.symbols = Symbols::Loading(job);
        }
        Ok(())
    }

    /// Attaches and starts recording from `patterns` in the background; `names` are
    /// shown as the roots meanwhile.
    pub(super) fn start_recording(
        &mut self,
        patterns: Vec<String>,
        names: Vec<String>,
        app: &mut App,
    ) -> anyhow::Result<()> {
        let pid = self.pid.ok_or_else(|| anyhow!("no process chosen"))?;
        let options = RecordOptions {
            pid,
            roots: patterns,
            scheme: Scheme::B,
            gross_only: false,
            timing: self.timing.clone(),
            pointer_candidates: false,
        };
        let job = Job::spawn("tendril-attach", move || Recorder::start(&options))?;
        self.recording = Recording::Starting(job);
        app.update_snapshot(ProfileSnapshot {
            status: Status {
                target: self.target.clone(),
                roots: names.clone(),
                ..Status::default()
            },
            ..ProfileSnapshot::default()
        });
        app.set_message(format!(
            "attaching to {} and instrumenting {}…",
            self.target,
            names.join(", ")
        ));
        Ok(())
    }

    /// Drains the target's event rings; returns the number of events.
    pub fn poll(&mut self) -> u64 {
        match &mut self.recording {
            Recording::Live(recorder) => recorder.poll(),
            _ => 0,
        }
    }

    /// Picks up finished background jobs and notices a target that exited. An error is
    /// fatal: the caller ends the UI (after [`ProfilingState::shutdown`]) and reports it.
    pub fn tick(&mut self, app: &mut App, now: Instant) -> anyhow::Result<()> {
        self.check_symbols(app)?;
        self.check_entries(app)?;
        self.check_sampling(app);
        self.check_start(app)?;
        self.check_busy(app);
        self.check_code(app);
        self.check_save(app);
        if now >= self.next_alive_check {
            self.next_alive_check = now + ALIVE_CHECK_INTERVAL;
            self.check_alive(app)?;
        }
        Ok(())
    }

    fn check_symbols(&mut self, app: &mut App) -> anyhow::Result<()> {
        let Symbols::Loading(job) = &self.symbols else {
            return Ok(());
        };
        let error = match job.poll() {
            JobState::Running => return Ok(()),
            JobState::Done(Ok(symbols)) => {
                // The root picker lists every name: made in the background, as sampling
                // needs only the names it meets.
                let all = symbols.clone();
                self.entries_job =
                    Some(Job::spawn("tendril-names", move || function_entries(&all))?);
                self.symbols = Symbols::Loaded(symbols);
                if self.when_loaded == WhenLoaded::ShowSampled
                    && let Symbols::Loaded(symbols) = &self.symbols
                {
                    let symbols = symbols.clone();
                    self.start_sampling(&symbols, app);
                }
                return Ok(());
            }
            JobState::Done(Err(error)) => error.to_string(),
            // The panic hook has given the terminal back already: the UI cannot go on.
            JobState::Died => {
                return Err(anyhow!("reading the symbols of {} crashed", self.target));
            }
        };
        self.symbols = Symbols::NotLoaded;
        let message = format!("cannot read the functions of {}: {error}", self.target);
        if self.errors_are_fatal {
            return Err(anyhow!(message));
        }
        // Back to choosing a process.
        self.pid = None;
        app.set_message(message);
        Ok(())
    }

    /// Hands the function entries over once they are made, as the loading asked.
    fn check_entries(&mut self, app: &mut App) -> anyhow::Result<()> {
        let Some(job) = &self.entries_job else {
            return Ok(());
        };
        let entries = match job.poll() {
            JobState::Running => return Ok(()),
            JobState::Done(entries) => entries,
            JobState::Died => {
                return Err(anyhow!("listing the functions of {} crashed", self.target));
            }
        };
        self.entries_job = None;
        match self.when_loaded {
            WhenLoaded::Nothing => {}
            WhenLoaded::ShowRootPicker => {
                app.show_root_picker(entries.clone());
                let invitation = || {
                    format!(
                        "{}: type to find a root function, Enter profiles it",
                        self.target
                    )
                };
                app.set_message(self.picker_note.take().unwrap_or_else(invitation));
            }
            WhenLoaded::SetFunctions | WhenLoaded::ShowSampled => {
                app.set_functions(entries.clone())
            }
        }
        self.entries = Some(entries);
        Ok(())
    }

    fn check_start(&mut self, app: &mut App) -> anyhow::Result<()> {
        let Recording::Starting(job) = &self.recording else {
            return Ok(());
        };
        let error = match job.poll() {
            JobState::Running => return Ok(()),
            JobState::Done(Ok(recorder)) => {
                app.set_message(match recorder.waiting_for() {
                    [] => format!(
                        "profiling {} in {} — ? shows the keys",
                        recorder.roots().join(", "),
                        self.target
                    ),
                    modules => format!(
                        "waiting for {} to load {}: its roots are profiled from then on — ? \
                         shows the keys",
                        self.target,
                        modules.join(", ")
                    ),
                });
                self.recording = Recording::Live(Box::new(recorder));
                // Its last tree stays, to compare with; hooks would only perturb it.
                self.stop_sampling();
                self.rate.clear();
                self.refresh(app);
                if let Some((patterns, names)) = self.pending_roots.take() {
                    self.change_roots(patterns, names, app);
                }
                return Ok(());
            }
            JobState::Done(Err(error)) => error,
            JobState::Died => {
                self.recording = Recording::NotStarted;
                return Err(anyhow!("attaching to {} crashed", self.target));
            }
        };
        self.recording = Recording::NotStarted;
        self.pending_roots = None;
        // No roots after all (the root picker would preselect the failed ones).
        app.update_snapshot(ProfileSnapshot {
            status: Status {
                target: self.target.clone(),
                ..Status::default()
            },
            ..ProfileSnapshot::default()
        });
        // A root that cannot be profiled is the user's to change; anything else (the
        // process cannot be attached to) ends a session that was about this process.
        let about_the_roots = matches!(error, RecordError::Select(_) | RecordError::Refused { .. });
        match &self.entries {
            // Sampled first: back to the samples, to choose another root or just browse
            // (sampling needs no ptrace, so it may work where attaching does not).
            Some(_) if app.has_sampled() => {
                app.show_sampled();
                app.set_message(format!("cannot profile that: {error}"));
                Ok(())
            }
            Some(entries) if about_the_roots || !self.errors_are_fatal => {
                app.show_root_picker(entries.clone());
                app.set_message(format!("cannot profile that: {error}"));
                Ok(())
            }
            _ if self.errors_are_fatal => Err(error.into()),
            _ => {
                app.set_message(error.to_string());
                Ok(())
            }
        }
    }

    fn check_alive(&mut self, app: &mut App) -> anyhow::Result<()> {
        let Some(pid) = self.pid else {
            return Ok(());
        };
        if self.target_gone {
            return Ok(());
        }
        if !process::is_gone_or_exiting(pid) {
            self.check_detached_elsewhere(pid, app);
            return Ok(());
        }
        match std::mem::replace(&mut self.recording, Recording::NotStarted) {
            Recording::Live(recorder) => {
                self.target_gone = true;
                let message = format!(
                    "{} exited; the data stays — w saves it, q quits",
                    self.target
                );
                self.end_with(recorder.finish(true), message, app);
            }
            // Attaching to a process that exits fails by itself; check_start reports it.
            starting @ Recording::Starting(_) => self.recording = starting,
            Recording::NotStarted => {
                let message = format!("{} exited", self.target);
                if self.errors_are_fatal {
                    self.target_gone = true;
                    return Err(anyhow!(message));
                }
                // Back to the process list: there is nothing left to choose a root in.
                self.forget_target();
                app.show_process_picker(list_processes());
                app.set_message(format!("{message}; choose another process"));
            }
            other => self.recording = other,
        }
        Ok(())
    }

    /// A live recording whose agent ended the session while the process lives on was
    /// detached by another tendril, or the process exec'd: the data stays, as when the
    /// target exits.
    fn check_detached_elsewhere(&mut self, pid: i32, app: &mut App) {
        let Recording::Live(recorder) = &self.recording else {
            return;
        };
        if !recorder.agent_gone() {
            return;
        }
        let why = match agent_departure(pid, EXIT_GRACE, || false) {
            // The exit is told by the regular check that the target still exists.
            departure if departure.exited() => return,
            Departure::Detached => format!("another tendril detached {}", self.target),
            execed => execed.headline(pid),
        };
        let Recording::Live(recorder) =
            std::mem::replace(&mut self.recording, Recording::NotStarted)
        else {
            return;
        };
        self.target_gone = true;
        let message = format!("{why}; the data stays — w saves it, q quits");
        self.end_with(recorder.finish(true), message, app);
    }

    fn check_save(&mut self, app: &mut App) {
        let Some(job) = &self.saving else {
            return;
        };
        let message = match job.poll() {
            JobState::Running => return,
            JobState::Done(saved) => save_message(saved),
            JobState::Died => "saving the profile crashed".to_string(),
        };
        self.saving = None;
        app.set_message(message);
    }

    /// The state after `finish`: the final profile, shown as detached, with `message`.
    pub(super) fn end_with(
        &mut self,
        finished: Result<Finished, RecordError>,
        message: String,
        app: &mut App,
    ) {
        match finished {
            Ok(Finished {
                profile, refused, ..
            }) => {
                let mut status = self.ended_status(&profile);
                status.overlap = self.overlap_with_samples(&profile, true);
                let mut snapshot = snapshot_of(&profile, status);
                snapshot.status.detached = true;
                app.update_snapshot(snapshot);
                let message = if refused.is_empty() {
                    message
                } else {
                    format!(
                        "{message} ({} callees could not be instrumented; their time counts as their callers' own)",
                        refused.len()
                    )
                };
                app.set_message(message);
                self.recording = Recording::Ended(Box::new(profile));
            }
            Err(error) => {
                // The recorder is gone, and with it the agent's connection: the agent
                // restores the code by itself. The last snapshot stays on screen.
                let mut snapshot = app.snapshot().clone();
                snapshot.status.detached = true;
                app.update_snapshot(snapshot);
                app.set_message(format!(
                    "{message}; the recording did not end cleanly ({error}), the agent restores the code by itself"
                ));
                self.recording = Recording::NotStarted;
                self.target_gone = true;
            }
        }
    }

    fn ended_status(&self, profile: &Profile) -> Status {
        Status {
            target: self.target.clone(),
            roots: profile.roots.clone(),
            elapsed: Duration::from_nanos(profile.duration_ns),
            detached: true,
            ..Status::default()
        }
    }

    /// Hands the UI a fresh snapshot of a live recording.
    pub fn refresh(&mut self, app: &mut App) {
        let Recording::Live(recorder) = &mut self.recording else {
            return;
        };
        let profile = recorder.snapshot();
        // While the roots' module is not loaded yet, the status bar says so.
        let roots = match recorder.roots() {
            [] => recorder
                .waiting_for()
                .iter()
                .map(|module| format!("(waiting for {module})"))
                .collect(),
            roots => roots.to_vec(),
        };
        let mut status = Status {
            target: self.target.clone(),
            roots,
            elapsed: recorder.elapsed(),
            events_per_second: self.rate.sample(Instant::now(), recorder.events()),
            paused: !recorder.is_recording(),
            ..Status::default()
        };
        status.overlap = self.overlap_with_samples(&profile, false);
        app.update_snapshot(snapshot_of(&profile, status));
    }
}

/// The message for a finished save.
fn save_message((path, saved): (PathBuf, Result<(), ProfileError>)) -> String {
    match saved {
        Ok(()) => format!("saved the profile to {}", path.display()),
        Err(error) => format!("cannot save the profile: {error}"),
    }
}
