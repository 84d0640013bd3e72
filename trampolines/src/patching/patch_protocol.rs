//! Writing and unwriting entry jumps while the process's other threads keep running,
//! whatever their signal masks: no step writes an `int3` a thread could meet.
//!
//! Installing a batch:
//! 1. write each short patch's `jmp rel32` into its padding (dead code: no thread runs
//!    there until the entry jumps are written, after the serialisations below);
//! 2. if some entry jump overwrites more than one instruction, stop every thread that
//!    runs user code (`stop_world`: parked by a signal, or held with ptrace if it blocks
//!    signals) — before any guard goes up, so that no thread spins at one while the
//!    stop waits for a thousand others; for a batch of the unwinder's own entries (run
//!    only by a thread that throws or exits), the guards go up first and a peek moves
//!    the threads instead, holding none;
//! 3. store a jump-to-self guard (`EB FE`) over each entry's first two bytes, one store
//!    each (`code_pages`), and serialise: a thread arriving at an entry now (one woken
//!    from a system call) spins there for the microseconds the patch takes instead of
//!    running half-written bytes (the planner guarantees those two bytes are one
//!    instruction's, on one cache line); with a stop, move any stopped thread that sits
//!    between two overwritten instructions — or whose signal frame would resume there
//!    (`signal_frames`) — to the same instruction in the trampoline's copy; a thread
//!    left asleep in a system call cannot be inside, and comes back through the guard,
//!    but one may have woken between its look and the guards: each is looked at again
//!    once they are up, and one no longer in a system call is stopped and moved too;
//! 4. write the rest of each jump, serialise, store each jump's first two bytes over
//!    its guard, serialise, and let the threads go.
//!
//! Restoring needs no stop for the entries: a patched entry is one instruction, so the
//! same guard, then the original tail, then the original first two bytes (serialising
//! between steps) is safe for any thread at any point. A pad can have a thread on it
//! (it took the short jump just before the entry was restored), so pads are restored
//! with the threads stopped, such a thread being moved on to the trampoline the pad led
//! to. Restore and Scheme B's patches made from the target's own threads go through
//! the same two functions. If the patching thread dies mid-way the process dies with
//! it; if the controller dies, the agent finishes the batch and then restores.

use crate::code::entry_plan::PatchStyle;
use crate::code::padding::PAD_LEN;
use crate::patching::signal_frames::{self, Frames};
use crate::patching::sites::PendingPad;
pub use crate::patching::sites::{MAX_ENTRY_PATCH, Pad, Site, Trampoline};
use crate::patching::state::STATE;
use crate::patching::stop_world::{self, StopBuffers, StoppedWorld};
use crate::sys::agent_threads;
use crate::sys::code_memory;
use crate::sys::code_pages::WritableCode;
use crate::sys::error::AgentError;

/// `jmp $`: two bytes that keep an arriving thread where it is.
const GUARD: [u8; 2] = [0xeb, 0xfe];
const JMP_REL32: u8 = 0xe9;
const JMP_REL8: u8 = 0xeb;
const CALL_REL32: u8 = 0xe8;
const NOP: u8 = 0x90;

impl Site {
    pub fn function(&self) -> u64 {
        self.patch_at - self.trampoline.plan.patch_offset as u64
    }

    fn jump_len(&self) -> usize {
        self.trampoline.plan.jump_len
    }

    /// Whether its entry jump overwrites more than one instruction: a thread may be
    /// between two of them, so the process's threads must be stopped while it goes in.
    /// With one instruction overwritten, no thread can be in the middle of the patch.
    pub fn needs_stop(&self) -> bool {
        self.trampoline.plan.instruction_offsets.len() > 1
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

fn write(address: u64, bytes: &[u8]) -> Result<(), AgentError> {
    code_memory::write_code(address, bytes).map_err(|e| AgentError::io("cannot write code", e))
}

/// Writes the jumps of a prepared batch (see the module comment).
pub fn install(batch: &mut [Site]) -> Result<(), AgentError> {
    let _no_thread_start = agent_threads::code_change();
    let writable = WritableCode::open(batch.iter().map(|s| (s.patch_at, s.jump_len() as u64)))
        .map_err(|e| AgentError::io("cannot make the code writable for a moment", e))?;
    crate::sys::page_copies::note_before_writing(
        batch
            .iter()
            .filter_map(|site| site.pad.as_ref().map(|pad| (pad.address, PAD_LEN))),
    );
    // The pads need no serialisation of their own: nothing can reach them before the
    // entry jumps are written, two serialisations later.
    let mut pads_written = 0;
    let mut pad_result = Ok(());
    for site in batch.iter() {
        if let Some(pad) = &site.pad {
            pad_result = write(pad.address, &rel32_jump(pad.address, site.trampoline.hook));
            if pad_result.is_err() {
                break;
            }
        }
        pads_written += 1;
    }
    if let Err(error) = pad_result {
        put_pads_back(&batch[..pads_written]);
        return Err(error);
    }
    let jumps: Vec<Vec<u8>> = batch.iter().map(Site::entry_jump).collect();
    let needs_stop = batch.iter().any(Site::needs_stop);
    let peek_moves = needs_stop
        .then(|| moves_off_unwinder_entries(batch))
        .flatten();
    let mut buffers = needs_stop.then(|| {
        // Only a stop moves threads, and only then are signal frames looked for.
        signal_frames::learn_restorers(stop_world::park_signal());
        StopBuffers::new()
    });
    // From the first guard to the last final store, this thread must not run any code
    // a guard may hold (libc included): raw system calls only, and no allocation.
    let put_guards = || {
        for site in batch.iter() {
            writable.store_two_bytes(site.patch_at, GUARD);
        }
        stop_world::serialize_all_cores();
    };
    let batch_view: &[Site] = batch;
    let write_jumps = || {
        // Plain stores: a system call per tail here would leave the guards up for
        // longer, and a thread spinning at a guard burns its time slice meanwhile.
        for (site, jump) in batch_view.iter().zip(&jumps) {
            writable.store_bytes(site.patch_at + 2, &jump[2..]);
        }
        stop_world::serialize_all_cores();
        for (site, jump) in batch_view.iter().zip(&jumps) {
            writable.store_two_bytes(site.patch_at, [jump[0], jump[1]]);
        }
        stop_world::serialize_all_cores();
    };
    // With a stop, the guards go up once every running thread is parked: up while the
    // stop waited for a thousand threads, they held every thread that called a patched
    // function spinning there, taking the cores from the threads the stop waited for
    // (a batch of 716 libc functions held threads for 0.65 s). Only threads that wake
    // from a system call meanwhile meet them now; those that woke before are stopped
    // behind the guards (`with_world_stopped_behind`): one could be between two
    // instructions that the jumps overwrite.
    let written = match (buffers.as_mut(), &peek_moves) {
        // A batch of the unwinder's entries, which a thread reaches only when it throws
        // or exits: the guards go up first, and a peek moves each thread that is inside
        // one on to the trampoline's copy, holding none (see
        // `moves_off_unwinder_entries`).
        (Some(buffers), Some(moves)) => {
            put_guards();
            stop_world::with_every_thread_peeked_in(buffers, moves, |world| {
                move_threads(world, &|pc| resume_point_in_copy(pc, batch_view));
                write_jumps()
            })
        }
        (Some(buffers), None) => {
            stop_world::with_world_stopped_behind(buffers, &put_guards, |world| {
                move_threads(world, &|pc| resume_point_in_copy(pc, batch_view));
                write_jumps()
            })
        }
        (None, _) => {
            put_guards();
            write_jumps();
            Ok(())
        }
    };
    match written {
        Ok(()) => {
            for (site, jump) in batch.iter_mut().zip(&jumps) {
                let hook = site.trampoline.hook;
                site.recorded = [
                    active::record(site.patch_at, &site.original[..site.jump_len()], jump),
                    site.pad.as_ref().and_then(|pad| {
                        let written = rel32_jump(pad.address, hook);
                        active::record(pad.address, &pad.original, &written)
                    }),
                ];
            }
            Ok(())
        }
        Err(reason) => {
            // Only the guards and the pads were written, and no thread can be on a pad
            // yet: put it all back (a thread at a guard goes on into the original).
            for site in batch.iter() {
                writable.store_two_bytes(site.patch_at, [site.original[0], site.original[1]]);
            }
            stop_world::serialize_all_cores();
            put_pads_back(batch);
            Err(reason)
        }
    }
}

/// Points the installed `site` at another trampoline, whose hook is `hook`: its entry
/// jump, or for a short patch its pad's jump, now leads there (a copy behind a
/// recording hook). Either is one instruction before and after, so no thread is ever
/// between two of its instructions: a thread arriving meanwhile waits at the guard, and
/// one already on a pad (it took the short jump just before the guard) is sent to the
/// old hook, where it would have gone, by a peek (`stop_world`: no thread is held
/// while the others look). A thread inside the old trampoline
/// finishes there. The site's original bytes do not change. On an error the site still
/// leads to its old trampoline.
///
/// A call thunk's call is retargeted the same way (adaptive timing switches its hook):
/// only its displacement changes.
pub fn retarget(site: &Site, hook: u64) -> Result<(), AgentError> {
    let call_thunk = site.trampoline.plan.style == PatchStyle::CallThunk;
    if call_thunk && site.pad.is_some() {
        return Err(AgentError::Refused(
            "its entry is a call, which its hook replaced in place, behind a pad".into(),
        ));
    }
    let _no_thread_start = agent_threads::code_change();
    let writable = WritableCode::open([(site.patch_at, site.jump_len() as u64)])
        .map_err(|e| AgentError::io("cannot make the code writable for a moment", e))?;
    // Everything a stop needs is ready before the guard goes up: from then on this
    // thread runs no code the guard may hold (libc included) and allocates nothing.
    let mut buffers = match &site.pad {
        Some(_) => {
            stop_world::install()?;
            crate::sys::thread_tracer::prepare()?;
            signal_frames::learn_restorers(stop_world::park_signal());
            Some(StopBuffers::new())
        }
        None => None,
    };
    let entry = site.entry_jump();
    writable.store_two_bytes(site.patch_at, GUARD);
    stop_world::serialize_all_cores();
    let written = match (&site.pad, buffers.as_mut()) {
        (Some(pad), Some(buffers)) => {
            let old_hook = site.trampoline.hook;
            let on_pad =
                |pc: u64| (pc >= pad.address && pc < pad.address + PAD_LEN).then_some(old_hook);
            let jump = rel32_jump(pad.address, hook);
            // The guard keeps threads off the pad from now on: each only looks once.
            let moves = [(pad.address, pad.address + PAD_LEN, old_hook)];
            let written = stop_world::with_every_thread_peeked_in(buffers, &moves, |world| {
                move_threads(world, &on_pad);
                let written = code_memory::write_code(pad.address, &jump);
                stop_world::serialize_all_cores();
                written
            });
            if matches!(written, Ok(Ok(()))) {
                active::rewrite(site.recorded[1], &jump);
            }
            written
        }
        _ => {
            let mut jump = rel32_jump(site.patch_at, hook);
            if call_thunk {
                jump[0] = CALL_REL32;
            }
            writable.store_bytes(site.patch_at + 2, &jump[2..]);
            stop_world::serialize_all_cores();
            writable.store_two_bytes(site.patch_at, [jump[0], jump[1]]);
            stop_world::serialize_all_cores();
            active::rewrite(site.recorded[0], &jump);
            return Ok(());
        }
    };
    // The short jump to the pad goes back over the guard, whatever the pad now says;
    // only then may an error be formatted (it allocates).
    writable.store_two_bytes(site.patch_at, [entry[0], entry[1]]);
    stop_world::serialize_all_cores();
    written?.map_err(|e| AgentError::io("cannot write code", e))
}

/// When every entry of `batch` is one of the unwinder's own (`Site::internal`:
/// functions a thread runs only when it throws, is cancelled or exits; they go in as
/// a batch of their own), the moves of a peek that puts a thread found between two
/// instructions an entry jump overwrites on the same instruction in the trampoline's
/// copy: one per instruction boundary (a thread is interrupted at one). `None`
/// otherwise: the batch is installed with the process stopped, since any other
/// function's guard, up for the length of a peek, could hold every thread that calls it
/// (see `install`).
fn moves_off_unwinder_entries(batch: &[Site]) -> Option<Vec<(u64, u64, u64)>> {
    if batch.iter().any(|site| !site.internal) {
        return None;
    }
    let several = batch.iter().filter(|site| site.needs_stop());
    let moves = several.flat_map(|site| {
        let inside = site.patch_at + 1..site.patch_at + site.trampoline.plan.overwritten_len as u64;
        (site.trampoline.instruction_map.iter())
            .map(|&(original, copy)| (site.function() + original as u64, copy))
            .filter(move |(at, _)| inside.contains(at))
            .map(|(at, copy)| (at, at + 1, site.trampoline.body + copy as u64))
    });
    Some(moves.collect())
}

/// Writes back the bytes of pads no thread can have reached.
fn put_pads_back(sites: &[Site]) {
    for site in sites {
        if let Some(pad) = &site.pad {
            let _ = write(pad.address, &pad.original);
        }
    }
}

/// Moves every stopped thread, and every saved pc in a signal frame on a stopped or
/// sleeping thread's stack, for which `resume_at` gives a new place.
fn move_threads(world: StoppedWorld<'_>, resume_at: &dyn Fn(u64) -> Option<u64>) {
    for thread in world.stopped.iter_mut() {
        if let Some(pc) = resume_at(thread.pc()) {
            thread.set_pc(pc);
        }
    }
    // A thread held with ptrace may be inside the stop signal's own handler (a late
    // signal's), interrupted inside these bytes: its frame is looked for even in a
    // program with no handlers of its own (`move_saved_pcs` scans nothing else then).
    for thread in world.stopped.iter() {
        let frames = if thread.held_with_ptrace() {
            Frames::OwnToo
        } else {
            Frames::ProgramsOnly
        };
        signal_frames::move_saved_pcs(thread.sp(), frames, resume_at);
    }
    if !signal_frames::any_restorers() {
        return;
    }
    for &tid in world.asleep {
        if let Some((_, sp)) = crate::sys::tasks::user_position(tid) {
            signal_frames::move_saved_pcs(sp, Frames::ProgramsOnly, resume_at);
        }
    }
    // The stopper's own stack: it may be a target thread, in a handler of a signal that
    // interrupted it inside one of these functions.
    let own = 0u64;
    signal_frames::move_saved_pcs(&own as *const u64 as u64, Frames::ProgramsOnly, resume_at);
}

/// Where a thread at `pc` strictly inside the bytes a site of `batch` overwrites goes
/// on: the same instruction in the site's trampoline copy. Pure.
pub fn resume_point_in_copy(pc: u64, batch: &[Site]) -> Option<u64> {
    let site = batch.iter().find(|site| {
        pc > site.patch_at && pc < site.patch_at + site.trampoline.plan.overwritten_len as u64
    })?;
    let offset = (pc - site.function()) as usize;
    site.trampoline
        .instruction_map
        .iter()
        .find(|&&(original, _)| original == offset)
        .map(|&(_, copy)| site.trampoline.body + copy as u64)
}

/// Whether `site`'s entry (and pad) still hold the jumps tendril wrote: false once the
/// library it was in has been unloaded (and maybe another mapped there), whose bytes
/// are then not tendril's to restore. Reads through `/proc/self/mem`, so an address
/// nothing maps any more reads as not installed instead of faulting.
pub fn still_installed(site: &Site) -> bool {
    let entry = site.entry_jump();
    let mut now = [0u8; MAX_ENTRY_PATCH];
    let now = &mut now[..entry.len()];
    if !code_memory::read_memory(site.patch_at, now) || now != entry.as_slice() {
        return false;
    }
    site.pad
        .as_ref()
        .is_none_or(|pad| holds(pad.address, &rel32_jump(pad.address, site.trampoline.hook)))
}

/// Forgets `site` without writing a byte: its library was unloaded while it was
/// patched (see [`still_installed`]), so a fork's child must not restore it either.
pub fn forget_unloaded(site: &Site) {
    for slot in site.recorded {
        active::forget(slot);
    }
}

/// Whether the code at `address` is `bytes` now (an unmapped address is not).
fn holds(address: u64, bytes: &[u8]) -> bool {
    let mut now = [0u8; 16];
    let now = &mut now[..bytes.len()];
    code_memory::read_memory(address, now) && now == bytes
}

/// Puts back the original bytes of `sites` (see the module comment). Every site must
/// still be installed ([`still_installed`], checked with the loader held).
pub fn restore(sites: &[Site]) {
    let _no_thread_start = agent_threads::code_change();
    match WritableCode::open(sites.iter().map(|s| (s.patch_at, s.jump_len() as u64))) {
        Ok(writable) => {
            for site in sites {
                writable.store_two_bytes(site.patch_at, GUARD);
            }
            stop_world::serialize_all_cores();
            for site in sites {
                writable.store_bytes(site.patch_at + 2, &site.original[2..site.jump_len()]);
            }
            stop_world::serialize_all_cores();
            for site in sites {
                writable.store_two_bytes(site.patch_at, [site.original[0], site.original[1]]);
                active::forget(site.recorded[0]);
            }
            stop_world::serialize_all_cores();
        }
        Err(_) => {
            // The pages cannot be made writable (a policy refuses it): write the bytes
            // with every thread that runs user code stopped; a thread asleep in a
            // system call would have to wake and reach the entry within microseconds.
            let _ = stop_world::with_world_stopped(|_| {
                for site in sites {
                    let _ = write(site.patch_at, &site.original[..site.jump_len()]);
                }
                stop_world::serialize_all_cores();
            });
            for site in sites {
                active::forget(site.recorded[0]);
            }
        }
    }
    let mut pending = STATE.pending_pads.lock().unwrap_or_else(|p| p.into_inner());
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
    // A pad whose library was unloaded since is not tendril's to write any more.
    pending.retain(|p| {
        let ours = holds(p.pad.address, &rel32_jump(p.pad.address, p.hook));
        if !ours {
            active::forget(p.recorded);
        }
        ours
    });
    if pending.is_empty() {
        drop(pending);
        crate::sys::page_copies::give_back_unchanged();
        return;
    }
    let pads: &[PendingPad] = &pending;
    signal_frames::learn_restorers(stop_world::park_signal());
    // The entries no longer lead to the pads: a thread that is not on one now never
    // will be, so each thread only looks once, and none waits for the others.
    let moves: Vec<(u64, u64, u64)> = pads
        .iter()
        .map(|p| (p.pad.address, p.pad.address + PAD_LEN, p.hook))
        .collect();
    let restored = stop_world::with_every_thread_peeked(&moves, |world| {
        move_threads(world, &|pc| resume_point_off_pad(pc, pads));
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
    drop(pending);
    crate::sys::page_copies::give_back_unchanged();
}

/// Whether a pad that leads to `hook` still waits to be restored (its restoring peek
/// has not completed).
pub fn pad_pending_for(hook: u64) -> bool {
    STATE
        .pending_pads
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .any(|pending| pending.hook == hook)
}

/// Where a thread at `pc` on one of `pads` goes on: the trampoline the pad led to.
fn resume_point_off_pad(pc: u64, pads: &[PendingPad]) -> Option<u64> {
    pads.iter()
        .find(|p| pc >= p.pad.address && pc < p.pad.address + PAD_LEN)
        .map(|p| p.hook)
}

/// In a forked child, which has only the thread that forked: put back every byte at
/// once. The engine's lock may have been held by a thread that does not exist in the
/// child, so this reads the lock-free record of what is patched. Only bytes that are
/// still tendril's (what it wrote, or a guard a patch in progress put up) are put
/// back: a library unloaded since it was patched is not tendril's to write.
pub fn restore_all_in_forked_child() {
    active::for_each(|address, original, written| {
        let mut now = [0u8; 7];
        let now = &mut now[..written.len()];
        let ours =
            code_memory::read_memory(address, now) && (now == written || now.starts_with(&GUARD));
        if ours {
            let _ = code_memory::write_code(address, original);
        }
    });
}

/// A lock-free record of the bytes patched now (address, original bytes), for the
/// child of a fork.
mod active {
    use crate::patching::state::{PATCHED_NOW_CAPACITY as CAPACITY, STATE};
    use std::sync::atomic::Ordering;

    fn pack(bytes: &[u8]) -> u64 {
        let mut word = [0u8; 8];
        word[..bytes.len()].copy_from_slice(bytes);
        word[7] = bytes.len() as u8;
        u64::from_le_bytes(word)
    }

    fn unpack(word: u64) -> ([u8; 8], usize) {
        let bytes = word.to_le_bytes();
        let len = (bytes[7] as usize).min(7);
        (bytes, len)
    }

    /// Records patched bytes, the `original` ones and those `written` over them (called
    /// with the engine's lock held); returns the slot.
    pub fn record(address: u64, original: &[u8], written: &[u8]) -> Option<usize> {
        let start = STATE.patched_now_next.load(Ordering::Relaxed);
        let slot = (0..CAPACITY)
            .map(|i| (start + i) % CAPACITY)
            .find(|&slot| STATE.patched_now_address[slot].load(Ordering::Relaxed) == 0)?;
        STATE.patched_now_original[slot].store(pack(original), Ordering::Relaxed);
        STATE.patched_now_written[slot].store(pack(written), Ordering::Relaxed);
        STATE.patched_now_address[slot].store(address, Ordering::Release);
        STATE
            .patched_now_next
            .store((slot + 1) % CAPACITY, Ordering::Relaxed);
        Some(slot)
    }

    /// Records that `written` now stands where the slot's bytes were written (a site
    /// pointed at another hook; called with the engine's lock held).
    pub fn rewrite(slot: Option<usize>, written: &[u8]) {
        if let Some(slot) = slot {
            STATE.patched_now_written[slot].store(pack(written), Ordering::Release);
        }
    }

    /// Forgets restored bytes (called with the engine's lock held).
    pub fn forget(slot: Option<usize>) {
        if let Some(slot) = slot {
            STATE.patched_now_address[slot].store(0, Ordering::Release);
        }
    }

    /// Calls `visit(address, original, written)` for every slot in use.
    pub fn for_each(mut visit: impl FnMut(u64, &[u8], &[u8])) {
        for slot in 0..CAPACITY {
            let at = STATE.patched_now_address[slot].load(Ordering::Acquire);
            if at != 0 {
                let (original, len) =
                    unpack(STATE.patched_now_original[slot].load(Ordering::Relaxed));
                let (written, written_len) =
                    unpack(STATE.patched_now_written[slot].load(Ordering::Acquire));
                visit(at, &original[..len], &written[..written_len]);
            }
        }
    }
}

#[cfg(test)]
mod tests;
