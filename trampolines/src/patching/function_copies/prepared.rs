//! A function's copy with counters, prepared: its code read and analysed (graph,
//! unwind rows, exception tables, counter ids, path numbering), then built behind a
//! hook in a trampoline of its own and written, its unwind information and exception
//! tables registered. `function_copies` puts it where threads run it.

use crate::code::control_flow::{BlockExit, ControlFlowGraph, FunctionBytes, MAX_PARTS, Successor};
use crate::code::copy_unwind::{self, OriginalUnwind};
use crate::code::entry_plan::{EntryPlan, SHORT_PATCH_LEN};
use crate::code::function_copy::{self, CounterSite, FunctionCopy};
use crate::code::lsda::Lsda;
use crate::hooks::edge_counters::{EdgeCounters, Gate, PointerSites};
use crate::hooks::path_register::{MAX_PATH_NUMBER, PathRegister};
use crate::hooks::stubs::{self, TrampolineCode};
use crate::patching::patch_protocol::Trampoline;
use crate::patching::site_plan::{pop_lead_pushes, unreadable};
use crate::patching::sites::Engine;
use crate::patching::state::runtime;
use crate::sys::error::AgentError;
use crate::sys::{code_memory, frame_registrar, frame_registry};
use tendril_callgraph::paths::{EdgeAction, PathNumbering};
use tendril_wire::Hook;
use tendril_wire::edges::{EdgeBlock, EdgeExit, EdgeLayout, PathLayout, TableEntry};
use tendril_wire::events::HookShape;

/// Room for the hook in front of the copy (a recording hook's is the largest), and for
/// an entry adapter after it.
const HOOK_ROOM: u64 = stubs::TRAMPOLINE_BYTES;
/// Most counters one function may have.
const MAX_COUNTERS: usize = 1 << 15;
/// Most paths of one function counted one by one; the others share one counter.
const MAX_ITEMIZED_PATHS: u64 = 4096;

/// A function's code, read and analysed for a copy with counters: its graph, unwind
/// rows, counter sites and ids, and path numbering (or why its paths are not counted).
pub(super) struct Counted {
    /// The main part's bytes, from the entry.
    pub(super) code: Vec<u8>,
    /// The `.cold` parts copied with it: (start, bytes).
    cold: Vec<(u64, Vec<u8>)>,
    graph: ControlFlowGraph,
    unwind: Option<OriginalUnwind>,
    sites: Vec<CounterSite>,
    ids: Vec<u32>,
    actions: Vec<EdgeAction>,
    paths: Result<PathLayout, String>,
    /// Behind a recording hook: the calls counter, and only the call graph's calls count.
    calls_counter: Option<u32>,
    /// The calls and tail jumps through pointers checked (original addresses, sorted).
    pointer_sites: Vec<u64>,
    /// Its exception tables, which the copy gets a version of.
    lsda: Option<Lsda>,
    /// Each landing pad's block and the number a path starting there begins with.
    pad_starts: Vec<(usize, u64)>,
}

/// What a copy carries.
#[derive(Debug, Clone, Copy)]
pub(super) struct CopyOptions {
    /// A counter per block and edge (`tendril edges`, the live view's code).
    pub(super) counters: bool,
    pub(super) count_paths: bool,
    /// Behind a recording hook: the calls counter.
    pub(super) calls_counter: Option<u32>,
    /// Checks before the calls through pointers (a recording that follows them).
    pub(super) pointer_checks: bool,
}

/// A copy written to memory, inside its trampoline.
pub(super) struct BuiltCopy {
    /// The original function's address.
    function: u64,
    hook: u64,
    body: u64,
    copy: FunctionCopy,
}

impl Counted {
    /// The bytes of every part copied.
    fn bytes(&self) -> FunctionBytes<'_> {
        let mut bytes = FunctionBytes::new(self.graph.start, &self.code);
        for (start, part) in &self.cold {
            bytes = bytes.with_part(*start, part);
        }
        bytes
    }

    /// Reads and analyses the function at `address` (`size` bytes) and the `.cold`
    /// parts `cold_parts` ((start, size), from the controller's symbols) that it jumps
    /// to: they are copied with it, so that a jump there and back stays in the copy.
    pub(super) fn read(
        engine: &mut Engine,
        address: u64,
        size: u64,
        cold_parts: &[(u64, u64)],
        options: CopyOptions,
    ) -> Result<Counted, AgentError> {
        let CopyOptions {
            counters,
            count_paths,
            calls_counter,
            pointer_checks,
        } = options;
        if size == 0 {
            return Err(AgentError::Refused(
                "its size is unknown (no symbol size and no unwind information)".into(),
            ));
        }
        let mut code = vec![0u8; size.min(function_copy_limit()) as usize];
        code_memory::read_code(address, &mut code).map_err(unreadable)?;
        engine.put_back_originals(address, &mut code);
        let read = |at: u64, buffer: &mut [u8]| code_memory::read_code(at, buffer).is_ok();
        let mut unwind = original_unwind(address)?;
        // Each part's rows and exception tables; a cold part that cannot be read, or
        // whose unwind information does not go with the main part's, stays out (a jump
        // there leaves the copy, as before).
        let mut tables = Vec::new();
        if let Some(exceptions) = unwind.as_ref().and_then(|u| u.exceptions) {
            tables.push(read_table(exceptions.lsda, address)?);
        }
        let main_end = address + code.len() as u64;
        let cold = read_cold_parts(
            engine,
            (address, main_end),
            cold_parts,
            &mut unwind,
            &mut tables,
        );
        let lsda = match tables.is_empty() {
            true => None,
            false => Some(Lsda::join(tables).map_err(|e| AgentError::Refused(e.to_string()))?),
        };
        let mut bytes = FunctionBytes::new(address, &code);
        for (start, part) in &cold {
            bytes = bytes.with_part(*start, part);
        }
        // Landing pads inside the function are reached by the unwinder only.
        let ranges: Vec<(u64, u64)> = (bytes.parts().iter())
            .map(|&(start, part)| (start, start + part.len() as u64))
            .collect();
        let pads = lsda
            .as_ref()
            .map_or_else(Vec::new, |lsda| lsda.landing_pads_in(&ranges));
        let graph = ControlFlowGraph::build_with_entries(&bytes, &read, &pads)
            .map_err(|refusal| AgentError::Refused(refusal.to_string()))?;
        let sites = function_copy::counter_sites(&graph);
        if counters && sites.len() > MAX_COUNTERS {
            return Err(AgentError::Refused(format!(
                "it needs {} counters, more than the {MAX_COUNTERS} tendril gives one function",
                sites.len()
            )));
        }
        let ids = match counters {
            true => counter_ids(engine, address, 0..sites.len())?,
            false => Vec::new(),
        };
        let pointer_sites = match pointer_checks {
            true => function_copy::pointer_sites(&graph, &bytes),
            false => Vec::new(),
        };
        // The pads' blocks, in the pads' (address) order, as the controller finds them.
        let pad_blocks: Vec<usize> = (pads.iter())
            .filter_map(|&pad| graph.blocks.iter().position(|block| block.start == pad))
            .collect();
        let numbering = match &unwind {
            _ if !(counters && count_paths) => Err("not asked for (--no-paths)".to_string()),
            Some(frames) if PathRegister::frames_suffice(frames) => {
                path_numbering(&graph, &pad_blocks)
            }
            _ => Err(
                "it has no unwind information saying where each call's frame is, which \
                  tendril needs to keep each call's path apart"
                    .to_string(),
            ),
        };
        let (actions, pad_starts) = match &numbering {
            Ok(numbering) => (
                numbering.edges.iter().map(|edge| edge.action).collect(),
                numbering.landing_pads.clone(),
            ),
            Err(_) => (Vec::new(), Vec::new()),
        };
        let paths = match &numbering {
            Ok(numbering) => path_counters(engine, address, sites.len(), numbering.paths),
            Err(why) => Err(why.clone()),
        };
        Ok(Counted {
            pad_starts,
            lsda,
            cold,
            code,
            graph,
            unwind,
            sites,
            ids,
            actions,
            paths,
            calls_counter,
            pointer_sites,
        })
    }

    /// Whether the function calls or tail-jumps through a pointer anywhere the copy
    /// checks.
    pub(super) fn has_pointer_sites(&self) -> bool {
        !self.pointer_sites.is_empty()
    }

    /// Builds the copy behind a `kind` hook for function `id`, for an entry patched as
    /// `plan` (with a pad if `has_pad`), writes it near `address` and registers its
    /// unwind rows.
    pub(super) fn build(
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
                    landing_pads: &self.pad_starts,
                }),
            gate,
            calls_id: self.calls_counter,
            pointers: match self.pointer_sites.is_empty() {
                true => None,
                false => Some(PointerSites {
                    sites: &self.pointer_sites,
                    slow: stubs::pointer_slow_path()?,
                }),
            },
        };
        // A first copy, anywhere in reach, says how much room the real one needs.
        let trial = function_copy::build(&self.graph, &self.bytes(), address, &mut counters)
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
            let built = function_copy::build(&self.graph, &self.bytes(), body, &mut counters)
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
        // Its body is the target's code, not a hook's, for whoever asks where a thread is.
        code_memory::note_function_copy(body, body + copy.bytes.len() as u64);
        // The copy's frames unwind like the original's before any thread can enter it.
        if let Some(unwind) = &self.unwind {
            // The copy's exception tables: its own call sites and landing pads.
            let lsda = self.lsda.as_ref().map(|lsda| {
                // A landing pad in one of the copied parts is a block of the copy.
                let moved = |pad: u64| match self.graph.blocks.iter().position(|b| b.start == pad) {
                    Some(block) => copy.block_starts[block],
                    None => pad,
                };
                let pieces = |start: u64, end: u64| copy.pieces_of(start, end);
                let bytes = lsda.for_copy(copy.address, &pieces, &moved);
                // Like the copy, never freed: a thread may unwind through it any time.
                Box::leak(bytes.into_boxed_slice()).as_ptr() as u64
            });
            let section = copy_unwind::eh_frame_for_copy(
                unwind,
                copy.address,
                copy.code_len,
                &copy.instructions,
                lsda,
            )
            .map_err(|refusal| AgentError::Refused(refusal.to_string()))?;
            frame_registrar::register(section)
                .map_err(|refusal| AgentError::Refused(refusal.to_string()))?;
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
    pub(super) fn layout(&self, calls_counter: u32) -> EdgeLayout {
        let ranges: Vec<(u64, u64)> = (self.bytes().parts().iter())
            .map(|&(start, part)| (start, start + part.len() as u64))
            .collect();
        let landing_pads =
            (self.lsda.as_ref()).map_or_else(Vec::new, |lsda| lsda.landing_pads_in(&ranges));
        layout(
            &self.graph,
            calls_counter,
            &self.sites,
            &self.ids,
            self.paths.clone(),
            landing_pads,
        )
    }
}

impl BuiltCopy {
    /// The trampoline record of the copy, for an entry patched as `plan`. Threads found
    /// strictly inside the bytes the entry jump overwrites go on in the copy, past its
    /// entry code: their calls have no path entry, so the path code counts their paths
    /// as lost (a thread at the entry itself takes the jump).
    pub(super) fn trampoline(&self, code: &[u8], plan: EntryPlan) -> Trampoline {
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
/// The `.cold` parts `cold_parts` ((start, size)) of the function at `main` (start,
/// end) that can be copied with it, read with the original bytes under any patch; each
/// one's unwind rows joined to `unwind` and its exception table added to `tables`. A
/// part that cannot be read, or whose unwind information or exception table does not
/// go with the main part's, stays out (a jump there leaves the copy, as before).
fn read_cold_parts(
    engine: &mut Engine,
    (address, main_end): (u64, u64),
    cold_parts: &[(u64, u64)],
    unwind: &mut Option<OriginalUnwind>,
    tables: &mut Vec<Lsda>,
) -> Vec<(u64, Vec<u8>)> {
    let mut cold = Vec::new();
    for &(start, size) in cold_parts {
        let overlaps = start < main_end && address < start.saturating_add(size);
        if cold.len() + 1 >= MAX_PARTS || size == 0 || size > function_copy_limit() || overlaps {
            continue;
        }
        let mut bytes = vec![0u8; size as usize];
        if code_memory::read_code(start, &mut bytes).is_err() {
            continue;
        }
        engine.put_back_originals(start, &mut bytes);
        let part_unwind = match (&unwind, original_unwind(start)) {
            (Some(main), Ok(Some(part))) if main.joins(&part) => Some(part),
            (None, _) => None,
            _ => continue,
        };
        if let Some(part) = part_unwind {
            // A part whose table cannot be read, or does not agree with the
            // others', stays out too.
            if let Some(exceptions) = part.exceptions {
                let Ok(table) = read_table(exceptions.lsda, start) else {
                    continue;
                };
                let mut with_it = tables.clone();
                with_it.push(table.clone());
                if Lsda::join(with_it).is_err() {
                    continue;
                }
                tables.push(table);
            }
            if let Some(main) = unwind.as_mut() {
                main.join(part);
            }
        }
        cold.push((start, bytes));
    }
    cold
}

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

/// The function's Ball–Larus numbering (a path starting at each of the landing pads
/// `pads` too), or why its paths are not counted.
fn path_numbering(graph: &ControlFlowGraph, pads: &[usize]) -> Result<PathNumbering, String> {
    let numbering = PathNumbering::with_landing_pads(&graph.edge_lists(), pads)
        .map_err(|too| too.to_string())?;
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

/// The exception table at `lsda` of the part of a function starting at `part`.
fn read_table(lsda: u64, part: u64) -> Result<Lsda, AgentError> {
    Lsda::parse(&read_lsda(lsda)?, lsda, part).map_err(|e| AgentError::Refused(e.to_string()))
}

/// The bytes of the LSDA at `address`: up to 64 KiB, as far as it is mapped (an LSDA
/// is a few hundred bytes; its parse stops where it ends).
fn read_lsda(address: u64) -> Result<Vec<u8>, AgentError> {
    const PAGE: u64 = 4096;
    const MOST: u64 = 64 << 10;
    let mut bytes = Vec::new();
    let mut at = address;
    while at - address < MOST {
        let chunk = (PAGE - at % PAGE).min(MOST - (at - address));
        let mut buffer = vec![0u8; chunk as usize];
        if code_memory::read_code(at, &mut buffer).is_err() {
            break;
        }
        bytes.extend_from_slice(&buffer);
        at += chunk;
    }
    if bytes.is_empty() {
        return Err(AgentError::Refused(format!(
            "its exception table at {address:#x} cannot be read"
        )));
    }
    Ok(bytes)
}

/// The longest function copied.
fn function_copy_limit() -> u64 {
    crate::code::control_flow::MAX_FUNCTION_BYTES as u64
}

/// Ids for the counters `indices` of the function at `address`: the same ids every
/// time the function is copied (ids are never reused). Their keys in the id table are
/// not addresses: bit 63 set, the counter's index in bits 47..63.
pub(super) fn counter_ids(
    engine: &mut Engine,
    address: u64,
    indices: std::ops::Range<usize>,
) -> Result<Vec<u32>, AgentError> {
    indices
        .map(|index| {
            let key = 1 << 63 | (index as u64) << 47 | address;
            let (id, new) = engine.id_under(key)?;
            if new {
                // In the registry too, where the controller reads ids in order: the
                // key, which no code address can be.
                (runtime()?.function_registered)(id, key);
            }
            Ok(id)
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
    landing_pads: Vec<u64>,
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
        landing_pads,
    }
}
