//! Collecting one module's functions as they are found, into one string table.
//!
//! The one idea: every name found (the symbol as stored, its demangled form, a synthetic
//! `name@plt` or `module+0x…`) is appended to one growing buffer, the module's name
//! first, and a function is kept as offsets into it until all are found; then the
//! buffer becomes the module's [`StringTable`] and each function's texts are ranges of
//! it. A module of 300,000 functions costs a handful of allocations, not a million.
//!
//! Demangling is most of a large module's load (half of `librustc_driver`'s, whose
//! LLVM part is C++): [`Builder::push_all`] splits a large symbol table between a few
//! threads, each demangling into a buffer of its own, and appends their buffers in
//! order, so the table comes out as one thread would have made it.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use super::demangle::demangle_into;
use super::text::StringTable;
use super::{Function, SymbolSource};

/// From this many symbols, a module's names are demangled on several threads.
const PARALLEL_FROM: usize = 20_000;
/// The most threads that demangle one module's names.
const MAX_DEMANGLING_THREADS: usize = 4;

/// A symbol to add: ELF virtual address, size, name as stored, where it was found,
/// whether it is an indirect function.
pub(super) type Symbol<'a> = (u64, u64, &'a str, SymbolSource, bool);

/// A function found, its texts as `(offset, length)` in the builder's buffer.
struct Found {
    vaddr: u64,
    size: u64,
    name: (u32, u32),
    raw_name: (u32, u32),
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

    /// Adds a function at ELF virtual address `vaddr`, named by demangling `raw_name`.
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
        // `before` fits in a u32: `add_text` just checked that the buffer's end does.
        let before = self.strings.len();
        let demangled = demangle_into(raw_name, &mut self.strings);
        let fits = u32::try_from(self.strings.len()).is_ok();
        let name = if demangled && fits {
            (before as u32, (self.strings.len() - before) as u32)
        } else {
            // Not mangled, or the name would pass 4 GiB of names: shown as stored.
            self.strings.truncate(before);
            raw
        };
        self.found.push(Found {
            vaddr,
            size,
            name,
            raw_name: raw,
            source,
            ifunc,
        });
    }

    /// Adds every symbol of `symbols` in order, as [`Builder::push`] would one by one;
    /// a long list is demangled on several threads.
    pub(super) fn push_all(&mut self, symbols: &[Symbol<'_>]) {
        let threads = match symbols.len() >= PARALLEL_FROM {
            true => std::thread::available_parallelism().map_or(1, |n| n.get()),
            false => 1,
        }
        .min(MAX_DEMANGLING_THREADS);
        if threads <= 1 {
            self.push_each(symbols);
            return;
        }
        let parts: Vec<(String, Vec<Found>)> = std::thread::scope(|scope| {
            let workers: Vec<_> = symbols
                .chunks(symbols.len().div_ceil(threads))
                .map(|part| {
                    scope.spawn(move || {
                        let mut builder = Builder::new("", 0, 0..0, part.len());
                        // Room for each name stored and demangled (a C++ name's
                        // demangled form is about twice as long).
                        let stored: usize = part.iter().map(|&(_, _, raw, _, _)| raw.len()).sum();
                        builder.strings.reserve(stored * 3);
                        builder.push_each(part);
                        (builder.strings, builder.found)
                    })
                })
                .collect();
            (workers.into_iter())
                .map(|worker| {
                    worker
                        .join()
                        .unwrap_or_else(|p| std::panic::resume_unwind(p))
                })
                .collect()
        });
        self.strings
            .reserve(parts.iter().map(|(strings, _)| strings.len()).sum());
        for (strings, found) in parts {
            if !self.append_part(&strings, found) {
                return;
            }
        }
    }

    /// Adds every symbol of `symbols` in order, on this thread.
    fn push_each(&mut self, symbols: &[Symbol<'_>]) {
        for &(vaddr, size, raw, source, ifunc) in symbols {
            self.push(vaddr, size, raw, source, ifunc);
        }
    }

    /// Appends another builder's buffer and its functions, their offsets moved past
    /// this buffer's end; false (nothing appended) once the buffer would pass 4 GiB.
    fn append_part(&mut self, strings: &str, found: Vec<Found>) -> bool {
        let Some(base) = self.add_text(strings).map(|(at, _)| at) else {
            return false;
        };
        let moved = |(at, len): (u32, u32)| (at + base, len);
        self.found.extend(found.into_iter().map(|f| Found {
            name: moved(f.name),
            raw_name: moved(f.raw_name),
            ..f
        }));
        true
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
                name: raw,
                raw_name: raw,
                source,
                ifunc: false,
            });
        }
    }

    /// The functions found, at their runtime addresses, in the order found; their
    /// module is named `path`.
    pub(super) fn finish(self, path: &Path, name_len: usize) -> Vec<Function> {
        let table = StringTable::from_string(self.strings);
        let text = |(at, len): (u32, u32)| {
            // Every range was pushed whole onto the buffer: it lies inside, at characters.
            table.text(at, len).expect("a range pushed")
        };
        let module = text((0, name_len as u32));
        let module_path: Arc<Path> = Arc::from(path);
        self.found
            .into_iter()
            .map(|f| Function {
                addr: f.vaddr.wrapping_add(self.bias),
                size: f.size,
                module: module.clone(),
                module_path: module_path.clone(),
                name: text(f.name),
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

    #[test]
    fn names_demangled_on_several_threads_come_out_as_on_one() {
        let raw: Vec<String> = (0..PARALLEL_FROM as u64 + 7)
            .map(|i| {
                let function = format!("f{i}");
                match i % 3 {
                    0 => format!("_ZN2ns{}{function}Ei", function.len()),
                    1 => format!("plain_{i}"),
                    _ => format!("_RNvCs1234_7mycrate{}{function}", function.len()),
                }
            })
            .collect();
        let symbols: Vec<Symbol<'_>> = (raw.iter().enumerate())
            .map(|(i, name)| (i as u64 * 16, 8, name.as_str(), SymbolSource::Symtab, false))
            .collect();
        let rows = |functions: Vec<Function>| -> Vec<(u64, String, String)> {
            (functions.into_iter())
                .map(|f| (f.addr, f.name.to_string(), f.raw_name.to_string()))
                .collect()
        };
        let mut one_by_one = Builder::new("lib", 0x1000, 0..0, symbols.len());
        one_by_one.push_each(&symbols);
        let mut all_at_once = Builder::new("lib", 0x1000, 0..0, symbols.len());
        all_at_once.push_all(&symbols);
        let expected = rows(one_by_one.finish(Path::new("/lib"), 3));
        assert_eq!(expected[0].1, "ns::f0(int)");
        assert_eq!(expected[2].1, "mycrate::f2");
        assert_eq!(rows(all_at_once.finish(Path::new("/lib"), 3)), expected);
    }
}
