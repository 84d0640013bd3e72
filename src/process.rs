//! What tendril needs to know about a target process before it touches it.
//!
//! [`inspect`] turns a user-supplied pid into a [`TargetProcess`] or into an
//! [`AttachError`] that says, in one line, why tendril will not attach and what the user
//! can do. Every check here only reads `/proc`: nothing is done to the target yet.

use std::path::PathBuf;
use thiserror::Error;

/// Why tendril cannot attach to a process. Each message is one line for the user.
#[derive(Debug, Error)]
pub enum AttachError {
    #[error("no process with pid {0}")]
    NoSuchProcess(i32),
    #[error("pid {0} is tendril itself; give the pid of the program to profile")]
    OwnProcess(i32),
    #[error("pid {tid} is a thread of process {tgid}; give the process id {tgid}")]
    ThreadNotProcess { tid: i32, tgid: i32 },
    #[error("process {0} is a zombie: it has exited and waits for its parent to reap it")]
    Zombie(i32),
    #[error("pid {0} is a kernel thread; tendril attaches to user-space programs")]
    KernelThread(i32),
    #[error("process {pid} runs {exe}, which is not an ELF executable")]
    NotElf { pid: i32, exe: String },
    #[error(
        "process {pid} runs {exe}, which is not an x86-64 program ({what}); tendril supports 64-bit x86-64 targets only"
    )]
    WrongArchitecture {
        pid: i32,
        exe: String,
        what: &'static str,
    },
    #[error(
        "process {pid} ({exe}) is statically linked: it has no dynamic loader, so tendril cannot load its agent into it"
    )]
    StaticallyLinked { pid: i32, exe: String },
    #[error(
        "process {pid} is already traced by pid {tracer} ({tracer_name}); detach that tracer first"
    )]
    AlreadyTraced {
        pid: i32,
        tracer: i32,
        tracer_name: String,
    },
    #[error(
        "process {pid} is being traced by pid {tracer} ({tracer_name}): {who}; try again when it is done"
    )]
    BeingTraced {
        pid: i32,
        tracer: i32,
        tracer_name: String,
        /// Who that is likely to be: another tendril attaching, or a debugger.
        who: &'static str,
    },
    #[error("cannot attach to {0}: operation not permitted — {advice}", advice = permission_advice())]
    PermissionDenied(i32),
    #[error("process {0} exited during the attach")]
    Exited(i32),
    #[error(
        "process {0} is stopped (SIGSTOP or job control), so it cannot answer; continue it with `kill -CONT {0}` and try again"
    )]
    Stopped(i32),
    #[error(
        "process {pid} runs with CET shadow stacks, which tendril's return hooks do not support yet"
    )]
    ShadowStack { pid: i32 },
    #[error("cannot attach to {pid}: {message}")]
    Other { pid: i32, message: String },
}

/// What to do about a refused attach: who may attach depends on who tendril runs as.
fn permission_advice() -> &'static str {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        "even root is refused here (a security module, a container without CAP_SYS_PTRACE, or a protected process)"
    } else {
        "run as the same user or as root, or set kernel.yama.ptrace_scope=0"
    }
}

/// Who a tracer that is a tendril is (its process is named so).
const ANOTHER_TENDRIL: &str = "another tendril is attaching to it";
/// Who any other tracer may be.
const ANOTHER_TRACER: &str = "another tendril or a debugger is attached";

impl AttachError {
    /// Process `pid` is traced by thread `tracer` (a `TracerPid`): names the tracer's
    /// process, and says whether it is another tendril.
    pub fn traced_by(pid: i32, tracer: i32) -> AttachError {
        let status = read_proc_text(format!("/proc/{tracer}/status")).unwrap_or_default();
        let tracer = status_field(&status, "Tgid")
            .and_then(|tgid| tgid.parse().ok())
            .unwrap_or(tracer);
        let tracer_name = read_proc_text(format!("/proc/{tracer}/comm"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        AttachError::BeingTraced {
            pid,
            tracer,
            who: if tracer_name == "tendril" {
                ANOTHER_TENDRIL
            } else {
                ANOTHER_TRACER
            },
            tracer_name,
        }
    }
}

/// The tracer (`TracerPid`) of thread `tid` of process `pid`, or else of any of its
/// threads: ptrace holds threads one by one. `None` if nothing traces it.
pub fn tracer_of(pid: i32, tid: i32) -> Option<i32> {
    let tracer_of_thread = |tid: i32| {
        let status = read_proc_text(format!("/proc/{pid}/task/{tid}/status")).ok()?;
        status_field(&status, "TracerPid")?
            .parse::<i32>()
            .ok()
            .filter(|&tracer| tracer != 0)
    };
    tracer_of_thread(tid).or_else(|| thread_ids(pid).ok()?.into_iter().find_map(tracer_of_thread))
}

/// A process tendril may attach to, with the facts the attach needs.
#[derive(Debug, Clone)]
pub struct TargetProcess {
    /// The pid as tendril sees it.
    pub pid: i32,
    /// The pid inside the target's own pid namespace (equal to `pid` outside containers).
    pub ns_pid: i32,
    /// The target's real uid: its runtime directory belongs to this user.
    pub uid: u32,
    pub gid: u32,
    /// The executable, as a path inside the target's mount namespace.
    pub exe: PathBuf,
}

impl TargetProcess {
    /// `path` (absolute, inside the target's mount namespace) as a path tendril can open.
    pub fn path_in_target(&self, path: &std::path::Path) -> PathBuf {
        let relative = path.strip_prefix("/").unwrap_or(path);
        PathBuf::from(format!("/proc/{}/root", self.pid)).join(relative)
    }

    /// Opens the directory `path` (absolute, inside the target's mount namespace) from
    /// `/proc/PID/root`, one component at a time, following no symbolic link: what is
    /// opened is the directory at that path, whoever controls a directory on the way.
    /// Files made or removed relative to the returned descriptor stay in it.
    pub fn open_dir_in_target(
        &self,
        path: &std::path::Path,
    ) -> std::io::Result<std::os::fd::OwnedFd> {
        open_dir_in_target(self.pid, path)
    }
}

/// Opens the directory `path` (absolute, inside the mount namespace of process `pid`)
/// from `/proc/PID/root`, one component at a time, following no symbolic link (see
/// [`TargetProcess::open_dir_in_target`]).
pub fn open_dir_in_target(
    pid: i32,
    path: &std::path::Path,
) -> std::io::Result<std::os::fd::OwnedFd> {
    use nix::fcntl::{OFlag, open, openat};
    use nix::sys::stat::Mode;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    // The root link itself is the kernel's (it leads into the target's mount
    // namespace); the components under it are the target's.
    let mut dir = open(format!("/proc/{pid}/root").as_str(), flags, Mode::empty())?;
    for component in path.components() {
        if let std::path::Component::Normal(name) = component {
            dir = openat(&dir, name, flags | OFlag::O_NOFOLLOW, Mode::empty())?;
        }
    }
    Ok(dir)
}

/// The value of `key` in the text of `/proc/PID/status` (`Threads:\t9` gives `9`).
pub fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
        .map(str::trim)
}

/// The fields of `/proc/PID/stat` (or `/proc/PID/task/TID/stat`) that tendril reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatLine<'a> {
    /// The command name, without its parentheses.
    pub comm: &'a str,
    /// `R`, `S`, `D`, `Z`…
    pub state: char,
    /// The per-process flags (`PF_*`).
    pub flags: u64,
    /// Field 52, `exit_code`: an exited process's wait status (`code << 8`, or the
    /// signal that killed it), when the kernel shows it (since Linux 3.5).
    pub exit_code: Option<i32>,
}

/// The `PF_KTHREAD` bit of the per-process flags in `/proc/PID/stat`.
const PF_KTHREAD: u64 = 0x0020_0000;

impl<'a> StatLine<'a> {
    /// Parses a stat line. The command name may itself contain spaces and parentheses,
    /// so the fields are counted from its last `)`.
    pub fn parse(stat: &'a str) -> Option<StatLine<'a>> {
        let (before, after) = stat.rsplit_once(')')?;
        let comm = before.split_once('(').map_or("", |(_, comm)| comm);
        let fields: Vec<&str> = after.split_whitespace().collect();
        // After the name: state is the first field (3 of the line), flags the seventh
        // (9), exit_code the fiftieth (52).
        let state = fields.first()?.chars().next()?;
        let flags = fields.get(6)?.parse().ok()?;
        let exit_code = fields.get(49).and_then(|code| code.parse().ok());
        Some(StatLine {
            comm,
            state,
            flags,
            exit_code,
        })
    }

    pub fn is_kernel_thread(&self) -> bool {
        self.flags & PF_KTHREAD != 0
    }

    /// A zombie or a dead process: it has exited.
    pub fn has_exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// A text file of `/proc` (`stat`, `status`, `comm`, `maps`), its bytes that are not
/// UTF-8 replaced (`U+FFFD`). Those files hold names the target chooses — a thread
/// name, a file name — and a name that is not UTF-8 must not make a process look gone,
/// unreadable or hidden.
pub fn read_proc_text(path: impl AsRef<std::path::Path>) -> std::io::Result<String> {
    let bytes = std::fs::read(path)?;
    Ok(match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// Maps an I/O error on `/proc/PID/...` to the attach error a user should see.
pub fn io_to_attach_error(pid: i32, error: &std::io::Error) -> AttachError {
    match error.kind() {
        std::io::ErrorKind::NotFound => AttachError::NoSuchProcess(pid),
        std::io::ErrorKind::PermissionDenied => AttachError::PermissionDenied(pid),
        _ if error.raw_os_error() == Some(libc::ESRCH) => AttachError::Exited(pid),
        _ => AttachError::Other {
            pid,
            message: error.to_string(),
        },
    }
}

/// Checks everything that can be checked without touching the target.
pub fn inspect(pid: i32) -> Result<TargetProcess, AttachError> {
    if pid <= 0 {
        return Err(AttachError::NoSuchProcess(pid));
    }
    if pid == std::process::id() as i32 {
        return Err(AttachError::OwnProcess(pid));
    }
    let status =
        read_proc_text(format!("/proc/{pid}/status")).map_err(|e| io_to_attach_error(pid, &e))?;
    let field_i32 = |key: &str| -> i32 {
        status_field(&status, key)
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let tgid = field_i32("Tgid");
    if tgid != 0 && tgid != pid {
        return Err(AttachError::ThreadNotProcess { tid: pid, tgid });
    }
    if status_field(&status, "State").is_some_and(|s| s.starts_with('Z') || s.starts_with('X')) {
        return Err(AttachError::Zombie(pid));
    }
    let stat =
        read_proc_text(format!("/proc/{pid}/stat")).map_err(|e| io_to_attach_error(pid, &e))?;
    if StatLine::parse(&stat).is_some_and(|stat| stat.is_kernel_thread()) {
        return Err(AttachError::KernelThread(pid));
    }
    let tracer = field_i32("TracerPid");
    // tendril itself traces a program it started (`tendril run`) until it is set up.
    if tracer != 0 && tracer != std::process::id() as i32 {
        let error = AttachError::traced_by(pid, tracer);
        // Another tendril holds it only for a moment: it is attaching.
        if matches!(error, AttachError::BeingTraced { who, .. } if who == ANOTHER_TENDRIL) {
            return Err(error);
        }
        let tracer_name = read_proc_text(format!("/proc/{tracer}/comm"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        return Err(AttachError::AlreadyTraced {
            pid,
            tracer,
            tracer_name,
        });
    }
    let ids = |key: &str| -> Vec<u32> {
        status_field(&status, key)
            .map(|v| {
                v.split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    let uids = ids("Uid");
    let gids = ids("Gid");
    let (uid, gid) = (
        uids.first().copied().unwrap_or(0),
        gids.first().copied().unwrap_or(0),
    );
    // SAFETY: geteuid has no preconditions and cannot fail.
    let my_euid = unsafe { libc::geteuid() };
    if my_euid != 0 && uids.iter().any(|&u| u != my_euid) {
        return Err(AttachError::PermissionDenied(pid));
    }
    let ns_pid = status_field(&status, "NSpid")
        .and_then(|v| v.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(pid);
    if status_field(&status, "x86_Thread_features").is_some_and(|f| f.contains("shstk")) {
        return Err(AttachError::ShadowStack { pid });
    }

    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map_err(|e| match e.kind() {
        // The process was there a moment ago and it is not a kernel thread.
        std::io::ErrorKind::NotFound => AttachError::Exited(pid),
        _ => io_to_attach_error(pid, &e),
    })?;
    let target = TargetProcess {
        pid,
        ns_pid,
        uid,
        gid,
        exe,
    };
    check_executable(&target)?;
    Ok(target)
}

/// The executable must be a dynamically linked x86-64 ELF. Only its headers are read
/// (through a mapping, so a large executable costs a few page reads).
pub fn check_executable(target: &TargetProcess) -> Result<(), AttachError> {
    use goblin::elf::program_header::{PT_INTERP, ProgramHeader};
    let pid = target.pid;
    let exe = target.exe.display().to_string();
    let file =
        std::fs::File::open(format!("/proc/{pid}/exe")).map_err(|e| io_to_attach_error(pid, &e))?;
    // SAFETY: the mapping is read-only and private; a concurrent truncation of the file
    // could fault, which for an executable that is running cannot happen (ETXTBSY).
    let bytes = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io_to_attach_error(pid, &e))?;
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" {
        return Err(AttachError::NotElf { pid, exe });
    }
    let header = goblin::elf::Elf::parse_header(&bytes).map_err(|_| AttachError::NotElf {
        pid,
        exe: exe.clone(),
    })?;
    let Ok(container) = header.container() else {
        return Err(AttachError::NotElf { pid, exe });
    };
    if !container.is_big() {
        return Err(AttachError::WrongArchitecture {
            pid,
            exe,
            what: "32-bit",
        });
    }
    if header.e_machine != goblin::elf::header::EM_X86_64 {
        return Err(AttachError::WrongArchitecture {
            pid,
            exe,
            what: "another machine type",
        });
    }
    let ctx = goblin::container::Ctx::new(
        container,
        header
            .endianness()
            .unwrap_or(goblin::container::Endian::Little),
    );
    let program_headers = ProgramHeader::parse(
        &bytes,
        header.e_phoff as usize,
        header.e_phnum as usize,
        ctx,
    )
    .map_err(|e| AttachError::Other {
        pid,
        message: format!("cannot parse {exe}: {e}"),
    })?;
    if !program_headers.iter().any(|ph| ph.p_type == PT_INTERP) {
        return Err(AttachError::StaticallyLinked { pid, exe });
    }
    Ok(())
}

/// Thread ids of the process, main thread first.
pub fn thread_ids(pid: i32) -> Result<Vec<i32>, AttachError> {
    let entries =
        std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| io_to_attach_error(pid, &e))?;
    let mut tids: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
        .collect();
    tids.sort_by_key(|&tid| (tid != pid, tid));
    Ok(tids)
}

/// A thread's name (`comm`), or an empty string if it is gone.
pub fn thread_name(pid: i32, tid: i32) -> String {
    read_proc_text(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default()
}

/// True when the thread is blocked inside a system call right now, which makes it a
/// good thread to borrow: it is not in the middle of user-space work holding locks.
pub fn thread_is_in_syscall(pid: i32, tid: i32) -> bool {
    read_proc_text(format!("/proc/{pid}/task/{tid}/syscall"))
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .map(|nr| nr.parse::<i64>().is_ok_and(|n| n >= 0))
        })
        .unwrap_or(false)
}

/// True when the thread is runnable (state `R`): on a cpu or waiting for one.
pub fn thread_is_running(pid: i32, tid: i32) -> bool {
    read_proc_text(format!("/proc/{pid}/task/{tid}/stat"))
        .ok()
        .and_then(|stat| StatLine::parse(&stat).map(|stat| stat.state == 'R'))
        .unwrap_or(false)
}

/// True when the process no longer exists or is exiting (zombie or dead).
pub fn is_gone_or_exiting(pid: i32) -> bool {
    match read_proc_text(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => StatLine::parse(&stat).is_some_and(|stat| stat.has_exited()),
    }
}

/// Whether the process is gone or exiting, or becomes so within `grace`: a process
/// closes its files (its agent's connection among them) a moment before it shows as
/// exiting.
pub fn exits_within(pid: i32, grace: std::time::Duration) -> bool {
    becomes_true_within(grace, || is_gone_or_exiting(pid))
}

/// Whether `check` holds now or comes to within `grace` (asked every few milliseconds).
pub fn becomes_true_within(grace: std::time::Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + grace;
    loop {
        if check() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// True when the process is stopped by a signal (SIGSTOP, SIGTSTP...): its threads,
/// the agent's among them, run nothing until it is continued. A tracing stop (`t`,
/// as in a program `tendril run` holds at its first instruction) is not this.
pub fn is_stopped(pid: i32) -> bool {
    process_state(pid) == Some('T')
}

/// True when none of the process's code runs now: it is stopped by a signal (`T`) or
/// held by a tracer (`t`, as a debugger holds it). Its agent cannot answer then, so a
/// request that can wait is not sent: it would wait for its reply timeout, and the
/// failed request would close the connection.
pub fn is_halted(pid: i32) -> bool {
    matches!(process_state(pid), Some('T' | 't'))
}

/// The state letter of `/proc/PID/stat` (`R`, `S`, `T`…); `None` if it cannot be read.
fn process_state(pid: i32) -> Option<char> {
    let stat = read_proc_text(format!("/proc/{pid}/stat")).ok()?;
    StatLine::parse(&stat).map(|stat| stat.state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_read_after_the_last_parenthesis() {
        // A command name with spaces and a parenthesis of its own; flags of kthreadd.
        let line = "2 (a) b (c) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0";
        let stat = StatLine::parse(line).expect("parses");
        assert_eq!(stat.comm, "a) b (c");
        assert_eq!(stat.state, 'S');
        assert!(stat.is_kernel_thread());
        assert!(!stat.has_exited());
        let zombie = StatLine::parse("7 (x) Z 1 7 7 0 -1 4194308 0").expect("parses");
        assert!(zombie.has_exited() && !zombie.is_kernel_thread());
        assert_eq!(zombie.exit_code, None);
        // A whole line (Linux 3.5 and later): exit_code is the last field, 52.
        let whole = format!("7 (x) Z{} 9", " 0".repeat(48));
        assert_eq!(StatLine::parse(&whole).unwrap().exit_code, Some(9));
        assert_eq!(StatLine::parse("7 (x) Z 1"), None);
    }

    #[test]
    fn this_process_is_a_running_user_space_process() {
        // This very thread is running; the main thread may be asleep.
        let text = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let this_thread = StatLine::parse(&text).unwrap();
        assert_eq!(this_thread.state, 'R');
        let text = std::fs::read_to_string("/proc/self/stat").unwrap();
        let stat = StatLine::parse(&text).unwrap();
        assert!(!stat.is_kernel_thread() && !stat.has_exited());
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        assert_eq!(status_field(&status, "Name"), Some(stat.comm));
        assert_eq!(
            status_field(&status, "Tgid"),
            Some(std::process::id().to_string().as_str())
        );
        assert_eq!(status_field(&status, "NoSuchField"), None);
    }
}
