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
//! stub records holding offsets into a string table, and the string table.

use std::path::Path;
use std::sync::Arc;

use super::module::{ModuleSymbols, PltStub};
use super::text::StringTable;
use super::{Function, SymbolSource};

const MAGIC: &[u8; 8] = b"TNDRSYM\0";
/// Bump when the layout or what is stored in it changes.
pub const VERSION: u32 = 1;
const HEADER: usize = 24;
const FUNCTION: usize = 40;
const STUB: usize = 32;

/// The index of `symbols` (loaded at `symbols.load_bias`), addresses made ELF virtual.
pub fn encode(symbols: &ModuleSymbols) -> Vec<u8> {
    let bias = symbols.load_bias;
    let mut strings: Vec<u8> = symbols.name.as_bytes().to_vec();
    let mut add = |s: &str| {
        let at = strings.len() as u32;
        strings.extend_from_slice(s.as_bytes());
        (at, s.len() as u32)
    };
    let mut records =
        Vec::with_capacity(symbols.functions.len() * FUNCTION + symbols.plt_stubs.len() * STUB);
    for f in &symbols.functions {
        let raw = add(&f.raw_name);
        let name = if f.name == f.raw_name {
            raw
        } else {
            add(&f.name)
        };
        records.extend_from_slice(&f.addr.wrapping_sub(bias).to_le_bytes());
        records.extend_from_slice(&f.size.to_le_bytes());
        for part in [name.0, name.1, raw.0, raw.1] {
            records.extend_from_slice(&part.to_le_bytes());
        }
        let flags = u8::from(f.ifunc) | (u8::from(f.go_code) << 1);
        records.extend_from_slice(&[source_code(f.source), flags, 0, 0, 0, 0, 0, 0]);
    }
    for s in &symbols.plt_stubs {
        let target = add(&s.target);
        records.extend_from_slice(&s.addr.wrapping_sub(bias).to_le_bytes());
        records.extend_from_slice(&s.size.to_le_bytes());
        records.extend_from_slice(&s.got_slot.wrapping_sub(bias).to_le_bytes());
        records.extend_from_slice(&target.0.to_le_bytes());
        records.extend_from_slice(&target.1.to_le_bytes());
    }
    let mut payload = Vec::with_capacity(16 + records.len() + strings.len());
    for count in [
        symbols.functions.len() as u32,
        symbols.plt_stubs.len() as u32,
        strings.len() as u32,
        symbols.name.len() as u32,
    ] {
        payload.extend_from_slice(&count.to_le_bytes());
    }
    payload.extend_from_slice(&records);
    payload.extend_from_slice(&strings);
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// The module stored in `bytes`, relocated by `load_bias` and named `path`; `None`
/// unless the file is whole, of this version, and for the module named as `path` is.
/// The bytes are kept, not copied: every name of the module is a range of them
/// ([`StringTable`]).
pub fn decode(bytes: Vec<u8>, path: &Path, load_bias: u64) -> Option<ModuleSymbols> {
    let layout = Layout::check(&bytes)?;
    let strings = HEADER + layout.strings_at;
    let table = StringTable::new(bytes, strings..strings + layout.strings_len)?;
    let module = table.text(0, layout.name_len)?;
    if super::module::module_name(path) != module.as_str() {
        return None;
    }
    let module_path: Arc<Path> = Arc::from(path);
    let payload = &table.bytes()[HEADER..];
    let mut functions = Vec::with_capacity(layout.functions);
    for i in 0..layout.functions {
        let r = &payload[RECORDS + i * FUNCTION..][..FUNCTION];
        let (flags, source) = (r[33], source_from(r[32])?);
        functions.push(Function {
            addr: u64_at(r, 0)?.wrapping_add(load_bias),
            size: u64_at(r, 8)?,
            module: module.clone(),
            module_path: module_path.clone(),
            name: table.text(u32_at(r, 16)?, u32_at(r, 20)?)?,
            raw_name: table.text(u32_at(r, 24)?, u32_at(r, 28)?)?,
            source,
            ifunc: flags & 1 != 0,
            go_code: flags & 2 != 0,
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
}
