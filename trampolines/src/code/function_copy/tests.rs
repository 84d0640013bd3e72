//! Copies of assembled functions, run for real: results equal the original's, and
//! every counter counts exactly what ran.

use super::*;
use crate::code::executable_memory::Mapped;
use iced_x86::code_asm::*;
use iced_x86::{Code, MemoryOperand, Register};

/// Where the originals are assembled (never run there: only their copies run).
const BASE: u64 = 0x40_1000;

/// Counters at absolute addresses, with `pushfq`/`popfq` where the flags are live, so
/// a wrong liveness answer shows as a wrong result.
struct TestCounters {
    cells: Box<[u64]>,
    /// Counts the calls through pointers (in `through_pointer`'s code).
    pointer_calls: Box<u64>,
    /// No block or edge counters at all: every counter's code is empty.
    no_counters: bool,
}

impl TestCounters {
    fn new(count: usize) -> TestCounters {
        TestCounters {
            cells: vec![0u64; count].into_boxed_slice(),
            pointer_calls: Box::new(0),
            no_counters: false,
        }
    }
}

impl CounterCode for TestCounters {
    fn counter(&mut self, index: usize, flags_live: bool, _: &mut Labels) -> Inserted {
        if self.no_counters {
            return Inserted::default();
        }
        increment_code(&self.cells[index] as *const u64 as u64, flags_live)
    }

    fn through_pointer(&mut self, _: u64, _: &Instruction, _: &mut Labels) -> Inserted {
        increment_code(&*self.pointer_calls as *const u64 as u64, false)
    }
}

/// `lock inc` of the word at `cell`, the flags saved when `flags_live`.
fn increment_code(cell: u64, flags_live: bool) -> Inserted {
    let mut inserted = Inserted::default();
    let mut push = |instruction: Instruction, extra: u32| {
        inserted.instructions.push(instruction);
        inserted.extra_stack.push(extra);
    };
    let below = |d: i64| MemoryOperand::with_base_displ(Register::RSP, d);
    push(
        Instruction::with2(Code::Lea_r64_m, Register::RSP, below(-128)).unwrap(),
        0,
    );
    push(
        Instruction::with1(Code::Push_r64, Register::RAX).unwrap(),
        128,
    );
    if flags_live {
        push(Instruction::with(Code::Pushfq), 136);
    }
    let depth = if flags_live { 144 } else { 136 };
    push(
        Instruction::with2(Code::Mov_r64_imm64, Register::RAX, cell).unwrap(),
        depth,
    );
    let mut increment =
        Instruction::with1(Code::Inc_rm64, MemoryOperand::with_base(Register::RAX)).unwrap();
    increment.set_has_lock_prefix(true);
    push(increment, depth);
    if flags_live {
        push(Instruction::with(Code::Popfq), 144);
    }
    push(
        Instruction::with1(Code::Pop_r64, Register::RAX).unwrap(),
        136,
    );
    push(
        Instruction::with2(Code::Lea_r64_m, Register::RSP, below(128)).unwrap(),
        128,
    );
    inserted
}

/// A function assembled at `BASE`, its graph, and a copy of it mapped and ready.
struct Copied {
    graph: ControlFlowGraph,
    counters: TestCounters,
    _memory: Mapped,
    entry: extern "C" fn(u64, u64) -> u64,
    copy: FunctionCopy,
}

fn copy_of(assemble: impl FnOnce(&mut CodeAssembler), code_len: Option<usize>) -> Copied {
    copy_with(assemble, code_len, false)
}

/// [`copy_of`], with no block or edge counters when `no_counters`.
fn copy_with(
    assemble: impl FnOnce(&mut CodeAssembler),
    code_len: Option<usize>,
    no_counters: bool,
) -> Copied {
    let mut a = CodeAssembler::new(64).unwrap();
    assemble(&mut a);
    let bytes = a.assemble(BASE).unwrap();
    let read = |at: u64, buffer: &mut [u8]| {
        let Some(offset) = at.checked_sub(BASE) else {
            return false;
        };
        let offset = offset as usize;
        match bytes.get(offset..offset + buffer.len()) {
            Some(found) => {
                buffer.copy_from_slice(found);
                true
            }
            None => false,
        }
    };
    let code = &bytes[..code_len.unwrap_or(bytes.len())];
    let graph = ControlFlowGraph::build(BASE, code, &read).unwrap();
    let mut counters = TestCounters::new(counter_sites(&graph).len());
    counters.no_counters = no_counters;
    let memory = Mapped::new(1 << 16);
    let copy = build(
        &graph,
        &FunctionBytes::new(BASE, code),
        memory.address,
        &mut counters,
    )
    .unwrap();
    memory.write(0, &copy.bytes);
    // SAFETY: the copy is System V code taking two integers and returning one.
    let entry =
        unsafe { std::mem::transmute::<u64, extern "C" fn(u64, u64) -> u64>(memory.address) };
    Copied {
        graph,
        counters,
        _memory: memory,
        entry,
        copy,
    }
}

impl Copied {
    fn count(&self, site: CounterSite) -> u64 {
        let index = counter_sites(&self.graph)
            .iter()
            .position(|&s| s == site)
            .unwrap();
        // SAFETY: the copy's `lock inc`s are done; a volatile read sees them.
        unsafe { std::ptr::read_volatile(&self.counters.cells[index]) }
    }

    fn block(&self, offset: u64) -> usize {
        self.graph.block_at(BASE + offset).unwrap()
    }
}

#[test]
fn a_branch_taken_two_times_in_three_is_counted_exactly() {
    // f(i) = i % 3 != 0 ? i * 7 + 1 : i / 3
    let copied = copy_of(
        |a| {
            let mut divisible = a.create_label();
            a.mov(eax, edi).unwrap();
            a.xor(edx, edx).unwrap();
            a.mov(ecx, 3).unwrap();
            a.div(ecx).unwrap();
            a.test(edx, edx).unwrap();
            a.je(divisible).unwrap();
            a.imul_3(eax, edi, 7).unwrap();
            a.add(eax, 1).unwrap();
            a.ret().unwrap();
            a.set_label(&mut divisible).unwrap();
            a.ret().unwrap();
        },
        None,
    );
    for i in 0..300u64 {
        let expected = if i % 3 != 0 { i * 7 + 1 } else { i / 3 };
        assert_eq!((copied.entry)(i, 0), expected, "f({i})");
    }
    assert_eq!(copied.count(CounterSite::Block(0)), 300);
    assert_eq!(
        copied.count(CounterSite::Taken(0)),
        100,
        "je when divisible"
    );
    // The copy's map: in address order from its entry, every original instruction once.
    let placed = &copied.copy.instructions;
    assert_eq!(placed[0].copy, copied.copy.address);
    assert!(placed.windows(2).all(|pair| pair[0].copy < pair[1].copy));
    let originals: Vec<u64> = placed.iter().filter_map(|p| p.original).collect();
    let expected: Vec<u64> = copied
        .graph
        .blocks
        .iter()
        .flat_map(|b| b.instructions.clone())
        .collect();
    assert_eq!(originals, expected);
    assert!(
        placed
            .iter()
            .all(|p| p.original.is_none() || p.extra_stack == 0)
    );
    assert_eq!(copied.count(CounterSite::Block(1)), 200);
    assert_eq!(copied.count(CounterSite::Block(2)), 100);
}

#[test]
fn flags_live_across_blocks_survive_the_counters() {
    // cmp; jl less; jg greater; equal: the second block reads the cmp's flags.
    let copied = copy_of(
        |a| {
            let mut less = a.create_label();
            let mut greater = a.create_label();
            a.cmp(rdi, rsi).unwrap();
            a.jl(less).unwrap();
            a.jg(greater).unwrap();
            a.mov(eax, 2).unwrap();
            a.ret().unwrap();
            a.set_label(&mut less).unwrap();
            a.mov(eax, 1).unwrap();
            a.ret().unwrap();
            a.set_label(&mut greater).unwrap();
            a.mov(eax, 3).unwrap();
            a.ret().unwrap();
        },
        None,
    );
    let mut expected_counts = [0u64; 3];
    for x in 0..10u64 {
        for y in 0..10u64 {
            let expected = match x.cmp(&y) {
                std::cmp::Ordering::Less => 1,
                std::cmp::Ordering::Equal => 2,
                std::cmp::Ordering::Greater => 3,
            };
            expected_counts[expected as usize - 1] += 1;
            assert_eq!((copied.entry)(x, y), expected, "compare({x}, {y})");
        }
    }
    assert_eq!(copied.count(CounterSite::Taken(0)), expected_counts[0]);
    let second = copied.block(copied.graph.blocks[1].start - BASE);
    assert_eq!(copied.count(CounterSite::Block(second)), 55);
    assert_eq!(copied.count(CounterSite::Taken(second)), expected_counts[2]);
}

#[test]
fn a_loop_counts_its_iterations_and_the_red_zone_is_left_alone() {
    // sum of k for k < n, with the running sum kept in the red zone.
    let copied = copy_of(
        |a| {
            let mut head = a.create_label();
            let mut done = a.create_label();
            a.mov(qword_ptr(rsp - 8), 0).unwrap();
            a.xor(ecx, ecx).unwrap();
            a.set_label(&mut head).unwrap();
            a.cmp(rcx, rdi).unwrap();
            a.jae(done).unwrap();
            a.add(qword_ptr(rsp - 8), rcx).unwrap();
            a.inc(rcx).unwrap();
            a.jmp(head).unwrap();
            a.set_label(&mut done).unwrap();
            a.mov(rax, qword_ptr(rsp - 8)).unwrap();
            a.ret().unwrap();
        },
        None,
    );
    for n in 0..10u64 {
        assert_eq!(
            (copied.entry)(n, 0),
            n * n.saturating_sub(1) / 2,
            "sum below {n}"
        );
    }
    let head = copied.graph.blocks[1].start;
    assert_eq!(copied.count(CounterSite::Block(1)), 45 + 10, "{head:#x}");
    assert_eq!(copied.count(CounterSite::Taken(1)), 10, "one exit per call");
}

#[test]
fn a_jump_table_is_copied_and_counts_each_entry() {
    pic_switch_runs(5);
}

/// A position-independent switch over `cases` cases (`case k` returns `rsi + 10k + 1`,
/// anything else 100), its table holding `entries`; its bytes, the table's address
/// and the cases' addresses.
fn assemble_pic_switch(cases: usize, entries: &[i32]) -> (Vec<u8>, u64, Vec<u64>) {
    let mut a = CodeAssembler::new(64).unwrap();
    let mut default = a.create_label();
    let mut table_label = a.create_label();
    let mut case_labels: Vec<CodeLabel> = (0..cases).map(|_| a.create_label()).collect();
    a.cmp(edi, (cases - 1) as i32).unwrap();
    a.ja(default).unwrap();
    a.lea(rdx, qword_ptr(table_label)).unwrap();
    a.mov(edi, edi).unwrap();
    a.movsxd(rax, dword_ptr(rdx + rdi * 4)).unwrap();
    a.add(rax, rdx).unwrap();
    a.jmp(rax).unwrap();
    for (k, label) in case_labels.iter_mut().enumerate() {
        a.set_label(label).unwrap();
        a.lea(rax, qword_ptr(rsi + k as i32 * 10 + 1)).unwrap();
        a.ret().unwrap();
    }
    a.set_label(&mut default).unwrap();
    a.mov(eax, 100).unwrap();
    a.ret().unwrap();
    a.set_label(&mut table_label).unwrap();
    for &entry in entries {
        a.dd(&[entry as u32]).unwrap();
    }
    let result = a
        .assemble_options(
            BASE,
            iced_x86::BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS,
        )
        .unwrap();
    let address = |label: &CodeLabel| result.label_ip(label).unwrap();
    let table = address(&table_label);
    let cases: Vec<u64> = case_labels.iter().map(address).collect();
    (result.inner.code_buffer.clone(), table, cases)
}

/// `switch (op) { case 0..cases: x + 10 op + 1; default: 100 }` in GCC's
/// position-independent shape, assembled twice (the cases' addresses first, then the
/// table's entries), copied and run three rounds.
fn pic_switch_runs(cases: usize) {
    let (_, table, case_addresses) = assemble_pic_switch(cases, &vec![0; cases]);
    let entries: Vec<i32> = case_addresses
        .iter()
        .map(|&case| (case as i64 - table as i64) as i32)
        .collect();
    let (bytes, table, _) = assemble_pic_switch(cases, &entries);
    let code_len = (table - BASE) as usize;
    let read = |at: u64, buffer: &mut [u8]| {
        let offset = (at - BASE) as usize;
        match bytes.get(offset..offset + buffer.len()) {
            Some(found) => {
                buffer.copy_from_slice(found);
                true
            }
            None => false,
        }
    };
    let graph = ControlFlowGraph::build(BASE, &bytes[..code_len], &read).unwrap();
    let mut counters = TestCounters::new(counter_sites(&graph).len());
    let memory = Mapped::new(1 << 16);
    let bytes = FunctionBytes::new(BASE, &bytes[..code_len]);
    let copy = build(&graph, &bytes, memory.address, &mut counters).unwrap();
    assert!(
        copy.bytes.len() as u64 > copy.code_len,
        "the table's copy follows the code"
    );
    memory.write(0, &copy.bytes);
    // SAFETY: the copy is System V code taking two integers and returning one.
    let entry =
        unsafe { std::mem::transmute::<u64, extern "C" fn(u64, u64) -> u64>(memory.address) };
    for round in 0..3u64 {
        for op in 0..(cases as u64 + 2) {
            let expected = if op < cases as u64 {
                1000 + op * 10 + 1
            } else {
                100
            };
            assert_eq!(entry(op, 1000), expected, "op {op}, round {round}");
        }
    }
    let dispatch = graph
        .blocks
        .iter()
        .position(|b| matches!(b.exit, BlockExit::Table { .. }))
        .unwrap();
    let sites = counter_sites(&graph);
    let count = |site: CounterSite| {
        let index = sites.iter().position(|&s| s == site).unwrap();
        // SAFETY: the copy's `lock inc`s are done; a volatile read sees them.
        unsafe { std::ptr::read_volatile(&counters.cells[index]) }
    };
    for entry in 0..cases {
        assert_eq!(
            count(CounterSite::TableEntry {
                block: dispatch,
                entry
            }),
            3,
            "entry {entry}"
        );
    }
    assert_eq!(
        count(CounterSite::Taken(0)),
        6,
        "the bound check sends 2 ops per round to default"
    );
    drop(memory);
}

extern "C" fn add_three(x: u64) -> u64 {
    x + 3
}

#[test]
fn calls_through_pointers_run_their_check_first_in_a_copy_without_counters() {
    // f(n, g): x = 0; n times x = g(x) — once through a register, once through a
    // pointer kept on the stack, the loop's labels on blocks whose counters are empty.
    for through_stack in [false, true] {
        let copied = copy_with(
            |a| {
                let mut head = a.create_label();
                let mut done = a.create_label();
                a.push(rbx).unwrap();
                a.push(r13).unwrap();
                a.sub(rsp, 8).unwrap();
                a.mov(qword_ptr(rsp), rsi).unwrap();
                a.mov(rbx, rdi).unwrap();
                a.xor(r13d, r13d).unwrap();
                a.set_label(&mut head).unwrap();
                a.test(rbx, rbx).unwrap();
                a.je(done).unwrap();
                a.mov(rdi, r13).unwrap();
                if through_stack {
                    a.call(qword_ptr(rsp)).unwrap();
                } else {
                    a.mov(rax, qword_ptr(rsp)).unwrap();
                    a.call(rax).unwrap();
                }
                a.mov(r13, rax).unwrap();
                a.dec(rbx).unwrap();
                a.jmp(head).unwrap();
                a.set_label(&mut done).unwrap();
                a.mov(rax, r13).unwrap();
                a.add(rsp, 8).unwrap();
                a.pop(r13).unwrap();
                a.pop(rbx).unwrap();
                a.ret().unwrap();
            },
            None,
            true,
        );
        let g = add_three as extern "C" fn(u64) -> u64 as usize as u64;
        for n in [0u64, 1, 7] {
            assert_eq!(
                (copied.entry)(n, g),
                3 * n,
                "through the stack: {through_stack}"
            );
        }
        // SAFETY: the copy's `lock inc`s are done; a volatile read sees them.
        let checks = unsafe { std::ptr::read_volatile(&*copied.counters.pointer_calls) };
        assert_eq!(checks, 8, "one check per call through the pointer");
    }
}
