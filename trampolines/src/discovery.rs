//! Scheme B: the first time an instrumented function runs inside the call graph, its
//! direct callees are found in its machine code and instrumented before it goes on.
//!
//! The thread that runs the function for the first time posts a request and waits; the
//! agent's discovery thread decodes the function (bounds from the controller's function
//! table), collects where it calls and tail-jumps — direct `call`/`jmp`/`jcc` targets
//! outside its body, and calls through a GOT slot, read now — follows PLT stubs to the
//! function they lead to, counts indirect call sites, and patches the callees it has
//! not patched yet, in one batch. Then it marks the function invoked and wakes the
//! waiter, whose wait is tendril's pause (an Adjust event).
//!
//! The one idea: the waiting thread may hold any lock of the target (it may be inside
//! `malloc`), so it only makes raw system calls; all the real work — decoding, memory
//! allocation, patching — happens on the agent's own thread, which holds none.

use crate::code_memory;
use crate::patcher::{self, PatchRequest};
use crate::recording;
use crate::slow_call::SavedRegisters;
use crate::stubs::HookKind;
use crate::sys;
use crate::thread_state::with_own_state;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use tendril_wire::callees;
use tendril_wire::events::{Event, EventKind};
use tendril_wire::function_table::{FLAG_EXCLUDED, FLAG_PLT, FunctionEntry, FunctionTable};
use tendril_wire::rings::header;

/// Requests that can wait at once.
const SLOTS: usize = 256;
/// A slot's states.
const FREE: u32 = 0;
const FILLING: u32 = 1;
const REQUESTED: u32 = 2;
const DONE: u32 = 3;
/// How far around a callee to look for code that might branch into its entry.
const NEIGHBOURHOOD: u64 = 4096;
/// Longest body decoded.
const MAX_BODY: u64 = 1 << 20;

static SLOT_STATE: [AtomicU32; SLOTS] = [const { AtomicU32::new(FREE) }; SLOTS];
static SLOT_FUNCTION: [AtomicU32; SLOTS] = [const { AtomicU32::new(0) }; SLOTS];
/// Bumped for every request; the discovery thread sleeps on it.
static PENDING: AtomicU32 = AtomicU32::new(0);

/// What discovery needs to know of the recording.
struct Context {
    /// The session whose patches these are (restored when it ends).
    session: u64,
    /// The controller's function table (bytes of the file).
    table: Vec<u8>,
    /// Scheme B: patch callees. Otherwise (Scheme A, gross timing) only mark invoked.
    discover_callees: bool,
    /// Functions that could not be patched, with the reason.
    refused: Vec<(u64, String)>,
}

static CONTEXT: Mutex<Option<Context>> = Mutex::new(None);
static THREAD_STARTED: AtomicU32 = AtomicU32::new(0);

/// Starts discovery for a recording of `session` (the discovery thread is started
/// once and stays).
pub fn start(session: u64, table: Vec<u8>, discover_callees: bool) -> Result<(), String> {
    FunctionTable::parse(&table).ok_or("the function table is not a tendril function table")?;
    *CONTEXT.lock().unwrap_or_else(|p| p.into_inner()) = Some(Context {
        session,
        table,
        discover_callees,
        refused: Vec::new(),
    });
    if THREAD_STARTED.swap(1, Ordering::AcqRel) == 0 {
        crate::threads::spawn_agent_thread("discovery", serve)
            .map_err(|e| format!("cannot start the discovery thread: {e}"))?;
    }
    Ok(())
}

/// Ends discovery; returns the functions that could not be patched, with the reason.
pub fn stop() -> Vec<(u64, String)> {
    CONTEXT
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .map(|context| context.refused)
        .unwrap_or_default()
}

/// Slow path of a recording stub: function `rdx` runs in the graph for the first time.
pub extern "C" fn discover(registers: &mut SavedRegisters) {
    let id = registers.rdx as u32;
    if recording::is_invoked(id) {
        return;
    }
    with_own_state(|state| {
        let started = sys::rdtsc();
        wait_for_discovery(id);
        let paused = sys::rdtsc().saturating_sub(started);
        recording::add_to_header(header::PAUSE_TICKS, paused);
        recording::add_to_header(header::DISCOVERIES, 1);
        recording::add_to_header(header::DISCOVERY_TICKS, paused);
        recording::emit(state, Event::new(EventKind::Adjust, 0, paused));
    });
}

/// Posts a request for function `id` and waits until it is served. Raw system calls
/// only: the calling thread may hold any of the target's locks.
fn wait_for_discovery(id: u32) {
    loop {
        for slot in 0..SLOTS {
            if SLOT_STATE[slot]
                .compare_exchange(FREE, FILLING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            SLOT_FUNCTION[slot].store(id, Ordering::Release);
            SLOT_STATE[slot].store(REQUESTED, Ordering::Release);
            PENDING.fetch_add(1, Ordering::AcqRel);
            sys::futex_wake_all(&PENDING);
            loop {
                let state = SLOT_STATE[slot].load(Ordering::Acquire);
                if state == DONE {
                    break;
                }
                sys::futex_wait(&SLOT_STATE[slot], state);
            }
            SLOT_STATE[slot].store(FREE, Ordering::Release);
            return;
        }
        sys::sleep_microseconds(10);
    }
}

/// The discovery thread: serves requests in batches.
fn serve() {
    let mut served: Vec<usize> = Vec::new();
    loop {
        let seen = PENDING.load(Ordering::Acquire);
        served.clear();
        served.extend(
            (0..SLOTS).filter(|&slot| SLOT_STATE[slot].load(Ordering::Acquire) == REQUESTED),
        );
        if served.is_empty() {
            sys::futex_wait(&PENDING, seen);
            continue;
        }
        let mut ids: Vec<u32> = served
            .iter()
            .map(|&slot| SLOT_FUNCTION[slot].load(Ordering::Acquire))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        discover_batch(&ids);
        for &slot in &served {
            SLOT_STATE[slot].store(DONE, Ordering::Release);
            sys::futex_wake_all(&SLOT_STATE[slot]);
        }
    }
}

/// Discovers the callees of functions `ids` and patches them in one batch, then marks
/// the functions invoked.
fn discover_batch(ids: &[u32]) {
    let mut guard = CONTEXT.lock().unwrap_or_else(|p| p.into_inner());
    let Some(context) = guard.as_mut() else {
        // No recording: let the waiters go on.
        for &id in ids {
            recording::mark_invoked(id);
        }
        return;
    };
    let pending: Vec<u32> = ids
        .iter()
        .copied()
        .filter(|&id| !recording::is_invoked(id))
        .collect();
    if context.discover_callees {
        let Some(table) = FunctionTable::parse(&context.table) else {
            return;
        };
        let mut callees: Vec<FunctionEntry> = Vec::new();
        let mut indirect_sites = 0;
        for &id in &pending {
            let Some(address) = recording::registered_address(id) else {
                continue;
            };
            let Some(function) = table.starting_at(address) else {
                continue;
            };
            let scan = scan(&function, &table);
            indirect_sites += scan.indirect_call_sites;
            callees.extend(scan.callees);
        }
        callees.sort_unstable_by_key(|f| f.start);
        callees.dedup_by_key(|f| f.start);
        callees.retain(|f| !patcher::is_patched_by(context.session, f.start));
        recording::add_to_header(header::INDIRECT_CALL_SITES, indirect_sites);
        if !callees.is_empty() {
            let refused = patch_callees(context.session, &table, &callees);
            context.refused.extend(refused);
        }
    }
    for id in pending {
        recording::mark_invoked(id);
    }
}

/// Patches `callees`; returns the ones refused, with the reason.
fn patch_callees(
    session: u64,
    table: &FunctionTable,
    callees: &[FunctionEntry],
) -> Vec<(u64, String)> {
    let requests: Vec<PatchRequest> = callees
        .iter()
        .map(|callee| PatchRequest {
            address: callee.start,
            size: callee.size,
            kind: HookKind::Record { root: false },
        })
        .collect();
    let code_ranges = neighbourhood(table, callees);
    let results = patcher::patch(session, &requests, &code_ranges);
    let mut instrumented = 0;
    let mut refused = Vec::new();
    for (callee, result) in callees.iter().zip(results) {
        match result {
            Ok(_) => instrumented += 1,
            Err(reason) => {
                recording::add_to_header(header::REFUSED_CALLEES, 1);
                refused.push((callee.start, reason));
            }
        }
    }
    recording::add_to_header(header::INSTRUMENTED, instrumented);
    refused
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
    indirect_call_sites: u64,
}

/// Decodes `function` and finds its direct callees (see the module comment).
fn scan(function: &FunctionEntry, table: &FunctionTable) -> Scan {
    let mut code = vec![0u8; function.size.min(MAX_BODY) as usize];
    if code.is_empty() || code_memory::read_code(function.start, &mut code).is_err() {
        return Scan::default();
    }
    let found = callees::scan(&code, function.start);
    let targets = found
        .direct
        .into_iter()
        .chain(found.through_pointers.into_iter().filter_map(read_pointer));
    Scan {
        callees: targets.filter_map(|t| resolve(t, table)).collect(),
        indirect_call_sites: found.indirect_call_sites,
    }
}

/// The function a branch to `target` enters: a function of the table that starts
/// there, with PLT stubs followed to where they lead. `None` for the loader, the vDSO,
/// the agent itself, or an address that starts no known function.
fn resolve(target: u64, table: &FunctionTable) -> Option<FunctionEntry> {
    let entry = table.starting_at(target)?;
    let entry = if entry.flags & FLAG_PLT != 0 {
        let bound = plt_destination(&entry).and_then(|d| table.starting_at(d));
        match bound.filter(|b| b.flags & FLAG_PLT == 0) {
            Some(bound) => bound,
            None if entry.target != 0 => table.starting_at(entry.target)?,
            None => return None,
        }
    } else {
        entry
    };
    let excluded = entry.flags & (FLAG_EXCLUDED | FLAG_PLT) != 0 || entry.size == 0;
    (!excluded && !crate::is_agent_code(entry.start)).then_some(entry)
}

/// Where a PLT stub jumps now: the pointer in its GOT slot.
fn plt_destination(stub: &FunctionEntry) -> Option<u64> {
    let mut code = vec![0u8; stub.size.clamp(1, 32) as usize];
    code_memory::read_code(stub.start, &mut code).ok()?;
    callees::plt_slot(&code, stub.start).and_then(read_pointer)
}

fn read_pointer(address: u64) -> Option<u64> {
    let mut word = [0u8; 8];
    code_memory::read_code(address, &mut word).ok()?;
    Some(u64::from_le_bytes(word))
}
