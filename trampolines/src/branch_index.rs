//! Every direct branch of the code around a batch of patches, indexed by target.
//!
//! An entry patch overwrites a function's first bytes; a branch from anywhere that
//! lands strictly inside them would run half an instruction. The function's own body is
//! checked when its patch is planned; this index covers its neighbours — the functions
//! the controller listed as nearby, whose code may jump into it. The one idea: a batch
//! of neighbouring functions shares neighbours, so each function's code is read and
//! decoded once per batch, not once per patch.

use iced_x86::{Decoder, DecoderOptions, Instruction, OpKind};

/// Longest function decoded; longer ones are decoded up to this much.
const MAX_FUNCTION_BYTES: u64 = 1 << 20;

/// Direct branches (source, target), sorted by target.
pub struct BranchIndex {
    branches: Vec<(u64, u64)>,
}

impl BranchIndex {
    /// Decodes each of `functions` ((start, size) pairs) from its start; `read` fetches
    /// code bytes and returns false for unreadable memory (such a function is skipped).
    pub fn build(functions: &[(u64, u64)], read: impl Fn(u64, &mut [u8]) -> bool) -> BranchIndex {
        let mut branches = Vec::new();
        let mut code = Vec::new();
        let mut instruction = Instruction::default();
        for &(start, size) in functions {
            code.resize(size.min(MAX_FUNCTION_BYTES) as usize, 0);
            if code.is_empty() || !read(start, &mut code) {
                continue;
            }
            let mut decoder = Decoder::with_ip(64, &code, start, DecoderOptions::NONE);
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
        }
        branches.sort_unstable_by_key(|&(source, target)| (target, source));
        branches.dedup();
        BranchIndex { branches }
    }

    /// The branches (source, target) that land in `low..high`.
    pub fn landing_in(&self, low: u64, high: u64) -> &[(u64, u64)] {
        let first = self.branches.partition_point(|&(_, target)| target < low);
        let end = self.branches.partition_point(|&(_, target)| target < high);
        &self.branches[first..end.max(first)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_branches_into_a_range() {
        // At 0x1000: jmp +0x10 (to 0x1012); at 0x1002: je -2 (to 0x1002); then ret.
        let code = [0xeb, 0x10, 0x74, 0xfe, 0xc3];
        let read = |address: u64, buffer: &mut [u8]| {
            let offset = (address - 0x1000) as usize;
            buffer.copy_from_slice(&code[offset..offset + buffer.len()]);
            true
        };
        let index = BranchIndex::build(&[(0x1000, 5)], read);
        assert_eq!(index.landing_in(0x1010, 0x1020), [(0x1000, 0x1012)]);
        assert_eq!(index.landing_in(0x1000, 0x1003), [(0x1002, 0x1002)]);
        assert!(index.landing_in(0x2000, 0x3000).is_empty());
    }
}
