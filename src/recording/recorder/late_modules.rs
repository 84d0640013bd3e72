//! Modules loaded after a recording started (`dlopen`): their functions join the
//! agent's table and their address-taken functions are instrumented, so a callback in a
//! plugin is followed like any other.
//!
//! The one idea: the controller already knows how to read a module; it only has to
//! notice one. Every [`CHECK_EVERY`] of draining, it compares the code objects of
//! `/proc/PID/maps` with the modules it has symbols for (a read of a few kilobytes). A new
//! one makes it load the process's symbols again, send the agent the new table
//! (`UpdateTable`), patch the new module's address-taken and exported functions (a
//! `dlopen`ed module is reached through `dlsym`) in one batch, and say so on stderr. A call into the new module made before that (at most about
//! [`CHECK_EVERY`] after the `dlopen`) is not followed; from then on it is.

use super::*;
use crate::recording::address_taken;
use crate::symbols::maps;
use crate::terminal_text::say;
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

/// How often the target's modules are compared with the known ones.
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// When modules were last looked for.
#[derive(Debug, Default)]
pub(super) struct Watch {
    last_check: Option<Instant>,
    /// Modules that could not be followed, so that they are not tried again.
    given_up: HashSet<PathBuf>,
}

impl Recorder {
    /// Follows the modules loaded since the last look, if it is time to look.
    pub(super) fn follow_late_modules(&mut self) {
        if !self.recording || self.gross_only || self.indirect.is_none() {
            return;
        }
        let now = Instant::now();
        if self
            .late_modules
            .last_check
            .is_some_and(|last| now.duration_since(last) < CHECK_EVERY)
        {
            return;
        }
        self.late_modules.last_check = Some(now);
        let new = self.new_modules();
        if new.is_empty() {
            return;
        }
        if let Err(message) = self.follow(&new) {
            say!("calls into new modules are not followed: {message}");
            self.late_modules.given_up.extend(new);
        }
    }

    /// Code objects mapped now that the symbols do not know (the agent's own aside).
    fn new_modules(&self) -> Vec<PathBuf> {
        let Ok(mappings) = maps::read_maps(self.target.pid) else {
            return Vec::new();
        };
        let known: HashSet<&std::path::Path> = self
            .symbols
            .modules()
            .iter()
            .map(|m| m.path.as_path())
            .chain(self.symbols.skipped().iter().map(|s| s.path.as_path()))
            .chain(self.late_modules.given_up.iter().map(PathBuf::as_path))
            .collect();
        maps::code_objects(&mappings)
            .into_iter()
            .map(|object| object.path)
            .filter(|path| !known.contains(path.as_path()))
            .filter(|path| {
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                !crate::agent_bundle::is_agent_module(name)
            })
            .collect()
    }

    /// Reads the process's symbols again, hands the agent the new table and patches the
    /// address-taken functions of the `new` modules.
    fn follow(&mut self, new: &[PathBuf]) -> Result<(), String> {
        let pid = self.target.pid;
        let symbols = ProcessSymbols::load(pid).map_err(|e| e.to_string())?;
        let names: Vec<String> = symbols
            .modules()
            .iter()
            .filter(|m| new.contains(&m.path))
            .map(|m| m.name.clone())
            .collect();
        if names.is_empty() {
            // Unmapped again already, or unreadable: nothing to follow.
            self.late_modules.given_up.extend(new.iter().cloned());
            return Ok(());
        }
        let found = address_taken::find_late(&symbols, &names);
        self.symbols = symbols;
        let indirect = self.indirect.as_mut().expect("checked by the caller");
        indirect.note_unreadable(&found);
        indirect.taken.merge(found.clone());
        let table = function_table::encode(&self.symbols, &indirect.taken);
        let answer = self
            .session
            .request_with_payload(
                &Request::UpdateTable {
                    table_bytes: table.len() as u64,
                },
                &table,
            )
            .map_err(|e| e.to_string())?;
        if !matches!(answer, Response::TableUpdated { .. }) {
            return Err(format!("the agent answered {answer:?}"));
        }
        let candidates = indirect::functions_at(&self.symbols, &found.addresses);
        let patched: Vec<(&Function, Hook)> =
            candidates.iter().map(|&f| (f, Hook::Record)).collect();
        let outcomes = match self
            .session
            .request(&targets::patch_request(&self.symbols, &patched))
            .map_err(|e| e.to_string())?
        {
            Response::Patched { outcomes } => outcomes,
            other => return Err(format!("the agent answered {other:?}")),
        };
        let instrumented = outcomes.iter().filter(|o| o.refused.is_none()).count();
        self.instrumented_up_front += instrumented as u64;
        let indirect = self.indirect.as_mut().expect("checked by the caller");
        indirect.note_outcomes(&patched, &outcomes);
        say!(
            "new module {}: {} address-taken functions instrumented",
            names.join(", "),
            instrumented
        );
        Ok(())
    }
}
