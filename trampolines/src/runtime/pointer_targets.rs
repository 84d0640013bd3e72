//! Calls through pointers followed from the call graph itself (issue 33): the runtime's
//! answer to a pointer check (`hooks::pointer_checks`) that met a target not in the
//! table of targets followed.
//!
//! The one idea: a function reached through a pointer is a callee like any other, only
//! found by running instead of by decoding. So the target is resolved in the
//! controller's function table (a PLT stub followed to where it leads) and, when the
//! recording has not instrumented it yet, patched with the recording hook in a batch of
//! one, as Scheme B patches the direct callees a discovery finds. All of that happens
//! before the call goes on, so even the first call through the pointer is recorded,
//! under its real caller (the frame open on the thread). Then the target goes in the
//! table the checks probe (`pointer_checks::follow_to`): the next call to it, from any
//! site and thread, costs the check's probe only. The work runs as discovery's does:
//! on the agent's stack, with the thread's signals blocked and its hooks stepping
//! aside, and its time is tendril's pause (an `Adjust` event).
//!
//! A target that is not a function the table knows (code generated at run time, the
//! loader's, a function refused by name) goes in the table too, and is not followed;
//! one outside every function of the table is kept with its site
//! ([`unknown_targets`]), for the controller to show as JIT code where a perf map or
//! jitdump names it.

use crate::hooks::pointer_checks;
use crate::hooks::slow_call::SavedRegisters;
use crate::patching::{entry_stubs, patcher};
use crate::runtime::discovery;
use crate::runtime::recording;
use crate::runtime::state::{DiscoveryContext, STATE};
use crate::runtime::table_lookup::{FreshTable, resolve};
use crate::runtime::thread_state::with_own_state;
use crate::sys;
use crate::sys::loaded_modules::{self, LoadedModules};
use tendril_wire::events::{Event, EventKind};
use tendril_wire::function_table::FunctionTable;
use tendril_wire::rings::header;

/// Most calls to unknown targets kept (site and target: 64 KiB).
const MOST_UNKNOWN_TARGETS: usize = 4096;

/// The calls through pointers to code the function table does not know, met so far in
/// the recording of `session`: (site, target), each once.
pub fn unknown_targets(session: u64) -> Vec<(u64, u64)> {
    let guard = STATE.discovery.lock().unwrap_or_else(|p| p.into_inner());
    guard
        .as_ref()
        .filter(|context| context.session == session)
        .map(|context| context.unknown_targets.clone())
        .unwrap_or_default()
}

/// Slow path of a pointer check: target `rax` at the site `rdx`.
pub extern "C" fn target_met(registers: &mut SavedRegisters) {
    let (target, site) = (registers.rax, registers.rdx);
    // The answer, in rax: where the call goes (the target itself when not followed).
    // Followed already, but past the two slots the check probes: answered at once.
    if let Some(destination) = pointer_checks::destination_of(target) {
        registers.rax = destination;
        return;
    }
    with_own_state(|state| {
        let started = sys::rdtsc();
        let mut met = Met { target, site };
        let argument = &mut met as *mut Met as *mut libc::c_void;
        // SAFETY: `argument` points at `met`, alive until this returns;
        // `follow_on_stack` does not unwind (it catches panics).
        unsafe { discovery::on_agent_stack(state, argument, follow_on_stack) };
        let paused = sys::rdtsc().saturating_sub(started);
        recording::add_to_header(header::PAUSE_TICKS, paused);
        recording::emit(state, Event::new(EventKind::Adjust, 0, paused));
    });
    registers.rax = pointer_checks::destination_of(target).unwrap_or(target);
}

/// What the check met.
struct Met {
    target: u64,
    site: u64,
}

/// Runs on the discovery stack: `argument` points at a [`Met`].
extern "C" fn follow_on_stack(argument: *mut libc::c_void) {
    // SAFETY: `target_met` passes a pointer to its live `Met` and does not touch it
    // until this returns.
    let met = unsafe { &*(argument as *const Met) };
    let _ = std::panic::catch_unwind(|| follow(met.target, met.site));
}

/// Instruments the function at `target` if the recording has not yet (see the module
/// comment), then puts it in the checks' table: from then on, followed or not, the
/// check lets a call to it go on (also on a thread still inside a copy after the
/// recording stopped, which must not come here at every call). In the table only once
/// patched: a thread whose check found it there calls it with its hook in, or the hook
/// in front of it when its entry could not be patched.
fn follow(target: u64, site: u64) {
    // Lock order: the loader's, the discovery's, the engine's (as discovery's).
    loaded_modules::with_modules_held(|modules| {
        let mut guard = STATE.discovery.lock().unwrap_or_else(|p| p.into_inner());
        let destination = match guard.as_mut() {
            Some(context) => instrument(context, target, site, modules),
            None => target,
        };
        pointer_checks::follow_to(target, destination);
    });
}

/// [`follow`]'s instrumenting, with the loader and the discovery's state held; answers
/// where the target's calls go.
fn instrument(
    context: &mut DiscoveryContext,
    target: u64,
    site: u64,
    modules: &LoadedModules,
) -> u64 {
    // A thread still inside a copy when the recording stopped patches nothing: the
    // restore that follows the stop (it waits for the loader, held here) would miss
    // what it patched after it.
    if !context.follow_pointers || !recording::is_active() {
        return target;
    }
    if context.followed_sites.insert(site) {
        recording::add_to_header(header::INDIRECT_SITES_FOLLOWED, 1);
    }
    let Some(table) = FunctionTable::parse(&context.table) else {
        return target;
    };
    let fresh = FreshTable::new(&context.table_code, context.table_unloads, modules.unloads);
    let Some(callee) = resolve(target, &table).filter(|f| fresh.holds(f.start)) else {
        let unknown = table.starting_at(target).is_none();
        if unknown && context.unknown_targets.len() < MOST_UNKNOWN_TARGETS {
            context.unknown_targets.push((site, target));
        }
        return target;
    };
    if context.pointer_targets.insert(callee.start) {
        recording::add_to_header(header::INDIRECT_TARGETS, 1);
    }
    // Its calls go to the hook in front of it, when it has one (the target itself is
    // the callee's start, or a PLT stub that leads there: the stub is skipped), timed
    // or not as adaptive timing last set it.
    if let Some(hook) = entry_stubs::hook_now(callee.start, modules) {
        return hook;
    }
    let refused_before = context.refused.iter().any(|&(at, _)| at == callee.start);
    if refused_before || patcher::is_patched_by_now(context.session, callee.start, modules) {
        return target;
    }
    let refused = discovery::patch_callees(context.session, &table, &[callee]).refused;
    if refused.is_empty() {
        return target;
    }
    // Its entry refused (the patcher's reason stays the one said when no hook can go
    // in front either: tendril's own code, another session's function).
    match entry_stubs::hook_in_front(context.session, callee.start, callee.size) {
        Ok(hook) => {
            recording::add_to_header(header::INSTRUMENTED, 1);
            hook
        }
        Err(_) => {
            recording::add_to_header(header::REFUSED_CALLEES, refused.len() as u64);
            context.refused.extend(refused);
            target
        }
    }
}
