//! What each [`Action`] of the terminal UI does to the session.
//!
//! The one idea: an action never ends the program by failing — whatever goes wrong is
//! reported in the UI's message line and the session stays usable; only `Quit` leaves
//! the loop (and [`ProfilingState::shutdown`] then detaches). Actions that wait for the agent
//! (pause, resume, new roots, detach) run in the background (`busy.rs`).

use super::job::Job;
use super::profiling_state::{DETACHING_NOTE, Flow, ProfilingState, Symbols, WhenLoaded};
use super::roots::{function_entries, pattern_for};
use super::save_path::{FreshFileError, create_first_free, snapshot_paths};
use super::stage::Recording;
use crate::process;
use crate::profile::trace::{DEFAULT_TRACE_SECONDS, MAX_TRACE_EVENTS};
use crate::recording::Recorder;
use tendril_tui::{Action, App, FunctionEntry};

impl ProfilingState {
    /// A note to show (and draw) before an action that blocks the UI: quitting waits
    /// for the target to be detached.
    pub fn progress_note(&self, action: &Action) -> Option<&'static str> {
        let attached = matches!(
            self.recording,
            Recording::Live(_)
                | Recording::Starting(_)
                | Recording::Busy(_)
                | Recording::Detaching(_)
        );
        (matches!(action, Action::Quit) && attached).then_some(DETACHING_NOTE)
    }

    /// Carries out `action`, reporting the outcome through `app`.
    pub fn handle(&mut self, action: Action, app: &mut App) -> Flow {
        match action {
            Action::Quit => return Flow::Quit,
            Action::Attach(pid) => self.attach(pid as i32, app),
            Action::RefreshProcesses => app.set_processes(super::processes::list_processes()),
            Action::LoadFunctions => self.load_functions(app),
            Action::SetRoots(entries) => self.set_roots(&entries, app),
            Action::RootFromSamples {
                name,
                module,
                address,
            } => self.root_from_samples(&name, &module, address, app),
            Action::Pause | Action::Resume | Action::Reset => self.collection(&action, app),
            Action::Save => self.save(app),
            Action::SaveSampled => self.save_sampled(app),
            Action::Trace => self.trace(app),
            Action::Detach => self.detach(app),
            Action::ShowCode {
                name,
                module,
                address,
            } => self.show_code(name, module, address, app),
            Action::CloseCode => self.close_code(),
        }
        Flow::Continue
    }

    fn attach(&mut self, pid: i32, app: &mut App) {
        if let Some(current) = self.pid {
            app.set_message(format!("already attaching to pid {current}…"));
            return;
        }
        match process::inspect(pid) {
            Err(error) => app.set_message(error.to_string()),
            Ok(target) => {
                self.choose_target(&target);
                match self.load_symbols(WhenLoaded::ShowSampled) {
                    Ok(()) => app.set_message(format!(
                        "{}: reading its functions, then sampling it…",
                        self.target
                    )),
                    Err(error) => {
                        self.pid = None;
                        app.set_message(error.to_string());
                    }
                }
            }
        }
    }

    fn load_functions(&mut self, app: &mut App) {
        if self.entries.is_none()
            && let Recording::Live(recorder) = &self.recording
        {
            self.entries = Some(function_entries(recorder.symbols()));
        }
        if let Some(entries) = &self.entries {
            app.set_functions(entries.clone());
        } else if let Err(error) = self.load_symbols(WhenLoaded::SetFunctions) {
            app.set_message(error.to_string());
        }
    }

    pub(super) fn set_roots(&mut self, entries: &[FunctionEntry], app: &mut App) {
        let symbols = match (&self.recording, &self.symbols) {
            (Recording::Live(recorder), _) => recorder.symbols(),
            (_, Symbols::Loaded(symbols)) => symbols,
            _ => {
                app.set_message("the target's functions are not loaded yet; try again");
                return;
            }
        };
        let mut patterns: Vec<String> = Vec::new();
        let mut names: Vec<String> = Vec::new();
        for entry in entries {
            // Two functions of one symbol name (glibc's versioned `memcpy`) are one pattern.
            if let Some(pattern) = pattern_for(symbols, entry)
                && !patterns.contains(&pattern)
            {
                patterns.push(pattern);
            }
            if !names.contains(&entry.name) {
                names.push(entry.name.clone());
            }
        }
        if patterns.is_empty() {
            app.set_message("none of those functions is in the target any more");
            return;
        }
        match &self.recording {
            Recording::NotStarted => {
                if let Err(error) = self.start_recording(patterns, names, app) {
                    app.set_message(format!("cannot attach: {error}"));
                }
            }
            Recording::Starting(_) => {
                app.set_message(format!(
                    "still attaching; {} will be the roots once attached",
                    names.join(", ")
                ));
                self.pending_roots = Some((patterns, names));
            }
            Recording::Live(_) => self.change_roots(patterns, names, app),
            other @ (Recording::Busy(_) | Recording::Detaching(_)) => {
                app.set_message(other.not_live_note());
            }
            Recording::Ended(_) | Recording::Saved => {
                app.set_message("the target is detached: there is nothing to instrument");
            }
        }
    }

    /// Records from other roots, keeping the target attached (in the background: the
    /// agent restores the old roots and patches the new ones).
    pub(super) fn change_roots(
        &mut self,
        patterns: Vec<String>,
        names: Vec<String>,
        app: &mut App,
    ) {
        let note = format!("changing the roots to {}…", names.join(", "));
        self.run_on_recorder(
            "changing the roots",
            note,
            move |recorder| new_roots_message(recorder, &patterns, &names),
            app,
        );
    }

    /// Pause, resume or reset.
    fn collection(&mut self, action: &Action, app: &mut App) {
        match action {
            Action::Pause => self.run_on_recorder(
                "pausing",
                "pausing: restoring the target's code…".into(),
                |recorder| match recorder.pause() {
                    Ok(()) => match recorder.hooks_left_in() {
                        None => {
                            "paused: the target runs its own code again; p resumes, the data stays"
                                .to_string()
                        }
                        Some(left_in) => format!("paused; {left_in}; p resumes, the data stays"),
                    },
                    Err(error) => error.to_string(),
                },
                app,
            ),
            Action::Resume => self.run_on_recorder(
                "resuming",
                "resuming: instrumenting the roots again…".into(),
                |recorder| match recorder.resume() {
                    Ok(()) => format!("recording {} again", recorder.roots().join(", ")),
                    Err(error) => error.to_string(),
                },
                app,
            ),
            _ => {
                let Recording::Live(recorder) = &mut self.recording else {
                    app.set_message(self.recording.not_live_note());
                    return;
                };
                recorder.reset();
                self.rate.clear();
                app.set_message("data reset: counting from zero");
                self.refresh(app);
            }
        }
    }

    /// Starts a trace of the next second (`t`); `w` saves it with the profile.
    fn trace(&mut self, app: &mut App) {
        match &mut self.recording {
            Recording::Live(recorder) if recorder.is_recording() => {
                recorder.start_trace(DEFAULT_TRACE_SECONDS);
                app.set_message(format!(
                    "tracing the next {DEFAULT_TRACE_SECONDS} s (at most {MAX_TRACE_EVENTS} \
                     events); w saves it with the profile, for `report --format chrome`"
                ));
            }
            Recording::Live(_) => app.set_message("paused: p resumes, then t traces"),
            busy @ (Recording::Busy(_) | Recording::Detaching(_)) => {
                app.set_message(busy.not_live_note())
            }
            _ => app.set_message("nothing is being recorded to trace"),
        }
    }

    /// Takes the profile as it stands and writes it on a background thread, so the
    /// rings keep being drained while the file is written.
    fn save(&mut self, app: &mut App) {
        if self.saving.is_some() {
            app.set_message("still saving the previous profile; w again in a moment");
            return;
        }
        let profile = match &mut self.recording {
            Recording::Live(recorder) => recorder.snapshot(),
            Recording::Ended(profile) => (**profile).clone(),
            busy @ (Recording::Busy(_) | Recording::Detaching(_)) => {
                app.set_message(busy.not_live_note());
                return;
            }
            _ => {
                app.set_message("nothing recorded yet");
                return;
            }
        };
        self.write_profile(profile, app);
    }

    /// Writes the sampled profile as it stands (`w` in the Sampled view).
    fn save_sampled(&mut self, app: &mut App) {
        if self.saving.is_some() {
            app.set_message("still saving the previous profile; w again in a moment");
            return;
        }
        match &self.sampling.profile {
            Some(profile) => self.write_profile(profile.clone(), app),
            None => app.set_message("nothing sampled yet"),
        }
    }

    /// Writes `profile` to the first free `tendril-PID-TIME.json` here, in the background.
    fn write_profile(&mut self, profile: crate::profile::Profile, app: &mut App) {
        let Some(pid) = self.pid else {
            return;
        };
        // The file is created here, at once, so the message names it.
        let (path, file, links) = match create_first_free(snapshot_paths(pid)) {
            Ok(created) => (created.path, created.file, created.links_passed),
            Err(FreshFileError::Failed(path, error)) => {
                app.set_message(format!(
                    "cannot save the profile to {}: {error}",
                    path.display()
                ));
                return;
            }
            Err(FreshFileError::AllTaken(_)) => {
                app.set_message(
                    "cannot save the profile: every tendril-PID-TIME name is taken here",
                );
                return;
            }
        };
        let message = match links.first() {
            None => format!("saving the profile to {}…", path.display()),
            Some(link) => format!(
                "saving the profile to {}… ({} is a symbolic link someone put there: not followed)",
                path.display(),
                link.display()
            ),
        };
        let created = path.clone();
        let job = Job::spawn("tendril-save", move || {
            let saved = profile.write_to_file(file, &path);
            (path, saved)
        });
        match job {
            Ok(job) => {
                self.saving = Some(job);
                app.set_message(message);
            }
            Err(error) => {
                // Nothing was written: the empty file made for it goes.
                let _ = std::fs::remove_file(&created);
                app.set_message(format!("cannot save the profile: {error}"));
            }
        }
    }

    fn detach(&mut self, app: &mut App) {
        let message = format!(
            "detached from {}: its code is restored and it keeps running; the data stays",
            self.target
        );
        self.detach_in_background(DETACHING_NOTE, message, app);
    }
}

/// Sets new roots on `recorder` and says how it went.
fn new_roots_message(recorder: &mut Recorder, patterns: &[String], names: &[String]) -> String {
    match recorder.set_roots(patterns) {
        Ok(()) if recorder.is_recording() => {
            format!("profiling {} from now on", recorder.roots().join(", "))
        }
        Ok(()) => format!("paused: p starts profiling {}", recorder.roots().join(", ")),
        // The recorder kept the previous roots and the data.
        Err(error) if recorder.is_recording() => format!(
            "cannot profile {}: {error} — still profiling {}",
            names.join(", "),
            recorder.roots().join(", ")
        ),
        Err(error) => format!(
            "cannot profile {}: {error} — paused; p resumes {}, r chooses other roots",
            names.join(", "),
            recorder.roots().join(", ")
        ),
    }
}
