//! [`ProcessSymbols`]: the merged, address-sorted function table of a live process.
//!
//! Loading reads `/proc/PID/maps`, loads every code object in parallel (one
//! [`ModuleSymbols`] each) and merges them. Lookup by address is a binary search plus a
//! short backward walk bounded by a running maximum of function ends, so overlapping and
//! zero-size symbols are handled without an interval tree.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::cache;
use super::cache_dir::CacheDir;
use super::error::SymbolError;
use super::maps::{self, MappedObject, ObjectKind};
use super::module::{self, ModuleSymbols, PltStub};
use super::progress::{self, Progress};
use super::{Function, Module, pattern};

/// A code object that could not be read; the rest of the process still loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedModule {
    pub path: PathBuf,
    /// Why, as a full sentence fragment (the error message).
    pub reason: String,
}

/// Every function of every ELF module mapped into one process, sorted by address.
#[derive(Debug, Clone)]
pub struct ProcessSymbols {
    pid: i32,
    functions: Vec<Function>,
    /// `max_end[i]` = the largest `end()` among `functions[..=i]`.
    max_end: Vec<u64>,
    modules: Vec<Module>,
    /// Every mapping of the loaded modules, sorted by start: a module's start..end may
    /// span other memory (Node maps a copy of its builtins far above itself, and its
    /// JIT code lies between).
    mappings: Vec<ModuleMapping>,
    plt_stubs: Vec<PltStub>,
    skipped: Vec<SkippedModule>,
    /// The code objects read (loaded or skipped): path and lowest address.
    objects: Vec<(PathBuf, u64)>,
}

/// One mapping of a loaded module: where, which bytes of the file, whose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ModuleMapping {
    start: u64,
    end: u64,
    /// File offset of `start`.
    offset: u64,
    /// Index in `modules`.
    module: usize,
}

impl ProcessSymbols {
    /// Loads every code object mapped into `pid`. Objects that cannot be read (deleted
    /// files without privileges, unparsable ELF) are listed in [`Self::skipped`]; only a
    /// process that is missing or whose maps cannot be read is an error.
    pub fn load(pid: i32) -> Result<ProcessSymbols, SymbolError> {
        Self::load_matching(pid, |_| true)
    }

    /// Like [`Self::load`], reading only the objects whose target-side path satisfies
    /// `wanted` (e.g. just libc, to find `dlopen` quickly).
    pub fn load_matching(
        pid: i32,
        wanted: impl Fn(&Path) -> bool + Sync,
    ) -> Result<ProcessSymbols, SymbolError> {
        let mappings = maps::read_maps(pid)?;
        if mappings.is_empty() {
            return Err(SymbolError::NoMappings { pid });
        }
        let objects: Vec<MappedObject> = maps::code_objects(&mappings)
            .into_iter()
            .filter(|o| wanted(&o.path))
            .collect();
        let mut loaded = progress::with_progress(objects.len(), |p| load_all(pid, &objects, p));

        let mut this = ProcessSymbols {
            pid,
            functions: largest_table(&mut loaded),
            max_end: Vec::new(),
            modules: Vec::new(),
            mappings: Vec::new(),
            plt_stubs: Vec::new(),
            skipped: Vec::new(),
            objects: object_keys(&objects),
        };
        let mut loaded_objects = Vec::new();
        for (object, result) in objects.iter().zip(loaded) {
            match result {
                Ok(symbols) => {
                    this.modules.push(Module {
                        name: symbols.name,
                        path: symbols.path,
                        load_bias: symbols.load_bias,
                        start: object.mappings.iter().map(|m| m.start).min().unwrap_or(0),
                        end: object.mappings.iter().map(|m| m.end).max().unwrap_or(0),
                    });
                    this.functions.extend(symbols.functions);
                    this.plt_stubs.extend(symbols.plt_stubs);
                    loaded_objects.push(object);
                }
                Err(SymbolError::NoProcess { pid }) => return Err(SymbolError::NoProcess { pid }),
                Err(e) => this.skipped.push(SkippedModule {
                    path: object.path.clone(),
                    reason: e.to_string(),
                }),
            }
        }
        module::sort_functions(&mut this.functions);
        this.plt_stubs.sort_unstable_by_key(|s| s.addr);
        this.modules.sort_unstable_by_key(|m| m.start);
        this.mappings = module_mappings(&this.modules, &loaded_objects);
        this.max_end = this
            .functions
            .iter()
            .scan(0, |m, f| {
                *m = f.end().max(*m);
                Some(*m)
            })
            .collect();
        Ok(this)
    }

    /// The process these symbols were read from.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// All functions, sorted by address (aliases at one address are separate rows).
    pub fn functions(&self) -> &[Function] {
        &self.functions
    }

    /// Demangles every name now, on every core, for a view that lists them all (the
    /// root picker); a name is otherwise demangled when it is first read.
    pub fn demangle_all(&self) {
        super::demangle::demangle_every_name(&self.functions);
    }

    /// The loaded modules, sorted by address.
    pub fn modules(&self) -> &[Module] {
        &self.modules
    }

    /// Code objects that could not be read, with the reason.
    pub fn skipped(&self) -> &[SkippedModule] {
        &self.skipped
    }

    /// The function containing `addr`: the one starting closest below it whose size
    /// covers it (the first name, if several share that start). A zero-size symbol is
    /// returned only for its exact address, and only if no sized function contains it.
    pub fn lookup(&self, addr: u64) -> Option<&Function> {
        let fs = &self.functions;
        let upto = fs.partition_point(|f| f.addr <= addr);
        let mut found: Option<usize> = None;
        for i in (0..upto).rev() {
            if self.max_end[i] <= addr {
                break;
            }
            match found {
                Some(j) if fs[i].addr != fs[j].addr => break,
                _ if fs[i].contains(addr) => found = Some(i),
                _ => {}
            }
        }
        if let Some(i) = found {
            return Some(&fs[i]);
        }
        let exact = fs.partition_point(|f| f.addr < addr);
        fs.get(exact).filter(|f| f.addr == addr)
    }

    /// Whether `mappings` (the process's now) hold the code objects these symbols were
    /// read from, where they were: no library loaded or unloaded since. (For symbols
    /// loaded with [`Self::load`].)
    pub fn same_code_objects(&self, mappings: &[maps::Mapping]) -> bool {
        object_keys(&maps::code_objects(mappings)) == self.objects
    }

    /// The module mapped at `addr`: one of its mappings holds it (not only its span).
    pub fn module_at(&self, addr: u64) -> Option<&Module> {
        self.mapping_at(addr).map(|m| &self.modules[m.module])
    }

    fn mapping_at(&self, addr: u64) -> Option<&ModuleMapping> {
        let i = self.mappings.partition_point(|m| m.start <= addr);
        self.mappings[..i].last().filter(|m| addr < m.end)
    }

    /// Where the module's bytes at `addr` are mapped first: `addr` itself, except in a
    /// second mapping of the same file bytes (Node maps its builtins again near its JIT
    /// code), where it is the same byte in the module's first mapping of them — the
    /// address its symbols are at. `None` outside every module.
    pub fn canonical_address(&self, addr: u64) -> Option<u64> {
        let here = self.mapping_at(addr)?;
        let file_offset = addr - here.start + here.offset;
        let first = self
            .mappings
            .iter()
            .filter(|m| m.module == here.module)
            .find(|m| (m.offset..m.offset + (m.end - m.start)).contains(&file_offset))?;
        Some(first.start + (file_offset - first.offset))
    }

    /// Every PLT stub, sorted by address, with the GOT slot it jumps through.
    pub fn plt_stubs(&self) -> &[PltStub] {
        &self.plt_stubs
    }

    /// The PLT stub containing `addr`, with its GOT slot.
    pub fn plt_stub(&self, addr: u64) -> Option<&PltStub> {
        let i = self.plt_stubs.partition_point(|s| s.addr <= addr);
        self.plt_stubs[..i]
            .last()
            .filter(|s| addr < s.addr + s.size)
    }

    /// The functions matching `pattern`, sorted by address.
    ///
    /// * `name` — exact: the demangled name, the raw (mangled) name, or the C++ name
    ///   without parameters and return type (`ns::foo` matches `ns::foo(int)`).
    /// * a pattern containing `*`, `?` or `[` is a glob over the same names (`dee*`);
    ///   a literal match still counts, so `foo[abi:cxx11]()` finds itself.
    /// * `module:name` — `module` is a file name or path, exact or glob (`libc.so.6:malloc`,
    ///   `libc*:mall*`). The split is at the first colon that is not part of `::`, and
    ///   only if the text before it matches a loaded module; otherwise the whole pattern
    ///   is a name. So `std::vector<int>::size` and `f[abi:cxx11]` are names. An empty
    ///   name (`libc.so.6:`) matches every function of the module.
    /// * `0x…` — an address: the function that starts there, else the one whose code
    ///   holds it. The one way to name one of two functions that share a name in one
    ///   module (`static` functions of two source files).
    ///
    /// Nothing found is [`SymbolError::NoMatch`] with up to five close names.
    pub fn find(&self, pattern: &str) -> Result<Vec<&Function>, SymbolError> {
        pattern::find(&self.functions, &self.modules, pattern)
    }

    /// Whether `pattern` names `module` in a module part (`libc*:mall*` names
    /// `libc.so.6`; `mall*` and `*` name no module).
    pub fn pattern_names_module(&self, pattern: &str, module: &Module) -> bool {
        pattern::names_module(pattern, &self.modules, module)
    }
}

/// The functions of the module with the most, taken out of it, with room for everyone
/// else's: the process's table grows from it in place rather than copying it (a big
/// library's table is tens of MB).
fn largest_table(loaded: &mut [Result<ModuleSymbols, SymbolError>]) -> Vec<Function> {
    let total: usize = loaded.iter().flatten().map(|m| m.functions.len()).sum();
    let largest = loaded
        .iter_mut()
        .flatten()
        .max_by_key(|m| m.functions.len());
    let mut functions = largest.map_or_else(Vec::new, |m| std::mem::take(&mut m.functions));
    functions.reserve(total - functions.len());
    functions
}

/// Each object's path and lowest address.
fn object_keys(objects: &[MappedObject]) -> Vec<(PathBuf, u64)> {
    objects
        .iter()
        .map(|o| {
            let start = o.mappings.iter().map(|m| m.start).min().unwrap_or(0);
            (o.path.clone(), start)
        })
        .collect()
}

/// The mappings of the loaded `objects`, by module index, sorted by start.
fn module_mappings(modules: &[Module], objects: &[&MappedObject]) -> Vec<ModuleMapping> {
    let mut mappings: Vec<ModuleMapping> = objects
        .iter()
        .filter_map(|object| {
            let start = object.mappings.iter().map(|m| m.start).min()?;
            let module = modules.iter().position(|m| m.start == start)?;
            Some(object.mappings.iter().map(move |m| ModuleMapping {
                start: m.start,
                end: m.end,
                offset: m.offset,
                module,
            }))
        })
        .flatten()
        .collect();
    mappings.sort_unstable_by_key(|m| m.start);
    mappings
}

/// Loads each object on a small pool of threads; results keep the order of `objects`.
fn load_all(
    pid: i32,
    objects: &[MappedObject],
    progress: &Progress,
) -> Vec<Result<ModuleSymbols, SymbolError>> {
    let cache = CacheDir::open();
    let cache = cache.as_ref();
    let slots: Vec<Mutex<Option<Result<ModuleSymbols, SymbolError>>>> =
        objects.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(objects.len())
        .min(8);
    let work = || {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(object) = objects.get(i) else { break };
            let result = load_object(pid, object, cache);
            progress.tick();
            *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..workers {
            scope.spawn(work);
        }
        work();
    });
    slots
        .into_iter()
        .map(|s| {
            let taken = s.into_inner().unwrap_or_else(|e| e.into_inner());
            taken.expect("every object is loaded by some worker")
        })
        .collect()
}

fn load_object(
    pid: i32,
    object: &MappedObject,
    cache: Option<&CacheDir>,
) -> Result<ModuleSymbols, SymbolError> {
    let ranges: Vec<(u64, u64)> = object
        .mappings
        .iter()
        .map(|m| (m.start, m.offset))
        .collect();
    let no_segment = || SymbolError::BadElf {
        path: object.path.clone(),
        reason: "no mapping corresponds to a PT_LOAD segment".into(),
    };
    match object.kind {
        ObjectKind::Vdso => {
            let m = &object.mappings[0];
            let image = maps::read_memory(pid, m.start, m.end)?;
            let elf = module::parse_elf(&image, &object.path)?;
            let bias = module::load_bias(&elf, &ranges).ok_or_else(no_segment)?;
            Ok(ModuleSymbols::from_elf(&elf, &image, &object.path, bias))
        }
        ObjectKind::File { .. } => {
            let file = maps::open_object(pid, object)?;
            let image = module::map_file(&file, &object.path)?;
            cache::load_module(&file, &image, &object.path, &ranges, cache)
        }
    }
}
