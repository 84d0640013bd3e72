//! Pointing a function's entry at a whole copy of it with edge counters (`tendril
//! edges`, issue 18).
//!
//! The copy is built by `code::function_copy` behind a count hook (which counts the
//! calls and gives a thread its state before the first counter needs it), in one
//! trampoline of its own, and its entry jump goes in with the same protocol and
//! bookkeeping as every other patch: a restore (`Unpatch`, a detach) puts the entry's
//! bytes back, and a thread still inside the copy finishes there, as copies are never
//! freed. The copy's unwind information (`code::copy_unwind`) is registered with the
//! process's unwinder before the entry goes in, so exceptions, thread cancellation and
//! backtraces pass through the copy's frames as through the original's.

use super::patch_protocol::{self, Site, Trampoline};
use super::patcher::{
    Nearby, PatchRequest, engine, own_code, pop_lead_pushes, prepare, replaced_bytes, runtime,
    unreadable,
};
use super::sites::Engine;
use crate::code::branch_index::BranchIndex;
use crate::code::control_flow::{BlockExit, ControlFlowGraph, Successor};
use crate::code::copy_unwind::{self, OriginalUnwind};
use crate::code::entry_plan::{EntryPlan, PatchStyle, SHORT_PATCH_LEN};
use crate::code::function_copy::{self, CounterSite, FunctionCopy};
use crate::code::padding::KnownRanges;
use crate::hooks::edge_counters::{EdgeCounters, Gate};
use crate::hooks::path_register::{MAX_PATH_NUMBER, PathRegister};
use crate::hooks::stubs::{self, TrampolineCode};
use crate::sys::error::AgentError;
use crate::sys::{code_memory, frame_registry};
use tendril_wire::Hook;
use tendril_wire::edges::{EdgeBlock, EdgeExit, EdgeLayout, PathLayout, TableEntry};
use tendril_wire::events::HookShape;
use tendril_wire::paths::{EdgeAction, PathNumbering};

/// Room for the hook in front of the copy (a recording hook's is the largest), and for
/// an entry adapter after it.
const HOOK_ROOM: u64 = stubs::TRAMPOLINE_BYTES;
/// Most counters one function may have.
const MAX_COUNTERS: usize = 1 << 15;
/// The counter index (see [`counter_ids`]) of the calls counter of a copy behind a
/// recording hook: past every other index a copy can have.
const CALLS_INDEX: usize = 0xffff;
/// Most paths of one function counted one by one; the others share one counter.
const MAX_ITEMIZED_PATHS: u64 = 4096;

/// Copies the function at `address` (`size` bytes) with counters, and the path
/// register if `count_paths`, for session `owner`, and points its entry at the copy.
/// `code_ranges` as for `patcher::patch`.
pub fn install(
    owner: u64,
    address: u64,
    size: u64,
    code_ranges: &[(u64, u64)],
    count_paths: bool,
) -> Result<EdgeLayout, AgentError> {
    let mut guard = engine();
    let engine = guard.get_or_insert_with(Engine::default);
    prepare()?;
    if let Some(reason) = own_code(owner, address, size) {
        return Err(AgentError::Refused(reason.into()));
    }
    if engine.sites.contains_key(&address) {
        return Err(AgentError::Refused(
            "it is instrumented already (by another tendril command); stop that one first".into(),
        ));
    }
    let plan_code = Counted::read(engine, address, size, count_paths, None)?;
    let request = PatchRequest {
        address,
        size,
        kind: Hook::Count,
    };
    let nearby = Nearby {
        branches: BranchIndex::new(code_ranges),
        known: KnownRanges::new(code_ranges),
    };
    let pads_taken: Vec<u64> = engine
        .sites
        .values()
        .filter_map(|site| site.pad.as_ref().map(|pad| pad.address))
        .collect();
    // No call thunk: the copy runs the whole function, from its first instruction.
    let (plan, pad_address) =
        engine.choose_plan(&request, &plan_code.code, &nearby, &pads_taken, false)?;
    debug_assert_ne!(plan.style, PatchStyle::CallThunk);
    let calls_id = engine.id_for(address)?;
    let built = plan_code.build(
        engine,
        address,
        calls_id,
        Hook::Count,
        &plan,
        pad_address.is_some(),
    )?;
    let patch_at = address + plan.patch_offset as u64;
    let (original, pad) = replaced_bytes(&plan_code.code, &plan, pad_address)?;
    let site = Site {
        patch_at,
        original,
        pad,
        trampoline: built.trampoline(&plan_code.code, plan),
        owner,
        id: calls_id,
        kind: Hook::Count,
        internal: false,
        recorded: [None, None],
    };
    let layout = plan_code.layout(calls_id);
    let runtime = runtime()?;
    for id in layout.counters() {
        (runtime.before_patching)(id);
    }
    let mut batch = [site];
    patch_protocol::install(&mut batch)?;
    let [site] = batch;
    engine.register_installed(vec![site]);
    Ok(layout)
}

/// Puts a copy of the function at `address`, with counters for the calls made inside
/// the recording's call graph (and the path register if `count_paths`), behind the
/// recording hook session `owner` has on it: the hook runs as before, then the copy
/// instead of the original. The live view's annotated code (issue 18) reads these
/// counters while the recording goes on; a restore of the function takes out hook and
/// copy together. Answers the layout and the function's original bytes.
pub fn install_behind_hook(
    owner: u64,
    address: u64,
    size: u64,
    count_paths: bool,
) -> Result<(EdgeLayout, Vec<u8>), AgentError> {
    let mut guard = engine();
    let engine = guard.get_or_insert_with(Engine::default);
    prepare()?;
    let Some(site) = engine.sites.get(&address) else {
        return Err(AgentError::Refused(
            "it is not instrumented by this recording (any more)".into(),
        ));
    };
    if site.owner != owner || !site.kind.records() {
        return Err(AgentError::Refused(
            "it is not instrumented by this recording; only a recorded function's code \
             can be shown"
                .into(),
        ));
    }
    let (kind, id, plan, has_pad) = (
        site.kind,
        site.id,
        site.trampoline.plan.clone(),
        site.pad.is_some(),
    );
    // The calls counter's key is past every counter index a copy can have.
    let calls_counter = counter_ids(engine, address, CALLS_INDEX..CALLS_INDEX + 1)?[0];
    let plan_code = Counted::read(engine, address, size, count_paths, Some(calls_counter))?;
    let built = plan_code.build(engine, address, id, kind, &plan, has_pad)?;
    let trampoline = built.trampoline(&plan_code.code, plan);
    let layout = plan_code.layout(calls_counter);
    let runtime = runtime()?;
    for id in layout.counters() {
        (runtime.before_patching)(id);
    }
    let site = engine
        .sites
        .get_mut(&address)
        .expect("the site was found above, under the same lock");
    patch_protocol::retarget(site, trampoline.hook)?;
    site.trampoline = trampoline;
    Ok((layout, plan_code.code))
}

/// A function's code, read and analysed for a copy with counters: its graph, unwind
/// rows, counter sites and ids, and path numbering (or why its paths are not counted).
struct Counted {
    code: Vec<u8>,
    graph: ControlFlowGraph,
    unwind: Option<OriginalUnwind>,
    sites: Vec<CounterSite>,
    ids: Vec<u32>,
    actions: Vec<EdgeAction>,
    paths: Result<PathLayout, String>,
    /// Behind a recording hook: the calls counter, and only the call graph's calls count.
    calls_counter: Option<u32>,
}

/// A copy written to memory, inside its trampoline.
struct BuiltCopy {
    /// The original function's address.
    function: u64,
    hook: u64,
    body: u64,
    copy: FunctionCopy,
}

impl Counted {
    fn read(
        engine: &mut Engine,
        address: u64,
        size: u64,
        count_paths: bool,
        calls_counter: Option<u32>,
    ) -> Result<Counted, AgentError> {
        if size == 0 {
            return Err(AgentError::Refused(
                "its size is unknown (no symbol size and no unwind information)".into(),
            ));
        }
        let mut code = vec![0u8; size.min(function_copy_limit()) as usize];
        code_memory::read_code(address, &mut code).map_err(unreadable)?;
        engine.put_back_originals(address, &mut code);
        let read = |at: u64, buffer: &mut [u8]| code_memory::read_code(at, buffer).is_ok();
        let graph = ControlFlowGraph::build(address, &code, &read)
            .map_err(|refusal| AgentError::Refused(refusal.to_string()))?;
        let unwind = original_unwind(address)?;
        let sites = function_copy::counter_sites(&graph);
        if sites.len() > MAX_COUNTERS {
            return Err(AgentError::Refused(format!(
                "it needs {} counters, more than the {MAX_COUNTERS} tendril gives one function",
                sites.len()
            )));
        }
        let ids = counter_ids(engine, address, 0..sites.len())?;
        let numbering = match &unwind {
            _ if !count_paths => Err("not asked for (--no-paths)".to_string()),
            Some(frames) if PathRegister::frames_suffice(frames) => path_numbering(&graph),
            _ => Err(
                "it has no unwind information saying where each call's frame is, which \
                  tendril needs to keep each call's path apart"
                    .to_string(),
            ),
        };
        let actions: Vec<EdgeAction> = match &numbering {
            Ok(numbering) => numbering.edges.iter().map(|edge| edge.action).collect(),
            Err(_) => Vec::new(),
        };
        let paths = match &numbering {
            Ok(numbering) => path_counters(engine, address, sites.len(), numbering.paths),
            Err(why) => Err(why.clone()),
        };
        Ok(Counted {
            code,
            graph,
            unwind,
            sites,
            ids,
            actions,
            paths,
            calls_counter,
        })
    }

    /// Builds the copy behind a `kind` hook for function `id`, for an entry patched as
    /// `plan` (with a pad if `has_pad`), writes it near `address` and registers its
    /// unwind rows.
    fn build(
        &self,
        engine: &mut Engine,
        address: u64,
        id: u32,
        kind: Hook,
        plan: &EntryPlan,
        has_pad: bool,
    ) -> Result<BuiltCopy, AgentError> {
        let shape = if has_pad || plan.jump_len == SHORT_PATCH_LEN {
            HookShape::PadJump
        } else {
            HookShape::Jump
        };
        let gate = match self.calls_counter {
            Some(_) => Gate::InCallGraph,
            None => Gate::EveryCall,
        };
        let mut counters = EdgeCounters {
            ids: &self.ids,
            paths: self
                .paths
                .as_ref()
                .ok()
                .zip(self.unwind.as_ref())
                .map(|(paths, frames)| PathRegister {
                    actions: &self.actions,
                    first_id: paths.first_counter,
                    itemized: paths.itemized,
                    beyond_id: paths.beyond_counter,
                    lost_id: paths.lost_counter,
                    frames,
                    gate,
                }),
            gate,
            calls_id: self.calls_counter,
        };
        // A first copy, anywhere in reach, says how much room the real one needs.
        let trial = function_copy::build(&self.graph, &self.code, address, &mut counters)
            .map_err(|refusal| AgentError::Refused(refusal.to_string()))?;
        let room = HOOK_ROOM + trial.bytes.len() as u64 + 64;
        let memory = engine.arena.allocate_near(address, room)?;
        let mut copy: Option<FunctionCopy> = None;
        let TrampolineCode {
            mut bytes,
            mut hook,
            body,
            ..
        } = stubs::build_in(memory, room, id, kind, None, shape, |body| {
            let built = function_copy::build(&self.graph, &self.code, body, &mut counters)
                .map_err(|refusal| AgentError::Refused(refusal.to_string()))?;
            let bytes = built.bytes.clone();
            copy = Some(built);
            Ok(bytes)
        })?;
        let copy = copy.expect("the body was built");
        debug_assert_eq!(copy.address, body, "the copy is the trampoline's body");
        if plan.lead_pushes > 0 {
            let adapter = memory + bytes.len() as u64;
            bytes.extend_from_slice(&pop_lead_pushes(plan.lead_pushes, adapter, hook));
            if bytes.len() as u64 > room {
                return Err(AgentError::NoRoomForEntryAdapter);
            }
            hook = adapter;
        }
        code_memory::write_code(memory, &bytes)
            .map_err(|e| AgentError::io("cannot write a function's copy", e))?;
        // The copy's frames unwind like the original's before any thread can enter it.
        if let Some(unwind) = &self.unwind {
            let section = copy_unwind::eh_frame_for_copy(
                unwind,
                copy.address,
                copy.code_len,
                &copy.instructions,
            )
            .map_err(|refusal| AgentError::Refused(refusal.to_string()))?;
            frame_registry::register_eh_frame(section);
        }
        Ok(BuiltCopy {
            function: address,
            hook,
            body,
            copy,
        })
    }

    /// What the controller needs to read and explain the counters, the calls counted by
    /// `calls_counter`.
    fn layout(&self, calls_counter: u32) -> EdgeLayout {
        layout(
            &self.graph,
            calls_counter,
            &self.sites,
            &self.ids,
            self.paths.clone(),
        )
    }
}

impl BuiltCopy {
    /// The trampoline record of the copy, for an entry patched as `plan`. Threads found
    /// strictly inside the bytes the entry jump overwrites go on in the copy, past its
    /// entry code: their calls have no path entry, so the path code counts their paths
    /// as lost (a thread at the entry itself takes the jump).
    fn trampoline(&self, code: &[u8], plan: EntryPlan) -> Trampoline {
        let instruction_map = plan
            .instruction_offsets
            .iter()
            .filter_map(|&offset| {
                let copied = self.copy.copy_of(self.function + offset as u64)?;
                Some((offset, (copied - self.copy.address) as usize))
            })
            .collect();
        Trampoline {
            body: self.body,
            hook: self.hook,
            entry_bytes: code[..plan.patch_offset + plan.overwritten_len].to_vec(),
            plan,
            instruction_map,
        }
    }
}

/// Ids for the counters of `paths` paths, after the `first` edge counters: the path
/// code indexes them from the first, so the itemized ones must be consecutive.
fn path_counters(
    engine: &mut Engine,
    address: u64,
    first: usize,
    paths: u64,
) -> Result<PathLayout, String> {
    let itemized = paths.min(MAX_ITEMIZED_PATHS) as usize;
    let ids = counter_ids(engine, address, first..first + itemized + 2)
        .map_err(|error| format!("no counters are left for them ({error})"))?;
    if ids[..itemized]
        .windows(2)
        .any(|pair| pair[1] != pair[0] + 1)
    {
        return Err(
            "their counters would not be consecutive (other code was counted at \
                    this address before); edges only"
                .into(),
        );
    }
    Ok(PathLayout {
        paths,
        first_counter: ids[0],
        itemized: itemized as u32,
        beyond_counter: ids[itemized],
        lost_counter: ids[itemized + 1],
    })
}

/// The function's Ball–Larus numbering, or why its paths are not counted.
fn path_numbering(graph: &ControlFlowGraph) -> Result<PathNumbering, String> {
    let numbering = PathNumbering::new(&graph.edge_lists()).map_err(|too| too.to_string())?;
    if numbering.paths > MAX_PATH_NUMBER {
        return Err(format!(
            "{} acyclic paths, more than the {MAX_PATH_NUMBER} tendril numbers",
            numbering.paths
        ));
    }
    Ok(numbering)
}

/// The unwind rows of the function at `address`, if the unwinder has an FDE for it
/// (code without one cannot be unwound through in the original either, so its copy
/// needs none). Refuses what a copy cannot carry (exception tables, expressions).
fn original_unwind(address: u64) -> Result<Option<OriginalUnwind>, AgentError> {
    let Some(found) = frame_registry::find_fde(address) else {
        return Ok(None);
    };
    if found.function != address {
        return Err(AgentError::Refused(format!(
            "its unwind information starts at {:#x}, not at its entry",
            found.function
        )));
    }
    let (start, section) = found.section();
    OriginalUnwind::parse(section, start, found.fde)
        .map(Some)
        .map_err(|refusal| AgentError::Refused(refusal.to_string()))
}

/// The longest function copied.
fn function_copy_limit() -> u64 {
    crate::code::control_flow::MAX_FUNCTION_BYTES as u64
}

/// Ids for the counters `indices` of the function at `address`: the same ids every
/// time the function is copied (ids are never reused). Their keys in the id table are
/// not addresses: bit 63 set, the counter's index in bits 47..63.
fn counter_ids(
    engine: &mut Engine,
    address: u64,
    indices: std::ops::Range<usize>,
) -> Result<Vec<u32>, AgentError> {
    indices
        .map(|index| {
            let key = 1 << 63 | (index as u64) << 47 | address;
            engine.id_under(key).map(|(id, _)| id)
        })
        .collect()
}

/// What the controller needs to read and explain the counters.
fn layout(
    graph: &ControlFlowGraph,
    calls_id: u32,
    sites: &[CounterSite],
    ids: &[u32],
    paths: Result<PathLayout, String>,
) -> EdgeLayout {
    let id_of = |site: CounterSite| {
        ids[sites
            .iter()
            .position(|&s| s == site)
            .expect("every counter site has an id")]
    };
    let address_of = |successor: &Successor| match successor {
        Successor::Block(index) => graph.blocks[*index].start,
        Successor::Leaves(address) => *address,
    };
    let blocks = graph
        .blocks
        .iter()
        .enumerate()
        .map(|(index, block)| EdgeBlock {
            start: block.start,
            end: block.end,
            counter: id_of(CounterSite::Block(index)),
            exit: match &block.exit {
                BlockExit::FallThrough(next) => EdgeExit::FallThrough {
                    to: address_of(next),
                },
                BlockExit::Jump(to) => EdgeExit::Jump { to: address_of(to) },
                BlockExit::Conditional {
                    branch,
                    taken,
                    not_taken,
                } => EdgeExit::Conditional {
                    branch: *branch,
                    taken: address_of(taken),
                    not_taken: address_of(not_taken),
                    taken_counter: id_of(CounterSite::Taken(index)),
                },
                BlockExit::Table { jump, targets, .. } => EdgeExit::Table {
                    jump: *jump,
                    entries: targets
                        .iter()
                        .enumerate()
                        .map(|(entry, &target)| TableEntry {
                            target: graph.blocks[target].start,
                            counter: id_of(CounterSite::TableEntry {
                                block: index,
                                entry,
                            }),
                        })
                        .collect(),
                },
                BlockExit::ThroughPointer { jump } => EdgeExit::ThroughPointer { jump: *jump },
                BlockExit::Return => EdgeExit::Return,
                BlockExit::Stops => EdgeExit::Stops,
            },
        })
        .collect();
    EdgeLayout {
        address: graph.start,
        calls_counter: calls_id,
        blocks,
        paths,
    }
}
