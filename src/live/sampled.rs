//! The session's Sampled view: sampling starts once a process is picked (no root given),
//! Enter on a sampled function instruments it, and the instrumented tree is compared
//! with the sampled one below the same roots.
//!
//! The one idea: sampling loads nothing into the target, so it runs from the moment
//! the target's functions are known until a root is instrumented; then it stops, and
//! its last tree stays — the picture of the program before any hook went in — for the
//! `S` key and for the overlap the live view shows (`profile::overlap`, as `compare`
//! computes it). Where perf events are refused, the root picker opens as before, with
//! the reason in one line.

use super::profiling_state::{ProfilingState, Symbols, WhenLoaded};
use super::roots::entry_of;
use super::sampler_thread::{SampledTree, Sampling, SamplingJob, SamplingUpdate};
use super::stage::Recording;
use crate::agent_bundle::is_agent_module;
use crate::profile::Profile;
use crate::profile::overlap::{
    PathWeights, agreement, is_sampled_on_the_cpu_clock, path_weights, root_names,
};
use crate::symbols::ProcessSymbols;
use std::time::{Duration, Instant};
use tendril_tui::{App, FunctionEntry};

/// How often the overlap with the sampled tree is computed again while recording (it
/// walks the whole instrumented tree).
const OVERLAP_INTERVAL: Duration = Duration::from_secs(1);

impl ProfilingState {
    /// Starts sampling the chosen process with its `symbols`; the Sampled view opens
    /// with the first tree. If no thread can be had, the root picker opens instead.
    pub(super) fn start_sampling(&mut self, symbols: &ProcessSymbols, app: &mut App) {
        let Some(pid) = self.pid else {
            return;
        };
        match SamplingJob::start(pid, symbols.clone(), self.target.clone()) {
            Ok(job) => {
                self.sampling = Sampling {
                    job: Some(job),
                    ..Sampling::default()
                };
                app.set_message(format!("{}: starting to sample…", self.target));
            }
            Err(error) => self.sampling_refused(format!("cannot sample: {error}"), app),
        }
    }

    /// Picks up the sampler's updates: the newest tree for the Sampled view, and
    /// failures (before the first tree: the root picker opens with the reason).
    pub(super) fn check_sampling(&mut self, app: &mut App) {
        let Some(job) = &self.sampling.job else {
            return;
        };
        let Some(updates) = job.take_updates() else {
            self.sampling.job = None;
            return;
        };
        for update in updates {
            match update {
                SamplingUpdate::Tree(tree) => self.show_sampled_tree(*tree, app),
                SamplingUpdate::Failed(why) if self.sampling.profile.is_none() => {
                    self.sampling.job = None;
                    self.sampling_refused(why, app);
                }
                SamplingUpdate::Failed(why) => app.set_message(why),
            }
        }
    }

    fn show_sampled_tree(&mut self, tree: SampledTree, app: &mut App) {
        let first = self.sampling.profile.is_none();
        app.update_sampled(tree.snapshot);
        self.sampling.profile = Some(tree.profile);
        self.sampling.weights = None;
        if tree.last {
            self.sampling.job = None;
        }
        if first {
            app.show_sampled();
            app.set_message(format!(
                "sampling {}: Enter instruments the selected function, r picks one by name",
                self.target
            ));
        } else if tree.target_exited && app.screen() == tendril_tui::ScreenKind::Sampled {
            app.set_message(format!("{} exited; sampling stopped", self.target));
        }
    }

    /// Sampling is not possible: the root picker, as without sampling, says why.
    fn sampling_refused(&mut self, why: String, app: &mut App) {
        match &self.entries {
            Some(entries) => {
                app.show_root_picker(entries.clone());
                app.set_message(format!("{why} — choose a root by name instead"));
            }
            None => {
                // The functions are still being listed: the picker opens, saying why,
                // when they are.
                self.when_loaded = WhenLoaded::ShowRootPicker;
                self.picker_note = Some(format!("{why} — choose a root by name instead"));
                app.set_message(why);
            }
        }
    }

    /// Stops sampling (a root is instrumented now); its last tree stays.
    pub(super) fn stop_sampling(&self) {
        if let Some(job) = &self.sampling.job {
            job.stop();
        }
    }

    /// Enter on a sampled function: instrument it as the only root. A name that no
    /// function of the target has (an address in stripped code no unwind entry covers)
    /// is refused with the reason, back in the Sampled view. `address` picks one of two
    /// functions that share a name and module.
    pub(super) fn root_from_samples(
        &mut self,
        name: &str,
        module: &str,
        address: Option<u64>,
        app: &mut App,
    ) {
        let symbols = match (&self.recording, &self.symbols) {
            (Recording::Live(recorder), _) => recorder.symbols(),
            (_, Symbols::Loaded(symbols)) => symbols,
            _ => {
                app.show_sampled();
                app.set_message("the target's functions are not loaded yet; try again");
                return;
            }
        };
        let entries = sampled_function(symbols, name, module, address);
        if entries.is_empty() {
            app.show_sampled();
            app.set_message(cannot_instrument(name, module));
            return;
        }
        self.set_roots(&entries, app);
    }

    /// The overlap of the instrumented `profile` with the sampled tree below the same
    /// roots, recomputed at most once a [`OVERLAP_INTERVAL`] unless `now_please`.
    pub(super) fn overlap_with_samples(
        &mut self,
        profile: &Profile,
        now_please: bool,
    ) -> Option<f64> {
        let sampled = self.sampling.profile.as_ref()?;
        let now = Instant::now();
        if !now_please && self.sampling.next_overlap.is_some_and(|next| now < next) {
            return self.sampling.overlap;
        }
        self.sampling.next_overlap = Some(now + OVERLAP_INTERVAL);
        let roots = root_names(profile);
        if roots.is_empty() {
            self.sampling.overlap = None;
            return None;
        }
        if self
            .sampling
            .weights
            .as_ref()
            .is_none_or(|(for_roots, _)| *for_roots != roots)
        {
            self.sampling.weights = Some((roots.clone(), path_weights(sampled, &roots)));
        }
        let sampled_weights = &self.sampling.weights.as_ref()?.1;
        // Samples count CPU time: compare with the recording's on-CPU times when it
        // has them (a thread waiting inside a root is not in the samples).
        let on_cpu = (profile.has_cpu_time() && is_sampled_on_the_cpu_clock(sampled))
            .then(|| {
                let mut on_cpu = profile.clone();
                on_cpu
                    .show_clock(crate::profile::Clock::Cpu)
                    .ok()
                    .map(|()| on_cpu)
            })
            .flatten();
        let has_time = |weights: &PathWeights| weights.values().any(|w| w.total_share > 0.0);
        // On-CPU times can all come out below resolution: a root of calls of a few ns on
        // a machine that preempts the target for most of its wall time has its hooks'
        // cost removed from less CPU time than it. The wall-clock shares are compared
        // then.
        let instrumented = on_cpu
            .map(|on_cpu| path_weights(&on_cpu, &roots))
            .filter(has_time)
            .unwrap_or_else(|| path_weights(profile, &roots));
        self.sampling.overlap = (has_time(sampled_weights) && has_time(&instrumented))
            .then(|| agreement(sampled_weights, &instrumented).overlap);
        self.sampling.overlap
    }
}

/// The target's functions a sampled frame names, as the root picker would hand them
/// over: the one at `address` when the frame has it, else every one of that name and
/// module (several only for a name two functions of one module share).
fn sampled_function(
    symbols: &ProcessSymbols,
    name: &str,
    module: &str,
    address: Option<u64>,
) -> Vec<FunctionEntry> {
    // The module first: only its names are demangled, not the whole process's.
    let named: Vec<FunctionEntry> = (symbols.functions().iter())
        .filter(|f| f.module == module && !is_agent_module(&f.module) && f.name == name)
        .map(entry_of)
        .collect();
    match address {
        Some(address) if named.iter().any(|entry| entry.address == address) => named
            .into_iter()
            .filter(|entry| entry.address == address)
            .collect(),
        _ => named,
    }
}

/// Why a sampled name cannot be instrumented.
fn cannot_instrument(name: &str, module: &str) -> String {
    if module == crate::symbols::jit::JIT_MODULE {
        format!(
            "{name} cannot be instrumented: it is code generated at run time (JIT), which \
             tendril never patches — Enter on the native function that calls it"
        )
    } else if name.starts_with(&format!("{module}+0x")) {
        format!(
            "{name} cannot be instrumented: it is an address in stripped code that no \
             symbol or unwind entry covers, so where its function starts is unknown — \
             Enter on a caller, or r to pick a root by name"
        )
    } else {
        format!(
            "{name} ({module}) is not among the target's functions (loaded since its \
             functions were read?) — r picks a root by name"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::roots::function_entries;
    use super::*;

    fn own_symbols() -> ProcessSymbols {
        ProcessSymbols::load(std::process::id() as i32).expect("symbols of the test process")
    }

    #[test]
    fn a_sampled_name_finds_its_function_and_an_uncovered_address_is_refused() {
        let symbols = own_symbols();
        let libc = symbols
            .functions()
            .iter()
            .find(|f| f.name == "malloc" && f.module.starts_with("libc"))
            .expect("malloc in libc")
            .module
            .clone();
        let entries = sampled_function(&symbols, "malloc", &libc, None);
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert_eq!(entries[0].name, "malloc");
        let uncovered = format!("{libc}+0x1");
        assert!(sampled_function(&symbols, &uncovered, &libc, None).is_empty());
        assert!(cannot_instrument(&uncovered, &libc).contains("stripped code"));
        assert!(cannot_instrument("JS:*leafy app.js:1", "[jit]").contains("never patches"));
        assert!(
            cannot_instrument("gone", "libgone.so").contains("not among the target's functions")
        );
    }

    #[test]
    fn a_sampled_address_picks_one_of_two_functions_that_share_a_name() {
        // This test binary has names that several functions of one module share
        // (generic instances under Rust's legacy mangling, say).
        let symbols = own_symbols();
        let entries = function_entries(&symbols);
        let twin = entries
            .iter()
            .find(|a| {
                (entries.iter())
                    .any(|b| b.address != a.address && b.name == a.name && b.module == a.module)
            })
            .expect("two functions of one name in one module");
        let all = sampled_function(&symbols, &twin.name, &twin.module, None);
        assert!(all.len() >= 2, "{all:?}");
        for entry in &all {
            let one = sampled_function(&symbols, &twin.name, &twin.module, Some(entry.address));
            assert_eq!(one, std::slice::from_ref(entry));
        }
    }
}
