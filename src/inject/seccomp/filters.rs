//! Reading a thread's seccomp state: its mode from `/proc/PID/task/TID/status`, and
//! its filters with `PTRACE_SECCOMP_GET_FILTER`.
//!
//! The filters come newest first (index 0 is the one installed last), each as the
//! classic BPF program that was installed. Reading them needs `CAP_SYS_ADMIN`, a tracer
//! that is not itself under seccomp, a thread that tendril has stopped with ptrace, and
//! a kernel built with `CONFIG_CHECKPOINT_RESTORE`.

use super::bpf::Instruction;
use nix::errno::Errno;

/// `PTRACE_SECCOMP_GET_FILTER` (linux/ptrace.h).
const PTRACE_SECCOMP_GET_FILTER: libc::c_uint = 0x420c;
/// `BPF_MAXINSNS`: no filter is longer.
const MAX_INSTRUCTIONS: usize = 4096;
/// More filters than one thread can have: the kernel allows 32768 instructions in all,
/// and counts 4 more for each filter.
const MAX_FILTERS: usize = 32768 / 5;

/// A thread's seccomp mode (`Seccomp:` in its status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// 0: no seccomp.
    Disabled,
    /// 1: `SECCOMP_MODE_STRICT`: only read, write, _exit and sigreturn.
    Strict,
    /// 2: `SECCOMP_MODE_FILTER`.
    Filter,
}

/// A thread's mode, and how many filters it has (`Seccomp_filters:`, which kernels
/// before 5.9 do not show).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadSeccomp {
    pub mode: Mode,
    pub filters: Option<usize>,
}

/// The seccomp state of thread `tid` of `pid`; `None` if the thread is gone.
/// A kernel that shows no `Seccomp:` line has no seccomp, which is mode 0.
pub fn thread_seccomp(pid: i32, tid: i32) -> Option<Result<ThreadSeccomp, String>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    let field = |key| crate::process::status_field(&status, key).map(str::trim);
    let mode = match field("Seccomp") {
        None | Some("0") => Mode::Disabled,
        Some("1") => Mode::Strict,
        Some("2") => Mode::Filter,
        Some(other) => return Some(Err(format!("an unknown seccomp mode {other}"))),
    };
    let filters = field("Seccomp_filters").and_then(|count| count.parse().ok());
    Some(Ok(ThreadSeccomp { mode, filters }))
}

/// Every filter of thread `tid`, which this process has stopped with ptrace; newest
/// first. On failure, why they cannot be read, in words for the user.
pub fn read_filters(tid: i32) -> Result<Vec<Vec<Instruction>>, String> {
    let mut filters = Vec::new();
    loop {
        if filters.len() == MAX_FILTERS {
            return Err(format!("more than {MAX_FILTERS} filters"));
        }
        match read_filter(tid, filters.len()) {
            Ok(filter) => filters.push(filter),
            Err(Errno::ENOENT) if !filters.is_empty() => return Ok(filters),
            Err(errno) => return Err(describe(errno)),
        }
    }
}

/// Filter `index` of thread `tid`.
fn read_filter(tid: i32, index: usize) -> Result<Vec<Instruction>, Errno> {
    // Always room for the longest filter: the kernel copies the whole filter, whatever
    // its length, so asking for the count first (a null buffer) and then reading would
    // overflow a buffer of that count if another thread added filters in between
    // (SECCOMP_FILTER_FLAG_TSYNC).
    let mut buffer = vec![
        libc::sock_filter {
            code: 0,
            jt: 0,
            jf: 0,
            k: 0,
        };
        MAX_INSTRUCTIONS
    ];
    // SAFETY: PTRACE_SECCOMP_GET_FILTER writes at most BPF_MAXINSNS sock_filters, the
    // buffer's length, into the buffer, which lives across the call; `index` is passed
    // by value in the address argument.
    let count = unsafe {
        libc::ptrace(
            PTRACE_SECCOMP_GET_FILTER,
            tid,
            index as *mut libc::c_void,
            buffer.as_mut_ptr(),
        )
    };
    if count < 0 {
        return Err(Errno::last());
    }
    buffer.truncate((count as usize).min(MAX_INSTRUCTIONS));
    Ok(buffer
        .iter()
        .map(|i| Instruction {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect())
}

/// Why a filter cannot be read, from the kernel's error.
fn describe(errno: Errno) -> String {
    match errno {
        Errno::EACCES => "reading it needs CAP_SYS_ADMIN, and a tendril that is not under \
                          seccomp itself"
            .into(),
        Errno::EIO | Errno::EINVAL => "this kernel cannot show seccomp filters \
                                       (PTRACE_SECCOMP_GET_FILTER needs \
                                       CONFIG_CHECKPOINT_RESTORE)"
            .into(),
        Errno::EMEDIUMTYPE => "it is not a classic BPF program".into(),
        Errno::ENOENT => "the kernel listed no filter".into(),
        other => format!("PTRACE_SECCOMP_GET_FILTER failed: {}", other.desc()),
    }
}
