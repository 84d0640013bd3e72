//! The agent's record of every byte it has changed in the target's code.
//!
//! Whatever patches code registers here first, with the original bytes; restoring walks
//! the table and puts those bytes back. A detach, or the end of the session that made a
//! patch (including a controller that vanished), restores through this table, so the
//! target can never be left patched by a lost controller.

use std::sync::Mutex;

/// One patched code range and the bytes it held before.
struct PatchRecord {
    /// The session (control connection) that made the patch.
    owner: u64,
    address: usize,
    original: Vec<u8>,
}

static PATCHES: Mutex<Vec<PatchRecord>> = Mutex::new(Vec::new());

fn table() -> std::sync::MutexGuard<'static, Vec<PatchRecord>> {
    PATCHES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Number of functions currently patched.
pub fn patched_count() -> usize {
    table().len()
}

/// Restores every patch made by `owner`; returns how many were restored.
pub fn restore_owned_by(owner: u64) -> usize {
    restore_where(|record| record.owner == owner)
}

/// Restores every patch, whoever made it; returns how many were restored.
pub fn restore_all() -> usize {
    restore_where(|_| true)
}

fn restore_where(selected: impl Fn(&PatchRecord) -> bool) -> usize {
    let mut table = table();
    let (restore, keep): (Vec<_>, Vec<_>) = table.drain(..).partition(|r| selected(r));
    *table = keep;
    for record in &restore {
        write_code(record.address, &record.original);
    }
    restore.len()
}

/// Writes `bytes` over code at `address` through /proc/self/mem, which the kernel allows
/// on read-only executable pages without making them writable.
fn write_code(address: usize, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    if let Ok(mem) = std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/self/mem")
    {
        let _ = mem.write_all_at(bytes, address as u64);
    }
}
