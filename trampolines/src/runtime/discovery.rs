//! Scheme B: the first time an instrumented function runs inside the call graph, its
//! direct callees are found in its machine code and instrumented before it goes on.
//!
//! The thread that runs the function for the first time has it done at once: by the
//! agent's discoverer thread when the controller has raised that above the target's
//! threads (`discoverer`: on a busy machine the target's own thread waits for a core
//! while every other thread calling the function waits for it), otherwise by itself
//! (a context switch would only add to the wait). The work: it decodes the function
//! (bounds from the controller's function table), collects where it calls and
//! tail-jumps — direct `call`/`jmp`/`jcc` targets
//! outside its body, and calls through a GOT slot, read now — follows PLT stubs to the
//! function they lead to, notes its indirect call sites, and patches the callees not
//! patched yet, in one batch. Then it marks the function invoked; the time it took is
//! tendril's pause (an Adjust event).
//!
//! Calls through pointers: the controller instruments every address-taken function up
//! front (`FLAG_ADDRESS_TAKEN` in the table), with the recording hook that steps aside
//! outside the graph. So a target reached through a pointer inside the graph arrives
//! here like any other function on its first call, and is discovered as usual. Its
//! return address says where it was called from: when that is an indirect call site
//! discovery has met, the site counts as followed.
//!
//! The one idea: the thread may be anywhere — inside `malloc`, in a signal handler, on a
//! small stack — so the work runs on a stack of the agent's own, with the thread's
//! signals blocked (a handler cannot re-enter it), using only the agent's allocator and
//! locks only agent code takes.

use crate::hooks::pointer_checks;
use crate::hooks::slow_call::SavedRegisters;
use crate::patching::patcher::{self, PatchRequest};
use crate::runtime::discoverer;
use crate::runtime::discovery_turn::{self, DiscoveryTurn, Turn, turn_to_discover};
use crate::runtime::recording;
use crate::runtime::state::{DiscoveryContext, STATE};
use crate::runtime::table_lookup::{FreshTable, read_pointer, resolve};
use crate::runtime::thread_state::StatePtr;
use crate::runtime::thread_state::with_own_state;
use crate::sys;
use crate::sys::code_memory;
use crate::sys::error::AgentError;
use crate::sys::loaded_modules::{self, LoadedCode};
use std::collections::HashSet;
use tendril_callgraph::callees;
use tendril_wire::Hook;
use tendril_wire::events::{Event, EventKind};
use tendril_wire::function_table::{FLAG_ADDRESS_TAKEN, FunctionEntry, FunctionTable};
use tendril_wire::rings::header;

/// How far around a callee to look for code that might branch into its entry.
const NEIGHBOURHOOD: u64 = 4096;
/// Longest body decoded.
const MAX_BODY: u64 = 1 << 20;

/// Starts discovery for a recording of `session`.
pub fn start(
    session: u64,
    table: Vec<u8>,
    discover_callees: bool,
    follow_pointers: bool,
) -> Result<(), AgentError> {
    FunctionTable::parse(&table).ok_or_else(|| {
        AgentError::Request("the function table is not a tendril function table".into())
    })?;
    let (table_code, table_unloads) = loaded_now();
    let mut discovery = STATE.discovery.lock().unwrap_or_else(|p| p.into_inner());
    *discovery = Some(DiscoveryContext {
        session,
        table,
        discover_callees,
        refused: Vec::new(),
        indirect_sites: HashSet::new(),
        followed_sites: HashSet::new(),
        follow_pointers,
        pointer_targets: HashSet::new(),
        unknown_targets: Vec::new(),
        table_code,
        table_unloads,
    });
    // Under the discovery's lock, as every write of the table of pointer targets.
    pointer_checks::forget_all();
    drop(discovery);
    patcher::follow_pointers(session, follow_pointers && discover_callees);
    Ok(())
}

/// Replaces the recording's function table (modules loaded since it started joined
/// it); returns the number of functions it holds.
pub fn update_table(session: u64, table: Vec<u8>) -> Result<u64, String> {
    let functions = FunctionTable::parse(&table)
        .ok_or("the function table is not a tendril function table")?
        .len() as u64;
    // Read before the discovery's lock is taken (the loader's comes first).
    let (table_code, table_unloads) = loaded_now();
    let mut guard = STATE.discovery.lock().unwrap_or_else(|p| p.into_inner());
    match guard.as_mut() {
        Some(context) if context.session == session => {
            context.table = table;
            (context.table_code, context.table_unloads) = (table_code, table_unloads);
            // A library loaded where another was may hold other functions at the
            // targets the checks passed: each is met again.
            pointer_checks::forget_all();
            Ok(functions)
        }
        _ => Err("this session is not recording".into()),
    }
}

/// The libraries' code now, and the loader's count of unloaded libraries, read
/// together with the loader held.
fn loaded_now() -> (Vec<LoadedCode>, u64) {
    loaded_modules::with_modules_held(|modules| (loaded_modules::loaded_code(), modules.unloads))
}

/// Ends discovery; returns the functions that could not be patched, with the reason.
pub fn stop() -> Vec<(u64, String)> {
    // (A root refused its hook is still listed.)
    lock_discovered_ahead().clear();
    let context = STATE
        .discovery
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    if let Some(context) = &context {
        patcher::follow_pointers(context.session, false);
    }
    context.map(|context| context.refused).unwrap_or_default()
}

/// Where a recording hook's slow path finds the function's return address: above the
/// registers the hook pushed (for a call thunk, this is the thunk's own return).
const RETURN_ADDRESS_OFFSET: u64 = crate::hooks::stubs::RECORD_HOOK_PUSHES * 8;

/// Slow path of a recording stub: function `rdx` runs in the graph for the first time.
pub extern "C" fn discover(registers: &mut SavedRegisters) {
    let id = registers.rdx as u32;
    // The function's return address, on the thread's stack above the hook's pushes.
    // Read in place: nothing here may call a function (libc's `pread` is hooked too,
    // and the hooks only step aside once `with_own_state` says so).
    let slot = (registers.caller_stack_pointer() + RETURN_ADDRESS_OFFSET) as *const u64;
    // SAFETY: the hook pushed RECORD_HOOK_PUSHES registers below the return address slot
    // of the call being entered, on this thread's stack, and has not popped them: the
    // word is mapped, aligned and this thread's own.
    let entered_from = Some(unsafe { std::ptr::read_volatile(slot) });
    if recording::is_invoked(id) {
        return;
    }
    with_own_state(|state| {
        let started = sys::rdtsc();
        let turn = turn_to_discover(id);
        if turn == Turn::NothingToDiscover {
            return;
        }
        if turn == Turn::Waited {
            let paused = sys::rdtsc().saturating_sub(started);
            recording::add_to_header(header::PAUSE_TICKS, paused);
            recording::add_to_header(header::DISCOVERY_WAITS, 1);
            recording::add_to_header(header::DISCOVERY_WAIT_TICKS, paused);
            recording::emit(state, Event::new(EventKind::Adjust, 0, paused));
            return;
        }
        let _turn = DiscoveryTurn(id);
        if discoverer::hand_over(discoverer::Job { id, entered_from }) {
            let paused = sys::rdtsc().saturating_sub(started);
            recording::add_to_header(header::PAUSE_TICKS, paused);
            recording::add_to_header(header::DISCOVERIES, 1);
            recording::add_to_header(header::DISCOVERY_TICKS, paused);
            recording::sample_discovery(paused);
            recording::emit(state, Event::new(EventKind::Adjust, 0, paused));
            return;
        }
        let mut request = DiscoveryRequest {
            id,
            entered_from,
            discovered_here: false,
        };
        let argument = &mut request as *mut DiscoveryRequest as *mut libc::c_void;
        // SAFETY: `argument` points at `request`, alive and untouched until this returns;
        // `run_discovery` catches panics.
        if !unsafe { on_agent_stack(state, argument, run_discovery) } {
            // No memory for a stack: go on without instrumenting the callees now.
            return;
        }
        let paused = sys::rdtsc().saturating_sub(started);
        recording::add_to_header(header::PAUSE_TICKS, paused);
        if request.discovered_here {
            recording::add_to_header(header::DISCOVERIES, 1);
            recording::add_to_header(header::DISCOVERY_TICKS, paused);
            recording::sample_discovery(paused);
        } else {
            // Another thread discovered the function while this one waited.
            recording::add_to_header(header::DISCOVERY_WAITS, 1);
            recording::add_to_header(header::DISCOVERY_WAIT_TICKS, paused);
        }
        recording::emit(state, Event::new(EventKind::Adjust, 0, paused));
    });
}

/// Bytes of the stack discovery runs on (decoding and assembling want more than a
/// small thread stack may have left).
const DISCOVERY_STACK_BYTES: usize = 1 << 20;

/// The top of the thread's discovery stack, mapped on first use.
fn agent_stack(state: StatePtr) -> Option<u64> {
    let top = state.discovery_stack();
    if top.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        // SAFETY: an anonymous private mapping with no address hint has no
        // preconditions; the result is checked against MAP_FAILED.
        let mapped = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                DISCOVERY_STACK_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if mapped == libc::MAP_FAILED {
            return None;
        }
        let stack = mapped as u64 + DISCOVERY_STACK_BYTES as u64;
        top.store(stack, std::sync::atomic::Ordering::Relaxed);
    }
    Some(top.load(std::sync::atomic::Ordering::Relaxed))
}

/// What `discover` asks of the code on the discovery stack, and what it did.
struct DiscoveryRequest {
    id: u32,
    /// The function's return address, if it could be read.
    entered_from: Option<u64>,
    /// This thread discovered the function (rather than waiting while another did).
    discovered_here: bool,
}

/// Makes a discovery handed over by a target's thread, on the discoverer's thread (its
/// hooks step aside, and its own stack is large enough).
pub fn discover_for_another(job: discoverer::Job) {
    // Nothing may unwind out of the discoverer's loop: a panic ends this discovery, and
    // the waiting thread makes it itself.
    let _ = std::panic::catch_unwind(|| discover_batch(&[job.id], job.entered_from));
}

/// Runs on the discovery stack: `argument` points at a [`DiscoveryRequest`].
extern "C" fn run_discovery(argument: *mut libc::c_void) {
    // SAFETY: `discover` passes a pointer to its live DiscoveryRequest and does not
    // touch it until this returns.
    let request = unsafe { &mut *(argument as *mut DiscoveryRequest) };
    // Nothing may unwind off this stack: a panic here ends discovery for this call.
    let (id, entered_from) = (request.id, request.entered_from);
    if let Ok(discovered) = std::panic::catch_unwind(|| discover_batch(&[id], entered_from)) {
        request.discovered_here = discovered;
    }
}

core::arch::global_asm!(
    ".pushsection .text",
    ".globl tendril_call_on_stack",
    ".hidden tendril_call_on_stack",
    ".type tendril_call_on_stack, @function",
    // rdi: argument, rsi: function, rdx: top of the new stack (16-byte aligned).
    // The CFI keeps a backtrace from the agent's stack going into the thread's own:
    // the CFA is rbp-based while rsp lies on the other stack.
    "tendril_call_on_stack:",
    ".cfi_startproc",
    "push rbp",
    ".cfi_def_cfa_offset 16",
    ".cfi_offset rbp, -16",
    "mov rbp, rsp",
    ".cfi_def_cfa_register rbp",
    "mov rsp, rdx",
    "call rsi",
    "mov rsp, rbp",
    ".cfi_def_cfa_register rsp",
    "pop rbp",
    ".cfi_def_cfa_offset 8",
    ".cfi_restore rbp",
    "ret",
    ".cfi_endproc",
    ".size tendril_call_on_stack, . - tendril_call_on_stack",
    ".popsection",
);

/// Runs `function(argument)` on the thread's agent stack (`agent_stack`), with its
/// signals blocked; false, with nothing run, when no stack could be had.
///
/// # Safety
/// `function` must not unwind, and must only use `argument` as its caller allows.
pub(super) unsafe fn on_agent_stack(
    state: StatePtr,
    argument: *mut libc::c_void,
    function: extern "C" fn(*mut libc::c_void),
) -> bool {
    let Some(stack_top) = agent_stack(state) else {
        return false;
    };
    let mask = sys::block_signals();
    // SAFETY: `stack_top` is the top of a mapping of DISCOVERY_STACK_BYTES owned by this
    // thread (16-byte aligned); the caller vouches for `function` and `argument`.
    unsafe { tendril_call_on_stack(argument, function, stack_top) };
    sys::restore_signals(mask);
    true
}

unsafe extern "C" {
    fn tendril_call_on_stack(
        argument: *mut libc::c_void,
        function: extern "C" fn(*mut libc::c_void),
        stack_top: u64,
    );
}

/// Discovers the callees of functions `ids` and patches them in one batch, then marks
/// the functions invoked. Returns whether any of them was still to be discovered.
/// `entered_from`: the return address of the call that entered them, if known.
///
/// The decoding and the patching happen with the loader held, so that the table's
/// functions are checked against the libraries loaded for as long as they are used
/// ([`FreshTable`]). Lock order: the loader's, the discovery's, the engine's (a thread
/// inside `dl_iterate_phdr` may run a function discovered here).
fn discover_batch(ids: &[u32], entered_from: Option<u64>) -> bool {
    loaded_modules::with_modules_held(|modules| {
        let mut guard = STATE.discovery.lock().unwrap_or_else(|p| p.into_inner());
        discover_held(guard.as_mut(), ids, entered_from, modules.unloads)
    })
}

/// [`discover_batch`], with the discovery's state and the loader held.
fn discover_held(
    context: Option<&mut DiscoveryContext>,
    ids: &[u32],
    entered_from: Option<u64>,
    unloads: u64,
) -> bool {
    let Some(context) = context else {
        // No recording: let the waiters go on.
        for &id in ids {
            recording::mark_invoked(id);
        }
        return false;
    };
    let pending: Vec<u32> = ids
        .iter()
        .copied()
        .filter(|&id| !recording::is_invoked(id))
        .collect();
    let addresses: Vec<u64> = pending
        .iter()
        .filter_map(|&id| recording::registered_address(id))
        .collect();
    instrument_callees(context, &addresses, Some(entered_from), unloads);
    let discovered = !pending.is_empty();
    for id in pending {
        recording::mark_invoked(id);
    }
    discovered
}

/// Instruments the callees of the roots at `roots` before the roots are patched, on the
/// agent's own thread: the discovery their first calls would make, made before any
/// thread can wait for it. Every thread of a busy server enters a root at once when
/// it goes live; had the first of them discovered it (a stop of every thread when a
/// callee's patch needs one), the rest would have queued on the loader's lock behind
/// it, and been let through one at a time: hundreds of milliseconds each, with a
/// thousand threads. Each root is marked invoked as its hook goes in
/// ([`mark_if_discovered_ahead`]), so its first calls go straight on.
pub fn discover_ahead(roots: &[u64]) {
    loaded_modules::with_modules_held(|modules| {
        let mut guard = STATE.discovery.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(context) = guard.as_mut() {
            instrument_callees(context, roots, None, modules.unloads);
            lock_discovered_ahead().extend_from_slice(roots);
        }
    });
}

/// Marks function `id` invoked if its callees were instrumented ahead
/// ([`discover_ahead`]). Called by the patcher just before the function's hook goes in
/// (with its own lock held: the list's lock is taken after every other).
pub fn mark_if_discovered_ahead(id: u32) {
    let Some(address) = recording::registered_address(id) else {
        return;
    };
    let mut ahead = lock_discovered_ahead();
    if let Some(index) = ahead.iter().position(|&root| root == address) {
        ahead.swap_remove(index);
        recording::mark_invoked(id);
    }
}

fn lock_discovered_ahead() -> std::sync::MutexGuard<'static, Vec<u64>> {
    STATE
        .discovered_ahead
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Finds the callees of the functions at `functions` and patches those not patched
/// yet, in one batch. `entered`: for functions being entered (not discovered ahead),
/// the return address of the call that entered them, if known. Discovered ahead, the
/// roots themselves are left out of their callees (a recursive root calls itself):
/// they go in next, with their own hook.
fn instrument_callees(
    context: &mut DiscoveryContext,
    functions: &[u64],
    entered: Option<Option<u64>>,
    unloads: u64,
) {
    // (`start` checked that the table parses.)
    if !context.discover_callees {
        return;
    }
    let Some(table) = FunctionTable::parse(&context.table) else {
        return;
    };
    let fresh = FreshTable::new(&context.table_code, context.table_unloads, unloads);
    let mut callees: Vec<FunctionEntry> = Vec::new();
    let mut indirect_sites = 0;
    for &address in functions {
        let Some(function) = table.starting_at(address).filter(|_| fresh.holds(address)) else {
            continue;
        };
        if function.flags & FLAG_ADDRESS_TAKEN != 0
            && let Some(entered_from) = entered
        {
            recording::add_to_header(header::INDIRECT_TARGETS, 1);
            let site = entered_from.and_then(indirect_call_before);
            if let Some(site) = site.filter(|s| context.indirect_sites.contains(s))
                && context.followed_sites.insert(site)
            {
                recording::add_to_header(header::INDIRECT_SITES_FOLLOWED, 1);
            }
        }
        let scan = scan(&function, &table);
        for site in scan.indirect_sites {
            indirect_sites += context.indirect_sites.insert(site) as u64;
        }
        callees.extend(scan.callees);
    }
    callees.sort_unstable_by_key(|f| f.start);
    callees.dedup_by_key(|f| f.start);
    if entered.is_none() {
        callees.retain(|f| !functions.contains(&f.start));
    }
    // A callee in a library unloaded since the table came is not the table's.
    callees.retain(|f| fresh.holds(f.start));
    // A callee refused once is refused again: do not plan it for every caller.
    callees.retain(|f| {
        !patcher::is_patched_by(context.session, f.start)
            && !context
                .refused
                .iter()
                .any(|&(address, _)| address == f.start)
    });
    recording::add_to_header(header::INDIRECT_CALL_SITES, indirect_sites);
    if !callees.is_empty() {
        let patched = patch_callees(context.session, &table, &callees);
        recording::add_to_header(header::REFUSED_CALLEES, patched.refused.len() as u64);
        context.refused.extend(patched.refused);
        note_leaves(&table, &callees, &patched.ids);
    }
}

/// Notes the callees just patched (`ids`: address and id) that call nothing — no
/// direct callee, no call through a pointer — as having nothing to discover
/// (`discovery_turn`): their first calls go straight on. One decode each, which their
/// discovery would have made on their first call. A function whose address is taken is
/// left to its discovery, which notes the pointer call that reached it.
fn note_leaves(table: &FunctionTable, callees: &[FunctionEntry], ids: &[(u64, u32)]) {
    for callee in callees.iter().filter(|c| c.flags & FLAG_ADDRESS_TAKEN == 0) {
        let Some(&(_, id)) = ids.iter().find(|&&(address, _)| address == callee.start) else {
            continue;
        };
        let found = scan(callee, table);
        if found.callees.is_empty() && found.indirect_sites.is_empty() {
            discovery_turn::note_nothing_to_discover(id);
        }
    }
}

/// What [`patch_callees`] did: the callees refused, with the reason, and the id of each
/// one instrumented, by address.
pub(super) struct PatchedCallees {
    pub refused: Vec<(u64, String)>,
    pub ids: Vec<(u64, u32)>,
}

/// Patches `callees`, counting those instrumented; returns the ones refused, with the
/// reason (the caller counts them once it gives them up), and the others' ids.
pub(super) fn patch_callees(
    session: u64,
    table: &FunctionTable,
    callees: &[FunctionEntry],
) -> PatchedCallees {
    let requests: Vec<PatchRequest> = callees
        .iter()
        .map(|callee| PatchRequest {
            address: callee.start,
            size: callee.size,
            kind: Hook::Record,
        })
        .collect();
    let code_ranges = neighbourhood(table, callees);
    let results = patcher::patch(session, &requests, &code_ranges);
    let mut refused = Vec::new();
    let mut ids = Vec::new();
    for (callee, result) in callees.iter().zip(results) {
        match result {
            Ok(id) => ids.push((callee.start, id)),
            Err(reason) => refused.push((callee.start, reason.to_string())),
        }
    }
    recording::add_to_header(header::INSTRUMENTED, ids.len() as u64);
    PatchedCallees { refused, ids }
}

/// The known functions within [`NEIGHBOURHOOD`] of the callees, themselves included.
fn neighbourhood(table: &FunctionTable, callees: &[FunctionEntry]) -> Vec<(u64, u64)> {
    let mut ranges = Vec::new();
    for callee in callees {
        let low = callee.start.saturating_sub(NEIGHBOURHOOD);
        let high = callee.start + callee.size + NEIGHBOURHOOD;
        let mut index = table_index_at_or_after(table, low);
        while index < table.len() {
            let entry = table.get(index);
            if entry.start >= high {
                break;
            }
            if entry.size > 0 {
                ranges.push((entry.start, entry.size));
            }
            index += 1;
        }
    }
    ranges.sort_unstable();
    ranges.dedup();
    ranges
}

fn table_index_at_or_after(table: &FunctionTable, address: u64) -> usize {
    let (mut low, mut high) = (0, table.len());
    while low < high {
        let middle = (low + high) / 2;
        if table.get(middle).start < address {
            low = middle + 1;
        } else {
            high = middle;
        }
    }
    low
}

/// What decoding one function found.
#[derive(Debug, Default)]
struct Scan {
    callees: Vec<FunctionEntry>,
    indirect_sites: Vec<u64>,
}

/// Decodes `function` and finds its direct callees (see the module comment).
fn scan(function: &FunctionEntry, table: &FunctionTable) -> Scan {
    let mut code = vec![0u8; function.size.min(MAX_BODY) as usize];
    if code.is_empty() || patcher::read_original_code(function.start, &mut code).is_err() {
        return Scan::default();
    }
    let found = callees::scan(&code, function.start);
    let targets = found
        .direct
        .into_iter()
        .chain(found.through_pointers.into_iter().filter_map(read_pointer));
    Scan {
        callees: targets.filter_map(|t| resolve(t, table)).collect(),
        indirect_sites: found.indirect_sites,
    }
}

/// The indirect call site that returns to `return_address`, if the instruction before
/// it is one.
fn indirect_call_before(return_address: u64) -> Option<u64> {
    let mut code = [0u8; 9];
    let start = return_address.checked_sub(code.len() as u64)?;
    code_memory::read_code(start, &mut code).ok()?;
    callees::indirect_call_ending_at(&code, return_address)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks::unwind_probe;

    extern "C" fn do_nothing(_argument: *mut libc::c_void) {}

    /// A backtrace taken on the agent's stack, during discovery, reaches the thread's
    /// own frames: the routine that switches stacks tells the unwinder how.
    #[test]
    fn a_backtrace_at_every_step_of_a_call_on_another_stack_reaches_its_caller() {
        let mut stack = vec![0u64; 8 * 1024];
        let top = (stack.as_mut_ptr_range().end as u64) & !15;
        let routine = tendril_call_on_stack as *const () as u64;
        let function = do_nothing as *const () as u64;
        let steps = unwind_probe::step_through(routine, [0, function, top, 0]);
        unwind_probe::assert_every_walk_reaches_the_caller(
            "tendril_call_on_stack",
            routine,
            &steps,
        );
    }
}
