//! The function table the controller hands the agent for a recording: every function's
//! bounds, so the agent can decode a function it has never seen (Scheme B discovery) and
//! knows where a PLT stub really goes.
//!
//! The one idea: the agent has no symbol reader of its own; the controller writes the
//! table it already built over the control connection, right after the
//! `StartRecording` line, sorted by address, and the agent binary-searches it. Fixed-size little-endian
//! records keep both sides trivial.

/// The file's first word.
pub const MAGIC: u64 = u64::from_le_bytes(*b"tendrlf1");
/// Bytes before the first entry: magic, entry count.
pub const HEADER_BYTES: usize = 16;
/// Bytes of one entry.
pub const ENTRY_BYTES: usize = 32;

/// `FunctionEntry::flags`: a PLT stub; `target` is where it leads if known.
pub const FLAG_PLT: u64 = 1;
/// `FunctionEntry::flags`: never to be instrumented (dynamic loader, vDSO).
pub const FLAG_EXCLUDED: u64 = 2;
/// `FunctionEntry::flags`: an address-taken function (a pointer to it lies in data, or
/// code loads its address): a candidate target of calls through pointers, instrumented
/// up front so that such calls inside the graph are followed.
pub const FLAG_ADDRESS_TAKEN: u64 = 4;

/// One function, at its runtime address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FunctionEntry {
    pub start: u64,
    pub size: u64,
    pub flags: u64,
    /// For a PLT stub, the function it calls (0 if unknown).
    pub target: u64,
}

impl FunctionEntry {
    pub fn to_bytes(&self) -> [u8; ENTRY_BYTES] {
        let mut bytes = [0u8; ENTRY_BYTES];
        for (i, word) in [self.start, self.size, self.flags, self.target]
            .iter()
            .enumerate()
        {
            bytes[i * 8..i * 8 + 8].copy_from_slice(&word.to_le_bytes());
        }
        bytes
    }

    pub fn from_bytes(bytes: &[u8]) -> FunctionEntry {
        let word = |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
        FunctionEntry {
            start: word(0),
            size: word(1),
            flags: word(2),
            target: word(3),
        }
    }
}

/// Encodes a table (entries must be sorted by `start`).
pub fn encode(entries: &[FunctionEntry]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER_BYTES + entries.len() * ENTRY_BYTES);
    bytes.extend_from_slice(&MAGIC.to_le_bytes());
    bytes.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for entry in entries {
        bytes.extend_from_slice(&entry.to_bytes());
    }
    bytes
}

/// A table read from bytes, searched by address.
pub struct FunctionTable<'a> {
    entries: &'a [u8],
    count: usize,
}

impl<'a> FunctionTable<'a> {
    /// `None` if the bytes are not a table.
    pub fn parse(bytes: &'a [u8]) -> Option<FunctionTable<'a>> {
        if bytes.len() < HEADER_BYTES || bytes[..8] != MAGIC.to_le_bytes() {
            return None;
        }
        let count = u64::from_le_bytes(bytes[8..16].try_into().ok()?) as usize;
        let entries = bytes.get(HEADER_BYTES..HEADER_BYTES + count.checked_mul(ENTRY_BYTES)?)?;
        Some(FunctionTable { entries, count })
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn get(&self, index: usize) -> FunctionEntry {
        FunctionEntry::from_bytes(&self.entries[index * ENTRY_BYTES..(index + 1) * ENTRY_BYTES])
    }

    /// The function that starts exactly at `address`.
    pub fn starting_at(&self, address: u64) -> Option<FunctionEntry> {
        let (mut low, mut high) = (0, self.count);
        while low < high {
            let middle = (low + high) / 2;
            let entry = self.get(middle);
            if entry.start < address {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        (low < self.count)
            .then(|| self.get(low))
            .filter(|entry| entry.start == address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_round_trips_and_finds_functions_by_start() {
        let entries = [
            FunctionEntry {
                start: 0x1000,
                size: 16,
                flags: 0,
                target: 0,
            },
            FunctionEntry {
                start: 0x2000,
                size: 16,
                flags: FLAG_PLT,
                target: 0x9000,
            },
            FunctionEntry {
                start: 0x3000,
                size: 8,
                flags: FLAG_EXCLUDED,
                target: 0,
            },
        ];
        let bytes = encode(&entries);
        let table = FunctionTable::parse(&bytes).unwrap();
        assert_eq!(table.len(), 3);
        assert_eq!(table.starting_at(0x2000), Some(entries[1]));
        assert_eq!(table.starting_at(0x2001), None);
        assert_eq!(table.starting_at(0x3000), Some(entries[2]));
        assert!(FunctionTable::parse(b"not a table at all").is_none());
    }
}
