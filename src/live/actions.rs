//! What each [`Action`] of the terminal UI does to the session.
//!
//! The one idea: an action never ends the program by failing — whatever goes wrong is
//! reported in the UI's message line and the session stays usable; only `Quit` leaves
//! the loop (and [`Session::shutdown`] then detaches).

use super::roots::{function_entries, pattern_for};
use super::session::{Flow, Recording, Session, Symbols, WhenLoaded};
use crate::process;
use std::path::PathBuf;
use tendril_tui::{Action, App, FunctionEntry};

impl Session {
    /// A note to show (and draw) before an action that may take a moment.
    pub fn progress_note(&self, action: &Action) -> Option<&'static str> {
        let live = self.is_live();
        match action {
            Action::Pause if live => Some("pausing: restoring the target's code…"),
            Action::Resume if live => Some("resuming: instrumenting the roots again…"),
            Action::SetRoots(_) if live => Some("changing the roots…"),
            Action::Detach if live => Some("detaching: restoring the target's code…"),
            Action::Quit if live || matches!(self.recording, Recording::Starting(_)) => {
                Some("detaching: restoring the target's code…")
            }
            _ => None,
        }
    }

    /// Carries out `action`, reporting the outcome through `app`.
    pub fn handle(&mut self, action: Action, app: &mut App) -> Flow {
        match action {
            Action::Quit => return Flow::Quit,
            Action::Attach(pid) => self.attach(pid as i32, app),
            Action::RefreshProcesses => app.set_processes(super::processes::list_processes()),
            Action::LoadFunctions => self.load_functions(app),
            Action::SetRoots(entries) => self.set_roots(&entries, app),
            Action::Pause | Action::Resume | Action::Reset => self.collection(&action, app),
            Action::Save => self.save(app),
            Action::Detach => self.detach(app),
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
                match self.load_symbols(WhenLoaded::ShowRootPicker) {
                    Ok(()) => app.set_message(format!(
                        "attaching to {}: reading its functions…",
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

    fn set_roots(&mut self, entries: &[FunctionEntry], app: &mut App) {
        let symbols = match (&self.recording, &self.symbols) {
            (Recording::Live(recorder), _) => recorder.symbols(),
            (_, Symbols::Loaded(symbols)) => symbols,
            _ => {
                app.set_message("the target's functions are not loaded yet; try again");
                return;
            }
        };
        let patterns: Vec<String> = entries
            .iter()
            .filter_map(|entry| pattern_for(symbols, entry))
            .collect();
        let names: Vec<String> = entries.iter().map(|entry| entry.name.clone()).collect();
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
            Recording::Live(_) => {
                self.change_roots(&patterns, &names, app);
                self.refresh(app);
            }
            Recording::Ended(_) | Recording::Saved => {
                app.set_message("the target is detached: there is nothing to instrument");
            }
        }
    }

    /// Records from other roots, keeping the target attached. The caller refreshes the
    /// snapshot, so the status bar shows the roots the recorder has now.
    pub(super) fn change_roots(&mut self, patterns: &[String], names: &[String], app: &mut App) {
        let Recording::Live(recorder) = &mut self.recording else {
            return;
        };
        let message = match recorder.set_roots(patterns) {
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
        };
        self.rate.clear();
        app.set_message(message);
    }

    /// Pause, resume or reset.
    fn collection(&mut self, action: &Action, app: &mut App) {
        let Recording::Live(recorder) = &mut self.recording else {
            app.set_message("nothing is being recorded yet");
            return;
        };
        let outcome = match action {
            Action::Pause => recorder.pause().map(|()| {
                "paused: the target runs its own code again; p resumes, the data stays".to_string()
            }),
            Action::Resume => recorder
                .resume()
                .map(|()| format!("recording {} again", recorder.roots().join(", "))),
            _ => {
                recorder.reset();
                self.rate.clear();
                Ok("data reset: counting from zero".to_string())
            }
        };
        match outcome {
            Ok(message) => app.set_message(message),
            Err(error) => app.set_message(error.to_string()),
        }
        self.refresh(app);
    }

    fn save(&mut self, app: &mut App) {
        let Some(pid) = self.pid else {
            return;
        };
        let path = snapshot_path(pid);
        let saved = match &mut self.recording {
            Recording::Live(recorder) => recorder.snapshot().save(&path),
            Recording::Ended(profile) => profile.save(&path),
            _ => {
                app.set_message("nothing recorded yet");
                return;
            }
        };
        match saved {
            Ok(()) => app.set_message(format!("saved the profile to {}", path.display())),
            Err(error) => app.set_message(format!("cannot save the profile: {error}")),
        }
    }

    fn detach(&mut self, app: &mut App) {
        match std::mem::replace(&mut self.recording, Recording::NotStarted) {
            Recording::Live(recorder) => {
                let message = format!(
                    "detached from {}: its code is restored and it keeps running; the data stays",
                    self.target
                );
                self.end_with(recorder.finish(false), message, app);
            }
            starting @ Recording::Starting(_) => {
                self.recording = starting;
                app.set_message("still attaching; detach again in a moment");
            }
            other => self.recording = other,
        }
    }
}

/// `tendril-<pid>-<YYYYmmdd-HHMMSS>.json` in the current directory (with `-2`, `-3`…
/// added if that file exists).
pub fn snapshot_path(pid: i32) -> PathBuf {
    let stem = format!("tendril-{pid}-{}", local_timestamp());
    let mut path = PathBuf::from(format!("{stem}.json"));
    let mut next = 2;
    while path.exists() {
        path = PathBuf::from(format!("{stem}-{next}.json"));
        next += 1;
    }
    path
}

/// The local time as `YYYYmmdd-HHMMSS`.
fn local_timestamp() -> String {
    // SAFETY: time(NULL) has no preconditions.
    let now = unsafe { libc::time(std::ptr::null_mut()) };
    // SAFETY: an all-zero `tm` is a valid value of this plain C struct (its pointer
    // field `tm_zone` may be null).
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call; localtime_r is the thread-safe form.
    if unsafe { libc::localtime_r(&now, &mut tm) }.is_null() {
        return now.to_string();
    }
    format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_files_are_named_after_the_pid_and_the_time() {
        let name = snapshot_path(4242).display().to_string();
        let stamp = name
            .strip_prefix("tendril-4242-")
            .and_then(|rest| rest.strip_suffix(".json"))
            .unwrap_or_else(|| panic!("{name}"));
        let (date, time) = stamp.split_once('-').unwrap_or_else(|| panic!("{name}"));
        assert_eq!(date.len(), 8, "{name}");
        assert!(date.starts_with("20"), "{name}");
        assert_eq!(time.len(), 6, "{name}");
        assert!(
            stamp.chars().all(|c| c.is_ascii_digit() || c == '-'),
            "{name}"
        );
    }
}
