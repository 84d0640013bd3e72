//! Stopping threads that block every signal: ptrace, from a helper process that shares
//! the agent's memory.
//!
//! The one idea: a thread that blocks the agent's stop signal and runs user code can
//! only be stopped from outside, and the kernel refuses `ptrace` within one's own thread
//! group. So the agent clones a helper with `CLONE_VM` but without `CLONE_THREAD` (a
//! process of its own that shares this memory, as Frida's `gum_linux_modify_thread`
//! does). The helper seizes and interrupts each thread, publishes its pc and sp in
//! `STATE.tracer`, waits until the patcher says where each thread must resume, applies that
//! and detaches. The threads never see a signal: a thread stopped in a signal-delivery
//! stop gets its signal back at the detach.
//!
//! Nothing outlives a death: if the helper dies, the kernel detaches its tracees and
//! they run on; if the patching thread dies, the helper gets SIGKILL
//! (`PR_SET_PDEATHSIG`), and if the patcher never answers it detaches after
//! [`HELPER_PATIENCE_NS`] and exits.
//!
//! The helper shares this thread's TLS (no `CLONE_SETTLS`), so its code touches only
//! `STATE.tracer` and raw system calls: no allocation, no `errno`, no panics.

use crate::sys::error::AgentError;
use crate::sys::state::{MAX_TRACED, STATE};
use crate::sys::tasks;
use crate::sys::{futex_wait_timeout, futex_wake_all, monotonic_ns, syscall4};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long the helper waits for the patcher before it lets the threads go.
const HELPER_PATIENCE_NS: u64 = 2_000_000_000;
const HELPER_STACK: usize = 64 * 1024;

/// The helper's progress, in [`Shared::phase`].
const PHASE_START: u32 = 1;
const PHASE_STOPPED: u32 = 2;
const PHASE_RELEASE: u32 = 3;
const PHASE_DONE: u32 = 4;

const STOPPED: u32 = 1;
const GONE: u32 = 2;

/// Threads held by the helper until [`TracedThreads::release`] (or drop).
pub struct TracedThreads {
    helper: i32,
    count: usize,
    released: bool,
    needed_ptracer: bool,
}

/// Maps the helper's stack ahead of time, so [`stop`] allocates nothing.
pub fn prepare() -> Result<(), AgentError> {
    if STATE.tracer_stack_top.get().is_some() {
        return Ok(());
    }
    STATE
        .yama_needs_ptracer
        .store(yama_needs_ptracer(), Ordering::Relaxed);
    // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
    let stack = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            HELPER_STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if stack == libc::MAP_FAILED {
        return Err(AgentError::NotStopped(format!(
            "cannot map a stack for the ptrace helper: {}",
            std::io::Error::last_os_error()
        )));
    }
    let top = (stack as u64 + HELPER_STACK as u64) & !15;
    if STATE.tracer_stack_top.set(top).is_err() {
        // Another thread mapped one first: give this one back.
        // SAFETY: unmaps exactly the mapping made above, which nothing else uses.
        unsafe { libc::munmap(stack, HELPER_STACK) };
    }
    Ok(())
}

/// Stops `tids` (threads of this process, not the caller) with ptrace from a helper
/// process, within `timeout`. Threads that exit meanwhile, or are inside `exit`, are left
/// out. One stopper at a time (the caller holds the stop lock). Once [`prepare`] has
/// run, this allocates nothing and calls no libc function (except to format an error).
pub fn stop(tids: &[i32], timeout: Duration) -> Result<TracedThreads, AgentError> {
    if tids.len() > MAX_TRACED {
        return Err(AgentError::NotStopped(format!(
            "{} threads block every signal; tendril stops at most {MAX_TRACED} at once",
            tids.len()
        )));
    }
    let deadline = monotonic_ns() + timeout.as_nanos() as u64;
    let mut left = [0i32; MAX_TRACED];
    left[..tids.len()].copy_from_slice(tids);
    let mut count = tids.len();
    loop {
        match stop_these(&left[..count], deadline) {
            // A thread inside `exit` (glibc ends a thread with every signal blocked)
            // refuses ptrace, but runs no user code again: the others are stopped
            // without it.
            Err(Failure::Refused { tid, error }) if tasks::is_exiting(tid) => {
                match left[..count].iter().position(|&other| other == tid) {
                    Some(at) => {
                        left[at] = left[count - 1];
                        count -= 1;
                    }
                    None => return Err(Failure::Refused { tid, error }.into_error(timeout)),
                }
            }
            result => return result.map_err(|failure| failure.into_error(timeout)),
        }
    }
}

/// Why [`stop_these`] stopped nothing.
enum Failure {
    /// ptrace refused thread `tid` with `error`.
    Refused { tid: i32, error: i32 },
    /// The threads did not all stop by the deadline.
    TooSlow,
    /// Anything else, said.
    Other(AgentError),
}

impl Failure {
    fn into_error(self, timeout: Duration) -> AgentError {
        AgentError::NotStopped(match self {
            Failure::Refused { tid, error } => format!(
                "thread {tid} blocks every signal and runs, and tendril could not stop it \
                 with ptrace: {} (is a debugger attached, or is the process not dumpable?)",
                std::io::Error::from_raw_os_error(error)
            ),
            Failure::TooSlow => format!(
                "the threads that block every signal did not stop within {} ms",
                timeout.as_millis()
            ),
            Failure::Other(error) => return error,
        })
    }
}

/// [`stop`] of `tids`, once, by `deadline` (monotonic ns).
fn stop_these(tids: &[i32], deadline: u64) -> Result<TracedThreads, Failure> {
    let Some(&stack_top) = STATE.tracer_stack_top.get() else {
        return Err(Failure::Other(AgentError::NotStopped(
            "the ptrace helper is not prepared".into(),
        )));
    };
    STATE.tracer.phase.store(0, Ordering::Release);
    STATE.tracer.error.store(0, Ordering::Relaxed);
    STATE.tracer.error_tid.store(0, Ordering::Relaxed);
    for (index, &tid) in tids.iter().enumerate() {
        STATE.tracer.tids[index].store(tid, Ordering::Relaxed);
        STATE.tracer.states[index].store(0, Ordering::Relaxed);
        STATE.tracer.new_pcs[index].store(0, Ordering::Relaxed);
        STATE.tracer.signals[index].store(0, Ordering::Relaxed);
    }
    STATE
        .tracer
        .count
        .store(tids.len() as u32, Ordering::Release);
    let helper = spawn_helper(stack_top);
    if helper < 0 {
        return Err(Failure::Other(AgentError::NotStopped(format!(
            "cannot start the ptrace helper: {}",
            std::io::Error::from_raw_os_error(-helper as i32)
        ))));
    }
    let helper = helper as i32;
    let needed_ptracer = STATE.yama_needs_ptracer.load(Ordering::Relaxed);
    if needed_ptracer {
        // SAFETY: prctl with integer arguments; lets the helper (our child) trace us
        // under Yama's relational scope. Cleared again at the release.
        unsafe {
            syscall4(
                libc::SYS_prctl,
                libc::PR_SET_PTRACER as u64,
                helper as u64,
                0,
                0,
            )
        };
    }
    let mut traced = TracedThreads {
        helper,
        count: tids.len(),
        released: false,
        needed_ptracer,
    };
    STATE.tracer.phase.store(PHASE_START, Ordering::Release);
    futex_wake_all(&STATE.tracer.phase);
    loop {
        let phase = STATE.tracer.phase.load(Ordering::Acquire);
        if phase == PHASE_STOPPED {
            return Ok(traced);
        }
        if phase == PHASE_DONE {
            break;
        }
        let now = monotonic_ns();
        if now >= deadline {
            break;
        }
        futex_wait_timeout(&STATE.tracer.phase, phase, (deadline - now).min(10_000_000));
    }
    traced.release();
    let error = -STATE.tracer.error.load(Ordering::Acquire);
    let tid = STATE.tracer.error_tid.load(Ordering::Acquire);
    Err(if error != 0 {
        Failure::Refused { tid, error }
    } else {
        Failure::TooSlow
    })
}

impl TracedThreads {
    pub fn len(&self) -> usize {
        self.count
    }

    /// Thread `index`'s tid, pc and sp, or `None` if it exited before it stopped.
    pub fn thread(&self, index: usize) -> Option<(i32, u64, u64)> {
        (index < self.count && STATE.tracer.states[index].load(Ordering::Acquire) == STOPPED).then(
            || {
                (
                    STATE.tracer.tids[index].load(Ordering::Relaxed),
                    STATE.tracer.pcs[index].load(Ordering::Relaxed),
                    STATE.tracer.sps[index].load(Ordering::Relaxed),
                )
            },
        )
    }

    /// Lets the threads go (at their new pcs) and waits for the helper to end.
    pub fn release(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        STATE.tracer.phase.store(PHASE_RELEASE, Ordering::Release);
        futex_wake_all(&STATE.tracer.phase);
        let mut status = 0i32;
        // SAFETY: waits for our own clone child; `status` is a valid out-pointer.
        unsafe {
            syscall4(
                libc::SYS_wait4,
                self.helper as u64,
                &mut status as *mut i32 as u64,
                libc::__WALL as u64,
                0,
            )
        };
        if self.needed_ptracer {
            // SAFETY: prctl with integer arguments: no process may trace us by exception.
            unsafe { syscall4(libc::SYS_prctl, libc::PR_SET_PTRACER as u64, 0, 0, 0) };
        }
    }
}

impl Drop for TracedThreads {
    fn drop(&mut self) {
        self.release();
    }
}

/// Held thread `index`'s (pc, sp), while a [`TracedThreads`] holds it.
pub fn held_position(index: usize) -> (u64, u64) {
    let index = index.min(MAX_TRACED - 1);
    (
        STATE.tracer.pcs[index].load(Ordering::Acquire),
        STATE.tracer.sps[index].load(Ordering::Acquire),
    )
}

/// Makes held thread `index` resume at `pc`, while a [`TracedThreads`] holds it.
pub fn move_held(index: usize, pc: u64) {
    if index < MAX_TRACED {
        STATE.tracer.new_pcs[index].store(pc, Ordering::Release);
        STATE.tracer.pcs[index].store(pc, Ordering::Release);
    }
}

/// Whether Yama lets a process trace only its descendants (scope 1) and this process
/// is not privileged: the helper, our child, then needs `PR_SET_PTRACER`.
fn yama_needs_ptracer() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return false;
    }
    std::fs::read("/proc/sys/kernel/yama/ptrace_scope")
        .is_ok_and(|scope| scope.first() == Some(&b'1'))
}

/// Starts the helper on `stack_top` with a raw `clone` (glibc's wrapper may be code being
/// patched): it shares memory, files and the working directory, is not traced if we
/// are, and sends no signal when it ends. Returns its pid or a negative errno.
fn spawn_helper(stack_top: u64) -> i64 {
    let flags = (libc::CLONE_VM | libc::CLONE_FS | libc::CLONE_FILES | libc::CLONE_UNTRACED) as u64;
    let pid: i64;
    // SAFETY: the child starts on its own stack (mapped by `prepare`, used by one
    // helper at a time), calls `helper_main`, which touches only STATE.tracer and raw system
    // calls, and exits with its result; it never returns into this function. The
    // parent continues after the block with every register but rax, rcx and r11 kept.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "call r12",
            "mov edi, eax",
            "mov eax, {exit}",
            "syscall",
            "ud2",
            "2:",
            exit = const libc::SYS_exit,
            inlateout("rax") libc::SYS_clone => pid,
            in("rdi") flags,
            in("rsi") stack_top,
            in("rdx") 0u64,
            in("r10") 0u64,
            in("r8") 0u64,
            in("r12") helper_main as *const () as usize,
            lateout("rcx") _,
            lateout("r11") _,
        );
    }
    pid
}

/// The helper: stops every thread, waits for the release, applies the new pcs, detaches.
extern "C" fn helper_main() -> libc::c_int {
    // SAFETY: every syscall4 below passes integer arguments, or pointers to locals that
    // outlive the call.
    unsafe {
        syscall4(
            libc::SYS_prctl,
            libc::PR_SET_PDEATHSIG as u64,
            libc::SIGKILL as u64,
            0,
            0,
        );
    }
    wait_for_phase_change(0);
    let count = (STATE.tracer.count.load(Ordering::Acquire) as usize).min(MAX_TRACED);
    let mut seized = 0;
    for index in 0..count {
        let tid = STATE.tracer.tids[index].load(Ordering::Relaxed);
        // SAFETY: as above.
        let result = unsafe {
            syscall4(
                libc::SYS_ptrace,
                libc::PTRACE_SEIZE as u64,
                tid as u64,
                0,
                0,
            )
        };
        if result == -(libc::ESRCH as i64) {
            STATE.tracer.states[index].store(GONE, Ordering::Release);
        } else if result < 0 {
            STATE.tracer.error.store(result as i32, Ordering::Release);
            STATE.tracer.error_tid.store(tid, Ordering::Release);
            break;
        } else {
            // SAFETY: as above.
            unsafe {
                syscall4(
                    libc::SYS_ptrace,
                    libc::PTRACE_INTERRUPT as u64,
                    tid as u64,
                    0,
                    0,
                )
            };
        }
        seized = index + 1;
    }
    let failed = STATE.tracer.error.load(Ordering::Acquire) != 0;
    for index in 0..seized {
        if STATE.tracer.states[index].load(Ordering::Relaxed) != GONE {
            await_stop(index);
        }
    }
    if !failed {
        STATE.tracer.phase.store(PHASE_STOPPED, Ordering::Release);
        futex_wake_all(&STATE.tracer.phase);
        wait_for_phase_change(PHASE_STOPPED);
    }
    for index in 0..seized {
        if STATE.tracer.states[index].load(Ordering::Relaxed) == STOPPED {
            resume(index);
        }
    }
    STATE.tracer.phase.store(PHASE_DONE, Ordering::Release);
    futex_wake_all(&STATE.tracer.phase);
    0
}

/// Waits (at most [`HELPER_PATIENCE_NS`]) until the phase is no longer `phase`.
fn wait_for_phase_change(phase: u32) {
    let step = 10_000_000;
    let mut waited = 0;
    while STATE.tracer.phase.load(Ordering::Acquire) == phase && waited < HELPER_PATIENCE_NS {
        futex_wait_timeout(&STATE.tracer.phase, phase, step);
        waited += step;
    }
}

/// Waits for thread `index` to stop and records where it is.
fn await_stop(index: usize) {
    let tid = STATE.tracer.tids[index].load(Ordering::Relaxed);
    let mut status: i32 = 0;
    // SAFETY: wait4 on our tracee with a valid status pointer and no rusage.
    let waited = unsafe {
        syscall4(
            libc::SYS_wait4,
            tid as u64,
            &mut status as *mut i32 as u64,
            libc::__WALL as u64,
            0,
        )
    };
    if waited != tid as i64 || !libc::WIFSTOPPED(status) {
        STATE.tracer.states[index].store(GONE, Ordering::Release);
        return;
    }
    let event = (status >> 16) as u32;
    let signal = libc::WSTOPSIG(status);
    if event == 0 && signal != libc::SIGTRAP {
        // Stopped to deliver a signal: it goes back at the detach.
        STATE.tracer.signals[index].store(signal as u32, Ordering::Relaxed);
    }
    // SAFETY: a zeroed user_regs_struct is a valid buffer for PTRACE_GETREGS.
    let mut registers: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let read = unsafe {
        syscall4(
            libc::SYS_ptrace,
            libc::PTRACE_GETREGS as u64,
            tid as u64,
            0,
            &mut registers as *mut libc::user_regs_struct as u64,
        )
    };
    if read < 0 {
        STATE.tracer.states[index].store(GONE, Ordering::Release);
        return;
    }
    STATE.tracer.pcs[index].store(registers.rip, Ordering::Relaxed);
    STATE.tracer.sps[index].store(registers.rsp, Ordering::Relaxed);
    STATE.tracer.states[index].store(STOPPED, Ordering::Release);
}

/// Moves thread `index` if the patcher asked, then detaches it.
fn resume(index: usize) {
    let tid = STATE.tracer.tids[index].load(Ordering::Relaxed) as u64;
    let new_pc = STATE.tracer.new_pcs[index].load(Ordering::Acquire);
    if new_pc != 0 {
        // SAFETY: a zeroed user_regs_struct is a valid buffer for PTRACE_GETREGS.
        let mut registers: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        // SAFETY: GETREGS/SETREGS on our stopped tracee with a valid buffer.
        unsafe {
            let read = syscall4(
                libc::SYS_ptrace,
                libc::PTRACE_GETREGS as u64,
                tid,
                0,
                &mut registers as *mut libc::user_regs_struct as u64,
            );
            if read == 0 {
                registers.rip = new_pc;
                syscall4(
                    libc::SYS_ptrace,
                    libc::PTRACE_SETREGS as u64,
                    tid,
                    0,
                    &registers as *const libc::user_regs_struct as u64,
                );
            }
        }
    }
    let signal = STATE.tracer.signals[index].load(Ordering::Relaxed) as u64;
    // SAFETY: detaches our tracee, handing back the signal it was stopped with.
    unsafe { syscall4(libc::SYS_ptrace, libc::PTRACE_DETACH as u64, tid, 0, signal) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64};

    #[test]
    fn stops_a_thread_that_blocks_every_signal_and_moves_it() {
        prepare().unwrap();
        let (tid_sender, tid_receiver) = std::sync::mpsc::channel();
        let finished = Arc::new(AtomicBool::new(false));
        let spins = Arc::new(AtomicU64::new(0));
        let (stop_flag, spin_count) = (finished.clone(), spins.clone());
        let spinner = std::thread::spawn(move || {
            // SAFETY: blocks every signal in this thread only.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut set);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
            tid_sender.send(crate::sys::gettid()).unwrap();
            while !stop_flag.load(Ordering::Relaxed) {
                spin_count.fetch_add(1, Ordering::Relaxed);
            }
        });
        let tid = tid_receiver.recv().unwrap();
        let mut traced = stop(&[tid], Duration::from_secs(5)).unwrap();
        let (stopped_tid, pc, sp) = traced.thread(0).expect("stopped");
        assert_eq!(stopped_tid, tid);
        assert!(pc != 0 && sp != 0);
        let frozen = spins.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            spins.load(Ordering::Relaxed),
            frozen,
            "the thread is stopped"
        );
        // Resume it where it was (a move to its own pc changes nothing).
        move_held(0, pc);
        traced.release();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while spins.load(Ordering::Relaxed) == frozen && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert!(spins.load(Ordering::Relaxed) > frozen, "it runs again");
        finished.store(true, Ordering::Relaxed);
        spinner.join().unwrap();
    }
}
