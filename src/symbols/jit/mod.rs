//! Names of code generated at run time (JIT code, interpreters' trampolines), from the
//! files the runtimes write for profilers: the perf map `/tmp/perf-PID.map` ([`perf_map`])
//! and jitdump files `jit-PID.dump` ([`jitdump`]).
//!
//! The one idea: such code lives in anonymous executable memory, which no ELF file
//! describes, and the runtime that made it says what it is — the same files perf and
//! samply read. PID there is the target's pid in its own pid namespace. The perf map is
//! found by its conventional path, a jitdump by the executable mapping the runtime makes
//! of it (which is how perf finds it too); both are read through the target's own view
//! of the file system with the checks of [`target_file`] (no link followed, a regular
//! file of the target's user, nothing written), and read again as they grow, from the
//! offset reached ([`JitSymbols::refresh`]). A later entry replaces what it overlaps
//! (code freed and reused). Code in anonymous executable memory that no entry names is
//! `[jit] 0x…`, never an offset into a module. Names are the target's text: they are
//! escaped where printed, like every name.

pub mod jitdump;
pub mod perf_map;
mod target_file;

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jitdump::{DumpRecord, DumpState};
use target_file::{Opened, Owner, TargetFile};

/// The module name of JIT code.
pub const JIT_MODULE: &str = "[jit]";
/// The most of a perf map read (a long-running Node writes one line per compilation).
const MAX_MAP_BYTES: u64 = 64 << 20;
/// The most of a jitdump gone through (its code bytes are skipped, not read).
const MAX_DUMP_BYTES: u64 = 1 << 30;
/// The most entries kept.
const MAX_ENTRIES: usize = 2_000_000;
/// Bytes read at once.
const CHUNK: u64 = 1 << 20;

/// One named piece of code.
#[derive(Debug, Clone)]
struct Entry {
    end: u64,
    name: Arc<str>,
}

/// A jitdump being followed.
#[derive(Debug)]
struct Dump {
    file: TargetFile,
    state: DumpState,
    /// `/proc/PID/map_files/…` of the runtime's mapping of it.
    mapped: PathBuf,
    /// Why the rest of it is not read, once it cannot be.
    ended: bool,
}

/// A frame's name in JIT code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitName {
    /// The runtime's name, or `[jit] 0x…` (the frame's address) for code none names.
    pub name: String,
    /// The named code's start (none for unnamed code).
    pub start: Option<u64>,
}

/// The JIT code of one process, as its runtime described it so far.
#[derive(Debug)]
pub struct JitSymbols {
    owner: Owner,
    ns_pid: i32,
    entries: BTreeMap<u64, Entry>,
    perf_map: TargetFile,
    /// The perf map's last read ended inside a line too long to keep.
    map_skipping: bool,
    dumps: Vec<Dump>,
    /// The executable mappings no file backs, from the last refresh.
    anonymous_code: Vec<Range<u64>>,
    generation: u64,
    notes: Vec<String>,
    said_full: bool,
    last_refresh: Option<Instant>,
}

impl JitSymbols {
    /// The JIT code of process `pid` (read by [`refresh`](Self::refresh); empty before).
    pub fn new(pid: i32) -> JitSymbols {
        let status =
            crate::process::read_proc_text(format!("/proc/{pid}/status")).unwrap_or_default();
        let ns_pid = crate::process::status_field(&status, "NSpid")
            .and_then(|v| v.split_whitespace().last())
            .and_then(|v| v.parse().ok())
            .unwrap_or(pid);
        JitSymbols {
            owner: target_file::owner_of(pid),
            ns_pid,
            entries: BTreeMap::new(),
            perf_map: TargetFile::new(PathBuf::from(format!("/tmp/perf-{ns_pid}.map"))),
            map_skipping: false,
            dumps: Vec::new(),
            anonymous_code: Vec::new(),
            generation: 0,
            notes: Vec::new(),
            said_full: false,
            last_refresh: None,
        }
    }

    /// [`new`](Self::new), refreshed once.
    pub fn for_process(pid: i32) -> JitSymbols {
        let mut jit = JitSymbols::new(pid);
        jit.refresh();
        jit
    }

    /// Reads the process's mappings (its anonymous code, the jitdumps it mapped) and
    /// what its perf map and jitdumps gained since the last read. Returns whether any
    /// name changed (then [`generation`](Self::generation) moved on).
    pub fn refresh(&mut self) -> bool {
        self.last_refresh = Some(Instant::now());
        let Ok(mappings) = crate::symbols::maps::read_maps(self.owner.pid) else {
            return false;
        };
        let anonymous: Vec<Range<u64>> = mappings
            .iter()
            .filter(|m| m.executable && is_anonymous(m))
            .map(|m| m.start..m.end)
            .collect();
        let mut changed = anonymous != self.anonymous_code;
        self.anonymous_code = anonymous;
        let dump_name = format!("jit-{}.dump", self.ns_pid);
        for m in &mappings {
            let Some(path) = m
                .file()
                .filter(|_| m.file_name() == Some(dump_name.as_str()))
            else {
                continue;
            };
            if !self.dumps.iter().any(|d| d.file.path == path) {
                self.dumps.push(Dump {
                    file: TargetFile::new(path.to_path_buf()),
                    state: DumpState::default(),
                    mapped: PathBuf::from(format!(
                        "/proc/{}/map_files/{:x}-{:x}",
                        self.owner.pid, m.start, m.end
                    )),
                    ended: false,
                });
            }
        }
        changed |= self.read_perf_map();
        for i in 0..self.dumps.len() {
            changed |= self.read_dump(i);
        }
        if changed {
            self.generation += 1;
        }
        changed
    }

    /// How long since the last refresh (None: never refreshed).
    pub fn since_refresh(&self) -> Option<Duration> {
        self.last_refresh.map(|last| last.elapsed())
    }

    /// Moves on whenever a name changes: what was named before may be named anew.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The named code containing `address`: its start and name.
    pub fn lookup(&self, address: u64) -> Option<(u64, &str)> {
        let (&start, entry) = self.entries.range(..=address).next_back()?;
        (address < entry.end).then_some((start, &*entry.name))
    }

    /// Whether `address` lies in executable memory no file backs (at the last refresh).
    pub fn in_anonymous_code(&self, address: u64) -> bool {
        let i = self.anonymous_code.partition_point(|r| r.start <= address);
        i > 0 && address < self.anonymous_code[i - 1].end
    }

    /// The name of a frame at `address` outside every module: the runtime's, else
    /// `[jit] 0x…` if it lies in anonymous executable memory, else none.
    pub fn name_at(&self, address: u64) -> Option<JitName> {
        if let Some((start, name)) = self.lookup(address) {
            return Some(JitName {
                name: name.to_owned(),
                start: Some(start),
            });
        }
        self.in_anonymous_code(address).then(|| JitName {
            name: format!("[jit] {address:#x}"),
            start: None,
        })
    }

    /// How many pieces of code are named.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The files names came from (inside the target), with what was read of each.
    pub fn sources(&self) -> Vec<(PathBuf, u64)> {
        std::iter::once(&self.perf_map)
            .chain(self.dumps.iter().map(|d| &d.file))
            .filter(|f| f.is_open() && f.offset > 0)
            .map(|f| (f.path.clone(), f.offset))
            .collect()
    }

    /// What could not be read, and why, each said once: for stderr.
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    /// Reads what the perf map gained; whether a name changed.
    fn read_perf_map(&mut self) -> bool {
        match self.perf_map.open(&self.owner, None) {
            Opened::Ready => {}
            Opened::Refused(reason) => {
                self.notes.push(reason);
                return false;
            }
            Opened::Absent | Opened::StillRefused => return false,
        }
        let size = self.perf_map.size();
        let end = size.min(MAX_MAP_BYTES);
        let mut changed = false;
        let mut buffer = Vec::new();
        while self.perf_map.offset < end {
            let at = self.perf_map.offset;
            buffer.resize((end - at).min(CHUNK) as usize, 0);
            let got = self.perf_map.read_at(&mut buffer, at);
            let mut found = Vec::new();
            let used = perf_map::parse_lines(&buffer[..got], &mut self.map_skipping, |e| {
                found.push((
                    e.start,
                    e.size,
                    String::from_utf8_lossy(e.name).into_owned(),
                ))
            });
            for (start, size, name) in found {
                changed |= self.insert(start, size, name.into());
            }
            if used == 0 {
                break; // a line not written whole yet
            }
            self.perf_map.offset += used as u64;
        }
        if size > MAX_MAP_BYTES
            && self.perf_map.offset >= end.saturating_sub(perf_map::MAX_LINE as u64)
        {
            self.say_once_full(format!(
                "{} is larger than {} MiB: only its beginning is read",
                self.perf_map.path.display(),
                MAX_MAP_BYTES >> 20
            ));
        }
        changed
    }

    /// Reads what jitdump `index` gained; whether a name changed.
    fn read_dump(&mut self, index: usize) -> bool {
        let dump = &mut self.dumps[index];
        if dump.ended {
            return false;
        }
        match dump.file.open(&self.owner, Some(&dump.mapped)) {
            Opened::Ready => {}
            Opened::Refused(reason) => {
                self.notes.push(reason);
                return false;
            }
            Opened::Absent | Opened::StillRefused => return false,
        }
        let end = dump.file.size().min(MAX_DUMP_BYTES);
        let mut records = Vec::new();
        let file = &dump.file;
        let result = jitdump::read_records(
            |buffer, at| file.read_at(buffer, at),
            end,
            &mut dump.state,
            |record| records.push(record),
        );
        dump.file.offset = dump.state.offset;
        if let Err(reason) = result {
            dump.ended = true;
            let note = format!(
                "{}: {reason}; the rest is not read",
                dump.file.path.display()
            );
            self.notes.push(note);
        }
        let mut changed = false;
        for record in records {
            changed |= match record {
                DumpRecord::Load { start, size, name } => {
                    self.insert(start, size, String::from_utf8_lossy(&name).into())
                }
                DumpRecord::Move { old, new, size } => match self.entries.remove(&old) {
                    Some(entry) => {
                        self.insert(new, size, entry.name);
                        true
                    }
                    None => false,
                },
            };
        }
        changed
    }

    /// Names `[start, start + size)`, replacing what it overlaps; whether it did.
    fn insert(&mut self, start: u64, size: u64, name: Arc<str>) -> bool {
        let Some(end) = start.checked_add(size).filter(|_| size > 0) else {
            return false;
        };
        if self.entries.len() >= MAX_ENTRIES {
            self.say_once_full(format!(
                "more than {MAX_ENTRIES} pieces of JIT code: later ones are not named"
            ));
            return false;
        }
        // Entries do not overlap, so their ends rise with their starts: going down from
        // the last that starts before `end`, the overlapping ones come first.
        let overlapping: Vec<u64> = self
            .entries
            .range(..end)
            .rev()
            .take_while(|(_, entry)| entry.end > start)
            .map(|(&at, _)| at)
            .collect();
        for at in overlapping {
            self.entries.remove(&at);
        }
        self.entries.insert(start, Entry { end, name });
        true
    }

    fn say_once_full(&mut self, note: String) {
        if !std::mem::replace(&mut self.said_full, true) {
            self.notes.push(note);
        }
    }
}

/// An executable mapping that no file backs: anonymous memory (named or not) or a
/// memfd, but not the kernel's `[vdso]`, `[vsyscall]` or `[uprobes]`.
fn is_anonymous(mapping: &crate::symbols::maps::Mapping) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let path = mapping.path.as_os_str().as_bytes();
    path.is_empty()
        || path.starts_with(b"[anon")
        || path.starts_with(b"/memfd:")
        || (mapping.inode == 0 && !path.starts_with(b"["))
}

#[cfg(test)]
mod tests;
