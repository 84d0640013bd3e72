//! A patched library's code mapping made whole again once everything is restored.
//!
//! `code_pages` changes the protection of single pages for a moment
//! (`mprotect`), and the kernel splits the mapping there: after a recording that patched
//! a few hundred functions, libc's code was listed as 90-odd mappings. Putting the
//! protection back does not join them, for two reasons the kernel checks: each piece
//! that was written got an `anon_vma` of its own, and a piece once made writable is
//! accounted (`VM_ACCOUNT`) while its neighbours are not.
//!
//! The one idea: before the first split, one byte of the mapping is written with its
//! own value through `/proc/self/mem`, so the whole mapping gets its `anon_vma` while it
//! is still one (the pieces cut from it later share it); once no page of it holds
//! tendril's bytes, the whole range is made writable and put back in two `mprotect`
//! calls, which makes every piece alike, and the kernel joins them. The byte's page is a
//! private copy for a moment, given back with the others (`page_copies`).
//!
//! The cost is that the whole mapping is then accounted as writable memory (commit
//! charge, not memory used). Under strict overcommit (`vm.overcommit_memory = 2`) that
//! charge could refuse the target's own allocations, so there the pieces stay apart.

use crate::sys::code_memory;
use crate::sys::maps::{self, Mapping};
use crate::sys::state::STATE;

/// Prepares for splitting the mappings of `pages` (page addresses, sorted): each
/// private file mapping not seen yet gets its `anon_vma` while whole, and is kept to be
/// joined again. Call it after the pages were noted by `page_copies` (the byte written
/// goes to one of them) and before their protection changes. Allocates.
pub fn before_splitting(pages: &[u64]) {
    if pages.is_empty() || strict_overcommit() {
        return;
    }
    let mut whole = STATE
        .whole_mappings
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let mut mappings: Option<Vec<Mapping>> = None;
    for &page in pages {
        if whole
            .iter()
            .any(|&(start, end, _)| (start..end).contains(&page))
        {
            continue;
        }
        if mappings.is_none() {
            mappings = maps::read_own().ok();
        }
        let Some(mapping) = mappings.iter().flatten().find(|m| m.contains(page)) else {
            continue;
        };
        if !is_private_code_of_a_file(mapping) {
            continue;
        }
        let mut byte = [0u8];
        if code_memory::read_code(page, &mut byte).is_ok()
            && code_memory::write_code(page, &byte).is_ok()
        {
            whole.push((mapping.start, mapping.end, mapping.protection()));
        }
    }
}

/// Joins again every mapping kept by [`before_splitting`] that holds none of
/// `still_changed` (pages that hold tendril's bytes yet): its pieces, if they are still
/// its own (the same file, the same protection, end to end), become one mapping. Call
/// it with the engine's lock held, once code is restored; returns how many were joined.
pub fn join_restored(still_changed: &[u64]) -> usize {
    let mut whole = STATE
        .whole_mappings
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if whole.is_empty() {
        return 0;
    }
    let Ok(mappings) = maps::read_own() else {
        return 0;
    };
    let mut joined = 0;
    whole.retain(|&(start, end, protection)| {
        if still_changed.iter().any(|page| (start..end).contains(page)) {
            return true;
        }
        if pieces_are_intact(&mappings, start, end, protection) {
            joined += usize::from(join(start, end, protection));
        }
        false
    });
    joined
}

/// Whether `start..end` is covered end to end by mappings of one file, each with
/// `protection`: the library it was, not one loaded at its place since.
fn pieces_are_intact(mappings: &[Mapping], start: u64, end: u64, protection: i32) -> bool {
    let mut pieces = mappings
        .iter()
        .filter(|m| m.start < end && m.end > start)
        .peekable();
    let Some(name) = pieces.peek().map(|m| m.name.clone()) else {
        return false;
    };
    let mut next = start;
    for piece in pieces {
        if piece.start != next
            || piece.name != name
            || piece.protection() != protection
            || !is_private_code_of_a_file(piece)
        {
            return false;
        }
        next = piece.end;
    }
    next == end
}

/// Makes `start..end` writable and puts `protection` back: every piece is then alike,
/// and the kernel joins them. Whether both calls succeeded.
fn join(start: u64, end: u64, protection: i32) -> bool {
    let made_writable = protect(start, end, protection | libc::PROT_WRITE);
    // Put back even after a failure: a failed `mprotect` may have changed some pieces.
    let put_back = protect(start, end, protection);
    made_writable && put_back
}

fn protect(start: u64, end: u64, protection: i32) -> bool {
    // SAFETY: changes the protection of whole pages of an existing private file mapping
    // of code, never removing read or execute access from code that may be running
    // there (`protection` is the mapping's own, executable).
    unsafe {
        libc::mprotect(
            start as *mut libc::c_void,
            (end - start) as usize,
            protection,
        ) == 0
    }
}

fn is_private_code_of_a_file(mapping: &Mapping) -> bool {
    let permissions = mapping.permissions.as_bytes();
    mapping.is_file()
        && mapping.executable()
        && permissions.get(1) == Some(&b'-')
        && permissions.get(3) == Some(&b'p')
}

/// Whether the system refuses memory beyond its commit limit (`vm.overcommit_memory`
/// is 2).
fn strict_overcommit() -> bool {
    std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|mode| mode.trim() == "2")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(start: u64, end: u64, permissions: &str, name: &str) -> Mapping {
        Mapping {
            start,
            end,
            permissions: permissions.into(),
            name: name.into(),
        }
    }

    const CODE: i32 = libc::PROT_READ | libc::PROT_EXEC;

    #[test]
    fn pieces_of_one_file_end_to_end_are_intact() {
        let maps = [
            mapping(0x1000, 0x2000, "r--p", "/lib/libc.so.6"),
            mapping(0x2000, 0x3000, "r-xp", "/lib/libc.so.6"),
            mapping(0x3000, 0x4000, "r-xp", "/lib/libc.so.6"),
            mapping(0x4000, 0x9000, "r-xp", "/lib/libc.so.6"),
        ];
        assert!(pieces_are_intact(&maps, 0x2000, 0x9000, CODE));
    }

    #[test]
    fn a_hole_another_file_or_a_writable_piece_is_not_joined() {
        let hole = [
            mapping(0x2000, 0x3000, "r-xp", "/lib/a.so"),
            mapping(0x4000, 0x9000, "r-xp", "/lib/a.so"),
        ];
        assert!(!pieces_are_intact(&hole, 0x2000, 0x9000, CODE));
        let other = [
            mapping(0x2000, 0x3000, "r-xp", "/lib/a.so"),
            mapping(0x3000, 0x9000, "r-xp", "/lib/b.so"),
        ];
        assert!(!pieces_are_intact(&other, 0x2000, 0x9000, CODE));
        let writable = [
            mapping(0x2000, 0x3000, "r-xp", "/lib/a.so"),
            mapping(0x3000, 0x9000, "rwxp", "/lib/a.so"),
        ];
        assert!(!pieces_are_intact(&writable, 0x2000, 0x9000, CODE));
        let shorter = [mapping(0x2000, 0x3000, "r-xp", "/lib/a.so")];
        assert!(!pieces_are_intact(&shorter, 0x2000, 0x9000, CODE));
        assert!(!pieces_are_intact(&[], 0x2000, 0x9000, CODE));
    }
}
