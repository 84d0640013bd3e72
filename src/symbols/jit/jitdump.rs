//! The jitdump format (`jit-PID.dump`, Linux perf's `tools/perf/Documentation/
//! jitdump-specification.txt`): a header, then records, each a prefix (`id`,
//! `total_size`, `timestamp`) and a body. Node (`--perf-prof`) and Java's perf agents
//! write it; the runtime maps the file executable so that a profiler finds it in the
//! process's mappings.
//!
//! The one idea: only what names code is read — `JIT_CODE_LOAD` (address, size, name;
//! the code bytes that follow are skipped) and `JIT_CODE_MOVE` (code that moved) —
//! record by record from the offset reached so far, so a growing file is read once. A
//! record not written whole yet waits for the next read; a record whose size makes no
//! sense ends the reading of that file (said once).

/// The header's magic, as the writer's (little-endian) machine stores it.
const MAGIC: u32 = 0x4A69_5444;
/// The byte-swapped magic: a dump of a big-endian machine.
const MAGIC_SWAPPED: u32 = 0x4454_694A;
/// The header's fixed part.
const HEADER_BYTES: u64 = 40;
/// A record's prefix: id, total size, timestamp.
const PREFIX_BYTES: u64 = 16;
/// `JIT_CODE_LOAD`'s fields after the prefix: pid, tid, vma, code_addr, code_size,
/// code_index.
const LOAD_BYTES: u64 = 40;
/// `JIT_CODE_MOVE`'s: pid, tid, vma, old_code_addr, new_code_addr, code_size,
/// code_index.
const MOVE_BYTES: u64 = 48;
/// The longest name read (a longer one is cut).
const MAX_NAME: u64 = 4096;
/// The largest record believed (a JIT function's code is far smaller).
const MAX_RECORD: u64 = 256 << 20;

const JIT_CODE_LOAD: u32 = 0;
const JIT_CODE_MOVE: u32 = 1;

/// What a record says about the code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DumpRecord {
    /// Code of `size` bytes at `start`, named `name`.
    Load {
        start: u64,
        size: u64,
        name: Vec<u8>,
    },
    /// The code at `old` moved to `new`.
    Move { old: u64, new: u64, size: u64 },
}

/// How far a dump has been read.
#[derive(Debug, Default)]
pub struct DumpState {
    /// The next byte to read: the header's start, then each record's.
    pub offset: u64,
    header_read: bool,
}

/// Reads the records between `state.offset` and `end` (the file's size, capped),
/// calling `each` for those that name code. `read_at(buffer, at)` reads the file and
/// returns how many bytes it read. An error (a file that is not a dump, a record that
/// cannot be) means the rest of the file is not read.
pub fn read_records(
    read_at: impl Fn(&mut [u8], u64) -> usize,
    end: u64,
    state: &mut DumpState,
    mut each: impl FnMut(DumpRecord),
) -> Result<(), String> {
    let word = |bytes: &[u8], at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let quad = |bytes: &[u8], at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    if !state.header_read {
        let mut header = [0u8; HEADER_BYTES as usize];
        if end < HEADER_BYTES || read_at(&mut header, 0) < header.len() {
            return Ok(());
        }
        match word(&header, 0) {
            MAGIC => {}
            MAGIC_SWAPPED => return Err("a jitdump of a big-endian machine".into()),
            _ => return Err("not a jitdump file (wrong magic)".into()),
        }
        let size = u64::from(word(&header, 8)).max(HEADER_BYTES);
        state.offset = size;
        state.header_read = true;
    }
    let mut fixed = [0u8; (PREFIX_BYTES + MOVE_BYTES) as usize];
    while state.offset + PREFIX_BYTES <= end {
        let at = state.offset;
        if read_at(&mut fixed[..PREFIX_BYTES as usize], at) < PREFIX_BYTES as usize {
            return Ok(());
        }
        let (id, total) = (word(&fixed, 0), u64::from(word(&fixed, 4)));
        if !(PREFIX_BYTES..=MAX_RECORD).contains(&total) {
            return Err(format!("a record of {total} bytes at offset {at}"));
        }
        if at + total > end {
            return Ok(()); // not written whole yet
        }
        let body = match id {
            JIT_CODE_LOAD => LOAD_BYTES,
            JIT_CODE_MOVE => MOVE_BYTES,
            _ => 0,
        };
        if body > 0 {
            if total < PREFIX_BYTES + body {
                return Err(format!("a record of {total} bytes at offset {at}"));
            }
            let wanted = (PREFIX_BYTES + body) as usize;
            if read_at(&mut fixed[..wanted], at) < wanted {
                return Ok(());
            }
        }
        match id {
            JIT_CODE_LOAD => {
                let (start, size) = (quad(&fixed, 32), quad(&fixed, 40));
                let name_at = at + PREFIX_BYTES + LOAD_BYTES;
                let room = (total - PREFIX_BYTES - LOAD_BYTES).min(MAX_NAME) as usize;
                let mut name = vec![0u8; room];
                let got = read_at(&mut name, name_at);
                name.truncate(got);
                if let Some(nul) = name.iter().position(|&b| b == 0) {
                    name.truncate(nul);
                }
                each(DumpRecord::Load { start, size, name });
            }
            JIT_CODE_MOVE => each(DumpRecord::Move {
                old: quad(&fixed, 32),
                new: quad(&fixed, 40),
                size: quad(&fixed, 48),
            }),
            _ => {}
        }
        state.offset = at + total;
    }
    Ok(())
}

/// A dump's bytes, for tests (here and in the symbols' tests).
#[cfg(test)]
pub mod writer {
    /// The header.
    pub fn header() -> Vec<u8> {
        let mut bytes = Vec::new();
        for word in [super::MAGIC, 1, 40, 62, 0, 1234] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes.extend_from_slice(&[0u8; 16]);
        bytes
    }

    /// A `JIT_CODE_LOAD` record with `code` after the name.
    pub fn load(start: u64, size: u64, name: &str, code: &[u8]) -> Vec<u8> {
        let total = 16 + 40 + name.len() + 1 + code.len();
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&(total as u32).to_le_bytes());
        bytes.extend_from_slice(&[0u8; 8 + 8]); // timestamp, pid and tid
        for quad in [start, start, size, 7] {
            bytes.extend_from_slice(&quad.to_le_bytes());
        }
        bytes.extend_from_slice(name.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(code);
        bytes
    }

    /// A `JIT_CODE_MOVE` record.
    pub fn moved(old: u64, new: u64, size: u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.extend_from_slice(&(16u32 + 48).to_le_bytes());
        bytes.extend_from_slice(&[0u8; 8 + 8]);
        for quad in [0, old, new, size, 7] {
            bytes.extend_from_slice(&quad.to_le_bytes());
        }
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(
        bytes: &[u8],
        end: u64,
        state: &mut DumpState,
    ) -> (Vec<DumpRecord>, Result<(), String>) {
        let read_at = |buffer: &mut [u8], at: u64| {
            let from = (at as usize).min(bytes.len());
            let n = buffer.len().min(bytes.len() - from);
            buffer[..n].copy_from_slice(&bytes[from..from + n]);
            n
        };
        let mut out = Vec::new();
        let result = read_records(read_at, end, state, |r| out.push(r));
        (out, result)
    }

    #[test]
    fn loads_and_moves_are_read_as_the_file_grows() {
        let mut bytes = writer::header();
        bytes.extend(writer::load(0x7000, 0x20, "jit_function", &[0x55, 0xc3]));
        let first_end = bytes.len() as u64;
        bytes.extend(writer::moved(0x7000, 0x9000, 0x20));
        let mut state = DumpState::default();
        // The second record is not whole yet.
        let (records, result) = read(&bytes, first_end + 10, &mut state);
        assert_eq!(result, Ok(()));
        assert_eq!(
            records,
            [DumpRecord::Load {
                start: 0x7000,
                size: 0x20,
                name: b"jit_function".to_vec()
            }]
        );
        assert_eq!(state.offset, first_end);
        let (records, _) = read(&bytes, bytes.len() as u64, &mut state);
        assert_eq!(
            records,
            [DumpRecord::Move {
                old: 0x7000,
                new: 0x9000,
                size: 0x20
            }]
        );
    }

    #[test]
    fn a_file_that_is_no_dump_and_a_bad_record_stop_the_reading() {
        let mut state = DumpState::default();
        let (_, result) = read(&[7u8; 64], 64, &mut state);
        assert!(result.unwrap_err().contains("magic"));
        let mut bytes = writer::header();
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&3u32.to_le_bytes()); // shorter than a prefix
        bytes.extend_from_slice(&[0u8; 8]);
        let mut state = DumpState::default();
        let (_, result) = read(&bytes, bytes.len() as u64, &mut state);
        assert!(result.unwrap_err().contains("3 bytes"));
    }
}
