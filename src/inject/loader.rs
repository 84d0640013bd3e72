//! Finding the target's dynamic loader entry points: `dlopen`, `syscall` (to make the
//! agent's memfd) and the functions a thread must not be inside when we borrow it to
//! call `dlopen`.
//!
//! Since glibc 2.34 `dlopen` is exported by libc itself; older glibc exports
//! `__libc_dlopen_mode`, and musl exports `dlopen` from its single libc. We read the
//! dynamic symbol table of each mapped library through `/proc/PID/root`, so targets in
//! other mount namespaces (containers) resolve against their own libc.

use crate::process::{AttachError, TargetProcess};
use crate::symbols::maps::Mapping;
use goblin::elf::Elf;
use std::ops::Range;

/// Addresses in the target needed to load the agent safely.
#[derive(Debug, Clone)]
pub struct LoaderEntryPoints {
    /// `dlopen(path, flags)` or an equivalent with the same calling convention.
    pub dlopen: u64,
    /// `dlerror()`, to explain a failed `dlopen`, when available.
    pub dlerror: Option<u64>,
    /// `syscall(number, ...)`, to make the agent's memfd with (every libc has it).
    pub syscall: Option<u64>,
    /// `mmap` and `munmap` of the same library, to give the call a stack of its own.
    pub mmap: Option<(u64, u64)>,
    /// `munmap(addr, len)`, to remove what a failed `dlopen` left mapped.
    pub munmap: Option<u64>,
    /// Code ranges that may hold allocator or loader locks: a thread whose pc or recent
    /// return addresses lie in one of them is not borrowed.
    pub unsafe_ranges: Vec<Range<u64>>,
}

/// libc functions that take the allocator's or the loader's locks.
const LOCK_TAKING_FUNCTIONS: &[&str] = &[
    "malloc",
    "free",
    "calloc",
    "realloc",
    "reallocarray",
    "memalign",
    "aligned_alloc",
    "posix_memalign",
    "valloc",
    "pvalloc",
    "malloc_trim",
    "malloc_stats",
    "malloc_info",
    "mallinfo",
    "mallinfo2",
    "fork",
    "_Fork",
    "dlopen",
    "dlmopen",
    "dlclose",
    "dlsym",
    "dlvsym",
    "dladdr",
    "dladdr1",
    "dlinfo",
    "dl_iterate_phdr",
    "__libc_dlopen_mode",
    "__libc_dlsym",
    "__libc_dlclose",
    "pthread_create",
    "exit",
    "__cxa_finalize",
    "__cxa_thread_atexit_impl",
];

/// Looks up the loader entry points in the libraries mapped into `target`.
pub fn find_entry_points(
    target: &TargetProcess,
    maps: &[Mapping],
) -> Result<LoaderEntryPoints, AttachError> {
    let pid = target.pid;
    let mut modules: Vec<&std::path::Path> = maps.iter().filter_map(|m| m.file()).collect();
    modules.dedup();
    // libc first: it is where dlopen lives on every current system.
    modules.sort_by_key(|path| {
        !path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("libc"))
    });

    let mut found: Option<LoaderEntryPoints> = None;
    let mut unsafe_ranges = Vec::new();
    for path in modules {
        let module_maps: Vec<&Mapping> = maps.iter().filter(|m| m.file() == Some(path)).collect();
        let is_loader = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("ld-"));
        if is_loader {
            // Lazy binding and every dl* function run here; none of it is a safe point.
            unsafe_ranges.extend(
                module_maps
                    .iter()
                    .filter(|m| m.executable)
                    .map(|m| m.start..m.end),
            );
        }
        if found.is_some() && !is_loader {
            continue;
        }
        let Ok(bytes) = std::fs::read(target.path_in_target(path)) else {
            continue;
        };
        let Ok(elf) = Elf::parse(&bytes) else {
            continue;
        };
        let Some(bias) = mapping_bias(&elf, &module_maps) else {
            continue;
        };
        let lookup = |name: &str| -> Option<(u64, u64)> {
            elf.dynsyms.iter().find_map(|sym| {
                let is_defined_function =
                    sym.st_value != 0 && sym.st_type() == goblin::elf::sym::STT_FUNC;
                (is_defined_function && elf.dynstrtab.get_at(sym.st_name) == Some(name))
                    .then(|| (bias.wrapping_add(sym.st_value), sym.st_size))
            })
        };
        if found.is_none()
            && let Some((dlopen, _)) = lookup("dlopen").or_else(|| lookup("__libc_dlopen_mode"))
        {
            unsafe_ranges.extend(
                LOCK_TAKING_FUNCTIONS
                    .iter()
                    .filter_map(|name| lookup(name))
                    .map(|(address, size)| address..address + size.max(1)),
            );
            found = Some(LoaderEntryPoints {
                dlopen,
                dlerror: lookup("dlerror").map(|(a, _)| a),
                syscall: lookup("syscall").map(|(a, _)| a),
                mmap: lookup("mmap")
                    .zip(lookup("munmap"))
                    .map(|((m, _), (u, _))| (m, u)),
                munmap: lookup("munmap").map(|(a, _)| a),
                unsafe_ranges: Vec::new(),
            });
        }
    }
    let mut entry_points = found.ok_or_else(|| AttachError::Other {
        pid,
        message: "no library of the target provides dlopen (is it still starting up?), so tendril cannot load its agent".into(),
    })?;
    entry_points.unsafe_ranges = unsafe_ranges;
    Ok(entry_points)
}

/// The load bias of a module from its mappings (see [`crate::symbols::load_bias`]).
pub fn mapping_bias(elf: &Elf, mappings: &[&Mapping]) -> Option<u64> {
    let pairs: Vec<(u64, u64)> = mappings.iter().map(|m| (m.start, m.offset)).collect();
    crate::symbols::load_bias(elf, &pairs)
}
