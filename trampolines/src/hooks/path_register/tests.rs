//! Copies with the path register, run for real on this thread with a thread state of
//! its own: every call's path is counted exactly, recursion keeps each call's register
//! apart, and calls nested deeper than the path stack are counted as lost.

use super::*;
use crate::code::control_flow::{ControlFlowGraph, FunctionBytes, Successor};
use crate::code::copy_unwind::{OriginalUnwind, Row};
use crate::code::executable_memory::Mapped;
use crate::code::function_copy::{self, counter_sites};
use crate::hooks::edge_counters::EdgeCounters;
use crate::hooks::thread_layout::{
    REGION_BYTES, STATE_GRAPH_DEPTH, STATE_PATH_STACK, ThreadState, set_current_slot,
};
use iced_x86::code_asm::*;
use iced_x86::{Decoder, DecoderOptions};
use std::collections::BTreeMap;
use tendril_callgraph::paths::PathNumbering;

/// A thread state for this test's thread, installed in its slot while it lives.
struct OwnState {
    region: Vec<u64>,
}

impl OwnState {
    fn install() -> OwnState {
        let mut region = vec![0u64; REGION_BYTES / 8];
        set_current_slot(region.as_mut_ptr().cast::<ThreadState>());
        OwnState { region }
    }

    fn counter(&self, id: u32) -> u64 {
        let index = thread_state::calls_displacement(id) as usize / 8;
        // SAFETY: the copy's increments are done; a volatile read sees them.
        unsafe { std::ptr::read_volatile(&self.region[index]) }
    }
}

impl Drop for OwnState {
    fn drop(&mut self) {
        set_current_slot(std::ptr::null_mut());
    }
}

/// A function assembled into memory of its own, whose entry jumps to its copy with
/// edge counters and the path register, as a patched function does.
struct Profiled {
    _original: Mapped,
    _copy: Mapped,
    entry: extern "C" fn(u64) -> u64,
    graph: ControlFlowGraph,
    numbering: PathNumbering,
    itemized: u32,
    first_id: u32,
    beyond_id: u32,
    lost_id: u32,
    /// The counter of the calls themselves (a copy behind a recording hook).
    calls_id: u32,
}

/// `assemble` writes the function, given the address it is assembled at.
fn profiled(assemble: impl FnOnce(&mut CodeAssembler, u64)) -> Profiled {
    profiled_behind(Gate::EveryCall, assemble)
}

/// [`profiled`], its code acting for the calls `gate` lets through, with a calls
/// counter when those are the call graph's.
fn profiled_behind(gate: Gate, assemble: impl FnOnce(&mut CodeAssembler, u64)) -> Profiled {
    let original = Mapped::new(1 << 12);
    let mut a = CodeAssembler::new(64).unwrap();
    assemble(&mut a, original.address);
    let bytes = a.assemble(original.address).unwrap();
    original.write(0, &bytes);
    let no_tables = |_: u64, _: &mut [u8]| false;
    let graph = ControlFlowGraph::build(original.address, &bytes, &no_tables).unwrap();
    let numbering = PathNumbering::new(&graph.edge_lists()).unwrap();
    let frames = frames_of(&graph, &bytes);
    let sites = counter_sites(&graph).len() as u32;
    let ids: Vec<u32> = (1..=sites).collect();
    let itemized = numbering.paths as u32;
    let (first_id, beyond_id, lost_id) = (sites + 1, sites + 1 + itemized, sites + 2 + itemized);
    let calls_id = lost_id + 1;
    let actions: Vec<EdgeAction> = numbering.edges.iter().map(|edge| edge.action).collect();
    let mut counters = EdgeCounters {
        ids: &ids,
        paths: Some(PathRegister {
            actions: &actions,
            first_id,
            itemized,
            beyond_id,
            lost_id,
            frames: &frames,
            gate,
            landing_pads: &[],
        }),
        gate,
        calls_id: (gate == Gate::InCallGraph).then_some(calls_id),
        pointers: None,
    };
    let copy = Mapped::new(1 << 16);
    let code = FunctionBytes::new(original.address, &bytes);
    let built = function_copy::build(&graph, &code, copy.address, &mut counters).unwrap();
    copy.write(0, &built.bytes);
    // The original's entry jumps to the copy, so recursive calls enter it again.
    let mut jump = CodeAssembler::new(64).unwrap();
    jump.jmp(copy.address).unwrap();
    original.write(0, &jump.assemble(original.address).unwrap());
    // SAFETY: the copy is System V code taking one integer and returning one.
    let entry = unsafe { std::mem::transmute::<u64, extern "C" fn(u64) -> u64>(copy.address) };
    Profiled {
        _original: original,
        _copy: copy,
        entry,
        graph,
        numbering,
        itemized,
        first_id,
        beyond_id,
        lost_id,
        calls_id,
    }
}

/// The unwind rows of an assembled function, worked out along its graph: the CFA is
/// `rsp + 8` at the entry and 8 further after each push (less after each pop), and
/// `rbp + offset` from a `mov rbp,rsp` to the `pop rbp`.
fn frames_of(graph: &ControlFlowGraph, bytes: &[u8]) -> OriginalUnwind {
    const RBP: u16 = 6;
    const RSP: u16 = 7;
    let mut cfa_at: BTreeMap<u64, (u16, i64, u64)> = BTreeMap::new();
    let mut work = vec![(0usize, (RSP, 8i64))];
    while let Some((index, mut cfa)) = work.pop() {
        let block = &graph.blocks[index];
        if cfa_at.contains_key(&block.start) {
            continue;
        }
        let code = &bytes[(block.start - graph.start) as usize..(block.end - graph.start) as usize];
        for instruction in Decoder::with_ip(64, code, block.start, DecoderOptions::NONE) {
            cfa_at.insert(instruction.ip(), (cfa.0, cfa.1, instruction.next_ip()));
            let register = instruction.op0_register();
            match instruction.code() {
                iced_x86::Code::Push_r64 if cfa.0 == RSP => cfa.1 += 8,
                iced_x86::Code::Pop_r64 if register == iced_x86::Register::RBP => cfa = (RSP, 8),
                iced_x86::Code::Pop_r64 if cfa.0 == RSP => cfa.1 -= 8,
                iced_x86::Code::Mov_r64_rm64 | iced_x86::Code::Mov_rm64_r64
                    if register == iced_x86::Register::RBP
                        && instruction.op1_register() == iced_x86::Register::RSP =>
                {
                    cfa.0 = RBP
                }
                _ => {}
            }
        }
        for successor in block.exit.successors() {
            if let Successor::Block(next) = successor {
                work.push((next, cfa));
            }
        }
    }
    let rows = cfa_at
        .into_iter()
        .map(|(start, (cfa_register, cfa_offset, end))| Row {
            start,
            end,
            cfa_register,
            cfa_offset,
            registers: Vec::new(),
        })
        .collect();
    OriginalUnwind {
        start: graph.start,
        end: graph.start + bytes.len() as u64,
        data_alignment_factor: -8,
        return_address_register: 16,
        rows,
        exceptions: None,
    }
}

/// A path as a test writes it: from a back edge?, blocks by start offset, to one?
type PathKey = (bool, Vec<u64>, bool);

impl Profiled {
    /// Every counted path with its count, and the lost ones.
    fn counted(&self, state: &OwnState) -> (BTreeMap<PathKey, u64>, u64) {
        assert_eq!(state.counter(self.beyond_id), 0);
        let mut paths = BTreeMap::new();
        for number in 0..self.itemized {
            let count = state.counter(self.first_id + number);
            if count == 0 {
                continue;
            }
            let path = self.numbering.path(u64::from(number)).unwrap();
            let blocks = path
                .blocks
                .iter()
                .map(|&b| self.graph.blocks[b].start - self.graph.start)
                .collect();
            paths.insert((path.from_back_edge, blocks, path.to_back_edge), count);
        }
        (paths, state.counter(self.lost_id))
    }

    fn offset_of(&self, block: usize) -> u64 {
        self.graph.blocks[block].start - self.graph.start
    }
}

/// f(i) = (i % 3 != 0 ? i + 100 : i) + 7 * (i & 3): a branch, then a loop of i & 3 trips.
fn branch_and_loop(a: &mut CodeAssembler, _start: u64) {
    let mut skip = a.create_label();
    let mut head = a.create_label();
    let mut done = a.create_label();
    a.mov(eax, edi).unwrap();
    a.xor(edx, edx).unwrap();
    a.mov(ecx, 3).unwrap();
    a.div(ecx).unwrap();
    a.mov(eax, edi).unwrap();
    a.test(edx, edx).unwrap();
    a.je(skip).unwrap();
    a.add(eax, 100).unwrap();
    a.set_label(&mut skip).unwrap();
    a.mov(ecx, edi).unwrap();
    a.and(ecx, 3).unwrap();
    a.je(done).unwrap();
    a.set_label(&mut head).unwrap();
    a.add(eax, 7).unwrap();
    a.dec(ecx).unwrap();
    a.jne(head).unwrap();
    a.set_label(&mut done).unwrap();
    a.ret().unwrap();
}

#[test]
fn a_branch_and_a_loop_count_every_path_exactly() {
    let function = profiled(branch_and_loop);
    let offsets: Vec<u64> = (0..function.graph.blocks.len())
        .map(|b| function.offset_of(b))
        .collect();
    // Blocks: 0 (to the je), 1 (add 100), 2 (the trip count), 3 (the loop), 4 (ret).
    assert_eq!(offsets.len(), 5, "{:#?}", function.graph);
    let (b0, b1, b2, b3, b4) = (offsets[0], offsets[1], offsets[2], offsets[3], offsets[4]);
    let mut state = OwnState::install();
    // An entry left by a deeper call that never returned (an exception or a longjmp
    // passed it): the first call drops it.
    let here = &state as *const OwnState as u64;
    let stack = STATE_PATH_STACK as usize / 8;
    state.region[stack + 2] = !(here - 4096);
    state.region[stack + 3] = 0xffff_ffff_8000_0005;
    state.region[STATE_PATH_DEPTH as usize / 8] = PATH_ENTRY_SIZE as u64;
    let mut expected: BTreeMap<PathKey, u64> = BTreeMap::new();
    for i in 0..600u64 {
        let result = (function.entry)(i);
        let plus = if i % 3 != 0 { 100 } else { 0 };
        assert_eq!(result, i + plus + 7 * (i & 3), "f({i})");
        let mut first = vec![b0];
        if i % 3 != 0 {
            first.push(b1);
        }
        first.push(b2);
        // The loop runs `trips` times; each run but the last takes the back edge.
        let trips = i & 3;
        if trips > 0 {
            first.push(b3);
        }
        if trips <= 1 {
            first.push(b4);
            *expected.entry((false, first, false)).or_default() += 1;
        } else {
            *expected.entry((false, first, true)).or_default() += 1;
            if trips > 2 {
                *expected.entry((true, vec![b3], true)).or_default() += trips - 2;
            }
            *expected.entry((true, vec![b3, b4], false)).or_default() += 1;
        }
    }
    let (counted, lost) = function.counted(&state);
    assert_eq!(lost, 0);
    assert_eq!(counted, expected);
    // The path stack is back to its sentinel.
    assert_eq!(state.region[STATE_PATH_DEPTH as usize / 8], 0);
}

/// g(n) = n == 0 ? 0 : g(n - 1) + (n odd ? 1 : 2), recursing through the patched entry;
/// with `frame_pointer`, its frame is `rbp`-based (the CFA is `rbp + 16`).
fn recursive(frame_pointer: bool) -> Profiled {
    profiled(|a, start| {
        let mut recurse = a.create_label();
        let mut even = a.create_label();
        if frame_pointer {
            a.push(rbp).unwrap();
            a.mov(rbp, rsp).unwrap();
        }
        let leave = |a: &mut CodeAssembler| {
            if frame_pointer {
                a.add(rsp, 8).unwrap();
            }
            a.pop(rbx).unwrap();
            if frame_pointer {
                a.pop(rbp).unwrap();
            }
            a.ret().unwrap();
        };
        a.test(rdi, rdi).unwrap();
        a.jne(recurse).unwrap();
        a.xor(eax, eax).unwrap();
        if frame_pointer {
            a.pop(rbp).unwrap();
        }
        a.ret().unwrap();
        a.set_label(&mut recurse).unwrap();
        a.push(rbx).unwrap();
        if frame_pointer {
            // Moves `rsp` where an `rsp`-based key would notice.
            a.sub(rsp, 8).unwrap();
        }
        a.mov(rbx, rdi).unwrap();
        a.lea(rdi, ptr(rdi - 1)).unwrap();
        // The original's entry, which jumps to the copy.
        a.call(start).unwrap();
        a.test(bl, 1).unwrap();
        a.je(even).unwrap();
        a.add(rax, 1).unwrap();
        leave(a);
        a.set_label(&mut even).unwrap();
        a.add(rax, 2).unwrap();
        leave(a);
    })
}

#[test]
fn recursive_calls_keep_their_own_registers_and_the_deepest_are_lost() {
    for frame_pointer in [false, true] {
        recursion_counts_exactly(recursive(frame_pointer));
    }
}

fn recursion_counts_exactly(function: Profiled) {
    let state = OwnState::install();
    for n in [0u64, 1, 2, 7, 60, 300] {
        let before = function.counted(&state);
        let result = (function.entry)(n);
        assert_eq!(result, (1..=n).map(|k| 2 - k % 2).sum::<u64>(), "g({n})");
        let after = function.counted(&state);
        let ran = |key_last: u64| {
            let key = after.0.iter().find(|(k, _)| k.1.last() == Some(&key_last));
            let old = before.0.iter().find(|(k, _)| k.1.last() == Some(&key_last));
            key.map_or(0, |(_, c)| *c) - old.map_or(0, |(_, c)| *c)
        };
        let blocks = function.graph.blocks.len();
        let (base, odd, even) = (
            function.offset_of(1),
            function.offset_of(blocks - 2),
            function.offset_of(blocks - 1),
        );
        // The stack has 127 entries above the sentinel: calls from depth 128 on get
        // none and are lost. g(n) makes n + 1 calls, g(k) at depth n + 1 - k.
        let calls = n + 1;
        let kept_calls = calls.min(127);
        assert_eq!(after.1 - before.1, calls - kept_calls, "g({n})");
        // The outermost calls have the largest arguments.
        let kept: Vec<u64> = (0..=n).rev().take(kept_calls as usize).collect();
        assert_eq!(ran(base), kept.iter().filter(|&&k| k == 0).count() as u64);
        let kept_odd = kept.iter().filter(|&&k| k % 2 == 1).count() as u64;
        let kept_even = kept.iter().filter(|&&k| k > 0 && k % 2 == 0).count() as u64;
        assert_eq!(ran(odd), kept_odd, "g({n})");
        assert_eq!(ran(even), kept_even, "g({n})");
        assert_eq!(state.region[STATE_PATH_DEPTH as usize / 8], 0);
    }
}

/// From `calls_back(x)` this many and more, the callback drops the caller's entry.
const DROPS_FROM: u64 = 1000;

/// Called from `calls_back(x)`: as if a deeper call had left its entry behind (an
/// exception passed it), or, from `DROPS_FROM` on, as if the caller's entry had been
/// dropped (a coroutine on another stack ran meanwhile).
extern "C" fn disturb_the_path_stack(x: u64) {
    let state = crate::hooks::thread_layout::current();
    let here = &state as *const _ as u64;
    // SAFETY: the test thread's own state, which only this thread's code touches.
    unsafe {
        let depth = (*state).path_depth as usize;
        if x < DROPS_FROM {
            let index = depth / PATH_ENTRY_SIZE as usize + 1;
            (*state).path_stack[index] = crate::hooks::thread_layout::PathEntry {
                not_entry_rsp: !(here - 256),
                register: 0xffff_ffff_8000_0001,
            };
            (*state).path_depth += PATH_ENTRY_SIZE as u64;
        } else {
            (*state).path_depth -= PATH_ENTRY_SIZE as u64;
        }
    }
}

/// h(x) = x odd ? 1 : 2, after calling `disturb_the_path_stack(x)` through a pointer.
fn calls_back() -> Profiled {
    profiled(|a, _| {
        let mut even = a.create_label();
        a.push(rbx).unwrap();
        a.mov(rbx, rdi).unwrap();
        a.mov(
            rax,
            disturb_the_path_stack as extern "C" fn(u64) as usize as u64,
        )
        .unwrap();
        a.call(rax).unwrap();
        a.test(bl, 1).unwrap();
        a.je(even).unwrap();
        a.mov(eax, 1).unwrap();
        a.pop(rbx).unwrap();
        a.ret().unwrap();
        a.set_label(&mut even).unwrap();
        a.mov(eax, 2).unwrap();
        a.pop(rbx).unwrap();
        a.ret().unwrap();
    })
}

#[test]
fn entries_of_gone_calls_are_dropped_and_a_missing_entry_loses_its_path() {
    let function = calls_back();
    let state = OwnState::install();
    // A deeper call's entry left behind: dropped, and every path counted exactly.
    for x in 0..100 {
        assert_eq!((function.entry)(x), 2 - x % 2);
    }
    let (counted, lost) = function.counted(&state);
    assert_eq!(lost, 0);
    assert_eq!(counted.values().copied().collect::<Vec<u64>>(), [50, 50]);
    assert_eq!(state.region[STATE_PATH_DEPTH as usize / 8], 0);
    // The call's own entry gone: its paths are lost, never counted under a number.
    for x in DROPS_FROM..DROPS_FROM + 100 {
        assert_eq!((function.entry)(x), 2 - x % 2);
    }
    let (counted, lost) = function.counted(&state);
    assert_eq!(lost, 100);
    assert_eq!(counted.values().copied().collect::<Vec<u64>>(), [50, 50]);
    assert_eq!(state.region[STATE_PATH_DEPTH as usize / 8], 0);
}

#[test]
fn behind_a_recording_hook_only_the_call_graphs_calls_are_counted() {
    let function = profiled_behind(Gate::InCallGraph, branch_and_loop);
    let mut state = OwnState::install();
    let graph_depth = STATE_GRAPH_DEPTH as usize / 8;
    let mut expected_runs = 0;
    for (depth, calls) in [(0, 100u64), (1, 300), (0, 50), (3, 60)] {
        state.region[graph_depth] = depth;
        for i in 0..calls {
            let plus = if i % 3 != 0 { 100 } else { 0 };
            assert_eq!((function.entry)(i), i + plus + 7 * (i & 3), "f({i})");
            if depth > 0 {
                // One path per call, and one more per back edge taken.
                expected_runs += 1 + (i & 3).saturating_sub(1);
            }
        }
    }
    // Outside the graph (depth 0) nothing counts, not even as lost.
    assert_eq!(state.counter(function.calls_id), 360);
    assert_eq!(state.counter(1), 360, "block 0's counter");
    let (counted, lost) = function.counted(&state);
    assert_eq!(lost, 0);
    assert_eq!(counted.values().sum::<u64>(), expected_runs);
    assert_eq!(state.region[STATE_PATH_DEPTH as usize / 8], 0);
}
