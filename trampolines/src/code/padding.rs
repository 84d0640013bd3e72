//! Finding dead padding near a function for the `jmp rel32` of a short patch.
//!
//! When a function's first five bytes cannot be overwritten — it is shorter, or code
//! elsewhere jumps to its third byte (glibc's `__mempcpy_*` enter `__memmove_*` that
//! way) — its entry gets a 2-byte `jmp rel8` instead, to a 5-byte `jmp rel32` to the
//! trampoline placed within 127 bytes. The one idea: the bytes between two functions'
//! known ranges (symbol sizes, FDEs) are alignment padding that nothing executes — as
//! long as they really are padding, so only gaps made entirely of `nop`s and `int3`s
//! are used.

use iced_x86::{Decoder, DecoderOptions, Mnemonic};

/// Bytes of a `jmp rel32` placed in padding.
pub const PAD_LEN: u64 = 5;

/// A place for a pad within reach of a `jmp rel8` that ends at `jump_end`: 5 bytes of
/// padding between the known code ranges `ranges` (the function and its neighbours),
/// not overlapping `taken` pads. `read` fetches code bytes.
pub fn find_pad(
    jump_end: u64,
    ranges: &[(u64, u64)],
    taken: &[u64],
    read: impl Fn(u64, &mut [u8]) -> bool,
) -> Option<u64> {
    let reach_low = jump_end.saturating_sub(128);
    let reach_high = jump_end + 127 + PAD_LEN; // a pad must start at most 127 after
    let mut sorted: Vec<(u64, u64)> = ranges
        .iter()
        .filter(|&&(_, size)| size > 0)
        .map(|&(start, size)| (start, start + size))
        .collect();
    sorted.sort_unstable();
    // Gaps that no known range covers, between the furthest end so far and the next
    // start, clipped to the reach; nearest to the jump first.
    let mut gaps: Vec<(u64, u64)> = Vec::new();
    let mut covered_to = None;
    for &(start, end) in &sorted {
        if let Some(covered_to) = covered_to
            && start > covered_to
        {
            let (low, high) = (covered_to.max(reach_low), start.min(reach_high));
            if high >= low + PAD_LEN {
                gaps.push((low, high));
            }
        }
        covered_to = Some(covered_to.map_or(end, |c: u64| c.max(end)));
    }
    gaps.sort_by_key(|&(low, _)| low.abs_diff(jump_end));
    for (low, high) in gaps {
        let mut bytes = vec![0u8; (high - low) as usize];
        if !read(low, &mut bytes) {
            continue;
        }
        let Some(padding) = padding_run(low, &bytes) else {
            continue;
        };
        let mut start = padding.0;
        while start + PAD_LEN <= padding.1 {
            let reachable = (-128..=127).contains(&(start as i64 - jump_end as i64));
            let free = !taken
                .iter()
                .any(|&t| t < start + PAD_LEN && start < t + PAD_LEN);
            if reachable && free {
                return Some(start);
            }
            start += 1;
        }
    }
    None
}

/// The range of `bytes` (at `address`) that decodes entirely as `nop`/`int3`
/// instructions, if all of it does; a gap holding anything else is not padding.
fn padding_run(address: u64, bytes: &[u8]) -> Option<(u64, u64)> {
    let mut decoder = Decoder::with_ip(64, bytes, address, DecoderOptions::NONE);
    for instruction in &mut decoder {
        if instruction.is_invalid()
            || !matches!(instruction.mnemonic(), Mnemonic::Nop | Mnemonic::Int3)
        {
            return None;
        }
    }
    Some((address, address + bytes.len() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64-byte code image at 0x1000: [0x1000, 0x1010) function A, 0x1010..0x1020
    /// padding (int3 then a multi-byte nop), [0x1020, 0x1030) function B.
    fn image() -> Vec<u8> {
        let mut code = vec![0x90u8; 0x40];
        code[..0x10].fill(0x55); // "push rbp" x16: real code
        code[0x10..0x14].fill(0xcc);
        code[0x14..0x20]
            .copy_from_slice(&[0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0, 0x66, 0x90]);
        code[0x20..0x30].fill(0x55);
        code
    }

    fn reader(code: &[u8]) -> impl Fn(u64, &mut [u8]) -> bool + '_ {
        move |address, buffer| {
            let offset = (address - 0x1000) as usize;
            match code.get(offset..offset + buffer.len()) {
                Some(bytes) => {
                    buffer.copy_from_slice(bytes);
                    true
                }
                None => false,
            }
        }
    }

    #[test]
    fn a_pad_goes_in_the_padding_between_two_functions() {
        let code = image();
        let ranges = [(0x1000, 0x10), (0x1020, 0x10)];
        // B's short jump ends at 0x1022; the gap before it is padding.
        let pad = find_pad(0x1022, &ranges, &[], reader(&code)).unwrap();
        assert!((0x1010..=0x101b).contains(&pad), "{pad:#x}");
        let second = find_pad(0x1022, &ranges, &[pad], reader(&code)).unwrap();
        assert!(second >= pad + PAD_LEN, "pads never overlap");
    }

    #[test]
    fn code_or_an_unknown_gap_is_never_used() {
        let mut code = image();
        code[0x18] = 0x55; // something real in the gap
        let ranges = [(0x1000, 0x10), (0x1020, 0x10)];
        assert_eq!(find_pad(0x1022, &ranges, &[], reader(&code)), None);
        // Without neighbours there is no gap to speak of.
        assert_eq!(
            find_pad(0x1022, &[(0x1020, 0x10)], &[], reader(&image())),
            None
        );
    }
}
