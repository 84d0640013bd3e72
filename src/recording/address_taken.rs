//! The static candidate set of calls through pointers: every address-taken function of
//! the process, found before anything runs.
//!
//! The one idea: a function reached through a pointer had its address taken somewhere,
//! and a native program leaves the trace of it in one of two places. In data: a
//! function pointer stored in a table, a vtable slot, a `static` callback, a GOT entry of
//! a function whose address is used — after the loader's relocations (`RELATIVE`,
//! `R_X86_64_64`, `GLOB_DAT`) every such pointer is a plain 8-byte word in the module's
//! mapped data, equal to a function's start. In code: `lea reg, [rip+f]` (PIC code taking
//! `&f`) or, in a non-PIE executable, an immediate `mov edi, offset f`. So the set is read
//! from the target's own memory, where the relocations are already applied: every
//! aligned word of each module's non-executable mappings, and every instruction of its
//! functions (decoded with iced-x86), that names a function's first byte. The GOT slots
//! that PLT stubs jump through (`JUMP_SLOT`) are left out: those are ordinary direct
//! calls, which discovery follows anyway.
//!
//! A module loaded with `dlopen` while a recording runs is reached through `dlsym`, which
//! reads no pointer the program stored: for such a module ([`find_late`]) the functions
//! it exports (`.dynsym`) are candidates too.
//!
//! The set is an over-approximation (a word that happens to equal a function start, a
//! function whose address is taken but never called), which costs only the 1–2 ns a
//! recording hook costs outside the call graph. What it cannot see: code generated at
//! run time (JIT), and targets computed arithmetically rather than stored.

use crate::refusals;
use crate::symbols::maps::{self, Mapping};
use crate::symbols::{Function, ProcessSymbols, SymbolSource};
use iced_x86::{Code, Decoder, DecoderOptions, Instruction, OpKind};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Longest function body decoded.
const MAX_BODY: u64 = 1 << 20;

/// Functions entered other than by a call even though their address lies in data: the
/// signal return trampoline is "returned into" by a handler, and must never be hooked.
const NEVER_CANDIDATES: [&str; 2] = ["__restore_rt", "_start"];

/// The address-taken functions of a process.
#[derive(Debug, Default, Clone)]
pub struct AddressTaken {
    /// Their start addresses, sorted.
    pub addresses: Vec<u64>,
    /// Per module (file name): how many.
    pub per_module: Vec<(String, usize)>,
    /// Modules whose memory could not be read, with the reason: calls through pointers
    /// into them are not followed.
    pub unreadable: Vec<(String, String)>,
    /// How long finding them took.
    pub elapsed: Duration,
}

impl AddressTaken {
    pub fn contains(&self, address: u64) -> bool {
        self.addresses.binary_search(&address).is_ok()
    }

    /// Adds the functions `other` found (in other modules).
    pub fn merge(&mut self, other: AddressTaken) {
        self.addresses.extend(other.addresses);
        self.addresses.sort_unstable();
        self.addresses.dedup();
        self.per_module.extend(other.per_module);
        self.unreadable.extend(other.unreadable);
        self.elapsed += other.elapsed;
    }
}

/// Finds the address-taken functions of the modules of `symbols` that `wanted` accepts
/// (by file name).
pub fn find(symbols: &ProcessSymbols, wanted: impl Fn(&str) -> bool) -> AddressTaken {
    let started = Instant::now();
    let pid = symbols.pid();
    let eligible = FunctionStarts::new(
        symbols
            .functions()
            .iter()
            .filter(|f| is_eligible(f) && refusals::reason(f, true).is_none()),
    );
    let jump_slots: HashSet<u64> = symbols.plt_stubs().iter().map(|s| s.got_slot).collect();
    let mappings = maps::read_maps(pid).unwrap_or_default();
    let mut found: HashSet<u64> = HashSet::new();
    let mut result = AddressTaken::default();
    for module in symbols.modules() {
        if !wanted(&module.name) || is_never_instrumented(&module.name) {
            continue;
        }
        let before = found.len();
        let module_mappings = mappings
            .iter()
            .filter(|m| m.file() == Some(module.path.as_path()) || m.path == module.path);
        for mapping in module_mappings {
            if mapping.executable {
                continue;
            }
            match maps::read_memory(pid, mapping.start, mapping.end) {
                Ok(data) => pointers_in_data(mapping, &data, &eligible, &jump_slots, &mut found),
                Err(e) => result.unreadable.push((module.name.clone(), e.to_string())),
            }
        }
        let functions = symbols
            .functions()
            .iter()
            .filter(|f| f.module == module.name && f.source != SymbolSource::Plt && f.size > 0);
        if let Err(reason) = addresses_in_code(pid, functions, &eligible, &mut found) {
            result.unreadable.push((module.name.clone(), reason));
        }
        result
            .per_module
            .push((module.name.clone(), found.len() - before));
    }
    result.addresses = found.into_iter().collect();
    result.addresses.sort_unstable();
    result.elapsed = started.elapsed();
    result
}

/// [`find`] for modules loaded after the recording started (file names `late`): their
/// exported functions are candidates as well, since `dlsym` hands them out.
pub fn find_late(symbols: &ProcessSymbols, late: &[String]) -> AddressTaken {
    let mut found = find(symbols, |module| late.iter().any(|l| l == module));
    let started = Instant::now();
    let mut exported: Vec<u64> = Vec::new();
    let mappings = maps::read_maps(symbols.pid()).unwrap_or_default();
    for object in maps::code_objects(&mappings) {
        let Some(module) = symbols
            .modules()
            .iter()
            .find(|m| m.path == object.path && late.contains(&m.name))
        else {
            continue;
        };
        match exported_functions(symbols.pid(), &object, module.load_bias) {
            Ok(addresses) => exported.extend(addresses),
            Err(reason) => found.unreadable.push((module.name.clone(), reason)),
        }
    }
    let eligible: HashSet<u64> = symbols
        .functions()
        .iter()
        .filter(|f| is_eligible(f))
        .map(|f| f.addr)
        .collect();
    found
        .addresses
        .extend(exported.into_iter().filter(|a| eligible.contains(a)));
    found.addresses.sort_unstable();
    found.addresses.dedup();
    found.elapsed += started.elapsed();
    found
}

/// The runtime addresses of the functions `object` defines in `.dynsym`.
fn exported_functions(
    pid: i32,
    object: &maps::MappedObject,
    load_bias: u64,
) -> Result<Vec<u64>, String> {
    use goblin::elf::sym::STT_FUNC;
    let file = maps::open_object(pid, object).map_err(|e| e.to_string())?;
    // SAFETY: a read-only private mapping of a module's file; tendril reads it once,
    // now, and a file changed under it gives wrong candidates, never unsoundness beyond
    // what reading a changing file gives (goblin checks every offset).
    let image = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| e.to_string())?;
    let elf = goblin::elf::Elf::parse(&image).map_err(|e| e.to_string())?;
    Ok(elf
        .dynsyms
        .iter()
        .filter(|sym| sym.st_type() == STT_FUNC && sym.st_shndx != 0 && sym.st_value != 0)
        .map(|sym| sym.st_value.wrapping_add(load_bias))
        .collect())
}

/// Whether a function may be a candidate: real code of its own, instrumentable.
fn is_eligible(function: &Function) -> bool {
    function.size > 0
        && function.source != SymbolSource::Plt
        && !function.ifunc
        && !is_never_instrumented(&function.module)
        && !NEVER_CANDIDATES.contains(&function.raw_name.as_str())
}

/// Modules tendril never instruments (the loader, the vDSO, the agent).
fn is_never_instrumented(module: &str) -> bool {
    module.starts_with("ld-") || module == "[vdso]" || crate::agent_bundle::is_agent_module(module)
}

/// The start addresses of the functions that may be found address-taken. Most words
/// of a module's data are no function's address (zeros, sizes, pointers to data): the
/// check of each module's span of functions turns them away before the set is
/// consulted (a big library's data holds millions of words).
struct FunctionStarts {
    starts: HashSet<u64>,
    /// Each module's lowest and highest function start, sorted.
    spans: Vec<(u64, u64)>,
}

impl FunctionStarts {
    fn new<'a>(functions: impl Iterator<Item = &'a Function>) -> FunctionStarts {
        let mut starts = HashSet::new();
        let mut spans: HashMap<&str, (u64, u64)> = HashMap::new();
        for function in functions {
            starts.insert(function.addr);
            let span = spans
                .entry(function.module.as_str())
                .or_insert((function.addr, function.addr));
            span.0 = span.0.min(function.addr);
            span.1 = span.1.max(function.addr);
        }
        let mut sorted: Vec<(u64, u64)> = spans.into_values().collect();
        sorted.sort_unstable();
        // Modules mapped among each other's spans: their spans are merged.
        let mut spans: Vec<(u64, u64)> = Vec::with_capacity(sorted.len());
        for (low, high) in sorted {
            match spans.last_mut() {
                Some(last) if low <= last.1 => last.1 = last.1.max(high),
                _ => spans.push((low, high)),
            }
        }
        FunctionStarts { starts, spans }
    }

    fn contains(&self, address: u64) -> bool {
        let after = self.spans.partition_point(|&(low, _)| low <= address);
        after > 0 && address <= self.spans[after - 1].1 && self.starts.contains(&address)
    }
}

/// The aligned words of `data` (mapped at `mapping.start`) that point at a function's
/// start, but for the GOT slots PLT stubs jump through.
fn pointers_in_data(
    mapping: &Mapping,
    data: &[u8],
    eligible: &FunctionStarts,
    jump_slots: &HashSet<u64>,
    found: &mut HashSet<u64>,
) {
    for (index, word) in data.chunks_exact(8).enumerate() {
        let value = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        if eligible.contains(value) && !jump_slots.contains(&(mapping.start + index as u64 * 8)) {
            found.insert(value);
        }
    }
}

/// Function addresses the code of `functions` takes: `lea reg, [rip+f]`, and immediate
/// operands equal to a function's start (non-PIE code).
fn addresses_in_code<'a>(
    pid: i32,
    functions: impl Iterator<Item = &'a Function>,
    eligible: &FunctionStarts,
    found: &mut HashSet<u64>,
) -> Result<(), String> {
    use std::os::unix::fs::FileExt;
    let path = format!("/proc/{pid}/mem");
    let memory = std::fs::File::open(&path).map_err(|e| format!("cannot open {path}: {e}"))?;
    let mut code = Vec::new();
    let mut instruction = Instruction::default();
    for function in functions {
        code.resize(function.size.min(MAX_BODY) as usize, 0);
        if memory.read_exact_at(&mut code, function.addr).is_err() {
            continue;
        }
        let mut decoder = Decoder::with_ip(64, &code, function.addr, DecoderOptions::NONE);
        while decoder.can_decode() {
            decoder.decode_out(&mut instruction);
            if let Some(address) = address_taken_by(&instruction)
                && address != function.addr
                && eligible.contains(address)
            {
                found.insert(address);
            }
        }
    }
    Ok(())
}

/// The code address `instruction` takes, if it takes one: a `lea` of an ip-relative
/// address, or a 32-bit immediate (an absolute address in non-PIE code).
fn address_taken_by(instruction: &Instruction) -> Option<u64> {
    if matches!(instruction.code(), Code::Lea_r64_m | Code::Lea_r32_m)
        && instruction.is_ip_rel_memory_operand()
    {
        return Some(instruction.ip_rel_memory_address());
    }
    (0..instruction.op_count()).find_map(|operand| match instruction.op_kind(operand) {
        OpKind::Immediate32 | OpKind::Immediate32to64 => {
            Some(instruction.immediate(operand) & 0xffff_ffff)
        }
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: &[u8], ip: u64) -> Instruction {
        Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE).decode()
    }

    #[test]
    fn leas_and_immediates_take_addresses_and_calls_do_not() {
        // lea rdi, [rip+0x100]
        let lea = decode(&[0x48, 0x8d, 0x3d, 0x00, 0x01, 0x00, 0x00], 0x1000);
        assert_eq!(address_taken_by(&lea), Some(0x1107));
        // mov edi, 0x401136
        let mov = decode(&[0xbf, 0x36, 0x11, 0x40, 0x00], 0x1000);
        assert_eq!(address_taken_by(&mov), Some(0x401136));
        // call 0x1100
        let call = decode(&[0xe8, 0xfb, 0x00, 0x00, 0x00], 0x1000);
        assert_eq!(address_taken_by(&call), None);
        // mov rax, [rip+0x100]: loads a pointer, takes no address
        let load = decode(&[0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00], 0x1000);
        assert_eq!(address_taken_by(&load), None);
    }

    #[test]
    fn function_starts_are_found_only_at_a_start_within_a_modules_span() {
        let function =
            |module: &str, addr: u64| Function::for_tests(module, &format!("f{addr:x}"), addr);
        // Module b is mapped inside a's span: the two spans merge.
        let functions = [
            function("a", 0x1000),
            function("a", 0x9000),
            function("b", 0x4000),
            function("b", 0xa000),
            function("c", 0x50000),
        ];
        let starts = FunctionStarts::new(functions.iter());
        assert_eq!(starts.spans, [(0x1000, 0xa000), (0x50000, 0x50000)]);
        for address in [0x1000, 0x4000, 0x9000, 0xa000, 0x50000] {
            assert!(starts.contains(address), "{address:#x}");
        }
        for address in [0, 0xfff, 0x1001, 0xa001, 0x4ffff, 0x50001, u64::MAX] {
            assert!(!starts.contains(address), "{address:#x}");
        }
    }

    /// This test process's own callbacks: `qsort_comparator` is passed to libc's qsort,
    /// so its address is taken; the set has it, and libc's GOT slots for its PLT do
    /// not make `qsort` itself a candidate of this executable.
    #[test]
    fn a_comparator_passed_to_qsort_is_address_taken() {
        extern "C" fn qsort_comparator(a: *const libc::c_void, b: *const libc::c_void) -> i32 {
            // SAFETY: qsort passes pointers to two elements of the u32 array below.
            unsafe { (*(a as *const u32)).cmp(&*(b as *const u32)) as i32 }
        }
        static COMPARATOR: extern "C" fn(*const libc::c_void, *const libc::c_void) -> i32 =
            qsort_comparator;
        let mut values = [3u32, 1, 2];
        // SAFETY: sorts a local array of three u32 with a comparator for u32.
        unsafe {
            libc::qsort(values.as_mut_ptr().cast(), 3, 4, Some(COMPARATOR));
        }
        assert_eq!(values, [1, 2, 3]);
        let symbols = ProcessSymbols::load(std::process::id() as i32).unwrap();
        let exe = std::env::current_exe().unwrap();
        let exe_name = exe.file_name().unwrap().to_str().unwrap().to_string();
        let taken = find(&symbols, |module| module == exe_name);
        let comparator = qsort_comparator as *const () as u64;
        assert!(taken.contains(comparator), "{:?}", taken.per_module);
        assert!(taken.unreadable.is_empty(), "{:?}", taken.unreadable);
    }
}
