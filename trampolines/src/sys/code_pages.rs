//! Replacing two bytes of live code in one store.
//!
//! The patch protocol swaps a patch point's first two bytes while other threads may be
//! fetching them: first for a jump-to-self guard, last for the final bytes. Each swap
//! must be one store, so that a core sees the old two bytes or the new two, never one
//! of each. A write through `/proc/self/mem` (how `code_memory` writes everything else)
//! is a copy the kernel may make a byte at a time, so for these stores the pages are
//! made writable for the moment — `mprotect` adding `PROT_WRITE` to what they had,
//! never taking `PROT_EXEC` away, since threads run there — and put back as they were
//! when the [`WritableCode`] is dropped. A `mov word` inside one cache line is atomic
//! for every core (the planner refuses a patch whose two bytes straddle a line).
//! The rest of an entry jump, behind its guard, is stored the same way, a byte at a
//! time ([`WritableCode::store_bytes`]): no system call while guards hold threads.
//!
//! The pages' own protection comes from `/proc/self/maps`, read once per mapping and
//! kept ([`refresh_protections`] reads it again), so a batch patched from a target's
//! thread during discovery does not parse the maps each time.

use crate::sys::maps;
use crate::sys::state::STATE;

const PAGE: u64 = 4096;

/// Reads the executable mappings' protection from `/proc/self/maps` again.
pub fn refresh_protections() -> std::io::Result<()> {
    let mappings = maps::read_own()?;
    let mut protections = STATE.protections.lock().unwrap_or_else(|p| p.into_inner());
    protections.clear();
    protections.extend(
        mappings
            .iter()
            .filter(|m| m.executable())
            .map(|m| (m.start, m.end, m.protection())),
    );
    Ok(())
}

/// The protection of the executable page at `page`, reading the maps again once if
/// it is not known.
fn page_protection(page: u64) -> std::io::Result<i32> {
    let known = |page: u64| {
        STATE
            .protections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|(start, end, _)| (*start..*end).contains(&page))
            .map(|&(_, _, protection)| protection)
    };
    if let Some(protection) = known(page) {
        return Ok(protection);
    }
    refresh_protections()?;
    known(page)
        .ok_or_else(|| std::io::Error::other(format!("{page:#x} is not in an executable mapping")))
}

/// Pages made writable for a batch of two-byte stores; their protection goes back when
/// this is dropped.
pub struct WritableCode {
    /// (first page, end, protection to restore), merged where contiguous.
    ranges: Vec<(u64, u64, i32)>,
}

impl WritableCode {
    /// Makes the pages holding every `(address, len)` of `spans` writable too. Allocates;
    /// call it before threads are parked.
    pub fn open(spans: impl IntoIterator<Item = (u64, u64)>) -> std::io::Result<WritableCode> {
        let spans: Vec<(u64, u64)> = spans.into_iter().collect();
        crate::sys::page_copies::note_before_writing(spans.iter().copied());
        let mut pages: Vec<u64> = Vec::new();
        for (address, len) in spans {
            let mut page = address & !(PAGE - 1);
            while page < address + len {
                pages.push(page);
                page += PAGE;
            }
        }
        pages.sort_unstable();
        pages.dedup();
        crate::sys::whole_mappings::before_splitting(&pages);
        let mut ranges: Vec<(u64, u64, i32)> = Vec::new();
        for page in pages {
            let protection = page_protection(page)?;
            match ranges.last_mut() {
                Some((_, end, last)) if *end == page && *last == protection => *end += PAGE,
                _ => ranges.push((page, page + PAGE, protection)),
            }
        }
        let mut writable = WritableCode { ranges: Vec::new() };
        for &(start, end, protection) in &ranges {
            if protection & libc::PROT_WRITE == 0 {
                protect(start, end, protection | libc::PROT_WRITE)?;
            }
            // Recorded at once, so a failure further on restores what was changed.
            writable.ranges.push((start, end, protection));
        }
        Ok(writable)
    }

    /// Stores `bytes` at `address` in one instruction. `address` must lie in a span
    /// given to [`open`](Self::open), and `address` and `address + 1` on one cache
    /// line. Allocates nothing and makes no system call.
    pub fn store_two_bytes(&self, address: u64, bytes: [u8; 2]) {
        debug_assert!(self.covers(address, 2), "{address:#x} was not opened");
        debug_assert!(address % 64 != 63, "{address:#x} straddles a cache line");
        let value = u16::from_le_bytes(bytes);
        // SAFETY: the page is mapped and writable (opened above); a thread executing
        // these bytes sees the old or the new word, both whole instructions by the
        // protocol's construction. The store touches only these two bytes.
        unsafe {
            std::arch::asm!(
                "mov word ptr [{address}], {value:x}",
                address = in(reg) address,
                value = in(reg) value,
                options(nostack, preserves_flags),
            );
        }
    }

    /// Stores `bytes` at `address`, a byte at a time, with no system call: for bytes no
    /// thread can be executing while they change (the tail of an entry jump behind its
    /// guard). `address..address + bytes.len()` must lie in a span given to
    /// [`open`](Self::open).
    pub fn store_bytes(&self, address: u64, bytes: &[u8]) {
        debug_assert!(
            self.covers(address, bytes.len() as u64),
            "{address:#x} was not opened"
        );
        for (offset, &byte) in bytes.iter().enumerate() {
            // SAFETY: the page is mapped and writable (opened above), and the caller
            // guarantees no thread executes these bytes while they change. Volatile,
            // so the stores stay byte stores and never become a `memcpy` call (the
            // caller may hold guards over libc's code).
            unsafe { std::ptr::write_volatile((address + offset as u64) as *mut u8, byte) };
        }
    }

    fn covers(&self, address: u64, len: u64) -> bool {
        self.ranges
            .iter()
            .any(|&(start, end, _)| address >= start && address + len <= end)
    }
}

impl Drop for WritableCode {
    fn drop(&mut self) {
        for &(start, end, protection) in &self.ranges {
            if protection & libc::PROT_WRITE == 0 {
                // A failure leaves the page writable as well: nothing else to do.
                let _ = protect(start, end, protection);
            }
        }
    }
}

fn protect(start: u64, end: u64, protection: i32) -> std::io::Result<()> {
    // SAFETY: changes the protection of whole pages of an existing executable mapping
    // without removing read or execute access from code that may be running there.
    let result = unsafe {
        libc::mprotect(
            start as *mut libc::c_void,
            (end - start) as usize,
            protection,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    extern "C" fn forty_two() -> u32 {
        std::hint::black_box(42)
    }

    #[test]
    fn two_bytes_of_own_code_change_in_one_store_and_the_page_is_put_back() {
        // A page of anonymous memory made read+execute, holding `mov eax,1; ret`.
        // SAFETY: a fresh private mapping, ours alone.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as u64;
        let code: [u8; 6] = [0xb8, 1, 0, 0, 0, 0xc3];
        // SAFETY: the page is writable and 6 bytes fit.
        unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), page as *mut u8, code.len()) };
        protect(page, page + PAGE, libc::PROT_READ | libc::PROT_EXEC).unwrap();
        refresh_protections().unwrap();
        assert_eq!(
            page_protection(page).unwrap(),
            libc::PROT_READ | libc::PROT_EXEC
        );
        // SAFETY: the page holds a complete function with the C ABI.
        let call = || unsafe { std::mem::transmute::<u64, extern "C" fn() -> u32>(page)() };
        assert_eq!(call(), 1);
        {
            let writable = WritableCode::open([(page + 1, 2)]).unwrap();
            // mov eax,1 -> mov eax,0x0207.
            writable.store_two_bytes(page + 1, [7, 2]);
        }
        assert_eq!(call(), 0x0207);
        refresh_protections().unwrap();
        assert_eq!(
            page_protection(page).unwrap(),
            libc::PROT_READ | libc::PROT_EXEC,
            "not writable any more"
        );
        assert_eq!(forty_two(), 42);
        // SAFETY: unmaps the page mapped above.
        unsafe { libc::munmap(page as *mut libc::c_void, PAGE as usize) };
    }
}
