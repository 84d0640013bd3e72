//! The functions of one ELF module, at the addresses it runs at.
//!
//! Six sources, merged in order of trust: `.symtab` (or, for a stripped file, the
//! `.symtab` of its separate debug file, found by build id), `.dynsym` (an entry with
//! the same address and name as a `.symtab` one is the same function; an alias with
//! another name stays a row of its own, as `nm` shows it), PLT stubs, the Go functions
//! of `.gopclntab` that no symbol overlaps (a stripped Go binary), and finally the
//! `.eh_frame` FDEs that no symbol overlaps, named `<file>+0x<offset>`. Every function
//! inside `.gopclntab`'s range is marked as Go code. All addresses are ELF virtual
//! addresses plus the load bias, which [`load_bias`] derives from `PT_LOAD` headers and
//! where the kernel mapped the file.

use foldhash::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use goblin::elf::Elf;
use goblin::elf::header::EM_X86_64;
use goblin::elf::program_header::PT_LOAD;
use goblin::elf::section_header::SHN_UNDEF;
use goblin::elf::sym::{STT_FUNC, STT_GNU_IFUNC};
use goblin::options::ParseOptions;
use memmap2::Mmap;

use super::builder::Builder;
use super::error::SymbolError;
use super::{Function, SymbolSource, fde, go_pclntab, plt};

/// A PLT stub and the GOT slot it jumps through (both runtime addresses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PltStub {
    pub addr: u64,
    pub size: u64,
    /// Where the stub loads its destination from; read it in the target to learn where
    /// the call really goes once the dynamic linker has bound it.
    pub got_slot: u64,
    /// The symbol the stub calls, without `@plt` (`memcpy`).
    pub target: String,
}

/// Every function of one ELF module, relocated by its load bias.
#[derive(Debug, Clone)]
pub struct ModuleSymbols {
    /// File name (`libc.so.6`), or `[vdso]`.
    pub name: String,
    /// Path as seen inside the target.
    pub path: PathBuf,
    /// Runtime address minus ELF virtual address.
    pub load_bias: u64,
    /// Sorted by address.
    pub functions: Vec<Function>,
    /// Sorted by address; each also appears in `functions` as `target@plt`.
    pub plt_stubs: Vec<PltStub>,
}

impl ModuleSymbols {
    /// Reads the ELF file at `path` (mapped, not copied) and relocates every function by
    /// `load_bias` (0 gives ELF virtual addresses, as `nm` prints them).
    pub fn from_file(path: impl AsRef<Path>, load_bias: u64) -> Result<Self, SymbolError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| SymbolError::io(path, e))?;
        let image = map_file(&file, path)?;
        Self::from_image(&image, path, load_bias)
    }

    /// Like [`ModuleSymbols::from_file`] for an image already in memory. `path` names
    /// the module (its file name becomes [`Function::module`]); it is not opened.
    pub fn from_image(image: &[u8], path: &Path, load_bias: u64) -> Result<Self, SymbolError> {
        let elf = parse_elf(image, path)?;
        Ok(Self::from_elf(&elf, image, path, load_bias))
    }

    /// The functions of `elf`, which was parsed from `image`.
    pub(super) fn from_elf(elf: &Elf, image: &[u8], path: &Path, load_bias: u64) -> Self {
        let name = module_name(path);
        let go_table =
            go_pclntab::from_elf(elf, image.len(), |range| &image[range]).and_then(Result::ok);
        let go_text = go_table
            .as_ref()
            .and_then(|table| table.text_range())
            .unwrap_or(0..0);
        let expected = elf.syms.len() + elf.dynsyms.len();
        let mut builder = Builder::new(&name, load_bias, go_text, expected);
        let debug_image = if elf.syms.is_empty() {
            separate_debug_file(elf, image, Path::new(DEBUG_ROOT))
        } else {
            None
        };
        let debug_elf = debug_image
            .as_ref()
            .and_then(|debug| parse_elf(debug, path).ok());
        let mut seen: HashSet<SymbolKey> = HashSet::default();
        let mut tables = vec![
            (&elf.syms, &elf.strtab, SymbolSource::Symtab),
            (&elf.dynsyms, &elf.dynstrtab, SymbolSource::Dynsym),
        ];
        if let Some(debug) = &debug_elf {
            tables.insert(0, (&debug.syms, &debug.strtab, SymbolSource::DebugFile));
        }
        let mut symbols = Vec::with_capacity(expected);
        for (syms, strtab, source) in tables {
            for sym in syms.iter() {
                let kind = sym.st_type();
                if (kind != STT_FUNC && kind != STT_GNU_IFUNC) || sym.st_shndx == SHN_UNDEF as usize
                {
                    continue;
                }
                let Some(raw) = strtab.get_at(sym.st_name).filter(|n| !n.is_empty()) else {
                    continue;
                };
                if seen.insert(SymbolKey(sym.st_value, raw)) {
                    let ifunc = kind == STT_GNU_IFUNC;
                    symbols.push((sym.st_value, sym.st_size, raw, source, ifunc));
                }
            }
        }
        builder.push_all(&symbols);

        let stubs = plt::stubs(elf, image);
        for stub in &stubs {
            let raw = format!("{}@plt", stub.target);
            if !seen.contains(&SymbolKey(stub.addr, raw.as_str())) {
                builder.push(stub.addr, stub.size, &raw, SymbolSource::Plt, false);
            }
        }
        let plt_stubs = stubs
            .into_iter()
            .map(|s| PltStub {
                addr: s.addr.wrapping_add(load_bias),
                size: s.size,
                got_slot: s.got_slot.wrapping_add(load_bias),
                target: s.target,
            })
            .collect();

        if let Some(table) = &go_table {
            let go_functions = table.functions().filter_map(|f| {
                let name = table.name(&f)?;
                Some((f.entry, f.end - f.entry, name.to_string()))
            });
            builder.add_uncovered(go_functions.collect(), Vec::new(), SymbolSource::GoPclntab);
        }
        let fdes = fde::ranges(elf, image).into_iter().map(|(start, len)| {
            let raw = format!("{name}+{start:#x}");
            (start, len, raw)
        });
        builder.add_uncovered(fdes.collect(), plt::section_ranges(elf), SymbolSource::Fde);
        let mut functions = builder.finish(path, name.len());
        sort_functions(&mut functions);
        ModuleSymbols {
            name,
            path: path.to_path_buf(),
            load_bias,
            functions,
            plt_stubs,
        }
    }
}

/// A symbol's address and name, hashed by the address and the name's length alone:
/// long C++ names are compared only when both match, which is rare but for the same
/// symbol in `.symtab` and `.dynsym`.
#[derive(PartialEq, Eq)]
struct SymbolKey<'a>(u64, &'a str);

impl std::hash::Hash for SymbolKey<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self.0, self.1.len()).hash(state);
    }
}

/// The name of the module at `path`: its file name (a library loaded from a memfd, as
/// tendril's agent is, is named by the memfd).
pub(super) fn module_name(path: &Path) -> String {
    match path.file_name() {
        Some(n) => {
            let n = n.to_string_lossy();
            n.strip_prefix("memfd:").unwrap_or(&n).to_string()
        }
        None => path.to_string_lossy().into_owned(),
    }
}

/// Where distributions install separate debug files (`.build-id/xx/yyyy.debug`).
pub(super) const DEBUG_ROOT: &str = "/usr/lib/debug";

/// The separate debug file of a stripped module, mapped: `<root>/.build-id/<first byte
/// of the build id>/<the rest>.debug`, if the module has a GNU build id and the file
/// exists, is an ELF file and carries the same build id.
fn separate_debug_file(elf: &Elf, image: &[u8], root: &Path) -> Option<Mmap> {
    let id = build_id(elf, image)?;
    let path = build_id_path(root, &id)?;
    let file = File::open(&path).ok()?;
    let debug = map_file(&file, &path).ok()?;
    let same = parse_elf(&debug, &path)
        .ok()
        .and_then(|debug_elf| build_id(&debug_elf, &debug))
        .is_some_and(|debug_id| debug_id == id);
    same.then_some(debug)
}

/// The module's GNU build id (`NT_GNU_BUILD_ID` note), if it has one.
pub(super) fn build_id(elf: &Elf, image: &[u8]) -> Option<Vec<u8>> {
    use goblin::elf::note::NT_GNU_BUILD_ID;
    let notes = elf
        .iter_note_headers(image)
        .into_iter()
        .flatten()
        .chain(elf.iter_note_sections(image, None).into_iter().flatten());
    notes
        .filter_map(Result::ok)
        .find(|note| note.n_type == NT_GNU_BUILD_ID && note.name == "GNU")
        .map(|note| note.desc.to_vec())
}

/// `<root>/.build-id/ab/cdef....debug` for build id `abcdef...`.
pub(super) fn build_id_path(root: &Path, id: &[u8]) -> Option<PathBuf> {
    let (first, rest) = id.split_first()?;
    let rest: String = rest.iter().map(|byte| format!("{byte:02x}")).collect();
    Some(
        root.join(".build-id")
            .join(format!("{first:02x}"))
            .join(format!("{rest}.debug")),
    )
}

/// Address order. At one address: symbol-table names before synthetic ones, then the
/// plainest name first (fewest leading underscores: `malloc` before `__libc_malloc`),
/// so that the first row at an address is the best name for it. A stable sort: a process's table is its modules' sorted tables one after another, runs which
/// it merges rather than sorting afresh; names are compared only at a shared address.
pub(super) fn sort_functions(functions: &mut [Function]) {
    let underscores = |f: &Function| f.raw_name.bytes().take_while(|&b| b == b'_').count();
    functions.sort_by(|a, b| {
        a.addr.cmp(&b.addr).then_with(|| {
            (a.source, underscores(a), &a.raw_name).cmp(&(b.source, underscores(b), &b.raw_name))
        })
    });
}

/// Maps `file` read-only.
pub(super) fn map_file(file: &File, path: &Path) -> Result<Mmap, SymbolError> {
    // SAFETY: the mapping is private and read-only, and we only read it. If another
    // process truncates or rewrites the file while we hold the map, reads may see the new
    // bytes (goblin and gimli bounds-check everything they parse) or fault with SIGBUS;
    // the same change would break the target that runs this file, so we accept it, as
    // every debugger and profiler that maps binaries does.
    let map = unsafe { Mmap::map(file) };
    map.map_err(|e| SymbolError::io(path, e))
}

/// Parses an x86-64 ELF image, strictly first, then permissively (tolerating, e.g., a
/// string table with invalid UTF-8).
pub(super) fn parse_elf<'a>(image: &'a [u8], path: &Path) -> Result<Elf<'a>, SymbolError> {
    if image.get(..4) != Some(b"\x7fELF") {
        return Err(SymbolError::BadElf {
            path: path.to_path_buf(),
            reason: "no ELF magic".into(),
        });
    }
    let elf = Elf::parse(image)
        .or_else(|_| Elf::parse_with_opts(image, &ParseOptions::permissive()))
        .map_err(|e| SymbolError::BadElf {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if elf.header.e_machine != EM_X86_64 {
        return Err(SymbolError::WrongArch {
            path: path.to_path_buf(),
            machine: elf.header.e_machine,
        });
    }
    Ok(elf)
}

/// The load bias of a module from where its file offsets are mapped: `mappings` holds
/// `(start address, file offset)` of each mapping of the file. The first mapping (in
/// the given order) whose offset lies in a `PT_LOAD` segment's file range decides:
/// runtime address of file offset `o` = `p_vaddr + (o - p_offset) + bias`.
/// `None` when no mapping corresponds to a loadable segment.
pub fn load_bias(elf: &Elf, mappings: &[(u64, u64)]) -> Option<u64> {
    const PAGE: u64 = 4096;
    let loads: Vec<_> = elf
        .program_headers
        .iter()
        .filter(|p| p.p_type == PT_LOAD && p.p_filesz > 0)
        .collect();
    for &(start, offset) in mappings {
        // Prefer the segment that starts on this mapping's page; segments sharing a page
        // (old layouts) are told apart by that.
        let seg = loads
            .iter()
            .find(|p| p.p_offset & !(PAGE - 1) == offset)
            .or_else(|| {
                loads.iter().find(|p| {
                    offset >= p.p_offset & !(PAGE - 1) && offset < p.p_offset + p.p_filesz
                })
            });
        if let Some(p) = seg {
            let vaddr = p.p_vaddr.wrapping_sub(p.p_offset).wrapping_add(offset);
            return Some(start.wrapping_sub(vaddr));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_id_names_its_debug_file() {
        let path = build_id_path(Path::new("/usr/lib/debug"), &[0x93, 0xac, 0x61, 0x0e]);
        assert_eq!(
            path,
            Some(PathBuf::from("/usr/lib/debug/.build-id/93/ac610e.debug"))
        );
        assert_eq!(build_id_path(Path::new("/x"), &[]), None);
    }
}
