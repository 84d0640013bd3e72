//! Writing and unwriting entry jumps while the process's other threads keep running.
//!
//! Installing a batch:
//! 1. write each short patch's `jmp rel32` into its padding (dead code: no thread runs
//!    there until the entry jumps are written, after the serialisations below);
//! 2. write `int3` over each entry's first byte and serialise: from now on a thread
//!    arriving at an entry traps and is sent to the trampoline (`traps`);
//! 3. if some entry jump overwrites more than one instruction, stop the other threads
//!    (`stop_world`) and move any that sits between two overwritten instructions to the
//!    same instruction in the trampoline's copy;
//! 4. write the rest of each jump, serialise, write the jump opcodes over the `int3`s
//!    and let the threads go. (No need to serialise after the opcodes: a core that
//!    still sees an `int3` traps and is sent to the trampoline, and every serialisation
//!    costs an interrupt on each core running the process, tens of µs in a VM.)
//!
//! Restoring needs no stop for the entries: the bytes after a jump opcode are its
//! displacement, which no thread ever executes, so `int3` on the opcode, then the
//! original tail, then the original first byte (serialising between steps) is safe for
//! any thread at any point. A pad can have a thread on it (it took the short jump just
//! before the entry was restored), so pads are restored with the threads stopped, such
//! a thread being moved on to the trampoline the pad led to.

use crate::code::entry_plan::{EntryPlan, PatchStyle};
use crate::code::padding::PAD_LEN;
use crate::sys::code_memory;

/// Most bytes an entry patch writes (a 6-byte `call [rip+x]` replaced by a thunk call).
pub const MAX_ENTRY_PATCH: usize = 6;
use crate::patching::stop_world::{self, ParkedThread};
use crate::patching::traps;
use crate::sys::agent_threads;
use std::sync::Mutex;

const INT3: u8 = 0xcc;
const JMP_REL32: u8 = 0xe9;
const JMP_REL8: u8 = 0xeb;
const CALL_REL32: u8 = 0xe8;
const NOP: u8 = 0x90;

/// A built trampoline, reusable while the function's bytes are unchanged.
#[derive(Clone)]
pub struct Trampoline {
    /// Where the relocated first instructions start.
    pub body: u64,
    pub hook: u64,
    /// Where a thread that traps on the entry's transient `int3` is sent.
    pub trap_entry: u64,
    /// Bytes at the function entry the trampoline was built from.
    pub entry_bytes: Vec<u8>,
    pub plan: EntryPlan,
    /// (offset of an overwritten instruction in the function, offset of its copy).
    pub instruction_map: Vec<(usize, usize)>,
}

/// A `jmp rel32` placed in padding for a short entry jump, and the bytes it replaced.
pub struct Pad {
    pub address: u64,
    pub original: [u8; PAD_LEN as usize],
}

/// A patched (or about to be patched) function.
pub struct Site {
    /// Where the entry jump is written (the entry, or just after its `endbr64`).
    pub patch_at: u64,
    /// The bytes the entry patch replaced (the first `jump_len` are meaningful).
    pub original: [u8; MAX_ENTRY_PATCH],
    pub pad: Option<Pad>,
    pub trampoline: Trampoline,
    pub owner: u64,
    pub id: u32,
    /// An internal hook on the unwinder (see `shadow`): it goes in before, and comes
    /// out after, every return hook.
    pub internal: bool,
    /// Where the lock-free record keeps the entry's and the pad's original bytes.
    pub recorded: [Option<usize>; 2],
}

impl Site {
    pub fn function(&self) -> u64 {
        self.patch_at - self.trampoline.plan.patch_offset as u64
    }

    fn jump_len(&self) -> usize {
        self.trampoline.plan.jump_len
    }

    /// The entry patch: `jmp rel32` to the hook, `jmp rel8` to the pad, or for a call
    /// thunk `call rel32` to the hook (and a `nop` for a 6-byte call).
    fn entry_jump(&self) -> Vec<u8> {
        if self.trampoline.plan.style == PatchStyle::CallThunk {
            let mut call = rel32_jump(self.patch_at, self.trampoline.hook).to_vec();
            call[0] = CALL_REL32;
            call.resize(self.jump_len(), NOP);
            return call;
        }
        match &self.pad {
            None => rel32_jump(self.patch_at, self.trampoline.hook).to_vec(),
            Some(pad) => {
                let displacement = pad.address.wrapping_sub(self.patch_at + 2) as i8;
                vec![JMP_REL8, displacement as u8]
            }
        }
    }
}

fn rel32_jump(from: u64, to: u64) -> [u8; 5] {
    let displacement = to.wrapping_sub(from + 5) as i32;
    let mut jump = [JMP_REL32, 0, 0, 0, 0];
    jump[1..].copy_from_slice(&displacement.to_le_bytes());
    jump
}

fn write(address: u64, bytes: &[u8]) -> Result<(), String> {
    code_memory::write_code(address, bytes).map_err(|e| format!("cannot write code: {e}"))
}

/// Writes the jumps of a prepared batch (see the module comment).
pub fn install(batch: &mut [Site]) -> Result<(), String> {
    let _no_thread_start = agent_threads::code_change();
    traps::wait_until_deliverable(traps::INSTALL_WAIT)?;
    // The pads need no serialisation of their own: nothing can reach them before the
    // entry jumps are written, two serialisations later.
    for site in batch.iter() {
        if let Some(pad) = &site.pad {
            write(pad.address, &rel32_jump(pad.address, site.trampoline.hook))?;
        }
    }
    for site in batch.iter() {
        write(site.patch_at, &[INT3])?;
    }
    stop_world::serialize_all_cores();
    let jumps: Vec<Vec<u8>> = batch.iter().map(Site::entry_jump).collect();
    let batch_view: &[Site] = batch;
    let write_jumps = || -> std::io::Result<()> {
        for (site, jump) in batch_view.iter().zip(&jumps) {
            code_memory::write_code(site.patch_at + 1, &jump[1..])?;
        }
        stop_world::serialize_all_cores();
        // No serialisation after this last step: a core that still sees an int3 traps
        // and is sent on to the trampoline (trap sites stay registered for good).
        for (site, jump) in batch_view.iter().zip(&jumps) {
            code_memory::write_code(site.patch_at, &jump[..1])?;
        }
        Ok(())
    };
    // With one instruction overwritten, no thread can be in the middle of the patch.
    let needs_stop = batch_view
        .iter()
        .any(|site| site.trampoline.plan.instruction_offsets.len() > 1);
    let written = if needs_stop {
        stop_world::with_world_stopped(|parked| {
            for thread in parked.iter_mut() {
                move_out_of_patches(thread, batch_view);
            }
            write_jumps()
        })
        .map_err(|e| e.0)
    } else {
        Ok(write_jumps())
    };
    match written {
        Ok(Ok(())) => {
            for site in batch.iter_mut() {
                site.recorded = [
                    active::record(site.patch_at, &site.original[..site.jump_len()]),
                    site.pad
                        .as_ref()
                        .and_then(|pad| active::record(pad.address, &pad.original)),
                ];
            }
            Ok(())
        }
        Ok(Err(error)) => {
            restore(batch);
            Err(format!("cannot write code: {error}"))
        }
        Err(reason) => {
            // Only the int3s and the pads were written, and no thread can be on a pad
            // yet: put it all back.
            for site in batch.iter() {
                let _ = write(site.patch_at, &site.original[..1]);
                if let Some(pad) = &site.pad {
                    let _ = write(pad.address, &pad.original);
                }
            }
            stop_world::serialize_all_cores();
            Err(reason)
        }
    }
}

/// A parked thread between two overwritten instructions continues at the same
/// instruction in the trampoline's copy.
fn move_out_of_patches(thread: &mut ParkedThread, batch: &[Site]) {
    let pc = thread.pc();
    for site in batch {
        let plan = &site.trampoline.plan;
        if pc > site.patch_at && pc < site.patch_at + plan.overwritten_len as u64 {
            let offset = (pc - site.function()) as usize;
            if let Some(&(_, copy)) = site
                .trampoline
                .instruction_map
                .iter()
                .find(|&&(original, _)| original == offset)
            {
                thread.set_pc(site.trampoline.body + copy as u64);
            }
            return;
        }
    }
}

/// A pad to restore: its bytes, the hook it leads to, and its record slot.
struct PendingPad {
    pad: Pad,
    hook: u64,
    recorded: Option<usize>,
}

/// Pads whose restore could not stop the process yet; retried on every restore.
static PENDING_PADS: Mutex<Vec<PendingPad>> = Mutex::new(Vec::new());

/// Puts back the original bytes of `sites` (see the module comment).
pub fn restore(sites: &[Site]) {
    let _no_thread_start = agent_threads::code_change();
    // The code must come back even if some thread keeps SIGTRAP blocked: after the
    // wait, the restore goes ahead (its int3s last microseconds).
    let _ = traps::wait_until_deliverable(traps::RESTORE_WAIT);
    for site in sites {
        let _ = write(site.patch_at, &[INT3]);
    }
    stop_world::serialize_all_cores();
    for site in sites {
        let _ = write(site.patch_at + 1, &site.original[1..site.jump_len()]);
    }
    stop_world::serialize_all_cores();
    for site in sites {
        let _ = write(site.patch_at, &site.original[..1]);
        active::forget(site.recorded[0]);
    }
    stop_world::serialize_all_cores();
    let mut pending = PENDING_PADS.lock().unwrap_or_else(|p| p.into_inner());
    pending.extend(sites.iter().filter_map(|site| {
        site.pad.as_ref().map(|pad| PendingPad {
            pad: Pad {
                address: pad.address,
                original: pad.original,
            },
            hook: site.trampoline.hook,
            recorded: site.recorded[1],
        })
    }));
    if pending.is_empty() {
        return;
    }
    let pads: &[PendingPad] = &pending;
    let restored = stop_world::with_world_stopped(|parked| {
        for thread in parked.iter_mut() {
            let pc = thread.pc();
            if let Some(pending) = pads
                .iter()
                .find(|p| pc >= p.pad.address && pc < p.pad.address + PAD_LEN)
            {
                thread.set_pc(pending.hook);
            }
        }
        for pending in pads {
            let _ = code_memory::write_code(pending.pad.address, &pending.pad.original);
        }
        stop_world::serialize_all_cores();
    });
    if restored.is_ok() {
        for pad in pending.iter() {
            active::forget(pad.recorded);
        }
        pending.clear();
    }
}

/// In a forked child, which has only the thread that forked: put back every byte at
/// once. The engine's lock may have been held by a thread that does not exist in the
/// child, so this reads the lock-free record of what is patched.
pub fn restore_all_in_forked_child() {
    active::for_each(|address, original| {
        let _ = code_memory::write_code(address, original);
    });
}

/// A lock-free record of the bytes patched now (address, original bytes), for the
/// child of a fork.
mod active {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    const CAPACITY: usize = 1 << 16;
    static ADDRESS: [AtomicU64; CAPACITY] = [const { AtomicU64::new(0) }; CAPACITY];
    /// Where the search for a free slot starts (slots are reused after a restore).
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    /// Up to 7 original bytes, and their count in the top byte.
    static ORIGINAL: [AtomicU64; CAPACITY] = [const { AtomicU64::new(0) }; CAPACITY];

    fn pack(bytes: &[u8]) -> u64 {
        let mut word = [0u8; 8];
        word[..bytes.len()].copy_from_slice(bytes);
        word[7] = bytes.len() as u8;
        u64::from_le_bytes(word)
    }

    /// Records patched bytes (called with the engine's lock held); returns the slot.
    pub fn record(address: u64, original: &[u8]) -> Option<usize> {
        let start = NEXT.load(Ordering::Relaxed);
        let slot = (0..CAPACITY)
            .map(|i| (start + i) % CAPACITY)
            .find(|&slot| ADDRESS[slot].load(Ordering::Relaxed) == 0)?;
        ORIGINAL[slot].store(pack(original), Ordering::Relaxed);
        ADDRESS[slot].store(address, Ordering::Release);
        NEXT.store((slot + 1) % CAPACITY, Ordering::Relaxed);
        Some(slot)
    }

    /// Forgets restored bytes (called with the engine's lock held).
    pub fn forget(slot: Option<usize>) {
        if let Some(slot) = slot {
            ADDRESS[slot].store(0, Ordering::Release);
        }
    }

    pub fn for_each(mut visit: impl FnMut(u64, &[u8])) {
        for (address, original) in ADDRESS.iter().zip(&ORIGINAL) {
            let at = address.load(Ordering::Acquire);
            if at != 0 {
                let bytes = original.load(Ordering::Relaxed).to_le_bytes();
                let len = (bytes[7] as usize).min(7);
                visit(at, &bytes[..len]);
            }
        }
    }
}
