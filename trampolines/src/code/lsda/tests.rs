//! LSDAs written as GCC writes them, read back, and moved to a copy: the copy's LSDA
//! says the same of the copy's code as the original's of the original's.

use super::*;

const FUNCTION: u64 = 0x5555_0000_1000;
const LSDA_AT: u64 = 0x5555_0000_9000;

/// A GCC-style LSDA: call sites in ULEB128, type entries `indirect|pcrel|sdata4`.
/// Call sites: [0x10, 0x18) lands at 0x40 catching type 1; [0x20, 0x24) passes
/// through; [0x30, 0x35) lands at 0x50 for a cleanup; [0x36, 0x3a) lands at 0x60 with
/// an exception specification allowing type 2.
fn gcc_lsda(types: [u64; 2]) -> Vec<u8> {
    let mut sites = Vec::new();
    for (start, len, pad, action) in [
        (0x10u64, 8u64, 0x40u64, 1u64),
        (0x20, 4, 0, 0),
        (0x30, 5, 0x50, 0),
        (0x36, 4, 0x60, 3),
    ] {
        for value in [start, len, pad, action] {
            write_uleb(&mut sites, value);
        }
    }
    // Action 1: filter 1, end. Action 3: filter -1 (the specification at offset 0).
    let actions = [0x01, 0x00, 0x7f, 0x00];
    let mut lsda = vec![OMIT, INDIRECT | PCREL | SDATA4];
    // The type offset (one byte), then the call-site encoding and length.
    let after_offset = 1 + 1 + sites.len() + actions.len() + 8;
    lsda.push(after_offset as u8);
    lsda.push(ULEB128);
    lsda.push(sites.len() as u8);
    lsda.extend_from_slice(&sites);
    lsda.extend_from_slice(&actions);
    // Type 2 then type 1, each relative to its own place.
    for pointer in [types[1], types[0]] {
        let at = LSDA_AT + lsda.len() as u64;
        let relative = if pointer == 0 {
            0
        } else {
            pointer.wrapping_sub(at) as i32
        };
        lsda.extend_from_slice(&relative.to_le_bytes());
    }
    // The specification: type 2, end.
    lsda.extend_from_slice(&[0x02, 0x00]);
    lsda
}

#[test]
fn a_gcc_lsda_reads_as_absolute_call_sites_pads_and_types() {
    let types = [0x5555_0000_7000, 0x5555_0000_7010];
    let lsda = Lsda::parse(&gcc_lsda(types), LSDA_AT, FUNCTION).unwrap();
    let sites: Vec<(u64, u64, Option<u64>, u64)> = lsda
        .call_sites
        .iter()
        .map(|s| {
            (
                s.start - FUNCTION,
                s.end - FUNCTION,
                s.landing_pad.map(|p| p - FUNCTION),
                s.action,
            )
        })
        .collect();
    assert_eq!(
        sites,
        [
            (0x10, 0x18, Some(0x40), 1),
            (0x20, 0x24, None, 0),
            (0x30, 0x35, Some(0x50), 0),
            (0x36, 0x3a, Some(0x60), 2)
        ]
    );
    assert_eq!(lsda.types, Some(types.to_vec()));
    assert!(lsda.indirect_types);
    assert_eq!(lsda.specifications, [0x02, 0x00]);
    assert_eq!(
        lsda.actions,
        [
            Action {
                filter: Filter::Catch(1),
                next: None
            },
            Action {
                filter: Filter::Allows(0),
                next: None
            }
        ]
    );
    assert_eq!(
        lsda.landing_pads_in(&[(FUNCTION, FUNCTION + 0x58)]),
        [FUNCTION + 0x40, FUNCTION + 0x50]
    );
}

#[test]
fn the_copys_lsda_says_the_same_of_the_copy() {
    let types = [0, 0x5555_0000_7010]; // type 1 catches everything
    let original = Lsda::parse(&gcc_lsda(types), LSDA_AT, FUNCTION).unwrap();
    let copy_start = 0x7f00_0000_0000;
    // Each original byte at offset o is at copy_start + 0x100 + 4o, except that the
    // first call site's range comes in two pieces with a counter between them.
    let pieces = |start: u64, end: u64| -> Vec<(u64, u64)> {
        let at = |address: u64| copy_start + 0x100 + 4 * (address - FUNCTION);
        if start == FUNCTION + 0x10 {
            vec![(at(start), at(start + 4)), (at(start + 4) + 8, at(end) + 8)]
        } else {
            vec![(at(start), at(end))]
        }
    };
    // A pad inside moves with the code; the one at 0x60 is "outside" (a .cold part).
    let moved = |pad: u64| {
        if pad < FUNCTION + 0x58 {
            copy_start + 0x100 + 4 * (pad - FUNCTION)
        } else {
            pad
        }
    };
    let bytes = original.for_copy(copy_start, &pieces, &moved);
    let at = 0x7f00_1000_0000;
    let copied = Lsda::parse(&bytes, at, copy_start).unwrap();
    let expected: Vec<CallSite> = original
        .call_sites
        .iter()
        .flat_map(|site| {
            pieces(site.start, site.end)
                .into_iter()
                .map(|(start, end)| CallSite {
                    start,
                    end,
                    landing_pad: site.landing_pad.map(moved),
                    action: site.action,
                })
        })
        .collect();
    assert_eq!(copied.call_sites, expected);
    assert!(copied.call_sites.windows(2).all(|w| w[0].end <= w[1].start));
    assert_eq!(copied.types, original.types, "the same type_info pointers");
    assert_eq!(copied.indirect_types, original.indirect_types);
    assert_eq!(copied.actions, original.actions);
    assert_eq!(copied.specifications, original.specifications);
}

#[test]
fn contiguous_pieces_merge_and_an_lsda_without_types_stays_without() {
    let mut lsda = vec![OMIT, OMIT, ULEB128, 8];
    for value in [0u64, 4, 0x20, 0, 4, 4, 0x20, 0] {
        write_uleb(&mut lsda, value);
    }
    let original = Lsda::parse(&lsda, LSDA_AT, FUNCTION).unwrap();
    assert_eq!(original.types, None);
    let shifted = |start: u64, end: u64| vec![(start + 0x1000, end + 0x1000)];
    let bytes = original.for_copy(FUNCTION + 0x1000, &shifted, &|pad| pad + 0x1000);
    let copied = Lsda::parse(&bytes, 0x9999_0000, FUNCTION + 0x1000).unwrap();
    assert_eq!(
        copied.call_sites,
        [CallSite {
            start: FUNCTION + 0x1000,
            end: FUNCTION + 0x1008,
            landing_pad: Some(FUNCTION + 0x1020),
            action: 0
        }]
    );
}

#[test]
fn truncated_or_strange_lsdas_are_refused() {
    let full = gcc_lsda([0x5555_0000_7000, 0x5555_0000_7010]);
    for cut in [1, 3, 6, full.len() - 3] {
        assert!(
            Lsda::parse(&full[..cut], LSDA_AT, FUNCTION).is_err(),
            "cut at {cut}"
        );
    }
    let mut datarel = full.clone();
    datarel[1] = 0x30 | SDATA4;
    assert_eq!(
        Lsda::parse(&datarel, LSDA_AT, FUNCTION),
        Err(LsdaRefusal::Encoding(0x3b))
    );
}

/// A cold part's LSDA, GCC-style with its own call site at its start landing at +0x10
/// on an action chain catching type 2, then type 1 (the function's numbers), and the
/// type table `types` (`indirect|absptr`).
fn cold_lsda(types: &[u64]) -> Vec<u8> {
    let mut sites = Vec::new();
    for value in [0u64, 5, 0x10, 3] {
        write_uleb(&mut sites, value);
    }
    let actions = [0x01, 0x00, 0x02, 0x7d]; // filter 1, end; filter 2, back to the first
    let type_bytes = 8 * types.len();
    let mut cold = vec![
        OMIT,
        INDIRECT | ABSPTR,
        (1 + 1 + sites.len() + actions.len() + type_bytes) as u8,
    ];
    cold.push(ULEB128);
    cold.push(sites.len() as u8);
    cold.extend_from_slice(&sites);
    cold.extend_from_slice(&actions);
    for pointer in types.iter().rev() {
        cold.extend_from_slice(&pointer.to_le_bytes());
    }
    cold.extend_from_slice(&[0x02, 0x00]); // the same specification
    cold
}

#[test]
fn the_tables_of_a_function_and_its_cold_part_join_with_every_filter_kept() {
    let hot_types = [0x5555_0000_7000, 0x5555_0000_7010];
    let hot = Lsda::parse(&gcc_lsda(hot_types), LSDA_AT, FUNCTION).unwrap();
    let cold_start = FUNCTION - 0x800;
    let cold = Lsda::parse(&cold_lsda(&hot_types), LSDA_AT + 0x100, cold_start).unwrap();
    assert_eq!(cold.call_sites[0].action, 1);
    let joined = Lsda::join(vec![hot.clone(), cold]).unwrap();
    let copy_start = FUNCTION;
    let same = |start: u64, end: u64| vec![(start + 0x10_0000, end + 0x10_0000)];
    let bytes = joined.for_copy(copy_start, &same, &|pad| pad + 0x10_0000);
    let copied = Lsda::parse(&bytes, 0x7f00_2000_0000, copy_start).unwrap();
    // The landing pads compare filters with the numbers compiled into them: the
    // types, and the specification's offset, are the function's own.
    assert_eq!(copied.types, Some(hot_types.to_vec()));
    assert_eq!(copied.specifications, [0x02, 0x00]);
    let site = copied
        .call_sites
        .iter()
        .find(|site| site.start == cold_start + 0x10_0000)
        .unwrap();
    assert_eq!(site.landing_pad, Some(cold_start + 0x10 + 0x10_0000));
    let first = copied.actions[site.action as usize - 1];
    assert_eq!(first.filter, Filter::Catch(2));
    assert_eq!(copied.actions[first.next.unwrap()].filter, Filter::Catch(1));
    let hot_site = (copied.call_sites.iter())
        .find(|s| s.start == FUNCTION + 0x10 + 0x10_0000)
        .unwrap();
    assert_eq!(
        copied.actions[hot_site.action as usize - 1].filter,
        Filter::Catch(1)
    );
    let spec_site = (copied.call_sites.iter())
        .find(|s| s.start == FUNCTION + 0x36 + 0x10_0000)
        .unwrap();
    assert_eq!(
        copied.actions[spec_site.action as usize - 1].filter,
        Filter::Allows(0)
    );
    // A cold part that names other types cannot join: its filters would mean others.
    let other = Lsda::parse(&cold_lsda(&[0x9010, 0x9020]), LSDA_AT + 0x100, cold_start).unwrap();
    assert_eq!(
        Lsda::join(vec![hot, other]),
        Err(LsdaRefusal::Mismatch("their type tables"))
    );
}
