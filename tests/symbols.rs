//! `tendril::symbols` against real processes: the functions it lists agree with what
//! binutils (`nm`, `objdump`, `readelf`) say about the same files, for unstripped,
//! stripped, C++, Rust and static fixtures; `find` and the `tendril symbols` command
//! behave as a user expects.

#[path = "symbols/binutils.rs"]
mod binutils;
#[path = "symbols/command.rs"]
mod command;
use crate::common;
#[path = "symbols/programs.rs"]
mod programs;

use std::collections::HashSet;

use binutils::{nm_functions, objdump_plt, readelf_fdes, readelf_functions, readelf_irelative};
use common::{Target, fixture};
use programs::{Program, build_calltree_variant};
use tendril::symbols::{Function, ModuleSymbols, ProcessSymbols, SymbolError, SymbolSource};

// ---------------------------------------------------------------------------------------
// Helpers on our side.

fn module_functions<'a>(symbols: &'a ProcessSymbols, module: &str) -> (u64, Vec<&'a Function>) {
    let m = symbols
        .modules()
        .iter()
        .find(|m| m.name == module)
        .unwrap_or_else(|| {
            panic!(
                "module {module} not loaded; modules: {:?}",
                symbols.modules()
            )
        });
    let functions = symbols
        .functions()
        .iter()
        .filter(|f| f.module == module)
        .collect();
    (m.load_bias, functions)
}

fn names(found: &[&Function]) -> Vec<String> {
    found.iter().map(|f| f.name.to_string()).collect()
}

fn no_match(result: Result<Vec<&Function>, SymbolError>) -> Vec<String> {
    match result {
        Err(SymbolError::NoMatch { suggestions, .. }) => suggestions,
        other => panic!("expected NoMatch, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// Tests.

#[test]
fn every_nm_function_of_calltree_is_listed_at_its_runtime_address() {
    let binary = fixture("calltree");
    let nm = nm_functions(&binary);
    assert!(
        nm.iter().any(|s| s.name == "compute_block"),
        "nm sees no compute_block: {nm:?}"
    );

    let target = Target::spawn("calltree", &["1"]);
    let symbols = ProcessSymbols::load(target.pid()).unwrap();
    let (bias, functions) = module_functions(&symbols, "calltree");
    assert_ne!(
        bias, 0,
        "calltree is PIE and cannot load at its link address"
    );
    assert!(functions.iter().all(|f| *f.module_path == *binary));

    for sym in &nm {
        let found = functions
            .iter()
            .find(|f| f.addr - bias == sym.addr && f.raw_name == sym.name);
        let Some(f) = found else {
            panic!("nm lists {sym:?}, symbols does not; calltree has {functions:#?}");
        };
        assert_eq!(f.size, sym.size.unwrap_or(0), "size of {}", sym.name);
        assert_eq!(f.name, sym.name, "C names need no demangling");
        assert_eq!(f.source, SymbolSource::Symtab);
    }
    // And nothing the symbol tables hold that nm does not.
    for f in functions
        .iter()
        .filter(|f| matches!(f.source, SymbolSource::Symtab | SymbolSource::Dynsym))
    {
        assert!(
            nm.iter()
                .any(|s| s.addr == f.addr - bias && s.name == f.raw_name),
            "{f:?} is not in nm's list"
        );
    }
    // `.symtab` and `.dynsym` name a function once per name; aliases stay rows of their own.
    let rows: HashSet<(u64, &str)> = functions
        .iter()
        .map(|f| (f.addr, f.raw_name.as_str()))
        .collect();
    assert_eq!(rows.len(), functions.len(), "duplicate rows");
    // A fully symbolized binary needs no FDE names.
    assert!(
        functions.iter().all(|f| f.source != SymbolSource::Fde),
        "{functions:#?}"
    );
}

#[test]
fn module_symbols_from_file_uses_elf_addresses_at_bias_zero() {
    let binary = fixture("calltree");
    let module = ModuleSymbols::from_file(&binary, 0).unwrap();
    assert_eq!(module.name, "calltree");
    assert_eq!(module.load_bias, 0);
    assert!(module.functions.windows(2).all(|w| w[0].addr <= w[1].addr));
    for sym in nm_functions(&binary) {
        assert!(
            module
                .functions
                .iter()
                .any(|f| f.addr == sym.addr && f.raw_name == sym.name),
            "{sym:?} missing"
        );
    }
    let shifted = ModuleSymbols::from_file(&binary, 0x1000_0000).unwrap();
    assert_eq!(shifted.functions.len(), module.functions.len());
    assert_eq!(
        shifted.functions[0].addr,
        module.functions[0].addr + 0x1000_0000
    );
}

#[test]
fn stripped_calltree_functions_come_from_fdes_at_the_same_offsets() {
    let unstripped = nm_functions(&fixture("calltree"));
    let stripped_path = fixture("calltree_stripped");
    assert!(
        nm_functions(&stripped_path).is_empty(),
        "the stripped copy still has symbols"
    );
    let fdes = readelf_fdes(&stripped_path);

    let target = Target::spawn("calltree_stripped", &["1"]);
    let symbols = ProcessSymbols::load(target.pid()).unwrap();
    let (bias, functions) = module_functions(&symbols, "calltree_stripped");

    let mut exact = 0;
    for sym in unstripped.iter().filter(|s| s.size.unwrap_or(0) > 0) {
        let f = functions
            .iter()
            .find(|f| f.addr - bias == sym.addr)
            .unwrap_or_else(|| {
                panic!(
                    "no function at {:#x} ({}) in {functions:#?}",
                    sym.addr, sym.name
                )
            });
        assert_eq!(f.source, SymbolSource::Fde, "{f:?}");
        assert_eq!(f.name, format!("calltree_stripped+{:#x}", sym.addr));
        assert_eq!(f.raw_name, f.name);
        let size = sym.size.unwrap();
        if fdes.contains(&(sym.addr, sym.addr + size)) {
            assert_eq!(f.size, size, "FDE size of {} ({})", sym.name, f.name);
            exact += 1;
        }
    }
    assert!(exact >= 15, "only {exact} FDEs cover a symbol exactly");
    // Lookup inside a stripped function finds the FDE function.
    let compute_block = unstripped
        .iter()
        .find(|s| s.name == "compute_block")
        .unwrap();
    let hit = symbols.lookup(compute_block.addr + bias + 3).unwrap();
    assert_eq!(
        hit.name,
        format!("calltree_stripped+{:#x}", compute_block.addr)
    );
}

#[test]
fn plt_stubs_match_objdump_labels_and_got_slots() {
    let binary = fixture("calltree");
    let stubs: Vec<(u64, String, u64)> = objdump_plt(&binary)
        .into_iter()
        .filter_map(|j| j.stub.map(|(addr, label)| (addr, label, j.got_slot)))
        .collect();
    let labels: Vec<&str> = stubs.iter().map(|s| s.1.as_str()).collect();
    // calltree.c calls these through the PLT (see its call tree).
    assert!(
        labels.contains(&"memcpy@plt") && labels.contains(&"snprintf@plt"),
        "{labels:?}"
    );

    let target = Target::spawn("calltree", &["1"]);
    let symbols = ProcessSymbols::load(target.pid()).unwrap();
    let (bias, functions) = module_functions(&symbols, "calltree");
    for (addr, label, got_slot) in &stubs {
        let f = functions
            .iter()
            .find(|f| f.addr - bias == *addr && f.source == SymbolSource::Plt)
            .unwrap_or_else(|| panic!("objdump's {label} at {addr:#x} is missing"));
        assert_eq!(&f.raw_name, label);
        assert_eq!(f.plt_target(), label.strip_suffix("@plt"));
        assert!(f.size == 16 || f.size == 8, "{f:?}");
        let info = symbols
            .plt_stub(f.addr + 2)
            .expect("plt_stub inside the stub");
        assert_eq!(info.got_slot - bias, *got_slot, "GOT slot of {label}");
        assert_eq!(symbols.lookup(f.addr + 2), Some(*f));
    }
    let plt_count = functions
        .iter()
        .filter(|f| f.source == SymbolSource::Plt)
        .count();
    assert_eq!(
        plt_count,
        stubs.len(),
        "PLT stubs objdump does not label (PLT0?)"
    );
}

#[test]
fn plt_layouts_of_other_linkers_and_options() {
    let dir = std::env::temp_dir().join(format!("tendril-symbols-plt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let variants: [(&str, &[&str]); 4] = [
        // IBT: lazy `.plt` without GOT jumps, named stubs in `.plt.sec` after `endbr64`.
        ("ibt", &["-fcf-protection", "-Wl,-z,ibtplt"]),
        ("nopie", &["-no-pie"]),
        ("gold", &["-fuse-ld=gold"]),
        // Calls through the GOT directly: only `.plt.got` stubs remain.
        ("noplt", &["-fno-plt"]),
    ];
    for (name, flags) in variants {
        let binary = build_calltree_variant(&dir, name, flags);
        let module = ModuleSymbols::from_file(&binary, 0).unwrap();
        let labeled: Vec<(u64, String)> = objdump_plt(&binary)
            .into_iter()
            .filter_map(|j| j.stub)
            .collect();
        assert!(!labeled.is_empty(), "{name}: objdump sees no stubs");
        let ours: Vec<&Function> = module
            .functions
            .iter()
            .filter(|f| f.source == SymbolSource::Plt)
            .collect();
        assert_eq!(
            ours.len(),
            labeled.len(),
            "{name}: {ours:#?} vs {labeled:?}"
        );
        for (addr, label) in &labeled {
            assert!(
                ours.iter().any(|f| f.addr == *addr && &f.raw_name == label),
                "{name}: {label} at {addr:#x} missing from {ours:#?}"
            );
        }
        assert_eq!(module.plt_stubs.len(), ours.len());
        for sym in nm_functions(&binary) {
            assert!(
                module
                    .functions
                    .iter()
                    .any(|f| f.addr == sym.addr && f.raw_name == sym.name),
                "{name}: {sym:?} missing"
            );
        }
        // No FDE of the PLT sections shows up as a function.
        assert!(
            module
                .functions
                .iter()
                .all(|f| f.source != SymbolSource::Fde),
            "{name}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_stripped_library_is_named_from_its_separate_debug_file() {
    // Debian's libc.so.6 has no .symtab; libc6-dbg (installed by .ci/run) puts its
    // debug file under /usr/lib/debug/.build-id. Without it, glibc's internal functions
    // (the memcpy variants an IFUNC picks, say) would be `libc.so.6+0x...`.
    let target = Target::spawn("calltree", &["1"]);
    let symbols = ProcessSymbols::load(target.pid()).unwrap();
    let (_, libc) = module_functions(&symbols, "libc.so.6");
    let internal = libc
        .iter()
        .find(|f| f.name == "__memmove_avx_unaligned_erms")
        .expect("glibc's internal functions are named");
    assert_eq!(internal.source, SymbolSource::DebugFile);
    assert!(internal.size > 0);
    // Exported functions keep one row per address and name.
    let mallocs = libc.iter().filter(|f| f.name == "malloc").count();
    assert_eq!(mallocs, 1);
}

#[test]
fn lookup_finds_the_containing_function_in_every_module() {
    let target = Target::spawn("calltree", &["1"]);
    let symbols = ProcessSymbols::load(target.pid()).unwrap();
    let fs = symbols.functions();
    assert!(
        fs.windows(2).all(|w| w[0].addr <= w[1].addr),
        "not sorted by address"
    );

    let compute_block = symbols.find("compute_block").unwrap()[0];
    for offset in [0, 1, compute_block.size - 1] {
        assert_eq!(
            symbols.lookup(compute_block.addr + offset),
            Some(compute_block)
        );
    }
    let after = symbols.lookup(compute_block.end());
    assert_ne!(after.map(|f| f.name.as_str()), Some("compute_block"));

    let malloc = symbols.find("libc.so.6:malloc").unwrap();
    assert_eq!(malloc.len(), 1);
    // At an address with aliases, the plainest name comes first.
    assert_eq!(symbols.lookup(malloc[0].addr + 1).unwrap().name, "malloc");

    let module = symbols.module_at(compute_block.addr).unwrap();
    assert_eq!(module.name, "calltree");
    assert!(
        symbols
            .modules()
            .iter()
            .any(|m| m.name.starts_with("ld-linux"))
    );
    assert!(symbols.lookup(0x10).is_none());
    assert!(symbols.skipped().is_empty(), "{:?}", symbols.skipped());

    // The vDSO is read from the target's memory.
    let vdso: Vec<&Function> = fs.iter().filter(|f| f.module == "[vdso]").collect();
    assert!(
        vdso.iter().any(|f| f.name.ends_with("clock_gettime")),
        "{vdso:?}"
    );
}

#[test]
fn find_by_exact_name_glob_and_module() {
    let target = Target::spawn("calltree", &["1"]);
    let symbols = ProcessSymbols::load(target.pid()).unwrap();

    let exact = symbols.find("compute_block").unwrap();
    assert_eq!(names(&exact), ["compute_block"]);
    assert_eq!(exact[0].module, "calltree");

    let glob = symbols.find("counted_*").unwrap();
    let mut glob_names = names(&glob);
    glob_names.sort();
    assert_eq!(
        glob_names,
        ["counted_inner", "counted_leaf", "counted_outer"]
    );

    assert_eq!(names(&symbols.find("calltree:mix").unwrap()), ["mix"]);
    // libc calls its own memcpy IFUNC through a PLT stub of its own.
    let memcpy_plt = symbols.find("memcpy@plt").unwrap();
    assert!(
        memcpy_plt
            .iter()
            .all(|f| f.name == "memcpy@plt" && f.source == SymbolSource::Plt)
    );
    assert!(memcpy_plt.iter().any(|f| f.module == "calltree"));
    assert_eq!(symbols.find("calltree:memcpy@plt").unwrap().len(), 1);

    let malloc = symbols.find("libc.so.6:malloc").unwrap();
    assert_eq!(names(&malloc), ["malloc"]);
    assert_eq!(malloc[0].module, "libc.so.6");
    let globbed = symbols.find("libc*:mall*").unwrap();
    assert!(
        globbed
            .iter()
            .all(|f| f.module == "libc.so.6" && f.name.starts_with("mall"))
    );
    assert!(names(&globbed).contains(&"malloc".to_string()));
    // A full path names the module too.
    let libc_path = malloc[0].module_path.to_str().unwrap().to_string();
    assert_eq!(
        symbols.find(&format!("{libc_path}:malloc")).unwrap(),
        malloc
    );

    // calltree itself does not define malloc: a module-qualified miss.
    let suggestions = no_match(symbols.find("calltree:malloc"));
    assert!(
        !suggestions.contains(&"malloc".to_string()),
        "{suggestions:?}"
    );

    let suggestions = no_match(symbols.find("compute_blok"));
    assert_eq!(
        suggestions.first().map(String::as_str),
        Some("compute_block"),
        "{suggestions:?}"
    );
    assert!(suggestions.len() <= 5);
    let unique: HashSet<&String> = suggestions.iter().collect();
    assert_eq!(
        unique.len(),
        suggestions.len(),
        "duplicates in {suggestions:?}"
    );
    let message = symbols.find("compute_blok").unwrap_err().to_string();
    assert!(
        message.starts_with("no function matches 'compute_blok' — did you mean: compute_block"),
        "{message}"
    );
}

#[test]
fn cpp_names_are_demangled_and_found_without_parameters() {
    let target = Target::spawn("exceptions", &["1"]);
    let symbols = ProcessSymbols::load(target.pid()).unwrap();
    let (_, functions) = module_functions(&symbols, "exceptions");

    let level1 = symbols.find("level1").unwrap();
    assert_eq!(
        names(&level1),
        ["level1(unsigned int)"],
        "the .cold clone is not level1"
    );
    assert_eq!(level1[0].raw_name, "_Z6level1j");
    assert_eq!(symbols.find("_Z6level1j").unwrap(), level1);
    assert_eq!(symbols.find("level1(unsigned int)").unwrap(), level1);
    assert_eq!(
        symbols.find("exceptions:level1*").unwrap().len(),
        2,
        "level1 and its clone"
    );
    assert!(
        functions
            .iter()
            .any(|f| f.name == "level1(unsigned int) [clone .cold]")
    );
    assert!(
        functions
            .iter()
            .any(|f| f.name == "(anonymous namespace)::mix(unsigned long, unsigned long)")
    );

    // `module:name` with a C++ name full of `::`.
    let terminate = symbols.find("libstdc++.so.6*:std::terminate").unwrap();
    assert_eq!(names(&terminate), ["std::terminate()"]);
    // Without a module, the executable's PLT stub for it is a different function.
    assert!(
        functions
            .iter()
            .any(|f| f.name == "std::terminate()@plt" && f.source == SymbolSource::Plt)
    );
    let scoped = symbols.find("std::runtime_error::runtime_error").unwrap();
    assert!(
        scoped
            .iter()
            .all(|f| f.name.starts_with("std::runtime_error::runtime_error(")),
        "{:?}",
        names(&scoped)
    );
}

#[test]
fn rust_names_are_demangled_without_hashes() {
    let target = Target::spawn("rust_panics", &["1"]);
    let symbols = ProcessSymbols::load(target.pid()).unwrap();
    let mix = symbols.find("rust_panics::mix").unwrap();
    assert_eq!(names(&mix), ["rust_panics::mix"]);
    assert!(
        mix[0].raw_name.starts_with("_ZN11rust_panics3mix17h"),
        "{:?}",
        mix[0]
    );
    assert!(!symbols.find("rust_panics::*").unwrap().is_empty());
}

#[test]
fn static_executable_has_ifunc_plt_stubs_and_no_bias() {
    let binary = fixture("static_loop");
    let target = Target::spawn("static_loop", &[]);
    let symbols = ProcessSymbols::load(target.pid()).unwrap();
    let (bias, functions) = module_functions(&symbols, "static_loop");
    assert_eq!(bias, 0, "a non-PIE executable runs at its link addresses");
    assert!(!symbols.modules().iter().any(|m| m.name.starts_with("libc")));
    assert_eq!(names(&symbols.find("static_loop:tick").unwrap()), ["tick"]);

    // Every PLT jump goes through a slot an IRELATIVE relocation fills with what the
    // resolver at its addend returns; the stub is named after the IFUNC symbol there.
    let ifuncs = readelf_functions(&binary);
    let irelative = readelf_irelative(&binary);
    let jumps = objdump_plt(&binary);
    assert!(
        !jumps.is_empty(),
        "a static glibc program calls IFUNCs through its PLT"
    );
    let stubs: Vec<&Function> = functions
        .iter()
        .filter(|f| f.source == SymbolSource::Plt)
        .copied()
        .collect();
    assert_eq!(stubs.len(), jumps.len(), "{stubs:#?}");
    for (f, jump) in stubs.iter().zip(&jumps) {
        assert_eq!(f.addr, jump.addr, "stubs start at their jmp: {f:?}");
        assert_eq!(symbols.plt_stub(f.addr).unwrap().got_slot, jump.got_slot);
        let resolver = irelative[&jump.got_slot];
        let name = f.plt_target().unwrap().to_string();
        assert!(ifuncs.contains(&(resolver, name)), "{f:?} for {jump:?}");
    }
    // The stubs of a static executable are 8 bytes apart.
    assert!(
        stubs
            .windows(2)
            .all(|w| w[0].addr + w[0].size == w[1].addr && w[0].size == 8)
    );
}

#[test]
fn a_deleted_executable_is_read_through_map_files_or_skipped() {
    let dir = std::env::temp_dir().join(format!("tendril-symbols-deleted-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("calltree_copy");
    std::fs::copy(fixture("calltree"), &copy).unwrap();
    let program = Program::start(&copy);
    std::fs::remove_dir_all(&dir).unwrap();

    let symbols = ProcessSymbols::load(program.pid()).unwrap();
    assert!(symbols.modules().iter().any(|m| m.name == "libc.so.6"));
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let found = symbols.find("calltree_copy:compute_block").unwrap();
        assert_eq!(*found[0].module_path, *copy);
    } else {
        let skipped = symbols
            .skipped()
            .iter()
            .find(|s| s.path == copy)
            .expect("listed as skipped");
        assert!(skipped.reason.contains("deleted"), "{}", skipped.reason);
    }
}

#[test]
fn non_pie_executable_runs_at_bias_zero() {
    let dir = std::env::temp_dir().join(format!("tendril-symbols-nopie-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let binary = build_calltree_variant(&dir, "calltree_nopie", &["-no-pie"]);
    let program = Program::start(&binary);
    let symbols = ProcessSymbols::load(program.pid()).unwrap();
    let (bias, functions) = module_functions(&symbols, "calltree_nopie");
    assert_eq!(bias, 0);
    for sym in nm_functions(&binary) {
        assert!(
            functions
                .iter()
                .any(|f| f.addr == sym.addr && f.raw_name == sym.name),
            "{sym:?}"
        );
    }
    let libc = symbols
        .modules()
        .iter()
        .find(|m| m.name == "libc.so.6")
        .unwrap();
    assert_ne!(libc.load_bias, 0, "shared libraries are relocated");
    drop(program);
    let _ = std::fs::remove_dir_all(&dir);
}
