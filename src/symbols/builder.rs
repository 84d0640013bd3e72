//! Collecting one module's functions as they are found, into one string table.
//!
//! The one idea: every name found (the symbol as stored, its demangled form, a synthetic
//! `name@plt` or `module+0x…`) is appended to one growing buffer, the module's name
//! first, and a function is kept as offsets into it until all are found; then the
//! buffer becomes the module's [`StringTable`] and each function's texts are ranges of
//! it. A module of 300,000 functions costs a handful of allocations, not a million.
//!
//! Nothing is demangled here: a mangled name's display name is its demangled form,
//! made when first read ([`StringTable::demangled_text`]), so a load costs what the
//! names shown and searched cost, not what all of them would.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use super::demangle::is_mangled;
use super::text::StringTable;
use super::{Function, SymbolSource};

/// A symbol to add: ELF virtual address, size, name as stored, where it was found,
/// whether it is an indirect function.
pub(super) type Symbol<'a> = (u64, u64, &'a str, SymbolSource, bool);

/// A function found, its name as `(offset, length)` in the builder's buffer.
struct Found {
    vaddr: u64,
    size: u64,
    raw_name: (u32, u32),
    /// Whether its display name is the demangled form of its raw name (else the raw
    /// name itself).
    mangled: bool,
    source: SymbolSource,
    ifunc: bool,
}

pub(super) struct Builder {
    bias: u64,
    /// Go's functions (ELF addresses), from `.gopclntab`; empty without one.
    go_text: Range<u64>,
    /// The module's name, then every name found.
    strings: String,
    found: Vec<Found>,
}

impl Builder {
    /// A builder for the module `name` loaded at `bias`, room made for `expected`
    /// functions.
    pub(super) fn new(name: &str, bias: u64, go_text: Range<u64>, expected: usize) -> Builder {
        Builder {
            bias,
            go_text,
            strings: name.to_string(),
            found: Vec::with_capacity(expected),
        }
    }

    /// Appends `text` to the buffer; `None` once the buffer would pass 4 GiB.
    fn add_text(&mut self, text: &str) -> Option<(u32, u32)> {
        let at = u32::try_from(self.strings.len()).ok()?;
        let len = u32::try_from(text.len()).ok()?;
        at.checked_add(len)?;
        self.strings.push_str(text);
        Some((at, len))
    }

    /// Adds a function at ELF virtual address `vaddr`, shown as `raw_name` demangled.
    pub(super) fn push(
        &mut self,
        vaddr: u64,
        size: u64,
        raw_name: &str,
        source: SymbolSource,
        ifunc: bool,
    ) {
        let Some(raw) = self.add_text(raw_name) else {
            return;
        };
        self.found.push(Found {
            vaddr,
            size,
            raw_name: raw,
            mangled: is_mangled(raw_name),
            source,
            ifunc,
        });
    }

    /// Adds every symbol of `symbols` in order.
    pub(super) fn push_all(&mut self, symbols: &[Symbol<'_>]) {
        let stored: usize = symbols.iter().map(|&(_, _, raw, _, _)| raw.len()).sum();
        self.strings.reserve(stored);
        for &(vaddr, size, raw, source, ifunc) in symbols {
            self.push(vaddr, size, raw, source, ifunc);
        }
    }

    /// Adds every `(start, length, raw name)` (ELF virtual addresses) that neither a
    /// function found so far nor one of the `covered` ranges overlaps; a zero-size
    /// symbol covers its first byte. Names are kept as they are (no demangling).
    pub(super) fn add_uncovered(
        &mut self,
        mut found: Vec<(u64, u64, String)>,
        covered: Vec<(u64, u64)>,
        source: SymbolSource,
    ) {
        let mut known: Vec<(u64, u64)> = self
            .found
            .iter()
            .map(|f| (f.vaddr, f.vaddr.saturating_add(f.size.max(1))))
            .chain(covered)
            .collect();
        known.sort_unstable();
        // max_end[i]: the largest end among known[..=i].
        let max_end: Vec<u64> = known
            .iter()
            .scan(0, |m, &(_, end)| {
                *m = end.max(*m);
                Some(*m)
            })
            .collect();
        found.sort_unstable_by_key(|&(start, _, _)| start);
        found.dedup_by_key(|&mut (start, _, _)| start);
        for (start, len, raw) in found {
            let end = start.saturating_add(len);
            let before_end = known.partition_point(|&(s, _)| s < end);
            let covered = before_end > 0 && max_end[before_end - 1] > start;
            if covered {
                continue;
            }
            let Some(raw) = self.add_text(&raw) else {
                return;
            };
            self.found.push(Found {
                vaddr: start,
                size: len,
                raw_name: raw,
                mangled: false,
                source,
                ifunc: false,
            });
        }
    }

    /// The functions found, at their runtime addresses, in the order found; their
    /// module is named `path`.
    pub(super) fn finish(self, path: &Path, name_len: usize) -> Vec<Function> {
        let slots = self.found.iter().filter(|f| f.mangled).count();
        let table = StringTable::from_string(self.strings, slots);
        // Every range was pushed whole onto the buffer: it lies inside, at characters,
        // and there is a slot for each mangled name.
        let text = |(at, len): (u32, u32)| table.text(at, len).expect("a range pushed");
        let module = text((0, name_len as u32));
        let module_path: Arc<Path> = Arc::from(path);
        let mut next_slot = 0..;
        self.found
            .into_iter()
            .map(|f| Function {
                addr: f.vaddr.wrapping_add(self.bias),
                size: f.size,
                module: module.clone(),
                module_path: module_path.clone(),
                name: match f.mangled {
                    true => (next_slot.next())
                        .and_then(|slot| table.demangled_text(f.raw_name.0, f.raw_name.1, slot))
                        .expect("a slot for each mangled name"),
                    false => text(f.raw_name),
                },
                raw_name: text(f.raw_name),
                source: f.source,
                ifunc: f.ifunc,
                go_code: self.go_text.contains(&f.vaddr),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_go_into_one_table_demangled_and_uncovered_code_is_added() {
        let mut builder = Builder::new("app", 0x1000, 0x40..0x50, 2);
        builder.push(0x10, 8, "_ZN2ns3fooEi", SymbolSource::Symtab, false);
        builder.push(0x20, 8, "main", SymbolSource::Dynsym, true);
        let fdes = vec![(0x12, 4, "app+0x12".into()), (0x40, 4, "app+0x40".into())];
        builder.add_uncovered(fdes, Vec::new(), SymbolSource::Fde);
        let functions = builder.finish(Path::new("/bin/app"), 3);
        let rows: Vec<(u64, &str, &str, bool, bool)> = functions
            .iter()
            .map(|f| {
                (
                    f.addr,
                    f.name.as_str(),
                    f.raw_name.as_str(),
                    f.ifunc,
                    f.go_code,
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                (0x1010, "ns::foo(int)", "_ZN2ns3fooEi", false, false),
                (0x1020, "main", "main", true, false),
                (0x1040, "app+0x40", "app+0x40", false, true),
            ]
        );
        assert!(functions.iter().all(|f| f.module == "app"));
        assert_eq!(&*functions[0].module_path, Path::new("/bin/app"));
    }
}
