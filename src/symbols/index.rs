//! The compact on-disk index of one module's functions, cached by build id.
//!
//! The one idea: a file read from the cache is untrusted input. It is accepted only if
//! its magic, format version, declared length and CRC-32 all hold and every offset in
//! it lies inside it; anything else is a miss, and the module is parsed afresh. The
//! index holds ELF virtual addresses (load bias 0), so one file serves every process
//! that maps the same build, wherever it is loaded.
//!
//! Layout (little endian): a 24-byte header (`TNDRSYM\0`, version u32, CRC-32 u32 of the
//! payload, payload length u64), then the payload: counts, fixed-size function and PLT
//! stub records holding offsets into a string table, and the string table. A function
//! whose display name is its mangled name demangled has a flag for it, and no second
//! text: names are demangled when read, so the index holds only mangled ones.
//!
//! A decoded module keeps the file's bytes whole as its string table: every name is a
//! range of them ([`SymbolText`](super::SymbolText)), checked to lie inside the table
//! on character boundaries (the table's UTF-8 is checked once). An index is written by
//! streaming it to its file, its checksum computed on the way.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use super::module::{ModuleSymbols, PltStub};
use super::text::StringTable;
use super::{Function, SymbolSource};

const MAGIC: &[u8; 8] = b"TNDRSYM\0";
/// Bump when the layout or what is stored in it changes. (2: demangled names are no
/// longer stored, only flagged.)
pub const VERSION: u32 = 2;
const HEADER: usize = 24;
const FUNCTION: usize = 40;
const STUB: usize = 32;
/// A function record's flags (its byte 33).
const IFUNC: u8 = 1;
const GO_CODE: u8 = 2;
/// The function's display name is its raw name demangled.
const DEMANGLED: u8 = 4;

/// The index of `symbols` (loaded at `symbols.load_bias`), addresses made ELF virtual.
#[cfg(test)]
pub fn encode(symbols: &ModuleSymbols) -> Vec<u8> {
    let mut payload = HashingWriter::new(Vec::new());
    write_payload(symbols, &mut payload).expect("writing to memory");
    let mut out = header(&payload).to_vec();
    out.extend_from_slice(&payload.inner);
    out
}

/// Writes the index of `symbols` to `file` (at its start), streamed: no copy of it is
/// made in memory (a big library's index is tens of MB).
pub fn write(symbols: &ModuleSymbols, file: &mut File) -> io::Result<()> {
    file.write_all(&[0; HEADER])?;
    let mut payload = HashingWriter::new(BufWriter::with_capacity(1 << 20, &mut *file));
    write_payload(symbols, &mut payload)?;
    payload.inner.flush()?;
    let header = header(&payload);
    drop(payload);
    file.write_all_at(&header, 0)
}

/// The header of an index whose payload went through `payload`.
fn header<W>(payload: &HashingWriter<W>) -> [u8; HEADER] {
    let mut header = [0; HEADER];
    header[..8].copy_from_slice(MAGIC);
    header[8..12].copy_from_slice(&VERSION.to_le_bytes());
    header[12..16].copy_from_slice(&payload.hasher.clone().finalize().to_le_bytes());
    header[16..].copy_from_slice(&payload.len.to_le_bytes());
    header
}

/// Counts and checksums what is written through it.
struct HashingWriter<W> {
    inner: W,
    hasher: crc32fast::Hasher,
    len: u64,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: crc32fast::Hasher::new(),
            len: 0,
        }
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(bytes)?;
        self.hasher.update(&bytes[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A function's display name as the index keeps it: `None` when it is the raw name
/// demangled (flagged, not stored) or the raw name itself, else the text to store.
fn stored_name(f: &Function) -> Option<&str> {
    let own_name = !demangled_from_raw(f) && f.name != f.raw_name;
    own_name.then(|| f.name.as_str())
}

/// Whether `f`'s display name is its raw name demangled when read.
fn demangled_from_raw(f: &Function) -> bool {
    f.name.mangled() == Some(f.raw_name.as_str())
}

/// The texts of `symbols` in the order the string table holds them (the module's
/// name, then per function its raw name and, when it is stored, its display name,
/// then each stub's target).
fn texts(symbols: &ModuleSymbols) -> impl Iterator<Item = &str> {
    let functions = symbols
        .functions
        .iter()
        .flat_map(|f| std::iter::once(f.raw_name.as_str()).chain(stored_name(f)));
    let stubs = symbols.plt_stubs.iter().map(|s| s.target.as_str());
    std::iter::once(symbols.name.as_str())
        .chain(functions)
        .chain(stubs)
}

/// The payload: counts, function records, stub records, string table.
fn write_payload(symbols: &ModuleSymbols, out: &mut impl Write) -> io::Result<()> {
    let too_big = || io::Error::other("the index would pass 4 GiB");
    let count = |n: usize| u32::try_from(n).map_err(|_| too_big());
    let strings_len = texts(symbols).map(str::len).sum::<usize>();
    for n in [
        symbols.functions.len(),
        symbols.plt_stubs.len(),
        strings_len,
        symbols.name.len(),
    ] {
        out.write_all(&count(n)?.to_le_bytes())?;
    }
    let bias = symbols.load_bias;
    // Offsets are handed out in the order of `texts`.
    let mut next = symbols.name.len() as u32;
    let mut add = |s: &str| {
        let at = next;
        next += s.len() as u32;
        [at, s.len() as u32]
    };
    for f in &symbols.functions {
        let raw = add(&f.raw_name);
        let name = stored_name(f).map_or(raw, &mut add);
        let mut record = [0u8; FUNCTION];
        record[..8].copy_from_slice(&f.addr.wrapping_sub(bias).to_le_bytes());
        record[8..16].copy_from_slice(&f.size.to_le_bytes());
        for (i, part) in [name[0], name[1], raw[0], raw[1]].into_iter().enumerate() {
            record[16 + 4 * i..20 + 4 * i].copy_from_slice(&part.to_le_bytes());
        }
        record[32] = source_code(f.source);
        let demangled = flag(demangled_from_raw(f), DEMANGLED);
        record[33] = flag(f.ifunc, IFUNC) | flag(f.go_code, GO_CODE) | demangled;
        out.write_all(&record)?;
    }
    for s in &symbols.plt_stubs {
        let target = add(&s.target);
        let mut record = [0u8; STUB];
        record[..8].copy_from_slice(&s.addr.wrapping_sub(bias).to_le_bytes());
        record[8..16].copy_from_slice(&s.size.to_le_bytes());
        record[16..24].copy_from_slice(&s.got_slot.wrapping_sub(bias).to_le_bytes());
        record[24..28].copy_from_slice(&target[0].to_le_bytes());
        record[28..32].copy_from_slice(&target[1].to_le_bytes());
        out.write_all(&record)?;
    }
    for text in texts(symbols) {
        out.write_all(text.as_bytes())?;
    }
    Ok(())
}

/// The module stored in `bytes`, relocated by `load_bias` and named `path`; `None`
/// unless the file is whole, of this version, and for the module named as `path` is.
/// The bytes are kept, not copied: every name of the module is a range of them
/// ([`StringTable`]).
pub fn decode(bytes: Vec<u8>, path: &Path, load_bias: u64) -> Option<ModuleSymbols> {
    let layout = Layout::check(&bytes)?;
    let strings = HEADER + layout.strings_at;
    let flags = |i: usize| bytes[HEADER + RECORDS + i * FUNCTION + 33];
    let slots = (0..layout.functions)
        .filter(|&i| flags(i) & DEMANGLED != 0)
        .count();
    let table = StringTable::new(bytes, strings..strings + layout.strings_len, slots)?;
    let module = table.text(0, layout.name_len)?;
    if super::module::module_name(path) != module.as_str() {
        return None;
    }
    let module_path: Arc<Path> = Arc::from(path);
    let payload = &table.bytes()[HEADER..];
    let mut functions = Vec::with_capacity(layout.functions);
    let mut next_slot = 0..;
    for i in 0..layout.functions {
        let r = &payload[RECORDS + i * FUNCTION..][..FUNCTION];
        let (flags, source) = (r[33], source_from(r[32])?);
        let raw = (u32_at(r, 24)?, u32_at(r, 28)?);
        let name = match flags & DEMANGLED != 0 {
            true => table.demangled_text(raw.0, raw.1, next_slot.next()?)?,
            false => table.text(u32_at(r, 16)?, u32_at(r, 20)?)?,
        };
        functions.push(Function {
            addr: u64_at(r, 0)?.wrapping_add(load_bias),
            size: u64_at(r, 8)?,
            module: module.clone(),
            module_path: module_path.clone(),
            name,
            raw_name: table.text(raw.0, raw.1)?,
            source,
            ifunc: flags & IFUNC != 0,
            go_code: flags & GO_CODE != 0,
        });
    }
    let stubs_at = RECORDS + layout.functions * FUNCTION;
    let mut plt_stubs = Vec::with_capacity(layout.stubs);
    for i in 0..layout.stubs {
        let r = &payload[stubs_at + i * STUB..][..STUB];
        plt_stubs.push(PltStub {
            addr: u64_at(r, 0)?.wrapping_add(load_bias),
            size: u64_at(r, 8)?,
            got_slot: u64_at(r, 16)?.wrapping_add(load_bias),
            target: table.text(u32_at(r, 24)?, u32_at(r, 28)?)?.to_string(),
        });
    }
    Some(ModuleSymbols {
        name: module.to_string(),
        path: path.to_path_buf(),
        load_bias,
        functions,
        plt_stubs,
    })
}

/// Where the parts of a checked index lie (offsets into its payload).
struct Layout {
    functions: usize,
    stubs: usize,
    strings_at: usize,
    strings_len: usize,
    name_len: u32,
}

/// The payload starts with four counts; the records follow.
const RECORDS: usize = 16;

impl Layout {
    /// The layout of `bytes`, if its header, length and checksum hold and its records
    /// and string table exactly fill its payload.
    fn check(bytes: &[u8]) -> Option<Layout> {
        let header = bytes.get(..HEADER)?;
        if &header[..8] != MAGIC || u32_at(header, 8)? != VERSION {
            return None;
        }
        let payload = &bytes[HEADER..];
        if u64_at(header, 16)? != payload.len() as u64
            || u32_at(header, 12)? != crc32fast::hash(payload)
        {
            return None;
        }
        let functions = u32_at(payload, 0)? as usize;
        let stubs = u32_at(payload, 4)? as usize;
        let strings_len = u32_at(payload, 8)? as usize;
        let strings_at = RECORDS
            .checked_add(functions.checked_mul(FUNCTION)?)?
            .checked_add(stubs.checked_mul(STUB)?)?;
        if strings_at.checked_add(strings_len)? != payload.len() {
            return None;
        }
        Some(Layout {
            functions,
            stubs,
            strings_at,
            strings_len,
            name_len: u32_at(payload, 12)?,
        })
    }
}

/// `bit` if `set`, else no bit.
fn flag(set: bool, bit: u8) -> u8 {
    if set { bit } else { 0 }
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

fn source_code(source: SymbolSource) -> u8 {
    match source {
        SymbolSource::Symtab => 0,
        SymbolSource::DebugFile => 1,
        SymbolSource::Dynsym => 2,
        SymbolSource::Plt => 3,
        SymbolSource::Fde => 4,
        SymbolSource::GoPclntab => 5,
    }
}

fn source_from(code: u8) -> Option<SymbolSource> {
    Some(match code {
        0 => SymbolSource::Symtab,
        1 => SymbolSource::DebugFile,
        2 => SymbolSource::Dynsym,
        3 => SymbolSource::Plt,
        4 => SymbolSource::Fde,
        5 => SymbolSource::GoPclntab,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_module() -> ModuleSymbols {
        let exe = std::env::current_exe().unwrap();
        ModuleSymbols::from_file(&exe, 0x1000).unwrap()
    }

    #[test]
    fn a_module_round_trips_at_another_bias() {
        let symbols = own_module();
        let bytes = encode(&symbols);
        let back = decode(bytes.clone(), &symbols.path, 0x1000).expect("a whole index");
        let mangled = |m: &ModuleSymbols| {
            m.functions
                .iter()
                .filter(|f| f.name.mangled().is_some())
                .count()
        };
        assert!(mangled(&symbols) > 1000, "Rust names, demangled when read");
        assert_eq!(
            mangled(&back),
            mangled(&symbols),
            "and still when read back"
        );
        assert_eq!(back.functions, symbols.functions);
        assert_eq!(back.plt_stubs, symbols.plt_stubs);
        let moved = decode(bytes, &symbols.path, 0x2000).unwrap();
        assert_eq!(moved.functions[0].addr, symbols.functions[0].addr + 0x1000);
    }

    #[test]
    fn a_damaged_index_is_refused() {
        let symbols = own_module();
        let bytes = encode(&symbols);
        assert!(decode(bytes[..bytes.len() - 1].to_vec(), &symbols.path, 0).is_none());
        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(decode(flipped, &symbols.path, 0).is_none());
        let mut newer = bytes.clone();
        newer[8] = newer[8].wrapping_add(1);
        assert!(decode(newer, &symbols.path, 0).is_none());
        assert!(decode(bytes, Path::new("/other/name.so"), 0).is_none());
        assert!(decode(Vec::new(), &symbols.path, 0).is_none());
    }

    /// `bytes` with its checksum made right again: damage only the structural checks
    /// can catch.
    fn with_checksum(mut bytes: Vec<u8>) -> Vec<u8> {
        let crc = crc32fast::hash(&bytes[HEADER..]);
        bytes[12..16].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    #[test]
    fn the_streamed_file_is_the_encoded_bytes() {
        let symbols = own_module();
        let path = std::env::temp_dir().join(format!("tendril-index-{}", std::process::id()));
        let mut file = File::create(&path).unwrap();
        write(&symbols, &mut file).unwrap();
        drop(file);
        let written = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(written, encode(&symbols));
        let back = decode(written, &symbols.path, symbols.load_bias).unwrap();
        assert_eq!(back.name, symbols.name);
        assert_eq!(back.functions.len(), symbols.functions.len());
    }

    #[test]
    fn every_name_shares_the_one_table() {
        let symbols = own_module();
        let back = decode(encode(&symbols), &symbols.path, 0x1000).unwrap();
        let f = &back.functions[0];
        assert_eq!(f.module, symbols.name.as_str());
        assert!(
            back.functions
                .iter()
                .all(|g| Arc::ptr_eq(&g.module_path, &f.module_path))
        );
    }

    #[test]
    fn a_truncated_index_is_refused_at_any_length() {
        let symbols = own_module();
        let bytes = encode(&symbols);
        let step = (bytes.len() / 997).max(1);
        for len in (0..bytes.len()).step_by(step) {
            let cut = bytes[..len].to_vec();
            assert!(decode(cut.clone(), &symbols.path, 0).is_none(), "{len}");
            // Even with a length and checksum that agree with what is left.
            if len >= HEADER {
                let mut cut = cut;
                let payload = (len - HEADER) as u64;
                cut[16..24].copy_from_slice(&payload.to_le_bytes());
                assert!(
                    decode(with_checksum(cut), &symbols.path, 0).is_none(),
                    "{len}"
                );
            }
        }
    }

    #[test]
    fn damaged_records_with_a_good_checksum_never_panic() {
        let symbols = own_module();
        let bytes = encode(&symbols);
        let records = HEADER + RECORDS;
        // Counts, and every field of the first records (offsets, lengths, source).
        let positions = (HEADER..records).chain(records..records + 4 * FUNCTION);
        for at in positions {
            for value in [0x00, 0x7f, 0xff] {
                let mut damaged = bytes.clone();
                damaged[at] = value;
                if let Some(back) = decode(with_checksum(damaged), &symbols.path, 0) {
                    // Whatever is accepted reads as text without panicking.
                    let total: usize = back.functions.iter().map(|f| f.name.len()).sum();
                    assert!(total > 0);
                }
            }
        }
        // A source code that names no source, and a name that runs past the table.
        let mut bad_source = bytes.clone();
        bad_source[records + 32] = 9;
        assert!(decode(with_checksum(bad_source), &symbols.path, 0).is_none());
        let mut past_end = bytes.clone();
        past_end[records + 20..records + 24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(with_checksum(past_end), &symbols.path, 0).is_none());
    }
}
