//! Code pages that tendril's writes turned into private copies, given back to their
//! file once nothing of tendril's is on them.
//!
//! A write to a private file mapping (a library's code) makes the kernel copy the page:
//! from then on the process holds its own anonymous copy, even after every byte is
//! restored. A recording that patched a few hundred functions left hundreds of KiB of
//! such copies in the target. The one idea: before tendril first writes to a page, it
//! asks the kernel (`/proc/self/pagemap`) whether the page is still the file's, and if so
//! keeps a snapshot of it; once its bytes equal the snapshot again (everything tendril
//! wrote there is restored), `madvise(MADV_DONTNEED)` drops the copy and the page is the
//! file's again. A thread that runs there meanwhile faults the file's page back in:
//! the same bytes. A page that was a copy already (relocated code, another tool's
//! patch) is never touched.

use crate::sys::code_memory;
use crate::sys::state::STATE;

const PAGE: u64 = 4096;

/// `/proc/self/pagemap` bits: the page is present, and it is a file page (or shared).
const PRESENT: u64 = 1 << 63;
const FILE_PAGE: u64 = 1 << 61;

/// Notes, before tendril writes to them, the pages of `spans` not seen yet. Allocates:
/// call it before any guard is up.
pub fn note_before_writing(spans: impl IntoIterator<Item = (u64, u64)>) {
    let mut known = STATE.page_origins.lock().unwrap_or_else(|p| p.into_inner());
    for (address, len) in spans {
        let mut page = address & !(PAGE - 1);
        while page < address + len {
            known.entry(page).or_insert_with(|| origin_of(page));
            page += PAGE;
        }
    }
}

/// The page at `page` as it is now: its bytes if it is the file's page, `None` if it
/// is a private copy already (never given back by tendril).
fn origin_of(page: u64) -> Option<Box<[u8; PAGE as usize]>> {
    let mut bytes = Box::new([0u8; PAGE as usize]);
    // Read first: that faults the page in if it was not, as the file's.
    if !code_memory::read_memory(page, &mut bytes[..]) {
        return None;
    }
    match pagemap_entry(page) {
        Some(entry) if entry & PRESENT != 0 && entry & FILE_PAGE != 0 => Some(bytes),
        _ => None,
    }
}

/// The page's `/proc/self/pagemap` entry.
fn pagemap_entry(page: u64) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let pagemap = std::fs::File::open("/proc/self/pagemap").ok()?;
    let mut entry = [0u8; 8];
    pagemap.read_exact_at(&mut entry, page / PAGE * 8).ok()?;
    Some(u64::from_le_bytes(entry))
}

/// Gives back to their file the noted pages whose bytes are the file's again; returns
/// how many, then joins the mappings split meanwhile (`whole_mappings`). Call it once
/// code is restored, with the engine's lock held (no write of tendril's can come
/// meanwhile).
pub fn give_back_unchanged() -> usize {
    let mut known = STATE.page_origins.lock().unwrap_or_else(|p| p.into_inner());
    let mut given = 0;
    known.retain(|&page, origin| {
        let Some(bytes) = origin else {
            return true;
        };
        let mut now = [0u8; PAGE as usize];
        if !code_memory::read_memory(page, &mut now) {
            // Unmapped since (a library unloaded): nothing to give back.
            return false;
        }
        if now[..] != bytes[..] {
            return true;
        }
        // SAFETY: drops this process's private copy of a page of a private file
        // mapping whose bytes are the file's (checked just above, with no write of
        // tendril's possible meanwhile): a thread that runs there faults the file's
        // page back in, the same bytes.
        let dropped = unsafe {
            libc::madvise(
                page as *mut libc::c_void,
                PAGE as usize,
                libc::MADV_DONTNEED,
            )
        };
        given += usize::from(dropped == 0);
        false
    });
    let still_changed: Vec<u64> = (known.iter())
        .filter_map(|(&page, origin)| origin.as_ref().map(|_| page))
        .collect();
    drop(known);
    crate::sys::whole_mappings::join_restored(&still_changed);
    given
}
