//! The direct branches of the code around a batch of patches that land in a given range.
//!
//! An entry patch overwrites a function's first bytes; a branch from anywhere that
//! lands strictly inside them would run half an instruction. The function's own body is
//! checked when its patch is planned; this covers its neighbours — the functions the
//! controller listed as nearby, whose code may jump into it.
//!
//! The one idea: decoding every neighbour costs far more than the rest of a patch (and
//! Scheme B patches while the target waits), yet almost no neighbour branches into a
//! patch. So the raw bytes are scanned first for any branch opcode and where it would
//! land — a superset of the real branches, since data and the middle of instructions
//! match too — and only a function with such a candidate in the range asked about is
//! decoded, to keep the candidates that are real instructions. The scan is done once
//! per batch, into a list of candidates sorted by where they land, so each question
//! costs a binary search however many functions the batch patches (scanning all the
//! neighbours again for each of several thousand patches took seconds); each function
//! is decoded at most once per batch.

use iced_x86::{Decoder, DecoderOptions, Instruction, OpKind};
use std::cell::{OnceCell, RefCell};
use std::collections::HashMap;

/// Longest function looked at; longer ones are looked at up to this much.
const MAX_FUNCTION_BYTES: u64 = 1 << 20;

/// The code of the functions around a batch, scanned and decoded on demand.
pub struct BranchIndex {
    /// (start, size) of the functions.
    functions: Vec<(u64, u64)>,
    /// Every candidate branch (where it lands, index of its function), sorted; made by
    /// the first question.
    candidates: OnceCell<Candidates>,
    /// Function index → its decoded direct branches (source, target).
    decoded: RefCell<HashMap<usize, Vec<(u64, u64)>>>,
}

/// The functions' bytes and their candidate branches.
struct Candidates {
    /// Function index → its bytes (empty if unreadable).
    code: Vec<Vec<u8>>,
    /// (target, function index), sorted.
    landing: Vec<(u64, usize)>,
}

impl BranchIndex {
    /// An index over `functions` ((start, size) pairs); nothing is read yet.
    pub fn new(functions: &[(u64, u64)]) -> BranchIndex {
        BranchIndex {
            functions: functions.to_vec(),
            candidates: OnceCell::new(),
            decoded: RefCell::new(HashMap::new()),
        }
    }

    /// The direct branches (source, target) that land in `low..high`. `read` fetches
    /// code bytes and returns false for unreadable memory (such a function is skipped).
    /// Every call must read the same code (the first call reads all of it).
    pub fn landing_in(
        &self,
        low: u64,
        high: u64,
        read: impl Fn(u64, &mut [u8]) -> bool,
    ) -> Vec<(u64, u64)> {
        let candidates = self.candidates.get_or_init(|| self.scan(read));
        let first = candidates
            .landing
            .partition_point(|&(target, _)| target < low);
        let mut functions: Vec<usize> = candidates.landing[first..]
            .iter()
            .take_while(|&&(target, _)| target < high)
            .map(|&(_, function)| function)
            .collect();
        functions.sort_unstable();
        functions.dedup();
        let mut found = Vec::new();
        let mut decoded = self.decoded.borrow_mut();
        for function in functions {
            let start = self.functions[function].0;
            let branches = decoded
                .entry(function)
                .or_insert_with(|| decode_branches(&candidates.code[function], start));
            found.extend(
                branches
                    .iter()
                    .filter(|&&(_, target)| (low..high).contains(&target)),
            );
        }
        found
    }

    /// Reads every function and lists its candidate branches.
    fn scan(&self, read: impl Fn(u64, &mut [u8]) -> bool) -> Candidates {
        let mut code = Vec::with_capacity(self.functions.len());
        let mut landing = Vec::new();
        for (index, &(start, size)) in self.functions.iter().enumerate() {
            let mut bytes = vec![0u8; size.min(MAX_FUNCTION_BYTES) as usize];
            if !read(start, &mut bytes) {
                bytes.clear();
            }
            for_each_candidate(&bytes, start, |target| landing.push((target, index)));
            code.push(bytes);
        }
        landing.sort_unstable();
        landing.dedup();
        Candidates { code, landing }
    }
}

/// Calls `visit(target)` for every byte of `code` (at `start`) that begins a direct
/// branch opcode, with where it would land: `jmp`/`call rel32`, `jcc rel32`, and the
/// `rel8` forms (`jmp`, `jcc`, `loop*`, `jrcxz`).
fn for_each_candidate(code: &[u8], start: u64, mut visit: impl FnMut(u64)) {
    let target = |at: usize, len: usize, displacement: i64| {
        (start + (at + len) as u64).wrapping_add(displacement as u64)
    };
    let rel32 = |at: usize| {
        code.get(at..at + 4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64)
    };
    for at in 0..code.len() {
        let landing = match code[at] {
            0xe8 | 0xe9 => rel32(at + 1).map(|d| target(at, 5, d)),
            0x0f if code.get(at + 1).is_some_and(|b| (0x80..=0x8f).contains(b)) => {
                rel32(at + 2).map(|d| target(at, 6, d))
            }
            0x70..=0x7f | 0xe0..=0xe3 | 0xeb => {
                code.get(at + 1).map(|&d| target(at, 2, d as i8 as i64))
            }
            _ => None,
        };
        if let Some(landing) = landing {
            visit(landing);
        }
    }
}

/// Every direct branch (from, to) of the code at `start`, decoded linearly; bytes that
/// do not decode (data, padding) are skipped one at a time.
pub fn decode_branches(code: &[u8], start: u64) -> Vec<(u64, u64)> {
    let mut branches = Vec::new();
    let mut decoder = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    let mut instruction = Instruction::default();
    while decoder.can_decode() {
        let position = decoder.position();
        decoder.decode_out(&mut instruction);
        if instruction.is_invalid() {
            // Data or padding: resynchronise one byte further.
            let _ = decoder.set_position(position + 1);
            decoder.set_ip(start + position as u64 + 1);
            continue;
        }
        if instruction.op0_kind() == OpKind::NearBranch64 {
            branches.push((instruction.ip(), instruction.near_branch_target()));
        }
    }
    branches
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(code: &'static [u8], base: u64) -> impl Fn(u64, &mut [u8]) -> bool {
        move |address, buffer| {
            let offset = (address - base) as usize;
            buffer.copy_from_slice(&code[offset..offset + buffer.len()]);
            true
        }
    }

    #[test]
    fn finds_branches_into_a_range() {
        // At 0x1000: jmp +0x10 (to 0x1012); at 0x1002: je -2 (to 0x1002); then ret.
        static CODE: [u8; 5] = [0xeb, 0x10, 0x74, 0xfe, 0xc3];
        let index = BranchIndex::new(&[(0x1000, 5)]);
        let read = reader(&CODE, 0x1000);
        assert_eq!(index.landing_in(0x1010, 0x1020, &read), [(0x1000, 0x1012)]);
        assert_eq!(index.landing_in(0x1000, 0x1003, &read), [(0x1002, 0x1002)]);
        assert!(index.landing_in(0x2000, 0x3000, &read).is_empty());
    }

    #[test]
    fn a_branch_opcode_inside_another_instruction_is_no_branch() {
        // mov eax, 0x000010e9 hides "e9 10 00 00 00" (a jmp to 0x1016) in its immediate;
        // then jmp rel32 to 0x1100, then ret.
        static CODE: [u8; 11] = [
            0xb8, 0xe9, 0x10, 0x00, 0x00, 0xe9, 0xf6, 0x00, 0x00, 0x00, 0xc3,
        ];
        let index = BranchIndex::new(&[(0x1000, 11)]);
        let read = reader(&CODE, 0x1000);
        assert!(index.landing_in(0x1010, 0x1020, &read).is_empty());
        assert_eq!(index.landing_in(0x1100, 0x1101, &read), [(0x1005, 0x1100)]);
    }
}
