//! Modules loaded after a recording started (`dlopen`): their functions join the
//! agent's table and their address-taken functions are instrumented, so a callback in a
//! plugin is followed like any other.
//!
//! The one idea: the controller already knows how to read a module; it only has to
//! notice one. Every [`CHECK_EVERY`] of draining, it asks the agent for the dynamic
//! loader's counts of libraries added and removed; when they moved, it compares the code
//! objects of `/proc/PID/maps` with the modules it has symbols for. A new one makes it
//! load the process's symbols again, send the agent the new table (`UpdateTable`), patch
//! the new module's address-taken and exported functions (a `dlopen`ed module is reached
//! through `dlsym`) in one batch, and say so on stderr. A call into the new module made
//! before that (at most about [`CHECK_EVERY`] after the `dlopen`) is not followed; from
//! then on it is.
//!
//! A library unloaded while instrumented takes its patches with it (the agent writes
//! nothing where they were, see the agent's `loaded_modules`); one loaded again where it
//! was is the same module to `/proc/PID/maps`. So when the loader removed a library,
//! everything instrumented up front and since (named by module path and file address,
//! so a library back elsewhere is found, and another at its address is not taken for it)
//! is patched again: the agent answers at once for what is still in, and instruments
//! anew what came back. The profile's stats
//! say how many libraries came and went, how many of those tendril followed, and how many
//! instrumented functions went away with theirs.

use super::*;
use crate::recording::address_taken;
use crate::symbols::maps;
use crate::terminal_text::say;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;
use tendril_wire::{LoaderCounts, PatchOutcome};

/// How often the target's modules are compared with the known ones.
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// When modules were last looked for, and what came and went.
#[derive(Debug, Default)]
pub(super) struct Watch {
    last_check: Option<Instant>,
    /// Modules that could not be followed, so that they are not tried again.
    given_up: HashSet<PathBuf>,
    /// The loader's counts when the recording (re)started, and at the last look.
    loader_at_start: LoaderCounts,
    loader: LoaderCounts,
    /// The loader's counts when the recording stopped.
    loader_at_stop: Option<LoaderCounts>,
    /// Libraries loaded since the start that tendril followed (new modules, and
    /// libraries loaded again whose functions it instrumented again).
    followed: u64,
    /// Instrumented functions whose library was unloaded while they were patched.
    unloaded_functions: u64,
    /// What is instrumented besides discovery (roots, address-taken functions), with the
    /// agent's id of the patch made last: patched again when a library was unloaded, in
    /// case it came back.
    instrumented: HashMap<Instrumented, u32>,
    /// A library was unloaded and none of what it took has been patched again yet: it
    /// may come back after a later look (a look between the unload and the load again
    /// finds nothing to patch again).
    unloaded_since: bool,
}

/// A function instrumented besides discovery, named by its module's path and its place
/// in the module's file, so that its library loaded again (where it was or elsewhere) is
/// recognised, and another library loaded at its address is not mistaken for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Instrumented {
    module_path: PathBuf,
    /// The function's address minus its module's load bias.
    file_address: u64,
    hook: Hook,
}

impl Instrumented {
    /// `function`, with `hook`, as found in `symbols`.
    fn of(symbols: &ProcessSymbols, function: &Function, hook: Hook) -> Option<Instrumented> {
        let module = symbols.module_at(function.addr)?;
        Some(Instrumented {
            module_path: module.path.clone(),
            file_address: function.addr.wrapping_sub(module.load_bias),
            hook,
        })
    }
}

impl Watch {
    /// A recording (re)started with the loader at `loader`.
    pub(super) fn started(&mut self, loader: LoaderCounts) {
        self.loader_at_start = loader;
        self.loader = loader;
        self.loader_at_stop = None;
        self.followed = 0;
        self.unloaded_functions = 0;
        self.instrumented.clear();
        self.unloaded_since = false;
    }

    /// Notes what `patched` got in (`outcomes`, in the same order), its functions
    /// found in `symbols`.
    pub(super) fn instrumented(
        &mut self,
        symbols: &ProcessSymbols,
        patched: &[(&Function, Hook)],
        outcomes: &[PatchOutcome],
    ) {
        self.note(symbols, patched, outcomes, true);
    }

    /// Notes what a new module's `patched` got in, keeping the ids already known: a
    /// library loaded again after the symbols forgot it comes back as a new module, and
    /// its functions' changed ids are what tell [`Recorder::instrument_again`] so.
    fn instrumented_new(
        &mut self,
        symbols: &ProcessSymbols,
        patched: &[(&Function, Hook)],
        outcomes: &[PatchOutcome],
    ) {
        self.note(symbols, patched, outcomes, false);
    }

    fn note(
        &mut self,
        symbols: &ProcessSymbols,
        patched: &[(&Function, Hook)],
        outcomes: &[PatchOutcome],
        replace_ids: bool,
    ) {
        for ((function, hook), outcome) in patched.iter().zip(outcomes) {
            let (Some(id), true) = (outcome.id, hook.records()) else {
                continue;
            };
            let Some(key) = Instrumented::of(symbols, function, *hook) else {
                continue;
            };
            if replace_ids {
                self.instrumented.insert(key, id);
            } else {
                self.instrumented.entry(key).or_insert(id);
            }
        }
    }

    /// The recording stopped with the loader at `loader`; `unloaded` instrumented
    /// functions had gone with their library.
    pub(super) fn stopped(&mut self, loader: LoaderCounts, unloaded: usize) {
        self.loader_at_stop = Some(loader);
        self.unloaded_functions += unloaded as u64;
    }

    /// The libraries that came and went, for the profile's stats.
    pub(super) fn fill_stats(&self, stats: &mut crate::profile::Stats) {
        let now = self.loader_at_stop.unwrap_or(self.loader);
        stats.libraries_loaded = now.loads.saturating_sub(self.loader_at_start.loads);
        stats.libraries_unloaded = now.unloads.saturating_sub(self.loader_at_start.unloads);
        stats.libraries_followed = self.followed.min(stats.libraries_loaded);
        stats.unloaded_functions = self.unloaded_functions;
    }
}

impl Recorder {
    /// Follows the modules loaded since the last look, if it is time to look.
    pub(super) fn follow_late_modules(&mut self) {
        if !self.recording || self.gross_only || self.indirect.is_none() {
            return;
        }
        let now = Instant::now();
        // A stopped target's agent cannot answer: asking would hold the caller (the
        // live view's drawing thread) for the reply timeout, then close the connection.
        if self
            .late_modules
            .last_check
            .is_some_and(|last| now.duration_since(last) < CHECK_EVERY)
            || crate::process::is_halted(self.target.pid)
        {
            return;
        }
        self.late_modules.last_check = Some(now);
        // Another tendril's detach may have ended the session: leave that for the
        // recording's owner to find (asking now would hide why it ended).
        if self.session.closed_by_agent() {
            return;
        }
        let Ok(loader) = self.session.loader_counts() else {
            return;
        };
        let before = std::mem::replace(&mut self.late_modules.loader, loader);
        if loader == before {
            return;
        }
        let new = self.new_modules();
        if !new.is_empty() {
            match self.follow(&new) {
                Ok(()) => {
                    self.late_modules.followed += new.len() as u64;
                    self.start_roots_now_loaded();
                }
                Err(message) => {
                    say!("calls into new modules are not followed: {message}");
                    self.late_modules.given_up.extend(new.iter().cloned());
                }
            }
        }
        if loader.unloads > before.unloads {
            self.late_modules.unloaded_since = true;
        }
        if self.late_modules.unloaded_since {
            let back = self.instrument_again();
            if !back.is_empty() {
                self.late_modules.unloaded_since = false;
            }
            // A library back where the symbols still had it: followed here, not as new.
            self.late_modules.followed +=
                back.iter().filter(|path| !new.contains(path)).count() as u64;
        }
    }

    /// Patches again what was instrumented besides discovery, after a library was
    /// unloaded: what went with it and came back (where it was or elsewhere) gets new
    /// patches (and ids); the rest is in already, which the agent answers at once.
    /// Returns the paths of the libraries whose functions came back.
    fn instrument_again(&mut self) -> Vec<PathBuf> {
        let biases: HashMap<&std::path::Path, u64> = self
            .symbols
            .modules()
            .iter()
            .map(|m| (m.path.as_path(), m.load_bias))
            .collect();
        let functions: Vec<(&Function, Hook)> = self
            .late_modules
            .instrumented
            .keys()
            .filter_map(|known| {
                let address = known
                    .file_address
                    .wrapping_add(*biases.get(known.module_path.as_path())?);
                let function = self.symbols.lookup(address).filter(|f| f.addr == address)?;
                Some((function, known.hook))
            })
            .collect();
        if functions.is_empty() {
            return Vec::new();
        }
        let Ok(Response::Patched { outcomes }) = self
            .session
            .request(&targets::patch_request(&self.symbols, &functions))
        else {
            return Vec::new();
        };
        let mut back: Vec<PathBuf> = Vec::new();
        let mut again = 0;
        for ((function, hook), outcome) in functions.iter().zip(&outcomes) {
            let (Some(id), Some(key)) =
                (outcome.id, Instrumented::of(&self.symbols, function, *hook))
            else {
                continue;
            };
            let before = self.late_modules.instrumented.insert(key.clone(), id);
            if before.is_some_and(|before| before != id) {
                again += 1;
                if !back.contains(&key.module_path) {
                    back.push(key.module_path);
                }
            }
        }
        if again > 0 {
            let names: Vec<String> = back
                .iter()
                .map(|path| {
                    path.file_name()
                        .unwrap_or(path.as_os_str())
                        .to_string_lossy()
                        .into_owned()
                })
                .collect();
            say!(
                "a library was loaded again ({}): {again} of its functions are instrumented again",
                names.join(", ")
            );
        }
        back
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
        // Followed from the call graph, a new module needs only to be in the agent's
        // table; through candidates, its exported functions are instrumented now.
        let found = match self.pointer_candidates {
            true => address_taken::find_late(&symbols, &names),
            false => address_taken::AddressTaken::default(),
        };
        // Functions registered so far are named from the modules they were in.
        self.refresh_names();
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
        if !self.pointer_candidates {
            say!(
                "new module {}: followed (calls into it are recorded from now on)",
                names.join(", ")
            );
            return Ok(());
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
        self.late_modules
            .instrumented_new(&self.symbols, &patched, &outcomes);
        say!(
            "new module {}: {} address-taken functions instrumented",
            names.join(", "),
            instrumented
        );
        Ok(())
    }
}
