//! Layer 1, the system: raw system calls, signals, memory, the process's threads.
//!
//! Submodules: the agent's own allocator (`alloc`), executable pages for trampolines
//! (`code_memory`), where the agent's library lies (`own_code`), the agent's threads
//! and the code-change lock (`agent_threads`), the target's threads as `/proc`
//! shows them (`tasks`), the process's unwinder as copies of functions need it
//! (`frame_registry`, and the thread that registers with it: `frame_registrar`), the
//! libraries the loader holds in place while code changes (`loaded_modules`), the code
//! pages given back to their file once restored (`page_copies`), the mappings they
//! split joined again (`whole_mappings`), the agent's one error type (`error`), and the
//! layer's statics (`state`). Nothing here knows
//! about hooks or patches.
//!
//! This file holds the raw system calls for the code that runs inside signal handlers
//! and hook slow paths, and for the patch protocol while guards are in place. The one
//! idea: that code must not call into the target's libc — any libc function may be
//! instrumented, or be the very function being patched (a thread that reaches a guard
//! waits there until the patch is done, so the patching thread itself must never
//! reach one) — so it makes its system calls with the `syscall` instruction.

pub mod agent_threads;
pub mod alloc;
pub mod code_memory;
pub mod code_pages;
pub mod error;
pub mod frame_registrar;
pub mod frame_registry;
pub mod loaded_modules;
pub mod maps;
#[cfg(not(any(test, miri)))]
pub mod mem_builtins;
pub mod own_code;
pub mod page_copies;
pub mod queued_signal;
mod state;
pub mod tasks;
pub mod thread_tracer;
pub mod whole_mappings;

use std::arch::asm;

/// The signals a handler must never block: a fault or trap raised while it is blocked
/// kills the process instead of reaching its handler.
pub const SYNCHRONOUS_SIGNALS: [i32; 5] = [
    libc::SIGTRAP,
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
];

/// A system call with up to four arguments; returns the raw result (negative errno).
///
/// # Safety
/// The arguments must be valid for the call `number` makes (pointers to live memory
/// of the right type and size).
pub unsafe fn syscall4(number: i64, a: u64, b: u64, c: u64, d: u64) -> i64 {
    let result: i64;
    // SAFETY: the syscall instruction clobbers rcx and r11 and returns in rax; the
    // caller vouches for the arguments.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") number => result,
            in("rdi") a,
            in("rsi") b,
            in("rdx") c,
            in("r10") d,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    result
}

/// A system call with up to six arguments; returns the raw result (negative errno).
///
/// # Safety
/// As for [`syscall4`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn syscall6(number: i64, a: u64, b: u64, c: u64, d: u64, e: u64, f: u64) -> i64 {
    let result: i64;
    // SAFETY: as in `syscall4`, with two more argument registers.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") number => result,
            in("rdi") a,
            in("rsi") b,
            in("rdx") c,
            in("r10") d,
            in("r8") e,
            in("r9") f,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    result
}

/// Opens `path` read-only (close-on-exec, plus `flags`); a negative errno on failure.
pub fn open_read_only(path: &std::ffi::CStr, flags: i32) -> i32 {
    // SAFETY: openat reads a NUL-terminated path that lives across the call.
    unsafe {
        syscall4(
            libc::SYS_openat,
            libc::AT_FDCWD as u64,
            path.as_ptr() as u64,
            (libc::O_RDONLY | libc::O_CLOEXEC | flags) as u64,
            0,
        ) as i32
    }
}

/// Reads into `buffer` from `fd`; the byte count or a negative errno.
pub fn read_fd(fd: i32, buffer: &mut [u8]) -> isize {
    // SAFETY: read writes at most buffer.len() bytes into `buffer`.
    unsafe {
        syscall4(
            libc::SYS_read,
            fd as u64,
            buffer.as_mut_ptr() as u64,
            buffer.len() as u64,
            0,
        ) as isize
    }
}

pub fn close_fd(fd: i32) {
    // SAFETY: closes a descriptor the caller owns.
    unsafe { syscall4(libc::SYS_close, fd as u64, 0, 0, 0) };
}

/// Gives the cpu to another thread.
pub fn yield_cpu() {
    // SAFETY: sched_yield takes no arguments.
    unsafe { syscall4(libc::SYS_sched_yield, 0, 0, 0, 0) };
}

/// The monotonic clock in ns, read with the system call itself (libc's wrapper, and
/// the vDSO it leads to, may be code being patched).
pub fn monotonic_ns() -> u64 {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes a timespec that lives across the call.
    unsafe {
        syscall4(
            libc::SYS_clock_gettime,
            libc::CLOCK_MONOTONIC as u64,
            &mut time as *mut libc::timespec as u64,
            0,
            0,
        )
    };
    time.tv_sec as u64 * 1_000_000_000 + time.tv_nsec as u64
}

pub fn gettid() -> i32 {
    // SAFETY: gettid takes no arguments.
    unsafe { syscall4(libc::SYS_gettid, 0, 0, 0, 0) as i32 }
}

pub fn getpid() -> i32 {
    // SAFETY: getpid takes no arguments.
    unsafe { syscall4(libc::SYS_getpid, 0, 0, 0, 0) as i32 }
}

/// Waits while `*word == expected` (spurious wake-ups possible).
pub fn futex_wait(word: &std::sync::atomic::AtomicU32, expected: u32) {
    // SAFETY: FUTEX_WAIT on a valid, aligned u32 that outlives the call, no timeout.
    unsafe {
        syscall4(
            libc::SYS_futex,
            word.as_ptr() as u64,
            (libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG) as u64,
            expected as u64,
            0,
        );
    }
}

/// Waits while `*word == expected`, at most `timeout_ns` (spurious wake-ups possible).
pub fn futex_wait_timeout(word: &std::sync::atomic::AtomicU32, expected: u32, timeout_ns: u64) {
    futex_wait_for(word, expected, timeout_ns, libc::FUTEX_PRIVATE_FLAG);
}

/// Waits while `*word == expected`, at most `timeout_ns`, on a word of memory shared
/// with another process (which wakes the waiter with a `FUTEX_WAKE` of its own mapping
/// of the same page); spurious wake-ups possible.
pub fn futex_wait_shared_timeout(
    word: &std::sync::atomic::AtomicU32,
    expected: u32,
    timeout_ns: u64,
) {
    futex_wait_for(word, expected, timeout_ns, 0);
}

/// `FUTEX_WAIT` with `flags` (`FUTEX_PRIVATE_FLAG` or 0) and a relative timeout.
fn futex_wait_for(word: &std::sync::atomic::AtomicU32, expected: u32, timeout_ns: u64, flags: i32) {
    let timeout = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on a valid, aligned u32 that outlives the call (shared or
    // private as `flags` says), with a relative timeout that lives on this stack for
    // the call's duration.
    unsafe {
        syscall4(
            libc::SYS_futex,
            word.as_ptr() as u64,
            (libc::FUTEX_WAIT | flags) as u64,
            expected as u64,
            &timeout as *const libc::timespec as u64,
        );
    }
}

/// Wakes every thread waiting on `word`.
pub fn futex_wake_all(word: &std::sync::atomic::AtomicU32) {
    // SAFETY: FUTEX_WAKE on a valid, aligned u32.
    unsafe {
        syscall4(
            libc::SYS_futex,
            word.as_ptr() as u64,
            (libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG) as u64,
            i32::MAX as u64,
            0,
        );
    }
}

/// Sends `signal` to thread `tid` of this process with `value` in `si_value`, so the
/// handler can tell which request the signal belongs to. Returns false if the thread
/// is gone.
pub fn signal_thread_with_value(tid: i32, signal: i32, value: u32) -> bool {
    // SAFETY: getuid has no arguments.
    let uid = unsafe { syscall4(libc::SYS_getuid, 0, 0, 0, 0) } as u32;
    let info = queued_signal::QueuedSignalInfo::new(signal, getpid(), uid, value as u64);
    // SAFETY: rt_tgsigqueueinfo reads a siginfo_t, which `info` has the layout of
    // (asserted in `queued_signal`); it lives across the call.
    let result = unsafe {
        syscall4(
            libc::SYS_rt_tgsigqueueinfo,
            getpid() as u64,
            tid as u64,
            signal as u64,
            &info as *const queued_signal::QueuedSignalInfo as u64,
        )
    };
    result == 0
}

/// The `si_value` a signal sent by [`signal_thread_with_value`] carries.
///
/// # Safety
/// `info` must be the siginfo the kernel passed to an SA_SIGINFO handler.
pub unsafe fn signal_value(info: *const libc::siginfo_t) -> u32 {
    // SAFETY: per the contract, a signal queued by `signal_thread_with_value`.
    unsafe { queued_signal::queued_value(info) as u32 }
}

/// Whether thread `tid` of this process still exists.
pub fn thread_exists(tid: i32) -> bool {
    // SAFETY: tgkill with signal 0 only checks that the thread exists.
    unsafe { syscall4(libc::SYS_tgkill, getpid() as u64, tid as u64, 0, 0) == 0 }
}

/// Whether the calling thread runs on its alternate signal stack now, and that stack.
pub fn on_alternate_signal_stack() -> Option<(u64, u64)> {
    // SAFETY: stack_t is plain data; sigaltstack with a null new stack only reports.
    let mut current: libc::stack_t = unsafe { std::mem::zeroed() };
    // SAFETY: the output pointer is valid for a stack_t.
    let result = unsafe {
        syscall4(
            libc::SYS_sigaltstack,
            0,
            &mut current as *mut libc::stack_t as u64,
            0,
            0,
        )
    };
    (result == 0 && current.ss_flags & libc::SS_ONSTACK != 0).then(|| {
        (
            current.ss_sp as u64,
            current.ss_sp as u64 + current.ss_size as u64,
        )
    })
}

/// The time-stamp counter.
pub fn rdtsc() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86-64.
    unsafe { std::arch::x86_64::_rdtsc() }
}

/// Sleeps about `microseconds` (a raw `nanosleep`; EINTR just ends it early).
pub fn sleep_microseconds(microseconds: u64) {
    let time = libc::timespec {
        tv_sec: (microseconds / 1_000_000) as libc::time_t,
        tv_nsec: ((microseconds % 1_000_000) * 1000) as libc::c_long,
    };
    // SAFETY: nanosleep reads a valid timespec; no remainder is asked for.
    unsafe {
        syscall4(
            libc::SYS_nanosleep,
            &time as *const libc::timespec as u64,
            0,
            0,
            0,
        );
    }
}

/// Makes the pages of `[start, start + len)`, shared writable memory, present and
/// writable now, so that the first write to each page later is no page fault: the
/// first word of each page is read and written back, which faults the page in for
/// writing and changes nothing.
///
/// Not `MADV_POPULATE_WRITE`: `madvise` holds the memory map's lock while it works, and
/// a thread preempted inside it (a thousand threads on two cores) kept every `mprotect`
/// of the patcher waiting, and behind it every other thread's `madvise`, for up to
/// seconds. A page fault takes only the lock of the ring's own mapping, which nothing
/// else changes. Nor an atomic OR of 0: the compiler may make an idempotent
/// read-modify-write a plain load, which faults the page in for reading only.
///
/// # Safety
/// The range must be 8-byte aligned, the pages it touches mapped writable, and no
/// thread or process may write the words it touches meanwhile (a ring's slots past
/// its producer's head: only that producer writes them, and readers read them as
/// they were).
pub unsafe fn populate_for_writing(start: u64, len: u64) {
    const PAGE: u64 = 4096;
    let mut word = start;
    while word + 8 <= start + len {
        let at = word as *mut u64;
        // SAFETY: a mapped, writable, aligned word that no one else writes (the
        // caller's promise); writing back what it holds changes nothing for a reader.
        unsafe { std::ptr::write_volatile(at, std::ptr::read_volatile(at)) };
        word = (word / PAGE + 1) * PAGE;
    }
}

/// Blocks every signal but the synchronous ones (a fault or trap must still reach its
/// handler) in the calling thread; returns the previous mask.
pub fn block_signals() -> u64 {
    let mut blocked: u64 = !0;
    for synchronous in SYNCHRONOUS_SIGNALS {
        blocked &= !(1u64 << (synchronous - 1));
    }
    let mut previous: u64 = 0;
    // SAFETY: rt_sigprocmask reads and writes 8-byte kernel signal sets that live
    // across the call.
    unsafe {
        syscall4(
            libc::SYS_rt_sigprocmask,
            libc::SIG_BLOCK as u64,
            &blocked as *const u64 as u64,
            &mut previous as *mut u64 as u64,
            8,
        );
    }
    previous
}

/// Puts back a mask [`block_signals`] returned.
pub fn restore_signals(mask: u64) {
    // SAFETY: as in `block_signals`.
    unsafe {
        syscall4(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK as u64,
            &mask as *const u64 as u64,
            0,
            8,
        );
    }
}

/// Writes `message` to standard error and ends the process with SIGABRT. For states
/// the agent cannot continue from without harming the target more.
pub fn fatal(message: &str) -> ! {
    // SAFETY: writes a valid buffer to fd 2.
    unsafe {
        syscall4(
            libc::SYS_write,
            2,
            message.as_ptr() as u64,
            message.len() as u64,
            0,
        );
        libc::abort()
    }
}
