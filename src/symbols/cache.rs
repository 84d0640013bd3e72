//! Loading a module through the symbol cache: headers first, the full parse only on a
//! miss.
//!
//! The one idea: what a warm load must not do is parse the module's symbol tables,
//! relocations and `.eh_frame` (goblin's `Elf::parse` reads them all) or demangle.
//! So the module's ELF header, program headers and section headers are read alone —
//! enough for its build id and its load bias — and the build id (with the module's
//! name and whether it relies on a separate debug file) names a cache file
//! ([`super::index`]); a module without one is named by its file's identity. A hit is
//! decoded; a miss parses the module as before and writes the index for next time.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use goblin::container::{Container, Ctx, Endian};
use goblin::elf::Elf;
use goblin::elf::header::EM_X86_64;
use goblin::elf::program_header::ProgramHeader;
use goblin::elf::section_header::{SHT_SYMTAB, SectionHeader};

use super::cache_dir::CacheDir;
use super::error::SymbolError;
use super::index;
use super::module::{self, ModuleSymbols};

/// The largest cache file read (a 150 MB library's index is a few tens of MB).
const INDEX_LIMIT: u64 = 1 << 30;

/// The functions of the ELF `image` at `path`, whose file offsets are mapped at the
/// `(start, offset)` pairs of `ranges`: from `cache` when it holds this build, else
/// parsed (and then stored in `cache`).
pub(super) fn load_module(
    file: &File,
    image: &[u8],
    path: &Path,
    ranges: &[(u64, u64)],
    cache: Option<&CacheDir>,
) -> Result<ModuleSymbols, SymbolError> {
    let no_segment = || SymbolError::BadElf {
        path: path.to_path_buf(),
        reason: "no mapping corresponds to a PT_LOAD segment".into(),
    };
    let key = match (cache, headers_only(image)) {
        (Some(cache), Some(headers)) => {
            let bias = module::load_bias(&headers, ranges).ok_or_else(no_segment)?;
            let key = cache_key(&headers, file, image, path);
            let hit = key
                .as_deref()
                .and_then(|key| cache.read(key, INDEX_LIMIT))
                .and_then(|bytes| index::decode(bytes, path, bias));
            if let Some(symbols) = hit {
                return Ok(symbols);
            }
            key.map(|key| (cache, key))
        }
        _ => None,
    };
    let elf = module::parse_elf(image, path)?;
    let bias = module::load_bias(&elf, ranges).ok_or_else(no_segment)?;
    let symbols = ModuleSymbols::from_elf(&elf, image, path, bias);
    if let Some((cache, key)) = key {
        // A cache that cannot be written (disk full, read-only home) costs only speed.
        let _ = cache.write_with(&key, |file| index::write(&symbols, file));
    }
    Ok(symbols)
}

/// The ELF header, program headers and section headers of `image`, nothing else; `None`
/// for anything but a well-formed little-endian x86-64 ELF64 image.
fn headers_only(image: &[u8]) -> Option<Elf<'_>> {
    if image.get(..4) != Some(b"\x7fELF") {
        return None;
    }
    let header = Elf::parse_header(image).ok()?;
    if header.e_machine != EM_X86_64 {
        return None;
    }
    let ctx = Ctx::new(Container::Big, Endian::Little);
    let mut elf = Elf::lazy_parse(header).ok()?;
    let phoff = usize::try_from(header.e_phoff).ok()?;
    let shoff = usize::try_from(header.e_shoff).ok()?;
    elf.program_headers = ProgramHeader::parse(image, phoff, header.e_phnum.into(), ctx).ok()?;
    elf.section_headers = SectionHeader::parse(image, shoff, header.e_shnum.into(), ctx).ok()?;
    Some(elf)
}

/// `<build>-<name hash>-<s|d|n>.v<version>.idx`: the build, the name the module is
/// shown by, and where its full symbol table comes from (its own `.symtab`, a separate
/// debug file, or none — so installing a debug package later is a miss, not a stale
/// hit). The build is the GNU build id, or for a module without one (Rust's toolchain
/// libraries have none) the file's identity: device, inode, size, and modification and
/// change times, the last of which no one can set back.
fn cache_key(headers: &Elf, file: &File, image: &[u8], path: &Path) -> Option<String> {
    let id = module::build_id(headers, image);
    let has_symtab = headers
        .section_headers
        .iter()
        .any(|s| s.sh_type == SHT_SYMTAB && s.sh_size > 0);
    let debug_file = || {
        let root = Path::new(module::DEBUG_ROOT);
        id.as_ref()
            .and_then(|id| module::build_id_path(root, id))
            .is_some_and(|p| p.exists())
    };
    let symtab = match () {
        () if has_symtab => 's',
        () if debug_file() => 'd',
        () => 'n',
    };
    let build = match &id {
        Some(id) => id.iter().map(|b| format!("{b:02x}")).collect(),
        None => file_identity(file)?,
    };
    let name = module::module_name(path);
    let name_hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    Some(format!(
        "{build}-{name_hash:016x}-{symtab}.v{}.idx",
        index::VERSION
    ))
}

/// What names a file without a build id: device, inode, size, and modification and
/// change times (a rewritten or replaced file is another file).
fn file_identity(file: &File) -> Option<String> {
    let m = file.metadata().ok()?;
    Some(format!(
        "file-{:x}-{:x}-{:x}-{}.{}-{}.{}",
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh file holding `bytes`, in a private scratch directory.
    fn scratch_file(tag: &str, bytes: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("tendril-identity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(tag);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn another_file_or_a_rewritten_one_has_another_identity() {
        let a = scratch_file("a", b"the same bytes");
        let b = scratch_file("b", b"the same bytes");
        let identity = |p: &Path| file_identity(&File::open(p).unwrap()).unwrap();
        let first = identity(&a);
        assert_eq!(identity(&a), first, "the same file, unchanged");
        assert_ne!(identity(&b), first, "a copy is another file");
        std::fs::write(&a, b"other bytes, longer").unwrap();
        assert_ne!(identity(&a), first, "a rewritten file is another file");
        let _ = std::fs::remove_dir_all(a.parent().unwrap());
    }
}
