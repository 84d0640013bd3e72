//! The threads of this process, read from `/proc/self/task` without allocating.
//!
//! The one idea: code that runs while target threads may be parked, or while a target
//! thread that might hold the allocator's lock waits for the agent, must not call the
//! target's `malloc` — and `opendir` does. So the directory is read with `getdents64`
//! into a buffer on the stack, and a thread's `stat` and `status` files are read into
//! stack buffers too.

use std::ffi::CStr;

/// What the kernel says a thread is doing (the state letter of `/proc/.../stat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    /// `R`: running or waiting for a cpu.
    Running,
    /// `S`: sleeping in the kernel (a system call, a futex), interruptibly.
    Sleeping,
    /// `D`: in the kernel uninterruptibly (disk I/O, a page fault).
    DiskSleep,
    /// `T`/`t`: stopped by a signal or a tracer.
    Stopped,
    /// `Z`/`X` or no longer listed: the thread is gone.
    Gone,
    /// Any other letter (idle kernel states).
    Other,
}

/// How many threads this process has now.
pub fn thread_count() -> usize {
    let mut count = 0;
    for_each_thread(|_| count += 1);
    count
}

/// Calls `visit` with the tid of every thread of this process.
pub fn for_each_thread(mut visit: impl FnMut(i32)) {
    let fd = crate::sys::open_read_only(c"/proc/self/task", libc::O_DIRECTORY);
    if fd < 0 {
        return;
    }
    let mut buffer = [0u8; 4096];
    loop {
        // SAFETY: getdents64 writes at most buffer.len() bytes into the buffer.
        let read = unsafe {
            crate::sys::syscall4(
                libc::SYS_getdents64,
                fd as u64,
                buffer.as_mut_ptr() as u64,
                buffer.len() as u64,
                0,
            )
        };
        if read <= 0 {
            break;
        }
        let mut offset = 0usize;
        while offset < read as usize {
            // linux_dirent64: d_ino u64, d_off i64, d_reclen u16, d_type u8, d_name.
            let record_length =
                u16::from_ne_bytes([buffer[offset + 16], buffer[offset + 17]]) as usize;
            let name_start = offset + 19;
            let name_bytes = &buffer[name_start..offset + record_length];
            if let Ok(name) = CStr::from_bytes_until_nul(name_bytes)
                && let Some(tid) = parse_decimal(name.to_bytes())
            {
                visit(tid);
            }
            offset += record_length;
        }
    }
    crate::sys::close_fd(fd);
}

fn parse_decimal(bytes: &[u8]) -> Option<i32> {
    if bytes.is_empty() || bytes.len() > 9 {
        return None;
    }
    bytes.iter().try_fold(0i32, |value, &b| {
        b.is_ascii_digit().then(|| value * 10 + (b - b'0') as i32)
    })
}

/// Reads `/proc/self/task/<tid>/<file>` into `buffer`; returns the bytes read.
fn read_task_file<'a>(tid: i32, file: &str, buffer: &'a mut [u8]) -> Option<&'a [u8]> {
    let mut path = [0u8; 64];
    let mut writer = &mut path[..];
    use std::io::Write;
    write!(writer, "/proc/self/task/{tid}/{file}\0").ok()?;
    let path = std::ffi::CStr::from_bytes_until_nul(&path).ok()?;
    let fd = crate::sys::open_read_only(path, 0);
    if fd < 0 {
        return None;
    }
    let mut filled = 0;
    while filled < buffer.len() {
        let n = crate::sys::read_fd(fd, &mut buffer[filled..]);
        if n <= 0 {
            break;
        }
        filled += n as usize;
    }
    crate::sys::close_fd(fd);
    (filled > 0).then(|| &buffer[..filled])
}

/// The kernel's state of thread `tid`.
pub fn state(tid: i32) -> TaskState {
    let mut buffer = [0u8; 512];
    match read_task_file(tid, "stat", &mut buffer) {
        Some(stat) => state_in_stat(stat),
        None => TaskState::Gone,
    }
}

/// Thread `tid`'s state, and whether it blocks `signal`, from one read of one file:
/// what a stop asks of every thread before it signals it. Signals 1–31 are read from
/// the `blocked` field of `stat` (a shorter file), real-time ones from `status`.
pub fn state_and_blocking(tid: i32, signal: i32) -> (TaskState, bool) {
    let mut buffer = [0u8; 2048];
    if signal < 32 {
        return match read_task_file(tid, "stat", &mut buffer[..512]) {
            Some(stat) => (
                state_in_stat(stat),
                classic_signal_blocked_in_stat(stat, signal),
            ),
            None => (TaskState::Gone, false),
        };
    }
    let Some(status) = read_task_file(tid, "status", &mut buffer) else {
        return (TaskState::Gone, false);
    };
    let field = |name: &[u8]| {
        status
            .split(|&b| b == b'\n')
            .find_map(|line| line.strip_prefix(name))
            .map(<[u8]>::trim_ascii)
    };
    let state = field(b"State:").map_or(TaskState::Other, |text| state_of_letter(text.first()));
    let mask = field(b"SigBlk:").and_then(signal_mask);
    (
        state,
        mask.is_some_and(|mask| mask & (1 << (signal - 1)) != 0),
    )
}

/// Whether thread `tid` blocks `signal` and has it pending, sent to it and not yet
/// taken: it will not take it until it unblocks it. A thread that took it and runs its
/// handler (whose mask blocks every signal) blocks it too, but has it no longer pending.
pub fn holds_back_signal(tid: i32, signal: i32) -> bool {
    let mut buffer = [0u8; 2048];
    let Some(status) = read_task_file(tid, "status", &mut buffer) else {
        return false;
    };
    let has = |name: &[u8]| {
        status
            .split(|&b| b == b'\n')
            .find_map(|line| line.strip_prefix(name))
            .and_then(|hex| signal_mask(hex.trim_ascii()))
            .is_some_and(|mask| mask & (1 << (signal - 1)) != 0)
    };
    has(b"SigBlk:") && has(b"SigPnd:")
}

/// A signal mask as `/proc/PID/status` writes it (hexadecimal, bit n − 1 for signal n).
fn signal_mask(hex: &[u8]) -> Option<u64> {
    hex.iter().try_fold(0u64, |mask, &b| {
        (b as char)
            .to_digit(16)
            .map(|digit| (mask << 4) | digit as u64)
    })
}

/// The state in a `stat` line: "tid (comm) S ..."; the comm may contain spaces and
/// parentheses, and the state follows the last ')'.
fn state_in_stat(stat: &[u8]) -> TaskState {
    match stat.iter().rposition(|&b| b == b')') {
        Some(close) => state_of_letter(stat.get(close + 2)),
        None => TaskState::Other,
    }
}

fn state_of_letter(letter: Option<&u8>) -> TaskState {
    match letter {
        Some(b'R') => TaskState::Running,
        Some(b'S') => TaskState::Sleeping,
        Some(b'D') => TaskState::DiskSleep,
        Some(b'T' | b't') => TaskState::Stopped,
        Some(b'Z' | b'X') | None => TaskState::Gone,
        Some(_) => TaskState::Other,
    }
}

/// The kernel's `PF_EXITING`: the task is inside `exit`, and runs no user code again.
const PF_EXITING: u64 = 0x4;

/// Whether thread `tid` is ending (inside the kernel's `exit`, or gone): it runs no
/// user code again, and the kernel refuses to let it be traced (`EPERM`).
pub fn is_exiting(tid: i32) -> bool {
    let mut buffer = [0u8; 512];
    let Some(stat) = read_task_file(tid, "stat", &mut buffer) else {
        return true;
    };
    state_in_stat(stat) == TaskState::Gone
        || stat_number(stat, 9).is_some_and(|flags| flags & PF_EXITING != 0)
}

/// Field `field` (numbered from 1, as in proc(5)) of a `stat` line, as a number. The
/// fields after the comm's last ')' start at field 3.
fn stat_number(stat: &[u8], field: usize) -> Option<u64> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let text = stat[close + 1..]
        .split(|&b| b == b' ')
        .filter(|field| !field.is_empty())
        .nth(field - 3)?;
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// Whether the `blocked` field of a `stat` line (signals 1–31, in decimal) has
/// `signal`.
fn classic_signal_blocked_in_stat(stat: &[u8], signal: i32) -> bool {
    stat_number(stat, 32).is_some_and(|mask| mask & (1 << (signal - 1)) != 0)
}

/// Where a thread is, as one read of its `syscall` file tells: half the cost of its
/// `status`, which a stop would otherwise read for each of a thousand threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whereabouts {
    /// Running or waiting for a cpu (the kernel says "running").
    Running,
    /// Blocked inside a system call, its pc just after its `syscall` instruction.
    InSystemCall,
    /// Blocked outside one ("-1 SP PC": a page fault, a stop after an interrupt).
    Elsewhere,
    /// The file could not be read: the thread is gone, or the kernel has no such file.
    Unknown,
}

/// Thread `tid`'s [`Whereabouts`].
pub fn whereabouts(tid: i32) -> Whereabouts {
    let mut buffer = [0u8; 256];
    match read_task_file(tid, "syscall", &mut buffer) {
        Some(text) => whereabouts_in(text),
        None => Whereabouts::Unknown,
    }
}

/// The [`Whereabouts`] a `syscall` file's text says.
fn whereabouts_in(text: &[u8]) -> Whereabouts {
    let first = text
        .split(|&b| b == b' ')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    if first == b"running" {
        Whereabouts::Running
    } else if !first.is_empty() && first.iter().all(u8::is_ascii_digit) {
        Whereabouts::InSystemCall
    } else if first.first() == Some(&b'-') {
        Whereabouts::Elsewhere
    } else {
        Whereabouts::Unknown
    }
}

/// Where thread `tid` is in user space while it sleeps in the kernel: (pc, sp), from
/// `/proc/self/task/<tid>/syscall` ("NR ARGS... SP PC", or "-1 SP PC" outside a system
/// call). `None` for a running thread (the kernel says "running") or one that is gone.
pub fn user_position(tid: i32) -> Option<(u64, u64)> {
    let mut buffer = [0u8; 256];
    let text = read_task_file(tid, "syscall", &mut buffer)?;
    let mut fields = text.trim_ascii().rsplit(|&b| b == b' ');
    let pc = parse_hex(fields.next()?)?;
    let sp = parse_hex(fields.next()?)?;
    Some((pc, sp))
}

/// Where thread `tid` is while it is blocked *in a system call*: (pc, sp), the pc
/// following its `syscall` instruction. `None` if it runs (or is runnable), sits in
/// the kernel for another reason (a page fault: "-1 SP PC"), or is gone.
pub fn in_system_call(tid: i32) -> Option<(u64, u64)> {
    let mut buffer = [0u8; 256];
    let text = read_task_file(tid, "syscall", &mut buffer)?;
    let number = text.split(|&b| b == b' ').next()?;
    if number.first() == Some(&b'-') || !number.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut fields = text.trim_ascii().rsplit(|&b| b == b' ');
    let pc = parse_hex(fields.next()?)?;
    let sp = parse_hex(fields.next()?)?;
    Some((pc, sp))
}

/// A `0x`-prefixed hexadecimal number.
fn parse_hex(bytes: &[u8]) -> Option<u64> {
    let digits = bytes.strip_prefix(b"0x")?;
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    digits.iter().try_fold(0u64, |value, &b| {
        (b as char)
            .to_digit(16)
            .map(|digit| (value << 4) | digit as u64)
    })
}

/// Thread `tid`'s name (`comm`, with its newline), read into `buffer`; `None` once the
/// thread is gone.
pub fn name(tid: i32, buffer: &mut [u8]) -> Option<&[u8]> {
    read_task_file(tid, "comm", buffer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_thread_is_not_exiting_and_a_gone_one_is() {
        assert!(!is_exiting(crate::sys::gettid()));
        assert!(is_exiting(i32::MAX));
        let stat = b"7 (a (b) c) R 1 7 7 0 -1 4194564 0 0";
        assert_eq!(stat_number(stat, 9), Some(4194564));
        assert_eq!(
            stat_number(stat, 9).map(|f| f & PF_EXITING != 0),
            Some(true)
        );
    }

    #[test]
    fn lists_this_threads_and_reads_its_state() {
        let mut tids = Vec::new();
        for_each_thread(|tid| tids.push(tid));
        let me = crate::sys::gettid();
        assert!(tids.contains(&me), "{tids:?} lacks {me}");
        assert_eq!(state(me), TaskState::Running);
        assert_eq!(state(i32::MAX), TaskState::Gone);
    }

    #[test]
    fn sees_a_blocked_signal_and_a_sleeping_thread() {
        let (tid_sender, tid_receiver) = std::sync::mpsc::channel();
        let (done_sender, done_receiver) = std::sync::mpsc::channel::<()>();
        let sleeper = std::thread::spawn(move || {
            // SAFETY: blocks SIGUSR2 in this thread only; the mask is plain data.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGUSR2);
                libc::sigaddset(&mut set, libc::SIGRTMIN() + 1);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
            tid_sender.send(crate::sys::gettid()).unwrap();
            done_receiver.recv().unwrap();
        });
        let tid = tid_receiver.recv().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while state(tid) != TaskState::Sleeping && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(state(tid), TaskState::Sleeping);
        let rt = libc::SIGRTMIN() + 1;
        assert_eq!(state_and_blocking(tid, rt), (TaskState::Sleeping, true));
        assert_eq!(
            state_and_blocking(tid, libc::SIGUSR2),
            (TaskState::Sleeping, true)
        );
        assert_eq!(
            state_and_blocking(tid, libc::SIGUSR1),
            (TaskState::Sleeping, false)
        );
        assert_eq!(state_and_blocking(i32::MAX, rt), (TaskState::Gone, false));
        assert!(state_and_blocking(tid, libc::SIGUSR2).1);
        assert!(!state_and_blocking(tid, libc::SIGUSR1).1);
        // Real-time signals are read from `status`, the others from `stat`.
        assert!(state_and_blocking(tid, libc::SIGRTMIN() + 1).1);
        assert!(!state_and_blocking(tid, libc::SIGRTMIN() + 2).1);
        // Blocked, but none sent: not held back. Sent while blocked: held back.
        assert!(!holds_back_signal(tid, rt));
        assert!(crate::sys::signal_thread_with_value(tid, rt, 7));
        assert!(holds_back_signal(tid, rt));
        assert!(!holds_back_signal(tid, libc::SIGRTMIN() + 2));
        let (pc, sp) = user_position(tid).expect("a sleeping thread's position");
        assert!(pc != 0 && sp != 0);
        // Asleep in a futex wait: a system call, whose return address follows `syscall`.
        let (in_call_pc, _) = in_system_call(tid).expect("asleep in a system call");
        assert_eq!(in_call_pc, pc);
        assert_eq!(whereabouts(tid), Whereabouts::InSystemCall);
        done_sender.send(()).unwrap();
        sleeper.join().unwrap();
    }

    #[test]
    fn whereabouts_are_read_from_the_syscall_file() {
        // A thread reading its own file is inside that read; a spinning one runs.
        assert_eq!(whereabouts(crate::sys::gettid()), Whereabouts::InSystemCall);
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (tid_sender, tid) = std::sync::mpsc::channel();
        let spinner = {
            let done = done.clone();
            std::thread::spawn(move || {
                tid_sender.send(crate::sys::gettid()).unwrap();
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        let tid = tid.recv().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while whereabouts(tid) != Whereabouts::Running && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(whereabouts(tid), Whereabouts::Running);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        spinner.join().unwrap();
        assert_eq!(whereabouts(i32::MAX), Whereabouts::Unknown);
        let futex = b"202 0x7f00 0x80 0x0 0x0 0x0 0x0 0x7ffd10 0x7f12\n";
        assert_eq!(whereabouts_in(futex), Whereabouts::InSystemCall);
        assert_eq!(
            whereabouts_in(b"-1 0x7ffd10 0x5555\n"),
            Whereabouts::Elsewhere
        );
        assert_eq!(whereabouts_in(b"running\n"), Whereabouts::Running);
        assert_eq!(whereabouts_in(b""), Whereabouts::Unknown);
    }

    #[test]
    fn hexadecimal_fields() {
        assert_eq!(parse_hex(b"0x7ffd1234"), Some(0x7ffd_1234));
        assert_eq!(parse_hex(b"1234"), None);
        assert_eq!(parse_hex(b"0x"), None);
    }
}
