//! Resume points saved in signal frames: a thread interrupted inside bytes a patch
//! overwrites, and now running a signal handler, resumes where its `ucontext` says when
//! the handler returns — so that saved pc must move like a stopped thread's pc.
//!
//! The one idea: the kernel builds a signal frame on the interrupted thread's stack (or
//! its alternate signal stack) as `rt_sigframe { pretcode; ucontext; siginfo; ... }`,
//! where `pretcode` is the handler's return address: the `sa_restorer` of the handler's
//! `sigaction` (glibc's `__restore_rt`). So a frame is a stack word equal to a known
//! restorer, followed by a `ucontext`. The scan reads `state::SCAN_WINDOW` bytes above a
//! thread's stack pointer with `process_vm_readv` (which stops at unmapped memory
//! instead of faulting), finds such words, and moves a saved pc that lies strictly
//! inside a patch, following a frame's saved stack pointer onto another stack (an
//! alternate signal stack's frame saves the pc of the ordinary stack). A word that only
//! happens to equal a restorer is left alone unless its "saved pc" lies strictly inside
//! bytes being patched, which no data word does by chance in practice.
//!
//! Bound: a signal frame more than `state::SCAN_WINDOW` bytes above the stack pointer of the
//! thread running its handler (a handler deeper than that) is not seen.

use crate::patching::state::{MAX_RESTORERS, SCAN_WINDOW, STATE};
use crate::sys;
use crate::sys::code_memory;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{MutexGuard, TryLockError};

/// Nested frames followed onto other stacks.
const MAX_STACK_HOPS: usize = 4;
/// `SA_RESTORER` (x86-64 Linux): the action names its own return trampoline.
const SA_RESTORER: i32 = 0x0400_0000;

/// Offsets inside `rt_sigframe` (from the word holding the restorer).
const UCONTEXT: u64 = 8;
const SAVED_PC: u64 = UCONTEXT
    + std::mem::offset_of!(libc::ucontext_t, uc_mcontext) as u64
    + 8 * libc::REG_RIP as u64;
const SAVED_SP: u64 = UCONTEXT
    + std::mem::offset_of!(libc::ucontext_t, uc_mcontext) as u64
    + 8 * libc::REG_RSP as u64;

/// Learns the restorers of the handlers installed now (each signal's `sa_restorer`),
/// keeping tendril's own stop signal's (`own_signal`) apart: a frame of its handler lies
/// below the interrupted stack pointer a parked thread publishes, so it is scanned only
/// on a thread held with ptrace, which may be inside that handler (see
/// [`Frames::OwnToo`]). A program with no handlers of its own has no frame to find, and
/// its stops scan only such threads. Runs before every stop that may scan.
pub fn learn_restorers(own_signal: i32) {
    for signal in 1..=libc::SIGRTMAX() {
        // SAFETY: a zeroed sigaction is a valid output buffer; a null new action only
        // reads the current disposition.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::sigaction(signal, std::ptr::null(), &mut action) } != 0 {
            continue;
        }
        let handled = action.sa_sigaction != libc::SIG_DFL && action.sa_sigaction != libc::SIG_IGN;
        if !handled || action.sa_flags & SA_RESTORER == 0 {
            continue;
        }
        let restorer = action.sa_restorer.map_or(0, |f| f as usize as u64);
        if signal == own_signal {
            STATE.own_restorer.store(restorer, Ordering::Release);
        } else {
            note_restorer(restorer);
        }
    }
}

/// Which signal frames a scan looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frames {
    /// Those of the program's own handlers: on a thread parked by the stop signal, whose
    /// published stack pointer is the interrupted one, above the stop handler's frame.
    ProgramsOnly,
    /// The stop signal handler's too: on a thread held with ptrace, which may be inside
    /// that handler — it took a signal of an earlier stop that had ended (a late one)
    /// and, with this stop's signal pending behind the handler's mask, looked like a
    /// thread that blocks it. Its pc is in the handler; where it was interrupted, and
    /// will resume, is in the handler's frame.
    OwnToo,
}

fn note_restorer(restorer: u64) {
    if restorer == 0 {
        return;
    }
    let count = STATE
        .restorer_count
        .load(Ordering::Acquire)
        .min(MAX_RESTORERS);
    if STATE.restorers[..count]
        .iter()
        .any(|known| known.load(Ordering::Relaxed) == restorer)
        || count == MAX_RESTORERS
    {
        return;
    }
    STATE.restorers[count].store(restorer, Ordering::Relaxed);
    STATE.restorer_count.store(count + 1, Ordering::Release);
}

fn is_restorer(word: u64, frames: Frames) -> bool {
    let count = STATE
        .restorer_count
        .load(Ordering::Acquire)
        .min(MAX_RESTORERS);
    let own = (frames == Frames::OwnToo).then(|| STATE.own_restorer.load(Ordering::Acquire));
    is_one_of(word, &STATE.restorers[..count], own)
}

/// Whether `word` is one of the `known` restorers, or the stop handler's (`own`, when
/// its frames are looked for too). Zero never is.
fn is_one_of(word: u64, known: &[AtomicU64], own: Option<u64>) -> bool {
    word != 0
        && (known
            .iter()
            .any(|known| known.load(Ordering::Relaxed) == word)
            || own == Some(word))
}

/// Whether any handler of the program's own could have left a signal frame.
pub fn any_restorers() -> bool {
    STATE.restorer_count.load(Ordering::Acquire) != 0
}

/// Moves every saved pc found in the signal frames (those `frames` names) above `sp` for
/// which `resume_at` gives a new place; returns how many moved. Allocates nothing.
pub fn move_saved_pcs(sp: u64, frames: Frames, resume_at: &dyn Fn(u64) -> Option<u64>) -> usize {
    let own_too = frames == Frames::OwnToo && STATE.own_restorer.load(Ordering::Acquire) != 0;
    if (STATE.restorer_count.load(Ordering::Acquire) == 0 && !own_too) || sp == 0 {
        return 0;
    }
    let mut window = scan_window();
    let mut moved = 0;
    let mut next_stack = Some(sp);
    for _ in 0..MAX_STACK_HOPS {
        let Some(from) = next_stack.take() else { break };
        let words = read_stack(from & !7, &mut window[..]);
        let found = find_frames(from & !7, &window[..words], |word| {
            is_restorer(word, frames)
        });
        for frame in found.iter().flatten() {
            if let Some(new_pc) = resume_at(frame.saved_pc)
                && code_memory::write_code(frame.address + SAVED_PC, &new_pc.to_ne_bytes()).is_ok()
            {
                moved += 1;
            }
            // A frame whose saved stack lies outside this window (an alternate signal
            // stack's frame): look there next.
            let end = (from & !7) + 8 * words as u64;
            if frame.saved_sp != 0 && !(from..end).contains(&frame.saved_sp) {
                next_stack = Some(frame.saved_sp);
            }
        }
    }
    moved
}

/// The stack-scanning window, taken without ever waiting in the kernel through libc:
/// this runs in the stop signal's handler, on threads whose hooks may not step aside
/// (one that never ran a hook), and libc's `syscall`, which a contended `Mutex` waits
/// through, may be patched. Nobody waits on the lock, so releasing it wakes nobody
/// either. Its holders only scan a stack, so the spin is short.
fn scan_window() -> MutexGuard<'static, [u64; SCAN_WINDOW / 8]> {
    loop {
        match STATE.scan_window.try_lock() {
            Ok(window) => return window,
            Err(TryLockError::Poisoned(poisoned)) => return poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => sys::yield_cpu(),
        }
    }
}

/// Reads words from `address` up into `buffer` until unmapped memory or the buffer's
/// end; returns how many words were read.
fn read_stack(address: u64, buffer: &mut [u64]) -> usize {
    let local = libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: buffer.len() * 8,
    };
    let remote = libc::iovec {
        iov_base: address as *mut libc::c_void,
        iov_len: buffer.len() * 8,
    };
    // SAFETY: reads this process's memory into `buffer`, within its length; the
    // kernel stops at the first unmapped page instead of faulting. (A raw system call:
    // libc's wrapper may be code being patched.)
    let read = unsafe {
        crate::sys::syscall6(
            libc::SYS_process_vm_readv,
            crate::sys::getpid() as u64,
            &local as *const libc::iovec as u64,
            1,
            &remote as *const libc::iovec as u64,
            1,
            0,
        )
    };
    if read < 0 { 0 } else { read as usize / 8 }
}

/// A signal frame found in a stack window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// Where its restorer word lies.
    pub address: u64,
    pub saved_pc: u64,
    pub saved_sp: u64,
}

/// Most frames reported from one window.
const MAX_FRAMES: usize = 16;

/// The signal frames in `words`, read from `base` up: each word equal to a restorer
/// with a whole `ucontext` after it in the window. Pure.
pub fn find_frames(
    base: u64,
    words: &[u64],
    is_restorer: impl Fn(u64) -> bool,
) -> [Option<Frame>; MAX_FRAMES] {
    let mut frames = [None; MAX_FRAMES];
    let mut found = 0;
    let word_at = |offset: u64| words.get(offset as usize / 8).copied();
    for (index, &word) in words.iter().enumerate() {
        if found == MAX_FRAMES || !is_restorer(word) {
            continue;
        }
        let offset = index as u64 * 8;
        if let (Some(saved_pc), Some(saved_sp)) =
            (word_at(offset + SAVED_PC), word_at(offset + SAVED_SP))
        {
            frames[found] = Some(Frame {
                address: base + offset,
                saved_pc,
                saved_sp,
            });
            found += 1;
        }
    }
    frames
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn the_stop_handlers_restorer_marks_a_frame_only_when_its_frames_are_looked_for() {
        let known = [AtomicU64::new(0x10)];
        assert!(is_one_of(0x10, &known, None));
        assert!(
            !is_one_of(0x20, &known, None),
            "a thread parked by the signal"
        );
        assert!(is_one_of(0x20, &known, Some(0x20)), "one held with ptrace");
        assert!(!is_one_of(0, &known, Some(0)), "no restorer learnt yet");
    }

    #[test]
    fn a_frame_is_a_restorer_word_followed_by_a_ucontext() {
        let base = 0x7ffc_0000_0000;
        let mut words = vec![0u64; 200];
        words[3] = 0xdead; // the restorer
        words[3 + SAVED_PC as usize / 8] = 0x5000_0010;
        words[3 + SAVED_SP as usize / 8] = base + 4000;
        // A restorer word too close to the window's end has no ucontext after it.
        words[198] = 0xdead;
        let frames = find_frames(base, &words, |w| w == 0xdead);
        assert_eq!(
            frames[0],
            Some(Frame {
                address: base + 24,
                saved_pc: 0x5000_0010,
                saved_sp: base + 4000,
            })
        );
        assert_eq!(frames[1], None);
    }

    static INSIDE_HANDLER: AtomicBool = AtomicBool::new(false);
    static HANDLER_SP: AtomicU64 = AtomicU64::new(0);
    static LEAVE: AtomicBool = AtomicBool::new(false);
    static SAVED_PC_SEEN: AtomicU64 = AtomicU64::new(0);

    extern "C" fn waiting_handler(_: i32, _: *mut libc::siginfo_t, context: *mut libc::c_void) {
        let context = context.cast::<libc::ucontext_t>();
        // SAFETY: the kernel passes a valid ucontext to an SA_SIGINFO handler.
        let pc = unsafe { (*context).uc_mcontext.gregs[libc::REG_RIP as usize] as u64 };
        SAVED_PC_SEEN.store(pc, Ordering::SeqCst);
        let marker = 0u64;
        HANDLER_SP.store(&marker as *const u64 as u64, Ordering::SeqCst);
        INSIDE_HANDLER.store(true, Ordering::SeqCst);
        while !LEAVE.load(Ordering::SeqCst) {
            std::hint::spin_loop();
        }
        // What the scan wrote is what the kernel will resume at: read it back.
        // SAFETY: as above.
        let pc = unsafe { (*context).uc_mcontext.gregs[libc::REG_RIP as usize] as u64 };
        SAVED_PC_SEEN.store(pc, Ordering::SeqCst);
        // Put it back, so the thread resumes where it was interrupted.
        // SAFETY: as above.
        unsafe {
            (*context).uc_mcontext.gregs[libc::REG_RIP as usize] = (pc - 0x1000) as i64;
        }
    }

    #[test]
    fn a_saved_pc_in_a_handlers_frame_is_found_and_moved() {
        let signal = libc::SIGRTMIN() + 2;
        // SAFETY: installs an SA_SIGINFO handler with the matching signature on a
        // signal no other test uses.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = waiting_handler as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO;
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
        learn_restorers(0);
        let (tid_sender, tid_receiver) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            tid_sender.send(crate::sys::gettid()).unwrap();
            while !LEAVE.load(Ordering::SeqCst) {
                std::hint::spin_loop();
            }
        });
        let tid = tid_receiver.recv().unwrap();
        // SAFETY: sends a signal to a thread of this process.
        unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, signal) };
        while !INSIDE_HANDLER.load(Ordering::SeqCst) {
            std::hint::spin_loop();
        }
        let interrupted = SAVED_PC_SEEN.load(Ordering::SeqCst);
        let sp = HANDLER_SP.load(Ordering::SeqCst);
        let moved = move_saved_pcs(sp, Frames::ProgramsOnly, &|pc| {
            (pc == interrupted).then_some(pc + 0x1000)
        });
        assert_eq!(moved, 1);
        LEAVE.store(true, Ordering::SeqCst);
        worker.join().unwrap();
        assert_eq!(SAVED_PC_SEEN.load(Ordering::SeqCst), interrupted + 0x1000);
    }
}
