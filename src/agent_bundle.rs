//! The agent library embedded in this binary, and installing it where a target can load it.
//!
//! The agent goes into a directory of tendril's own user (its effective uid), not of the
//! target's: `/tmp/tendril-agent-EUID` (mode 0755, each library 0644). When root profiles
//! another user's process, every file root writes is in a directory only root can
//! change, which the target can still read and `dlopen` from; a user cannot make root
//! write through a link, nor have root's next session load a library of theirs.
//!
//! How it is done, so that no step goes through a path the target's user controls:
//! - The directory is opened from `/proc/PID/root` (a target in a container gets its
//!   own `/tmp`) one component at a time without following links, created with
//!   `mkdirat` if needed, and checked on the held descriptor: a real directory owned by
//!   tendril's euid, writable by nobody else. Otherwise the attach stops with one line
//!   saying to remove it.
//! - The installed library counts as installed only if it is a regular file of that
//!   owner, writable by nobody else, whose bytes are exactly this build's agent (read
//!   through an `O_NOFOLLOW` descriptor) — never judged by size.
//! - A library is written to a fresh name with `O_CREAT | O_EXCL | O_NOFOLLOW`
//!   relative to the held directory, then `renameat` over the final name. The final
//!   name carries a digest of the bytes, so two tendril builds never replace each
//!   other's agent while a process has it mapped.

use crate::process::{AttachError, DirError, TargetProcess};
use nix::fcntl::{OFlag, openat, renameat};
use nix::sys::stat::{Mode, SFlag, fchmod, fstat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::PathBuf;

include!(concat!(env!("OUT_DIR"), "/agent_bundle.rs"));

/// The name every build of the agent library starts with.
pub const AGENT_LIBRARY_PREFIX: &str = "libtendril_agent";

/// Whether a module (by file name) is a tendril agent, of this build or another: its
/// code is tendril's own, and is never instrumented.
pub fn is_agent_module(file_name: &str) -> bool {
    file_name.starts_with(AGENT_LIBRARY_PREFIX)
}

/// File name of the agent library built into this tendril.
pub fn agent_file_name() -> String {
    format!("{AGENT_LIBRARY_PREFIX}-{AGENT_DIGEST}.so")
}

/// tendril's effective uid: the owner of the agent directory.
fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// The directory the agent library is installed in, as a path inside the target's mount
/// namespace.
pub fn agent_dir() -> PathBuf {
    PathBuf::from(format!("/tmp/tendril-agent-{}", euid()))
}

/// Installs the agent where `target` can load it unless this build's agent is there
/// already; returns the path the target must `dlopen` (inside its mount namespace).
pub fn install_agent(target: &TargetProcess) -> Result<PathBuf, AttachError> {
    let dir_path = agent_dir();
    let fail = |message: String| AttachError::Other {
        pid: target.pid,
        message,
    };
    let dir = open_agent_dir(target, &dir_path)?;
    let name = agent_file_name();
    if !is_genuine_agent(&dir, &name) {
        write_agent(&dir, &name).map_err(|e| {
            fail(format!(
                "cannot install the agent in {}: {e}",
                dir_path.display()
            ))
        })?;
    }
    Ok(dir_path.join(name))
}

/// Opens (creating it if needed) the agent directory, and checks it.
fn open_agent_dir(target: &TargetProcess, path: &std::path::Path) -> Result<OwnedFd, AttachError> {
    let fail = |message: String| AttachError::Other {
        pid: target.pid,
        message,
    };
    let unusable = |why: String| {
        fail(format!(
            "the agent directory {} is unusable ({why}); remove it and try again",
            path.display()
        ))
    };
    let (dir, created) = target
        .create_dir_in_target(path, 0o755)
        .map_err(|e| match e {
            DirError::Create(message) => fail(message),
            DirError::Unusable(why) => unusable(why),
        })?;
    if created {
        // The umask may have taken read or search permission from the target's user.
        fchmod(&dir, Mode::from_bits_truncate(0o755)).map_err(|e| unusable(e.to_string()))?;
    }
    let stat = fstat(&dir).map_err(|e| unusable(e.to_string()))?;
    let is_dir = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
    if !is_dir || stat.st_uid != euid() || stat.st_mode & 0o022 != 0 {
        return Err(unusable(format!(
            "it must be a directory owned by uid {} that no one else may write",
            euid()
        )));
    }
    Ok(dir)
}

/// Whether `name` in `dir` is exactly this build's agent, as tendril's own file.
fn is_genuine_agent(dir: &OwnedFd, name: &str) -> bool {
    let Ok(fd) = openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) else {
        return false;
    };
    let Ok(stat) = fstat(&fd) else { return false };
    let is_file = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG;
    if !is_file
        || stat.st_uid != euid()
        || stat.st_mode & 0o022 != 0
        || stat.st_size != AGENT_BYTES.len() as i64
    {
        return false;
    }
    let mut bytes = Vec::with_capacity(AGENT_BYTES.len());
    std::fs::File::from(fd)
        .take(AGENT_BYTES.len() as u64 + 1)
        .read_to_end(&mut bytes)
        .is_ok_and(|_| bytes == AGENT_BYTES)
}

/// Writes the agent as `name` in `dir`: to a fresh file first, then renamed over it.
fn write_agent(dir: &OwnedFd, name: &str) -> std::io::Result<()> {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let temporary = loop {
        let candidate = format!(
            ".{name}.{}.{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        match openat(
            dir,
            candidate.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        ) {
            Ok(fd) => break (candidate, fd),
            // Left by a tendril that died mid-install: pick the next name.
            Err(nix::errno::Errno::EEXIST) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    let (temporary, fd) = temporary;
    let written = fchmod(&fd, Mode::from_bits_truncate(0o644))
        .map_err(std::io::Error::from)
        .and_then(|()| std::fs::File::from(fd).write_all(AGENT_BYTES))
        .and_then(|()| renameat(dir, temporary.as_str(), dir, name).map_err(Into::into));
    if written.is_err() {
        let _ = unlinkat(dir, temporary.as_str(), UnlinkatFlags::NoRemoveDir);
    }
    written
}
