//! Control-flow graphs of real compiler output: the `branches` fixture built by GCC, and
//! every function of the C library this test runs with.

use super::*;
use goblin::elf::{Elf, program_header::PT_LOAD, sym::STT_FUNC};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use tendril_callgraph::paths::{EdgeAction, PathNumbering};

/// An ELF file's image, read by link-time address.
struct Image {
    bytes: Vec<u8>,
    /// (virtual address, file offset, size in the file) of each loaded segment.
    segments: Vec<(u64, u64, u64)>,
    /// Functions with a size: name → (address, size).
    functions: BTreeMap<String, (u64, u64)>,
}

impl Image {
    fn open(path: &Path) -> Image {
        let bytes = std::fs::read(path).unwrap();
        let elf = Elf::parse(&bytes).unwrap();
        let segments = elf
            .program_headers
            .iter()
            .filter(|header| header.p_type == PT_LOAD)
            .map(|header| (header.p_vaddr, header.p_offset, header.p_filesz))
            .collect();
        let mut functions = BTreeMap::new();
        for (symbols, names) in [(&elf.syms, &elf.strtab), (&elf.dynsyms, &elf.dynstrtab)] {
            for symbol in symbols.iter() {
                if symbol.st_type() == STT_FUNC && symbol.st_size > 0 && symbol.st_value > 0 {
                    let name = names.get_at(symbol.st_name).unwrap_or_default().to_string();
                    functions.insert(name, (symbol.st_value, symbol.st_size));
                }
            }
        }
        Image {
            bytes: bytes.clone(),
            segments,
            functions,
        }
    }

    fn read(&self, address: u64, out: &mut [u8]) -> bool {
        for &(vaddr, offset, size) in &self.segments {
            if address >= vaddr && address + out.len() as u64 <= vaddr + size {
                let at = (offset + address - vaddr) as usize;
                out.copy_from_slice(&self.bytes[at..at + out.len()]);
                return true;
            }
        }
        false
    }

    fn graph(&self, name: &str) -> Result<ControlFlowGraph, CfgRefusal> {
        let (address, size) = self.functions[name];
        let mut code = vec![0; size as usize];
        assert!(self.read(address, &mut code), "{name} is in the file");
        ControlFlowGraph::build(address, &code, &|at, out| self.read(at, out))
    }
}

fn built_fixture() -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/branches.c");
    let output = std::env::temp_dir().join(format!("tendril-cfg-branches-{}", std::process::id()));
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-o"])
        .arg(&output)
        .arg(&source)
        .status()
        .expect("gcc runs");
    assert!(status.success());
    output
}

#[test]
fn gcc_output_gives_the_graphs_the_source_says() {
    let path = built_fixture();
    let image = Image::open(&path);
    std::fs::remove_file(&path).unwrap();

    // classify: one conditional branch, two ways out.
    let classify = image.graph("classify").unwrap();
    let branches = classify
        .blocks
        .iter()
        .filter(|b| matches!(b.exit, BlockExit::Conditional { .. }))
        .count();
    assert_eq!(branches, 1, "{classify:#?}");
    assert_eq!(PathNumbering::new(&classify.edge_lists()).unwrap().paths, 2);

    // dispatch: a bounds check, then a jump table of 7 distinct cases.
    let dispatch = image.graph("dispatch").unwrap();
    let tables: Vec<&Vec<usize>> = dispatch
        .blocks
        .iter()
        .filter_map(|b| match &b.exit {
            BlockExit::Table { targets, .. } => Some(targets),
            _ => None,
        })
        .collect();
    assert_eq!(tables.len(), 1, "{dispatch:#?}");
    let mut cases = tables[0].clone();
    assert_eq!(cases.len(), 7);
    cases.sort();
    cases.dedup();
    assert_eq!(cases.len(), 7, "each case has a block of its own");
    // 7 cases and the default, whether the default is inside or in `dispatch.cold`.
    assert_eq!(PathNumbering::new(&dispatch.edge_lists()).unwrap().paths, 8);

    // trip: a loop, so a back edge.
    let trip = image.graph("trip").unwrap();
    let numbering = PathNumbering::new(&trip.edge_lists()).unwrap();
    let back_edges = numbering
        .edges
        .iter()
        .filter(|e| matches!(e.action, EdgeAction::Back { .. }))
        .count();
    assert_eq!(back_edges, 1, "{trip:#?}");
}

/// The C library this test process runs with.
fn libc_path() -> PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| path.contains("/libc.so"))
        .map(PathBuf::from)
        .expect("the test runs with a libc.so")
}

#[test]
fn every_function_of_libc_gets_a_graph_or_a_reason() {
    let image = Image::open(&libc_path());
    let mut built = 0;
    let mut tables = 0;
    let mut refused: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for name in image.functions.keys() {
        match image.graph(name) {
            Ok(graph) => {
                built += 1;
                tables += graph
                    .blocks
                    .iter()
                    .filter(|b| matches!(b.exit, BlockExit::Table { .. }))
                    .count();
                // Every successor is a block of the graph.
                for block in &graph.blocks {
                    for successor in block.exit.successors() {
                        if let Successor::Block(index) = successor {
                            assert!(index < graph.blocks.len(), "{name}");
                        }
                    }
                }
                let _ = PathNumbering::new(&graph.edge_lists());
            }
            Err(refusal) => {
                let kind = format!("{refusal:?}");
                let kind = kind.split([' ', '{']).next().unwrap().to_string();
                refused.entry(kind).or_default().push(name);
            }
        }
    }
    let total = image.functions.len();
    let refused_count: usize = refused.values().map(Vec::len).sum();
    eprintln!("libc: {built} of {total} functions have a graph, {tables} jump tables");
    for (kind, names) in &refused {
        eprintln!(
            "  {kind}: {} (e.g. {:?})",
            names.len(),
            &names[..names.len().min(5)]
        );
    }
    assert!(total > 1000, "{total} functions");
    assert!(tables > 10, "{tables} jump tables resolved");
    assert!(
        refused_count * 20 < total,
        "more than 5% refused: {refused:?}"
    );
}
