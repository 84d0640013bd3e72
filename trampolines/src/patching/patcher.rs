//! The patch engine's bookkeeping: which functions are patched, by whom, with which
//! trampoline, and with what id.
//!
//! Patching a batch of functions first *prepares* each one (`site_plan`) — reads its
//! code, plans what its entry jump overwrites (`relocate`), refusing what cannot be
//! proven safe, and builds its trampoline within ±2 GiB (`code_memory`, `stubs`) — and
//! then writes all their jumps in one go (`patch_protocol`). An entry takes a 5-byte
//! `jmp rel32` when it can; otherwise a 2-byte `jmp rel8` to a `jmp rel32` placed in
//! dead padding nearby (`padding`). Function ids are never reused and trampolines never freed, so a
//! counter keeps its meaning and a thread still inside a trampoline after a restore
//! finishes correctly.

use crate::patching::entry_stubs;
use crate::patching::function_copies;
use crate::patching::patch_protocol::{self, Site};
use crate::patching::readiness::prepare;
use crate::patching::site_plan::{Nearby, is_internal};
use crate::patching::sites::Engine;
pub use crate::patching::sites::{PatchRequest, RuntimeHooks, SELF_TEST_OWNER};
use crate::patching::state::{STATE, engine, runtime};
use crate::sys::code_memory;
use crate::sys::error::AgentError;
use crate::sys::loaded_modules::{self, LoadedModules};
use std::collections::HashMap;

/// Installs the runtime's hooks; the first installation stays.
pub fn install_runtime(hooks: RuntimeHooks) {
    let _ = STATE.runtime.set(hooks);
}

/// Whether session `owner`'s recording hooks go in front of copies that check calls
/// through pointers (`function_copies::pointer_checked_trampoline`), from now on.
pub fn follow_pointers(owner: u64, follow: bool) {
    let mut guard = engine();
    let engine = guard.get_or_insert_with(Engine::default);
    match follow {
        true => engine.follows_pointers.insert(owner),
        false => engine.follows_pointers.remove(&owner),
    };
}

/// Whether session `owner` has patched the function at `address`.
pub fn is_patched_by(owner: u64, address: u64) -> bool {
    engine()
        .as_ref()
        .and_then(|e| e.sites.get(&address))
        .is_some_and(|site| site.owner == owner)
}

/// [`is_patched_by`], with the loader held (`modules`): a patch whose library has been
/// unloaded since is forgotten first, so a function loaded at its address is not taken
/// for it.
pub fn is_patched_by_now(owner: u64, address: u64, modules: &LoadedModules) -> bool {
    let mut guard = engine();
    let Some(engine) = guard.as_mut() else {
        return false;
    };
    engine.forget_unloaded(modules);
    engine
        .sites
        .get(&address)
        .is_some_and(|site| site.owner == owner)
}

/// Calls `visit(id, key)` for every id ever given: a function's, keyed by its address,
/// or an edge counter's, keyed by a value with bit 63 set (`function_copies`), which no
/// code address has. Every id is visited, so a registry filled from it has no gaps.
pub fn for_each_id(mut visit: impl FnMut(u32, u64)) {
    if let Some(engine) = engine().as_ref() {
        for (&key, &id) in engine
            .ids
            .iter()
            .chain(engine.retired_ids.iter().map(|(k, i)| (k, i)))
        {
            visit(id, key);
        }
    }
}

/// Reads the code at `address` as it was before tendril patched it: the live bytes with
/// the original bytes of every entry jump and pad in the range put back (a patched
/// entry decodes as a jump to its trampoline, and the bytes after it decode out of
/// step with the function's instructions).
pub fn read_original_code(address: u64, buffer: &mut [u8]) -> std::io::Result<()> {
    code_memory::read_code(address, buffer)?;
    if let Some(engine) = engine().as_ref() {
        engine.put_back_originals(address, buffer);
    }
    Ok(())
}

/// Number of functions patched now, not counting the unwinder's hooks that wait to
/// come out (see [`pending_restore`]).
pub fn patched_count() -> usize {
    engine().as_ref().map_or(0, |e| {
        e.sites.values().filter(|s| s.owner != LINGERING).count()
    })
}

/// The unwinder's hooks that a restore had to leave in, and why (see `retire`): they
/// come out by themselves once nothing holds them (`lingering`).
pub fn pending_restore() -> (usize, Option<AgentError>) {
    let guard = engine();
    let pending = guard.as_ref().map_or(0, |e| {
        e.sites.values().filter(|s| s.owner == LINGERING).count()
    });
    let obstacle = STATE
        .lingering_because
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    (pending, obstacle.filter(|_| pending > 0))
}

/// Tries once more to take out the hooks a restore had to leave in; returns how many
/// are still in.
pub fn retry_pending_restore(attempts: usize) -> usize {
    loaded_modules::with_modules_held(|modules| {
        let mut guard = engine();
        let Some(engine) = guard.as_mut() else {
            return 0;
        };
        engine.forget_unloaded(modules);
        if engine.sites.values().any(|s| s.owner == LINGERING) {
            restore_addresses(engine, &[], attempts);
        }
        engine
            .sites
            .values()
            .filter(|s| s.owner == LINGERING)
            .count()
    })
}

/// Patches a batch of functions for session `owner`, all in one stop of the process.
/// `code_ranges` are the known functions around them (themselves included), whose code
/// might branch into a patched entry. Returns, per request, the function's id or why
/// it was not patched.
///
/// The code is read and written with the dynamic loader held (`loaded_modules`), so no
/// library is unloaded between the two; patches whose library went away since the last
/// look are forgotten first (see [`Engine::forget_unloaded`]). Lock order, everywhere:
/// the loader's, then the engine's.
pub fn patch(
    owner: u64,
    requests: &[PatchRequest],
    code_ranges: &[(u64, u64)],
) -> Vec<Result<u32, AgentError>> {
    loaded_modules::with_modules_held(|modules| {
        let mut guard = engine();
        let engine = guard.get_or_insert_with(Engine::default);
        engine.forget_unloaded(modules);
        patch_batch(engine, owner, requests, code_ranges)
    })
}

/// [`patch`], with the loader and the engine held.
fn patch_batch(
    engine: &mut Engine,
    owner: u64,
    requests: &[PatchRequest],
    code_ranges: &[(u64, u64)],
) -> Vec<Result<u32, AgentError>> {
    if let Err(reason) = prepare() {
        return requests.iter().map(|_| Err(reason.clone())).collect();
    }
    let nearby = Nearby::new(code_ranges);
    let mut results: Vec<Result<u32, AgentError>> = Vec::with_capacity(requests.len());
    let mut batch: Vec<Site> = Vec::new();
    // The batch's functions (address → id), and the pads taken so far, kept as the
    // batch grows: looking them up by going over the batch made thousands of functions
    // cost quadratic time.
    let mut batch_ids: HashMap<u64, u32> = HashMap::new();
    let mut pads_taken: Vec<u64> = engine
        .sites
        .values()
        .filter_map(|site| site.pad.as_ref().map(|pad| pad.address))
        .collect();
    for request in requests {
        let result = match engine.sites.get(&request.address) {
            Some(site) if site.owner == owner => Ok(site.id),
            Some(site) if site.owner == LINGERING && is_internal(request.kind) => {
                let id = site.id;
                if let Some(site) = engine.sites.get_mut(&request.address) {
                    site.owner = owner;
                }
                Ok(id)
            }
            Some(_) => Err(AgentError::OwnedByAnotherSession),
            None => match batch_ids.get(&request.address) {
                Some(&id) => Ok(id),
                None => engine
                    .prepare_site(
                        owner,
                        request,
                        &nearby,
                        &pads_taken,
                        function_copies::pointer_checked_trampoline,
                    )
                    .map(|site| {
                        let id = site.id;
                        batch_ids.insert(request.address, id);
                        pads_taken.extend(site.pad.as_ref().map(|pad| pad.address));
                        batch.push(site);
                        id
                    }),
            },
        };
        results.push(result);
    }
    // The unwinder's hooks go in first, completely: a return hook that runs before them
    // leaves a trampoline address in a return slot that an unwinder starting in the
    // meantime cannot step through (a Rust panic aborts with "failed to initiate
    // panic, error 5"; a C++ exception terminates).
    // Counters start from zero when the hooks go in (they may hold an earlier
    // session's counts), so a count includes the calls made while they went in.
    for site in &batch {
        if let Ok(runtime) = runtime() {
            (runtime.before_patching)(site.id);
        }
    }
    let (mut internal, others): (Vec<Site>, Vec<Site>) =
        batch.into_iter().partition(|site| site.internal);
    // The entries one instruction covers go in first, without a stop: their guards are
    // up for microseconds. A stop takes longer with many threads, and a thread that
    // arrives at a guard meanwhile spins there; a hot entry is often one of these.
    let (mut one_instruction, mut several): (Vec<Site>, Vec<Site>) =
        others.into_iter().partition(|site| !site.needs_stop());
    let batch_ids: Vec<u32> = batch_ids.into_values().collect();
    let mut installed: Vec<Site> = Vec::new();
    for part in [&mut internal, &mut one_instruction, &mut several] {
        if part.is_empty() {
            continue;
        }
        if let Err(reason) = patch_protocol::install(part) {
            // Nothing after a failed part goes in either.
            let done: Vec<u32> = installed.iter().map(|s| s.id).collect();
            for result in results.iter_mut() {
                if matches!(result, Ok(id) if batch_ids.contains(id) && !done.contains(id)) {
                    *result = Err(reason.clone());
                }
            }
            break;
        }
        installed.append(part);
    }
    engine.register_installed(installed);
    results
}

impl Engine {
    /// Records installed sites, and the bytes they replaced.
    pub(super) fn register_installed(&mut self, installed: Vec<Site>) {
        for site in installed {
            self.originals.insert(
                site.patch_at,
                site.original[..site.trampoline.plan.jump_len].to_vec(),
            );
            if let Some(pad) = &site.pad {
                self.originals.insert(pad.address, pad.original.to_vec());
            }
            self.sites.insert(site.function(), site);
        }
    }
}

/// Restores the functions patched by `owner` (every function for `None`); returns how
/// many were restored.
/// Functions whose library was unloaded while they were patched would have had their
/// bytes put back (and are not counted as restored): see [`take_unloaded`].
pub fn restore(owner: Option<u64>) -> usize {
    loaded_modules::with_modules_held(|modules| {
        let mut guard = engine();
        let Some(engine) = guard.as_mut() else {
            return 0;
        };
        engine.forget_unloaded(modules);
        let chosen: Vec<u64> = engine
            .sites
            .iter()
            .filter(|(_, site)| owner.is_none_or(|o| site.owner == o))
            .map(|(&address, _)| address)
            .collect();
        restore_addresses(engine, &chosen, RETIRE_ATTEMPTS)
    })
}

/// Restores the given functions of `owner`; returns how many were restored.
pub fn restore_functions(owner: u64, addresses: &[u64]) -> usize {
    loaded_modules::with_modules_held(|modules| {
        let mut guard = engine();
        let Some(engine) = guard.as_mut() else {
            return 0;
        };
        engine.forget_unloaded(modules);
        let owned: Vec<u64> = addresses
            .iter()
            .copied()
            .filter(|address| engine.sites.get(address).is_some_and(|s| s.owner == owner))
            .collect();
        restore_addresses(engine, &owned, RETIRE_ATTEMPTS)
    })
}

/// The functions of `owner` (every owner's for `None`) whose library was unloaded while
/// they were patched, since the last call: nothing of theirs was restored, as their
/// bytes were gone with the library. Each is told once.
pub fn take_unloaded(owner: Option<u64>) -> Vec<u64> {
    let mut guard = engine();
    let Some(engine) = guard.as_mut() else {
        return Vec::new();
    };
    let mut told = Vec::new();
    engine.unloaded.retain(|&(site_owner, address)| {
        let tell = owner.is_none_or(|o| o == site_owner);
        if tell {
            told.push(address);
        }
        !tell
    });
    told
}

impl Engine {
    /// Forgets the patches whose library was unloaded (and the code there is no longer
    /// the jump tendril wrote), when the loader has removed a library since the last
    /// look: their originals must not be put back into whatever is mapped there now,
    /// nor read as that code's bytes, and a function loaded there later gets an id of
    /// its own. Called with the loader held.
    pub(super) fn forget_unloaded(&mut self, modules: &LoadedModules) {
        if modules.unloads == self.unloads_seen {
            return;
        }
        self.unloads_seen = modules.unloads;
        let gone: Vec<u64> = self
            .sites
            .iter()
            .filter(|(_, site)| !patch_protocol::still_installed(site))
            .map(|(&address, _)| address)
            .collect();
        for address in gone {
            if let Some(site) = self.sites.remove(&address) {
                self.forget_site(site);
            }
        }
        entry_stubs::forget_unloaded(self);
    }

    /// Forgets one site whose library went away (see [`Engine::forget_unloaded`]).
    fn forget_site(&mut self, site: Site) {
        let function = site.function();
        patch_protocol::forget_unloaded(&site);
        self.originals.remove(&site.patch_at);
        if let Some(pad) = &site.pad {
            self.originals.remove(&pad.address);
        }
        self.copies_behind.remove(&function);
        self.pointer_checked.remove(&function);
        self.trampolines
            .retain(|&(address, _), _| address != function);
        if let Some(id) = self.ids.remove(&function) {
            self.retired_ids.push((function, id));
        }
        self.unloaded.push((site.owner, function));
    }
}

/// Owner of the unwinder's hooks while they cannot come out yet (some thread stayed
/// inside tendril's code, see `retire`): every later restore tries again, and the next
/// session that hooks returns takes them over.
const LINGERING: u64 = u64::MAX - 1;

/// Passes a restore tries before leaving the unwinder's hooks in for the background.
const RETIRE_ATTEMPTS: usize = 40;

/// Restores `addresses` and any lingering hooks; returns how many functions got their
/// bytes back (lingering ones included).
fn restore_addresses(engine: &mut Engine, addresses: &[u64], attempts: usize) -> usize {
    let lingering: Vec<u64> = engine
        .sites
        .iter()
        .filter(|(_, site)| site.owner == LINGERING)
        .map(|(&address, _)| address)
        .collect();
    let (sites, gone): (Vec<Site>, Vec<Site>) = addresses
        .iter()
        .chain(&lingering)
        .filter_map(|address| engine.sites.remove(address))
        .partition(patch_protocol::still_installed);
    for site in gone {
        engine.forget_site(site);
    }
    for site in &sites {
        engine.originals.remove(&site.patch_at);
        if let Some(pad) = &site.pad {
            engine.originals.remove(&pad.address);
        }
    }
    // The reverse of `patch`: the unwinder's hooks come out last, once no frame holds
    // a return hook's exit any more.
    let (mut internal, others): (Vec<Site>, Vec<Site>) =
        sites.into_iter().partition(|site| site.internal);
    if !others.is_empty() {
        patch_protocol::restore(&others);
    }
    let mut restored = others.len();
    if !internal.is_empty() {
        let retired = runtime().and_then(|runtime| (runtime.retire_exits)(attempts));
        *STATE
            .lingering_because
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = retired.clone().err();
        if retired.is_ok() {
            patch_protocol::restore(&internal);
            restored += internal.len();
        } else {
            for site in &mut internal {
                site.owner = LINGERING;
            }
            engine.register_installed(internal);
        }
    }
    restored
}
