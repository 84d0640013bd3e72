//! Go's own function table, `.gopclntab`: which code Go compiled, each function's name,
//! and the stack pointer's offset at every instruction.
//!
//! The one idea: Go binaries carry no `.eh_frame` for Go code, and a stripped one no
//! symbols, but the Go runtime needs to walk its own stacks and name its own frames, so
//! every Go binary keeps the table the runtime uses for that (`runtime/symtab.go`).
//! It holds, per function, its entry, its name and a *pc-value table* `pcsp`: the
//! bytes the function has pushed below its entry's stack pointer, at each pc. A frame
//! whose sp is `sp` at `pc` returns to the word at `sp + pcsp(pc)` and its caller's sp
//! is that plus 8 (x86-64 has no link register): that is how the runtime unwinds, and
//! tendril's sampler the same way (`sampling/go_unwind.rs`). The same table tells the
//! patch targets apart: code inside it is Go's, which tendril must not hook.
//!
//! Formats read: Go 1.18–1.19 (magic `0xfffffff0`) and Go 1.20 on (`0xfffffff1`), whose
//! header and function table are one layout (entries as 32-bit offsets from the text
//! start), and Go 1.16–1.17 (`0xfffffffa`, entries as absolute addresses). Older
//! tables are refused with the reason. Every read is bounds-checked: a corrupt table
//! gives `None`, never a panic. Addresses are the ELF's (link time); callers add the
//! load bias.

use std::ops::{Deref, Range};

use goblin::elf::Elf;

/// The section a Go linker writes the table into.
pub const SECTION: &str = ".gopclntab";

/// The function is the outermost frame of a stack (`runtime.goexit`,
/// `runtime.mstart`, `runtime.rt0_go`): a walk ends there, complete.
pub const FLAG_TOP_FRAME: u8 = 1;
/// The function moves the stack pointer in a way the table cannot describe (a switch
/// of stacks: `runtime.systemstack`, `runtime.asmcgocall`, `runtime.morestack`).
pub const FLAG_SP_WRITE: u8 = 2;

/// The outermost functions by name, for tables without flags (Go 1.16).
const TOP_FRAMES: [&str; 4] = [
    "runtime.goexit",
    "runtime.mstart",
    "runtime.rt0_go",
    "runtime.mcall",
];

/// Which layout a table has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// Go 1.16 and 1.17: magic `0xfffffffa`.
    Go116,
    /// Go 1.18 and 1.19: magic `0xfffffff0`.
    Go118,
    /// Go 1.20 on: magic `0xfffffff1`.
    Go120,
}

/// A parsed table over its bytes (`D`: a slice, or a shared mapping).
pub struct PcLineTable<D> {
    data: D,
    version: Version,
    functions: usize,
    text_start: u64,
    names: usize,
    pc_tables: usize,
    function_table: usize,
}

/// One Go function: its entry and end (ELF addresses), and where its record lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoFunction {
    pub entry: u64,
    /// The next function's entry (or the end of Go's text).
    pub end: u64,
    record: usize,
}

impl<D: Deref<Target = [u8]>> PcLineTable<D> {
    /// Reads the header of the table in `data`; the reason if it is not a table this
    /// reader knows (another magic, not 64-bit, offsets outside the section).
    pub fn parse(data: D) -> Result<PcLineTable<D>, String> {
        let bytes: &[u8] = &data;
        let magic = read_u32(bytes, 0).ok_or("too short for a header")?;
        let version = match magic {
            0xffff_fffa => Version::Go116,
            0xffff_fff0 => Version::Go118,
            0xffff_fff1 => Version::Go120,
            0xffff_fffb => return Err("a Go 1.2–1.15 table, which tendril does not read".into()),
            other => return Err(format!("unknown magic {other:#010x}")),
        };
        if bytes.get(6..8) != Some(&[1, 8]) {
            return Err("not an x86-64 table (instruction size 1, pointers of 8 bytes)".into());
        }
        let word = |index: usize| read_u64(bytes, 8 + 8 * index).ok_or("truncated header");
        let functions = usize::try_from(word(0)?).map_err(|_| "too many functions")?;
        // Go 1.18 added the text start after the file count; the offsets follow.
        let (text_start, first_offset) = match version {
            Version::Go116 => (0, 2),
            Version::Go118 | Version::Go120 => (word(2)?, 3),
        };
        let offset = |index: usize| -> Result<usize, String> {
            let value = word(first_offset + index)?;
            usize::try_from(value)
                .ok()
                .filter(|&v| v < bytes.len())
                .ok_or_else(|| format!("offset {value:#x} lies outside the table"))
        };
        let table = PcLineTable {
            version,
            functions,
            text_start,
            names: offset(0)?,
            pc_tables: offset(3)?,
            function_table: offset(4)?,
            data,
        };
        let entry_size = table.entry_size();
        let needed = functions
            .checked_add(1)
            .and_then(|n| n.checked_mul(entry_size))
            .and_then(|n| n.checked_add(table.function_table));
        if needed.is_none_or(|end| end > table.data.len()) {
            return Err(format!("{functions} functions do not fit in the table"));
        }
        Ok(table)
    }

    pub fn version(&self) -> Version {
        self.version
    }

    /// The address function entries are counted from (0 for Go 1.16's absolute ones).
    pub fn text_start(&self) -> u64 {
        self.text_start
    }

    /// Sets the text start, for a position-independent binary whose header holds 0
    /// and a dynamic relocation the value ([`text_start_field`]).
    pub fn set_text_start(&mut self, text_start: u64) {
        self.text_start = text_start;
    }

    /// How many functions the table lists.
    pub fn len(&self) -> usize {
        self.functions
    }

    pub fn is_empty(&self) -> bool {
        self.functions == 0
    }

    /// The addresses Go's functions cover: the first entry to the end of the last.
    pub fn text_range(&self) -> Option<Range<u64>> {
        Some(self.entry(0)?..self.entry(self.functions)?)
    }

    fn entry_size(&self) -> usize {
        match self.version {
            Version::Go116 => 16,
            Version::Go118 | Version::Go120 => 8,
        }
    }

    /// Entry `index` of the function table (`index == len()` is the end of the text).
    fn entry(&self, index: usize) -> Option<u64> {
        let at = self.function_table + index * self.entry_size();
        match self.version {
            Version::Go116 => read_u64(&self.data, at),
            Version::Go118 | Version::Go120 => {
                Some(self.text_start + u64::from(read_u32(&self.data, at)?))
            }
        }
    }

    /// Function `index`, if its entry and record can be read.
    pub fn function(&self, index: usize) -> Option<GoFunction> {
        if index >= self.functions {
            return None;
        }
        let at = self.function_table + index * self.entry_size();
        let offset = match self.version {
            Version::Go116 => usize::try_from(read_u64(&self.data, at + 8)?).ok()?,
            Version::Go118 | Version::Go120 => read_u32(&self.data, at + 4)? as usize,
        };
        let record = self.function_table.checked_add(offset)?;
        (record < self.data.len()).then_some(())?;
        Some(GoFunction {
            entry: self.entry(index)?,
            end: self.entry(index + 1)?,
            record,
        })
    }

    /// Every function, in address order.
    pub fn functions(&self) -> impl Iterator<Item = GoFunction> + '_ {
        (0..self.functions).filter_map(|index| self.function(index))
    }

    /// The function whose code holds `pc`.
    pub fn find(&self, pc: u64) -> Option<GoFunction> {
        // The last entry at or below pc (entries are sorted).
        let (mut low, mut high) = (0, self.functions);
        while low < high {
            let middle = low + (high - low) / 2;
            if self.entry(middle)? <= pc {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        let function = self.function(low.checked_sub(1)?)?;
        (pc < function.end).then_some(function)
    }

    /// The function's name (`main.leaf`, `runtime.goexit`, `(*T).Method`…).
    pub fn name(&self, function: &GoFunction) -> Option<&str> {
        let field = match self.version {
            Version::Go116 => 8,
            Version::Go118 | Version::Go120 => 4,
        };
        let offset = read_u32(&self.data, function.record + field)? as usize;
        let start = self.names.checked_add(offset)?;
        let bytes = self.data.get(start..)?;
        let length = bytes.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&bytes[..length]).ok()
    }

    /// The function's flags ([`FLAG_TOP_FRAME`], [`FLAG_SP_WRITE`]); for a Go 1.16
    /// table, which has none, the outermost functions are known by name.
    pub fn flags(&self, function: &GoFunction) -> u8 {
        let field = match self.version {
            Version::Go118 => 37,
            Version::Go116 | Version::Go120 => 41,
        };
        let flags = self.data.get(function.record + field).copied().unwrap_or(0);
        let top_by_name = self
            .name(function)
            .is_some_and(|name| TOP_FRAMES.contains(&name));
        if top_by_name {
            flags | FLAG_TOP_FRAME
        } else {
            flags
        }
    }

    /// How many bytes below its entry's stack pointer the function's stack pointer is
    /// at `pc` (the return address lies at `sp + delta`); `None` if the function has no
    /// table or `pc` is outside it.
    pub fn sp_delta(&self, function: &GoFunction, pc: u64) -> Option<i32> {
        let field = match self.version {
            Version::Go116 => 20,
            Version::Go118 | Version::Go120 => 16,
        };
        let offset = read_u32(&self.data, function.record + field)? as usize;
        if offset == 0 || pc < function.entry || pc >= function.end {
            return None;
        }
        let table = self.data.get(self.pc_tables.checked_add(offset)?..)?;
        pc_value(table, function.entry, pc)
    }
}

/// The value a pc-value table gives at `target`, for a function entered at `entry`.
///
/// The table is a run of pairs (value delta, pc delta), each an unsigned LEB128
/// varint; the value delta is zig-zag encoded and the value starts at -1; each pair
/// says the value holds up to the pc it reaches. A value delta of 0 ends the table
/// (except in the first pair).
pub fn pc_value(mut table: &[u8], entry: u64, target: u64) -> Option<i32> {
    let mut pc = entry;
    let mut value: i32 = -1;
    let mut first = true;
    loop {
        let (value_delta, used) = varint(table)?;
        if value_delta == 0 && !first {
            return None;
        }
        table = &table[used..];
        let (pc_delta, used) = varint(table)?;
        table = &table[used..];
        first = false;
        value = value.wrapping_add(zig_zag(value_delta));
        pc = pc.checked_add(u64::from(pc_delta))?;
        if target < pc {
            return Some(value);
        }
    }
}

/// An unsigned LEB128 number of at most 32 bits, and the bytes it took.
fn varint(bytes: &[u8]) -> Option<(u32, usize)> {
    let mut value: u32 = 0;
    for (index, &byte) in bytes.iter().enumerate().take(5) {
        value |= u32::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Some((value, index + 1));
        }
    }
    None
}

fn zig_zag(value: u32) -> i32 {
    ((value >> 1) as i32) ^ -((value & 1) as i32)
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let word = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(word.try_into().ok()?))
}

fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let word = bytes.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(word.try_into().ok()?))
}

/// Where an ELF file keeps its table: the section's file range and address.
pub fn section(elf: &Elf, image_len: usize) -> Option<(Range<usize>, u64)> {
    let header = elf
        .section_headers
        .iter()
        .find(|h| elf.shdr_strtab.get_at(h.sh_name) == Some(SECTION))?;
    let start = usize::try_from(header.sh_offset).ok()?;
    let end = start.checked_add(usize::try_from(header.sh_size).ok()?)?;
    (header.sh_type != goblin::elf::section_header::SHT_NOBITS && end <= image_len)
        .then_some((start..end, header.sh_addr))
}

/// The table of `elf` over the bytes `make` gives for its section's range, with the
/// text start a position-independent binary leaves to a relocation filled in. `None`
/// if the file has no table; the reason if it has one this reader cannot use.
pub fn from_elf<D: Deref<Target = [u8]>>(
    elf: &Elf,
    image_len: usize,
    make: impl FnOnce(Range<usize>) -> D,
) -> Option<Result<PcLineTable<D>, String>> {
    let (range, address) = section(elf, image_len)?;
    let mut table = match PcLineTable::parse(make(range)) {
        Ok(table) => table,
        Err(reason) => return Some(Err(reason)),
    };
    if table.version() != Version::Go116 && table.text_start() == 0 {
        match text_start_field(elf, address) {
            Some(start) => table.set_text_start(start),
            None => return Some(Err("its text start is unknown".into())),
        }
    }
    Some(Ok(table))
}

/// The addend of the dynamic relocation that fills the header's text start (at
/// `table_address + 24`), for position-independent binaries.
pub fn text_start_field(elf: &Elf, table_address: u64) -> Option<u64> {
    let field = table_address + 24;
    elf.dynrelas
        .iter()
        .find(|r| r.r_offset == field)
        .and_then(|r| u64::try_from(r.r_addend?).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zig-zag, LEB128 pc-value table of `(value, up to pc offset)` runs.
    fn encode(runs: &[(i32, u32)]) -> Vec<u8> {
        let mut bytes = Vec::new();
        let (mut value, mut pc) = (-1i32, 0u32);
        for &(next, until) in runs {
            let delta = next - value;
            let zig = ((delta << 1) ^ (delta >> 31)) as u32;
            leb(&mut bytes, zig);
            leb(&mut bytes, until - pc);
            (value, pc) = (next, until);
        }
        bytes.push(0);
        bytes
    }

    fn leb(out: &mut Vec<u8>, mut value: u32) {
        loop {
            let byte = (value & 0x7f) as u8;
            value >>= 7;
            if value == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }

    /// One function of a test table: entry offset, name, pcsp runs.
    type TestFunction<'a> = (u32, &'a str, &'a [(i32, u32)]);

    /// A Go 1.18 (or 1.20) table of `functions`.
    fn table(magic: u32, text: u64, functions: &[TestFunction], end: u32) -> Vec<u8> {
        let flag_field = if magic == 0xffff_fff0 { 37 } else { 41 };
        let mut names = Vec::new();
        let mut pc_tables = vec![0u8]; // offset 0 means "no table"
        let mut records = Vec::new();
        for (index, &(entry, name, runs)) in functions.iter().enumerate() {
            let mut record = vec![0u8; 44];
            record[..4].copy_from_slice(&entry.to_le_bytes());
            record[4..8].copy_from_slice(&(names.len() as u32).to_le_bytes());
            record[16..20].copy_from_slice(&(pc_tables.len() as u32).to_le_bytes());
            record[flag_field] = if index == 1 { FLAG_SP_WRITE } else { 0 };
            names.extend_from_slice(name.as_bytes());
            names.push(0);
            pc_tables.extend(encode(runs));
            records.push(record);
        }
        let header = 72;
        let names_at = header;
        let pc_at = names_at + names.len();
        let table_at = pc_at + pc_tables.len();
        let records_at = (functions.len() + 1) * 8;
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&magic.to_le_bytes());
        bytes.extend_from_slice(&[0, 0, 1, 8]);
        for word in [
            functions.len() as u64,
            0,
            text,
            names_at as u64,
            0,
            0,
            pc_at as u64,
            table_at as u64,
        ] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes.extend(names);
        bytes.extend(pc_tables);
        for (index, &(entry, _, _)) in functions.iter().enumerate() {
            bytes.extend_from_slice(&entry.to_le_bytes());
            let record = (records_at + 44 * index) as u32;
            bytes.extend_from_slice(&record.to_le_bytes());
        }
        bytes.extend_from_slice(&end.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        for record in records {
            bytes.extend(record);
        }
        bytes
    }

    const LEAF: &[(i32, u32)] = &[(0, 0x36)];
    // main.top as Go 1.19 builds it: 0 up to the SUBQ, 0x18 in the body, 0 at the RET,
    // then the morestack call after it at 0 again.
    const TOP: &[(i32, u32)] = &[(0, 0x6), (0x18, 0x3c), (0, 0x3d), (0x8, 0x4d)];

    #[test]
    fn functions_are_found_named_and_bounded() {
        for magic in [0xffff_fff0, 0xffff_fff1] {
            let bytes = table(
                magic,
                0x401000,
                &[(0, "main.leaf", LEAF), (0x40, "main.top", TOP)],
                0x90,
            );
            let table = PcLineTable::parse(&bytes[..]).unwrap();
            assert_eq!(table.len(), 2);
            assert_eq!(table.text_range(), Some(0x401000..0x401090));
            let leaf = table.find(0x401010).unwrap();
            assert_eq!((leaf.entry, leaf.end), (0x401000, 0x401040));
            assert_eq!(table.name(&leaf), Some("main.leaf"));
            let top = table.find(0x40108f).unwrap();
            assert_eq!(table.name(&top), Some("main.top"));
            assert_eq!(table.flags(&top), FLAG_SP_WRITE);
            assert_eq!(table.flags(&leaf), 0);
            assert_eq!(table.find(0x400fff), None);
            assert_eq!(table.find(0x401090), None);
            let names: Vec<&str> = table.functions().filter_map(|f| table.name(&f)).collect();
            assert_eq!(names, ["main.leaf", "main.top"]);
        }
    }

    #[test]
    fn the_sp_delta_follows_the_prologue_and_epilogue() {
        let bytes = table(0xffff_fff0, 0x1000, &[(0, "main.top", TOP)], 0x50);
        let table = PcLineTable::parse(&bytes[..]).unwrap();
        let top = table.find(0x1000).unwrap();
        let delta = |offset: u64| table.sp_delta(&top, 0x1000 + offset);
        assert_eq!(delta(0), Some(0));
        assert_eq!(delta(5), Some(0));
        assert_eq!(delta(6), Some(0x18));
        assert_eq!(delta(0x20), Some(0x18));
        assert_eq!(delta(0x3c), Some(0));
        assert_eq!(delta(0x3d), Some(8));
        assert_eq!(delta(0x4c), Some(8));
        assert_eq!(delta(0x4d), None, "past the table's end");
        assert_eq!(delta(0x50), None, "outside the function");
    }

    #[test]
    fn pc_values_decode_multi_byte_and_negative_deltas() {
        let bytes = encode(&[(0, 1), (300, 200), (-2, 70_000), (5, 70_001)]);
        assert_eq!(pc_value(&bytes, 0, 0), Some(0));
        assert_eq!(pc_value(&bytes, 0, 199), Some(300));
        assert_eq!(pc_value(&bytes, 0, 200), Some(-2));
        assert_eq!(pc_value(&bytes, 0, 69_999), Some(-2));
        assert_eq!(pc_value(&bytes, 0, 70_000), Some(5));
        assert_eq!(pc_value(&bytes, 0, 70_001), None);
        assert_eq!(pc_value(&[0x80, 0x80], 0, 0), None, "truncated varint");
    }

    #[test]
    fn bad_tables_are_refused_with_the_reason() {
        let good = table(0xffff_fff0, 0x1000, &[(0, "f", LEAF)], 0x40);
        let mut old = good.clone();
        old[..4].copy_from_slice(&0xffff_fffbu32.to_le_bytes());
        assert!(PcLineTable::parse(&old[..]).err().unwrap().contains("1.2"));
        let mut arm32 = good.clone();
        arm32[7] = 4;
        assert!(PcLineTable::parse(&arm32[..]).is_err());
        assert!(PcLineTable::parse(&good[..good.len() - 60]).is_err());
        let mut many = good.clone();
        many[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(PcLineTable::parse(&many[..]).is_err());
        assert!(PcLineTable::parse(&good[..3]).is_err());
    }

    #[test]
    fn go_1_16_tables_use_absolute_entries_and_name_the_top_frames() {
        // Header: magic, pads, nfunc, nfiles, then five offsets (no text start).
        let name = b"runtime.goexit\0";
        let names_at = 64u64;
        let table_at = names_at + name.len() as u64 + 1;
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&0xffff_fffau32.to_le_bytes());
        bytes.extend_from_slice(&[0, 0, 1, 8]);
        for word in [1, 0, names_at, 0, 0, names_at + name.len() as u64, table_at] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes.extend_from_slice(name);
        bytes.push(0);
        let record = 32u64;
        for word in [0x45_0000u64, record, 0x45_0020, 0] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        let mut function = vec![0u8; 44];
        function[..8].copy_from_slice(&0x45_0000u64.to_le_bytes());
        bytes.extend(function);
        let table = PcLineTable::parse(&bytes[..]).unwrap();
        assert_eq!(table.version(), Version::Go116);
        let goexit = table.find(0x45_0010).unwrap();
        assert_eq!((goexit.entry, goexit.end), (0x45_0000, 0x45_0020));
        assert_eq!(table.name(&goexit), Some("runtime.goexit"));
        assert_eq!(table.flags(&goexit), FLAG_TOP_FRAME);
        assert_eq!(table.sp_delta(&goexit, 0x45_0000), None, "no pcsp table");
    }
}
