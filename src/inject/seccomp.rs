//! Refusing, before anything is done to it, a target whose seccomp filter would kill
//! it, or refuse it a system call, while tendril loads and runs its agent.
//!
//! Once a thread is seized and stopped, and before the remote `dlopen`, [`check`] reads
//! that thread's seccomp mode. Strict mode is refused. Under filters, it reads them all
//! (`filters`) and runs them (`bpf`, a classic-BPF interpreter) on every system call in
//! [`SYSCALLS`] — the dynamic loader's, the agent's, and the one that resumes the thread
//! afterwards — with the argument values they are made with, combining the filters'
//! results as the kernel does. Any action but ALLOW or LOG refuses the attach with one
//! line naming the call and the action (an errno the caller falls back from is fine:
//! glibc retries `clone3` refused with ENOSYS as `clone`). The tracee is then dropped,
//! which restores its registers and lets it go: nothing was changed.
//!
//! Filters are per thread, and tendril can read only the stopped one's; the agent's
//! hooks and signals reach every thread. So a process whose threads differ in their
//! seccomp mode or number of filters is refused too, and so is one whose filters cannot
//! be read or run. What a filter decides by an argument that [`SYSCALLS`] holds only a
//! stand-in for (an address, a length, a descriptor) is judged by that stand-in, and
//! what it decides by the calling address, by address 0; a filter the program installs
//! after the check (`SECCOMP_FILTER_FLAG_TSYNC` from another thread, say) is not seen.

mod bpf;
mod filters;

use super::tracee::Tracee;
use crate::process::AttachError;
use bpf::{Action, SeccompData};
use filters::{Mode, ThreadSeccomp};

/// Who makes a system call, for the refusal's "which … needs".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// The target's dynamic loader, inside the remote `dlopen`.
    Loader,
    /// The borrowed thread, when its registers are put back after the remote call.
    Resume,
    /// The agent, on its own threads, in its hooks and its signal handler.
    Agent,
}

/// One system call tendril's injection or agent makes, with the arguments it passes.
#[derive(Clone, Copy, Debug)]
pub struct SyscallUse {
    pub nr: i64,
    pub name: &'static str,
    /// The arguments that tell this use apart, in words (empty if none do).
    pub detail: &'static str,
    /// The arguments; addresses, lengths and descriptors are stand-ins.
    pub args: [u64; 6],
    pub caller: Caller,
    pub on_errno: OnErrno,
}

/// What the caller does when a filter fails the call with an errno.
#[derive(Clone, Copy, Debug)]
pub enum OnErrno {
    /// It cannot do without the call: any errno refuses the attach.
    Fails,
    /// It falls back to other calls (also in [`SYSCALLS`]) on these errnos.
    FallsBack(&'static [i32]),
    /// It ignores the failure.
    Ignores,
}

const ENOSYS_EPERM: OnErrno = OnErrno::FallsBack(&[libc::ENOSYS, libc::EPERM]);
const IGNORED: OnErrno = OnErrno::Ignores;

/// Stand-ins: a non-null address, a length, a descriptor, and -1 and `AT_FDCWD`.
const PTR: u64 = 0x7ffd_0000_1000;
const LEN: u64 = 4096;
const FD: u64 = 3;
const NO_FD: u64 = u64::MAX;
const AT_FDCWD: u64 = libc::AT_FDCWD as u64;

const fn agent(nr: i64, name: &'static str, detail: &'static str, args: [u64; 6]) -> SyscallUse {
    SyscallUse {
        nr,
        name,
        detail,
        args,
        caller: Caller::Agent,
        on_errno: OnErrno::Fails,
    }
}

const fn loader(nr: i64, name: &'static str, detail: &'static str, args: [u64; 6]) -> SyscallUse {
    SyscallUse {
        caller: Caller::Loader,
        ..agent(nr, name, detail, args)
    }
}

impl SyscallUse {
    const fn on_errno(self, on_errno: OnErrno) -> SyscallUse {
        SyscallUse { on_errno, ..self }
    }
}

// Argument values, as the loader, glibc, Rust's std and the agent pass them.
const R: u64 = libc::PROT_READ as u64;
const RW: u64 = (libc::PROT_READ | libc::PROT_WRITE) as u64;
const RX: u64 = (libc::PROT_READ | libc::PROT_EXEC) as u64;
const RWX: u64 = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64;
const NONE: u64 = libc::PROT_NONE as u64;
const PRIVATE: u64 = libc::MAP_PRIVATE as u64;
const ANON: u64 = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
const FIXED: u64 = libc::MAP_FIXED as u64;
const DENYWRITE: u64 = libc::MAP_DENYWRITE as u64;
const NORESERVE: u64 = libc::MAP_NORESERVE as u64;
const STACK: u64 = libc::MAP_STACK as u64;
const NOREPLACE: u64 = libc::MAP_FIXED_NOREPLACE as u64;
const RDONLY: u64 = (libc::O_RDONLY | libc::O_CLOEXEC) as u64;
const DIRECTORY: u64 = libc::O_DIRECTORY as u64;
const PTHREAD_FLAGS: u64 = (libc::CLONE_VM
    | libc::CLONE_FS
    | libc::CLONE_FILES
    | libc::CLONE_SIGHAND
    | libc::CLONE_THREAD
    | libc::CLONE_SYSVSEM
    | libc::CLONE_SETTLS
    | libc::CLONE_PARENT_SETTID
    | libc::CLONE_CHILD_CLEARTID) as u64;
const HELPER_FLAGS: u64 =
    (libc::CLONE_VM | libc::CLONE_FS | libc::CLONE_FILES | libc::CLONE_UNTRACED) as u64;
const FUTEX_WAIT_PRIVATE: u64 = (libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG) as u64;
const FUTEX_WAKE_PRIVATE: u64 = (libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG) as u64;
const FUTEX_WAIT_BITSET_PRIVATE: u64 = (libc::FUTEX_WAIT_BITSET | libc::FUTEX_PRIVATE_FLAG) as u64;
const FUTEX_WAIT_BITSET_REALTIME: u64 =
    (libc::FUTEX_WAIT_BITSET | libc::FUTEX_CLOCK_REALTIME) as u64;
const STATX_ALL: u64 = 0xfff;
const SIGRTMAX: u64 = 64;

/// Every system call the injection and the agent make, with the arguments they make it
/// with, loader's first. The `seccomp` integration test runs a target that traps every
/// call not in this table through tendril's whole work (status, count, record, detach):
/// it is what keeps the table complete.
#[rustfmt::skip]
pub const SYSCALLS: &[SyscallUse] = &[
    // glibc's dynamic loader, mapping the agent and libgcc_s.
    loader(libc::SYS_openat, "openat", "O_RDONLY|O_CLOEXEC", [AT_FDCWD, PTR, RDONLY, 0, 0, 0]),
    loader(libc::SYS_read, "read", "", [FD, PTR, 832, 0, 0, 0]),
    loader(libc::SYS_pread64, "pread64", "", [FD, PTR, LEN, 64, 0, 0]),
    loader(libc::SYS_newfstatat, "newfstatat", "AT_EMPTY_PATH", [FD, PTR, PTR, 0x1000, 0, 0]),
    loader(libc::SYS_fstat, "fstat", "", [FD, PTR, 0, 0, 0, 0]),
    loader(libc::SYS_mmap, "mmap", "PROT_READ, MAP_PRIVATE|MAP_DENYWRITE", [0, LEN, R, PRIVATE | DENYWRITE, FD, 0]),
    loader(libc::SYS_mmap, "mmap", "PROT_READ|PROT_EXEC, MAP_PRIVATE|MAP_FIXED|MAP_DENYWRITE", [PTR, LEN, RX, PRIVATE | FIXED | DENYWRITE, FD, LEN]),
    loader(libc::SYS_mmap, "mmap", "PROT_READ, MAP_PRIVATE|MAP_FIXED|MAP_DENYWRITE", [PTR, LEN, R, PRIVATE | FIXED | DENYWRITE, FD, LEN]),
    loader(libc::SYS_mmap, "mmap", "PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_FIXED|MAP_DENYWRITE", [PTR, LEN, RW, PRIVATE | FIXED | DENYWRITE, FD, LEN]),
    loader(libc::SYS_mmap, "mmap", "PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_FIXED|MAP_ANONYMOUS", [PTR, LEN, RW, ANON | FIXED, NO_FD, 0]),
    loader(libc::SYS_mmap, "mmap", "PROT_READ, MAP_PRIVATE", [0, LEN, R, PRIVATE, FD, 0]),
    loader(libc::SYS_mmap, "mmap", "PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS", [0, LEN, NONE, ANON, NO_FD, 0]),
    loader(libc::SYS_mmap, "mmap", "PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS", [0, LEN, RW, ANON, NO_FD, 0]),
    loader(libc::SYS_mprotect, "mprotect", "PROT_READ", [PTR, LEN, R, 0, 0, 0]),
    loader(libc::SYS_mprotect, "mprotect", "PROT_NONE", [PTR, LEN, NONE, 0, 0, 0]),
    loader(libc::SYS_munmap, "munmap", "", [PTR, LEN, 0, 0, 0, 0]),
    loader(libc::SYS_close, "close", "", [FD, 0, 0, 0, 0, 0]),
    loader(libc::SYS_brk, "brk", "", [PTR, 0, 0, 0, 0, 0]),
    loader(libc::SYS_getrandom, "getrandom", "GRND_NONBLOCK", [PTR, 8, 1, 0, 0, 0]).on_errno(IGNORED),
    loader(libc::SYS_futex, "futex", "FUTEX_WAIT_PRIVATE", [PTR, FUTEX_WAIT_PRIVATE, 2, 0, 0, 0]),
    loader(libc::SYS_futex, "futex", "FUTEX_WAKE_PRIVATE", [PTR, FUTEX_WAKE_PRIVATE, 1, 0, 0, 0]),
    // The borrowed thread, put back into a system call the remote call interrupted.
    SyscallUse { caller: Caller::Resume, ..agent(libc::SYS_restart_syscall, "restart_syscall", "", [0; 6]) },
    // Threads (glibc's pthread_create and thread exit, Rust's std::thread).
    agent(libc::SYS_mmap, "mmap", "PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_STACK", [0, LEN, NONE, ANON | STACK, NO_FD, 0]),
    agent(libc::SYS_mprotect, "mprotect", "PROT_READ|PROT_WRITE", [PTR, LEN, RW, 0, 0, 0]),
    agent(libc::SYS_rt_sigprocmask, "rt_sigprocmask", "SIG_BLOCK", [libc::SIG_BLOCK as u64, PTR, PTR, 8, 0, 0]),
    agent(libc::SYS_rt_sigprocmask, "rt_sigprocmask", "SIG_UNBLOCK", [libc::SIG_UNBLOCK as u64, PTR, 0, 8, 0, 0]),
    agent(libc::SYS_rt_sigprocmask, "rt_sigprocmask", "SIG_SETMASK", [libc::SIG_SETMASK as u64, PTR, 0, 8, 0, 0]),
    agent(libc::SYS_clone3, "clone3", "", [PTR, 88, 0, 0, 0, 0]).on_errno(OnErrno::FallsBack(&[libc::ENOSYS])),
    agent(libc::SYS_clone, "clone", "pthread_create's flags", [PTHREAD_FLAGS, PTR, PTR, PTR, PTR, 0]),
    agent(libc::SYS_rseq, "rseq", "", [PTR, 32, 0, 0x5305_3053, 0, 0]).on_errno(IGNORED),
    agent(libc::SYS_set_robust_list, "set_robust_list", "", [PTR, 24, 0, 0, 0, 0]).on_errno(IGNORED),
    agent(libc::SYS_prctl, "prctl", "PR_SET_NAME", [libc::PR_SET_NAME as u64, PTR, 0, 0, 0, 0]).on_errno(IGNORED),
    agent(libc::SYS_prctl, "prctl", "PR_GET_NAME", [libc::PR_GET_NAME as u64, PTR, 0, 0, 0, 0]).on_errno(IGNORED),
    agent(libc::SYS_madvise, "madvise", "MADV_DONTNEED", [PTR, LEN, libc::MADV_DONTNEED as u64, 0, 0, 0]),
    agent(libc::SYS_futex, "futex", "FUTEX_WAIT_BITSET_PRIVATE", [PTR, FUTEX_WAIT_BITSET_PRIVATE, 0, PTR, 0, u32::MAX as u64]),
    agent(libc::SYS_futex, "futex", "FUTEX_WAIT_BITSET|FUTEX_CLOCK_REALTIME", [PTR, FUTEX_WAIT_BITSET_REALTIME, 1, 0, 0, u32::MAX as u64]),
    agent(libc::SYS_exit, "exit", "", [0; 6]),
    agent(libc::SYS_getrandom, "getrandom", "GRND_INSECURE", [PTR, 16, 4, 0, 0, 0]).on_errno(ENOSYS_EPERM),
    agent(libc::SYS_mmap, "mmap", "PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE", [0, LEN, NONE, ANON | NORESERVE, NO_FD, 0]),
    // The control socket, its directory and the startup-error note.
    agent(libc::SYS_getuid, "getuid", "", [0; 6]),
    agent(libc::SYS_geteuid, "geteuid", "", [0; 6]),
    agent(libc::SYS_getpid, "getpid", "", [0; 6]),
    agent(libc::SYS_gettid, "gettid", "", [0; 6]),
    agent(libc::SYS_statx, "statx", "AT_SYMLINK_NOFOLLOW", [AT_FDCWD, PTR, 0x100, STATX_ALL, PTR, 0]).on_errno(ENOSYS_EPERM),
    agent(libc::SYS_statx, "statx", "AT_EMPTY_PATH", [FD, PTR, 0x1000, STATX_ALL, PTR, 0]).on_errno(ENOSYS_EPERM),
    agent(libc::SYS_newfstatat, "newfstatat", "AT_SYMLINK_NOFOLLOW", [AT_FDCWD, PTR, PTR, 0x100, 0, 0]),
    agent(libc::SYS_mkdir, "mkdir", "", [PTR, 0o700, 0, 0, 0, 0]),
    agent(libc::SYS_chmod, "chmod", "", [PTR, 0o600, 0, 0, 0, 0]),
    agent(libc::SYS_unlink, "unlink", "", [PTR, 0, 0, 0, 0, 0]),
    agent(libc::SYS_socket, "socket", "AF_UNIX, SOCK_STREAM|SOCK_CLOEXEC", [libc::AF_UNIX as u64, (libc::SOCK_STREAM | libc::SOCK_CLOEXEC) as u64, 0, 0, 0, 0]),
    agent(libc::SYS_bind, "bind", "", [FD, PTR, 110, 0, 0, 0]),
    agent(libc::SYS_listen, "listen", "", [FD, u64::MAX, 0, 0, 0, 0]),
    agent(libc::SYS_ioctl, "ioctl", "FIONBIO", [FD, libc::FIONBIO, PTR, 0, 0, 0]),
    agent(libc::SYS_eventfd2, "eventfd2", "EFD_CLOEXEC|EFD_NONBLOCK", [0, (libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) as u64, 0, 0, 0, 0]),
    agent(libc::SYS_poll, "poll", "", [PTR, 2, 250, 0, 0, 0]),
    agent(libc::SYS_accept4, "accept4", "SOCK_CLOEXEC", [FD, PTR, PTR, libc::SOCK_CLOEXEC as u64, 0, 0]),
    agent(libc::SYS_getsockopt, "getsockopt", "SO_PEERCRED", [FD, libc::SOL_SOCKET as u64, libc::SO_PEERCRED as u64, PTR, PTR, 0]),
    agent(libc::SYS_recvfrom, "recvfrom", "", [FD, PTR, LEN, 0, 0, 0]),
    agent(libc::SYS_sendto, "sendto", "MSG_NOSIGNAL", [FD, PTR, LEN, libc::MSG_NOSIGNAL as u64, 0, 0]),
    agent(libc::SYS_sendmsg, "sendmsg", "MSG_NOSIGNAL", [FD, PTR, libc::MSG_NOSIGNAL as u64, 0, 0, 0]),
    agent(libc::SYS_shutdown, "shutdown", "SHUT_RDWR", [FD, libc::SHUT_RDWR as u64, 0, 0, 0, 0]),
    agent(libc::SYS_fcntl, "fcntl", "F_DUPFD_CLOEXEC", [FD, libc::F_DUPFD_CLOEXEC as u64, 3, 0, 0, 0]),
    agent(libc::SYS_openat, "openat", "O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC", [AT_FDCWD, PTR, (libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64, 0o600, 0, 0]),
    agent(libc::SYS_write, "write", "", [FD, PTR, LEN, 0, 0, 0]),
    agent(libc::SYS_clock_nanosleep, "clock_nanosleep", "CLOCK_REALTIME", [libc::CLOCK_REALTIME as u64, 0, PTR, 0, 0, 0]),
    agent(libc::SYS_clock_gettime, "clock_gettime", "CLOCK_MONOTONIC", [libc::CLOCK_MONOTONIC as u64, PTR, 0, 0, 0, 0]),
    // Files in /proc/self: maps, task, mem.
    agent(libc::SYS_openat, "openat", "O_RDONLY|O_CLOEXEC|O_DIRECTORY", [AT_FDCWD, PTR, RDONLY | DIRECTORY, 0, 0, 0]),
    agent(libc::SYS_openat, "openat", "O_RDONLY|O_CLOEXEC|O_DIRECTORY|O_NONBLOCK", [AT_FDCWD, PTR, RDONLY | DIRECTORY | libc::O_NONBLOCK as u64, 0, 0, 0]),
    agent(libc::SYS_openat, "openat", "O_RDWR|O_CLOEXEC", [AT_FDCWD, PTR, (libc::O_RDWR | libc::O_CLOEXEC) as u64, 0, 0, 0]),
    agent(libc::SYS_getdents64, "getdents64", "", [FD, PTR, LEN, 0, 0, 0]),
    agent(libc::SYS_pwrite64, "pwrite64", "", [FD, PTR, LEN, PTR, 0, 0]),
    agent(libc::SYS_process_vm_readv, "process_vm_readv", "", [1, PTR, 1, PTR, 1, 0]),
    // The recording's rings, shared with tendril.
    agent(libc::SYS_memfd_create, "memfd_create", "MFD_CLOEXEC|MFD_ALLOW_SEALING", [PTR, (libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) as u64, 0, 0, 0, 0]),
    agent(libc::SYS_ftruncate, "ftruncate", "", [FD, LEN, 0, 0, 0, 0]),
    agent(libc::SYS_fcntl, "fcntl", "F_ADD_SEALS", [FD, libc::F_ADD_SEALS as u64, (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL) as u64, 0, 0, 0]),
    agent(libc::SYS_mmap, "mmap", "PROT_READ|PROT_WRITE, MAP_SHARED", [0, LEN, RW, libc::MAP_SHARED as u64, FD, 0]),
    agent(libc::SYS_madvise, "madvise", "MADV_POPULATE_WRITE", [PTR, LEN, libc::MADV_POPULATE_WRITE as u64, 0, 0, 0]).on_errno(IGNORED),
    // A finished recording gives the rings' pages back.
    agent(libc::SYS_fallocate, "fallocate", "FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE", [FD, (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u64, LEN, LEN, 0, 0]),
    // Patching: code pages made writable for a moment (keeping execute), trampolines
    // near the code, per-thread state, cores serialised.
    agent(libc::SYS_mprotect, "mprotect", "PROT_READ|PROT_WRITE|PROT_EXEC", [PTR, LEN, RWX, 0, 0, 0]),
    agent(libc::SYS_mprotect, "mprotect", "PROT_READ|PROT_EXEC", [PTR, LEN, RX, 0, 0, 0]),
    agent(libc::SYS_mmap, "mmap", "PROT_READ|PROT_EXEC, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED_NOREPLACE", [PTR, LEN, RX, ANON | NOREPLACE, NO_FD, 0]),
    agent(libc::SYS_mmap, "mmap", "PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE", [0, LEN, RW, ANON | NORESERVE, NO_FD, 0]),
    agent(libc::SYS_membarrier, "membarrier", "MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE", [64, 0, 0, 0, 0, 0]),
    agent(libc::SYS_membarrier, "membarrier", "MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE", [32, 0, 0, 0, 0, 0]),
    agent(libc::SYS_sched_yield, "sched_yield", "", [0; 6]),
    // Whether the discoverer runs raised (a refusal: it is taken for not raised).
    agent(libc::SYS_getpriority, "getpriority", "PRIO_PROCESS", [libc::PRIO_PROCESS as u64, 2, 0, 0, 0, 0]).on_errno(IGNORED),
    agent(libc::SYS_sched_getaffinity, "sched_getaffinity", "", [0, LEN, PTR, 0, 0, 0]).on_errno(IGNORED),
    agent(libc::SYS_nanosleep, "nanosleep", "", [PTR, 0, 0, 0, 0, 0]),
    // Stopping the threads: the park signal, its handler, and the ptrace helper.
    agent(libc::SYS_rt_sigaction, "rt_sigaction", "reading a handler", [SIGRTMAX, 0, PTR, 8, 0, 0]),
    agent(libc::SYS_rt_sigaction, "rt_sigaction", "installing a handler", [SIGRTMAX, PTR, 0, 8, 0, 0]),
    agent(libc::SYS_rt_tgsigqueueinfo, "rt_tgsigqueueinfo", "", [1, 2, SIGRTMAX, PTR, 0, 0]),
    agent(libc::SYS_tgkill, "tgkill", "signal 0", [1, 2, 0, 0, 0, 0]),
    agent(libc::SYS_rt_sigreturn, "rt_sigreturn", "", [0; 6]),
    agent(libc::SYS_sigaltstack, "sigaltstack", "", [0, PTR, 0, 0, 0, 0]),
    agent(libc::SYS_mmap, "mmap", "PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_STACK", [0, LEN, RW, ANON | STACK, NO_FD, 0]),
    agent(libc::SYS_clone, "clone", "CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_UNTRACED", [HELPER_FLAGS, PTR, 0, 0, 0, 0]),
    agent(libc::SYS_prctl, "prctl", "PR_SET_PDEATHSIG", [libc::PR_SET_PDEATHSIG as u64, libc::SIGKILL as u64, 0, 0, 0, 0]),
    agent(libc::SYS_prctl, "prctl", "PR_SET_PTRACER", [libc::PR_SET_PTRACER as u64, 2, 0, 0, 0, 0]),
    agent(libc::SYS_ptrace, "ptrace", "PTRACE_SEIZE", [libc::PTRACE_SEIZE as u64, 2, 0, 0, 0, 0]),
    agent(libc::SYS_ptrace, "ptrace", "PTRACE_INTERRUPT", [libc::PTRACE_INTERRUPT as u64, 2, 0, 0, 0, 0]),
    agent(libc::SYS_ptrace, "ptrace", "PTRACE_GETREGS", [libc::PTRACE_GETREGS as u64, 2, 0, PTR, 0, 0]),
    agent(libc::SYS_ptrace, "ptrace", "PTRACE_SETREGS", [libc::PTRACE_SETREGS as u64, 2, 0, PTR, 0, 0]),
    agent(libc::SYS_ptrace, "ptrace", "PTRACE_DETACH", [libc::PTRACE_DETACH as u64, 2, 0, 0, 0, 0]),
    agent(libc::SYS_wait4, "wait4", "__WALL", [2, PTR, libc::__WALL as u64, 0, 0, 0]),
];

/// The numbers of the system calls in [`SYSCALLS`], each once, in increasing order.
pub fn agent_syscalls() -> Vec<i64> {
    let mut numbers: Vec<i64> = SYSCALLS.iter().map(|call| call.nr).collect();
    numbers.sort_unstable();
    numbers.dedup();
    numbers
}

/// Refuses the attach unless the seccomp state of the stopped `tracee`, and of every
/// other thread of its process, lets the injection and the agent make every call in
/// [`SYSCALLS`]. Reads only: on refusal the caller drops the tracee, which restores it.
pub(super) fn check(tracee: &Tracee) -> Result<(), AttachError> {
    let (pid, tid) = (tracee.pid(), tracee.tid());
    let refuse = |message: String| AttachError::Other { pid, message };
    let seized = match filters::thread_seccomp(pid, tid) {
        Some(Ok(seized)) => seized,
        Some(Err(unknown)) => return Err(refuse(cannot_judge(&unknown))),
        None => return Err(AttachError::Exited(pid)),
    };
    if let Some((other, state)) = thread_unlike(pid, tid, seized)? {
        return Err(refuse(format!(
            "its threads run under different seccomp filters (thread {tid}: {}, thread \
             {other}: {}), and tendril can read only the thread it borrows; attaching could \
             get it killed; nothing was changed",
            describe(seized),
            describe(state)
        )));
    }
    match seized.mode {
        Mode::Disabled => Ok(()),
        Mode::Strict => Err(refuse(
            "it runs in seccomp strict mode, which allows only read, write, exit and \
             sigreturn, so loading tendril's agent would kill it; nothing was changed"
                .into(),
        )),
        Mode::Filter => {
            let filters = filters::read_filters(tid).map_err(|why| refuse(unreadable(&why)))?;
            if let Some(count) = seized.filters.filter(|&count| count != filters.len()) {
                let why = format!("{} filters read, {count} listed", filters.len());
                return Err(refuse(unreadable(&why)));
            }
            match judge(&filters) {
                Ok(None) => Ok(()),
                Ok(Some((call, result))) => Err(refuse(refusal(call, result))),
                Err(error) => Err(refuse(cannot_judge(&error.to_string()))),
            }
        }
    }
}

/// A thread of `pid` whose seccomp state differs from `seized`'s (thread `tid`'s).
fn thread_unlike(
    pid: i32,
    tid: i32,
    seized: ThreadSeccomp,
) -> Result<Option<(i32, ThreadSeccomp)>, AttachError> {
    for other in crate::process::thread_ids(pid)? {
        match filters::thread_seccomp(pid, other) {
            Some(Ok(state)) if state != seized => return Ok(Some((other, state))),
            Some(Err(unknown)) if other != tid => {
                return Err(AttachError::Other {
                    pid,
                    message: cannot_judge(&unknown),
                });
            }
            // Gone meanwhile, or alike.
            _ => {}
        }
    }
    Ok(None)
}

fn describe(state: ThreadSeccomp) -> String {
    match (state.mode, state.filters) {
        (Mode::Disabled, _) => "no seccomp".into(),
        (Mode::Strict, _) => "strict mode".into(),
        (Mode::Filter, Some(1)) => "1 filter".into(),
        (Mode::Filter, Some(count)) => format!("{count} filters"),
        (Mode::Filter, None) => "filters".into(),
    }
}

/// The call in [`SYSCALLS`] whose combined result is the worst one the caller cannot
/// live with, and that result; `None` if every call may be made.
fn judge(
    filters: &[Vec<bpf::Instruction>],
) -> Result<Option<(&'static SyscallUse, u32)>, bpf::BpfError> {
    let mut worst: Option<(&'static SyscallUse, u32)> = None;
    for call in SYSCALLS {
        let data = SeccompData {
            nr: call.nr as i32,
            arch: bpf::AUDIT_ARCH_X86_64,
            instruction_pointer: 0,
            args: call.args,
        };
        let results = filters
            .iter()
            .map(|filter| bpf::run(filter, &data))
            .collect::<Result<Vec<u32>, _>>()?;
        let result = bpf::combine(results);
        if tolerated(call, Action::of(result)) {
            continue;
        }
        if worst.is_none_or(|(_, kept)| bpf::precedence(result) < bpf::precedence(kept)) {
            worst = Some((call, result));
        }
    }
    Ok(worst)
}

/// Whether `call` works well enough when the kernel takes `action` on it.
fn tolerated(call: &SyscallUse, action: Action) -> bool {
    match action {
        Action::Allow | Action::Log => true,
        Action::Errno(errno) => match call.on_errno {
            OnErrno::Fails => false,
            OnErrno::FallsBack(errnos) => errnos.iter().any(|&e| e as u32 == errno),
            OnErrno::Ignores => true,
        },
        _ => false,
    }
}

/// The refusal for `call`, which the filters' combined `result` does not let through.
fn refusal(call: &SyscallUse, result: u32) -> String {
    let action = Action::of(result);
    let consequence = match action {
        Action::KillProcess | Action::Unknown(_) => "kill it".to_string(),
        Action::KillThread => "kill the calling thread".into(),
        Action::Trap => "send it SIGSYS".into(),
        Action::Errno(0) => "skip the call, returning 0".into(),
        Action::Errno(errno) => match nix::errno::Errno::from_raw(errno as i32) {
            nix::errno::Errno::UnknownErrno => format!("fail with errno {errno}"),
            known => format!("fail with {known:?}"),
        },
        Action::UserNotif => "hand the call to a seccomp supervisor".into(),
        Action::Trace => "hand the call to a tracer".into(),
        Action::Allow | Action::Log => "let it through".into(),
    };
    let what = if call.detail.is_empty() {
        call.name.to_string()
    } else {
        format!("{} with {}", call.name, call.detail)
    };
    let needs = match call.caller {
        Caller::Loader => "loading tendril's agent",
        Caller::Resume => "resuming it after tendril's call",
        Caller::Agent => "tendril's agent",
    };
    format!(
        "its seccomp filter would {consequence} ({}) on {what}, which {needs} needs; nothing \
         was changed",
        action.name()
    )
}

fn unreadable(why: &str) -> String {
    format!(
        "it runs under a seccomp filter tendril cannot read ({why}); attaching could get it \
         killed; nothing was changed"
    )
}

fn cannot_judge(why: &str) -> String {
    format!(
        "tendril cannot judge its seccomp filter ({why}); attaching could get it killed; \
         nothing was changed"
    )
}

#[cfg(test)]
mod tests;
