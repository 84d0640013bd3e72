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

/// The known code ranges around a batch, sorted once so that each pad search looks
/// only at the few ranges near its jump (sorting them all again for each of thousands of
/// functions was most of a large batch's time).
pub struct KnownRanges {
    /// (start, end) of every non-empty range, sorted.
    ranges: Vec<(u64, u64)>,
    /// `furthest_end[i]`: the largest end among `ranges[..=i]` (ranges may nest).
    furthest_end: Vec<u64>,
}

impl KnownRanges {
    /// Sorts `ranges`, given as (start, size) pairs.
    pub fn new(ranges: &[(u64, u64)]) -> KnownRanges {
        let mut sorted: Vec<(u64, u64)> = ranges
            .iter()
            .filter(|&&(_, size)| size > 0)
            .map(|&(start, size)| (start, start + size))
            .collect();
        sorted.sort_unstable();
        sorted.dedup();
        let furthest_end = sorted
            .iter()
            .scan(0u64, |furthest, &(_, end)| {
                *furthest = (*furthest).max(end);
                Some(*furthest)
            })
            .collect();
        KnownRanges {
            ranges: sorted,
            furthest_end,
        }
    }

    /// The gaps no range covers within `low..high`, between the furthest end so far and
    /// the next start (nothing before the first range or after the last one counts), with
    /// `extra` (start, size) counted as one more range.
    fn gaps_within(&self, low: u64, high: u64, extra: (u64, u64)) -> Vec<(u64, u64)> {
        // Only a range starting after `low` can end a gap inside `low..high`, and after
        // the first one starting past `high` no gap reaches back into it.
        let first = self.ranges.partition_point(|&(start, _)| start <= low);
        let past = self.ranges.partition_point(|&(start, _)| start <= high);
        let mut covered_to = first.checked_sub(1).map(|i| self.furthest_end[i]);
        let mut window: Vec<(u64, u64)> =
            self.ranges[first..(past + 1).min(self.ranges.len())].to_vec();
        let (extra_start, extra_size) = extra;
        if extra_size > 0 {
            let extra_end = extra_start + extra_size;
            if extra_start <= low {
                covered_to = Some(covered_to.map_or(extra_end, |c| c.max(extra_end)));
            } else {
                window.push((extra_start, extra_end));
                window.sort_unstable();
            }
        }
        let mut gaps = Vec::new();
        for (start, end) in window {
            if let Some(covered_to) = covered_to
                && start > covered_to
            {
                let (gap_low, gap_high) = (covered_to.max(low), start.min(high));
                if gap_high >= gap_low + PAD_LEN {
                    gaps.push((gap_low, gap_high));
                }
            }
            covered_to = Some(covered_to.map_or(end, |c| c.max(end)));
        }
        gaps
    }
}

/// A place for a pad within reach of a `jmp rel8` that ends at `jump_end`: 5 bytes of
/// padding between the known code ranges (the neighbours, and `function` (start, size)
/// itself), not overlapping `taken` pads. `read` fetches code bytes.
pub fn find_pad(
    jump_end: u64,
    known: &KnownRanges,
    function: (u64, u64),
    taken: &[u64],
    read: impl Fn(u64, &mut [u8]) -> bool,
) -> Option<u64> {
    let reach_low = jump_end.saturating_sub(128);
    let reach_high = jump_end + 127 + PAD_LEN; // a pad must start at most 127 after
    // Gaps nearest to the jump first.
    let mut gaps = known.gaps_within(reach_low, reach_high, function);
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
        let known = KnownRanges::new(&[(0x1000, 0x10), (0x1020, 0x10)]);
        let b = (0x1020, 0x10);
        // B's short jump ends at 0x1022; the gap before it is padding.
        let pad = find_pad(0x1022, &known, b, &[], reader(&code)).unwrap();
        assert!((0x1010..=0x101b).contains(&pad), "{pad:#x}");
        let second = find_pad(0x1022, &known, b, &[pad], reader(&code)).unwrap();
        assert!(second >= pad + PAD_LEN, "pads never overlap");
    }

    #[test]
    fn code_or_an_unknown_gap_is_never_used() {
        let mut code = image();
        code[0x18] = 0x55; // something real in the gap
        let known = KnownRanges::new(&[(0x1000, 0x10), (0x1020, 0x10)]);
        let b = (0x1020, 0x10);
        assert_eq!(find_pad(0x1022, &known, b, &[], reader(&code)), None);
        // Without neighbours there is no gap to speak of.
        let alone = KnownRanges::new(&[]);
        assert_eq!(find_pad(0x1022, &alone, b, &[], reader(&image())), None);
        // The function itself counts as known code even when the list misses it.
        let only_a = KnownRanges::new(&[(0x1000, 0x10)]);
        let pad = find_pad(0x1022, &only_a, b, &[], reader(&image())).unwrap();
        assert!((0x1010..=0x101b).contains(&pad), "{pad:#x}");
    }

    /// The old way, for comparison: every range sorted for each question.
    fn gaps_by_sorting_all(ranges: &[(u64, u64)], low: u64, high: u64) -> Vec<(u64, u64)> {
        let mut sorted: Vec<(u64, u64)> = ranges
            .iter()
            .filter(|&&(_, size)| size > 0)
            .map(|&(start, size)| (start, start + size))
            .collect();
        sorted.sort_unstable();
        let mut gaps = Vec::new();
        let mut covered_to: Option<u64> = None;
        for (start, end) in sorted {
            if let Some(c) = covered_to
                && start > c
                && start.min(high) >= c.max(low) + PAD_LEN
            {
                gaps.push((c.max(low), start.min(high)));
            }
            covered_to = Some(covered_to.map_or(end, |c| c.max(end)));
        }
        gaps
    }

    #[test]
    fn the_window_of_sorted_ranges_finds_the_gaps_sorting_everything_finds() {
        // Nested, overlapping, touching, empty and far-away ranges, in no order.
        let ranges = [
            (0x2000, 0x40),
            (0x1000, 0x30),
            (0x1010, 0x8),
            (0x1100, 0x0),
            (0x1080, 0x20),
            (0x10a0, 0x10),
            (0x1200, 0x400),
            (0x1250, 0x10),
            (0x1700, 0x10),
            (0x9000, 0x10),
        ];
        let known = KnownRanges::new(&ranges[1..]);
        // Every 0x13 bytes natively; under Miri, which runs this a thousand times
        // slower, every 0x95 (still landing before, inside and after every range).
        let step = if cfg!(miri) { 0x95 } else { 0x13 };
        for low in (0x0f00..0x2100).step_by(step) {
            for width in [0x20, 0x84, 0x100, 0x400] {
                let high = low + width;
                let expected = gaps_by_sorting_all(&ranges, low, high);
                assert_eq!(
                    known.gaps_within(low, high, ranges[0]),
                    expected,
                    "{low:#x}..{high:#x}"
                );
            }
        }
    }
}
