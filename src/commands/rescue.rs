//! Where a recorded profile (or an edge count) goes when its destination fails at the
//! end (a disk that filled up while the target was recorded): to a directory of
//! tendril's own, so the recording is not lost.
//!
//! The one idea: a recording cannot be made again, so a profile that cannot be written
//! where it was asked for is written to `tendril-profiles-<euid>` under `/var/tmp`,
//! `/tmp` or `/dev/shm` — the first that takes it, usually another file system — and
//! the error says exactly where it went. Those parents are writable by everyone, so the
//! directory is made and checked as the agent's is (`agent_bundle`): created with
//! `mkdirat` 0700, opened without following a link, and used only if it is a directory
//! owned by tendril's euid that no one else may enter; the file is a fresh name made
//! with `O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600.

use crate::live::save_path::timestamped_names;
use nix::errno::Errno;
use nix::fcntl::{OFlag, open, openat};
use nix::sys::stat::{Mode, SFlag, fstat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

/// The directories tried, in order: `/var/tmp` survives a reboot, `/dev/shm` is memory.
pub const RESCUE_PARENTS: [&str; 3] = ["/var/tmp", "/tmp", "/dev/shm"];

/// Names tried in one directory before giving up on it.
const ATTEMPTS: usize = 100;

/// The directory of tendril's own under `parent`: `PARENT/tendril-profiles-<euid>`.
pub fn rescue_dir(parent: &str) -> PathBuf {
    PathBuf::from(parent).join(format!(
        "tendril-profiles-{}",
        nix::unistd::geteuid().as_raw()
    ))
}

/// What is saved: its file name's prefix and extension (`tendril-4242`, `json`), and
/// how to write it.
pub struct Rescued<'a> {
    pub prefix: String,
    pub extension: &'a str,
    pub write: &'a dyn Fn(&mut dyn Write) -> std::io::Result<()>,
}

/// Writes `what` to a fresh `<prefix>-<time>.<extension>` in the first rescue
/// directory that takes it; the file's path, or why each directory failed (`DIR:
/// reason`).
pub fn save_elsewhere(what: &Rescued) -> Result<PathBuf, Vec<String>> {
    let mut failures = Vec::new();
    for parent in RESCUE_PARENTS {
        let dir = rescue_dir(parent);
        match own_dir(parent, &dir).and_then(|fd| write_fresh(&fd, what)) {
            Ok(name) => return Ok(dir.join(name)),
            Err(why) => failures.push(format!("{}: {why}", dir.display())),
        }
    }
    Err(failures)
}

/// Opens (making it if needed) `dir` in `parent`, and checks it is tendril's own.
fn own_dir(parent: &str, dir: &std::path::Path) -> Result<OwnedFd, String> {
    let name = dir.file_name().expect("a rescue directory has a name");
    let parent = open(
        parent,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| e.desc().to_owned())?;
    match mkdirat(&parent, name, Mode::from_bits_truncate(0o700)) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(e.desc().to_owned()),
    }
    let fd = openat(
        &parent,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::ELOOP | Errno::ENOTDIR => "it is not a directory (a link?); remove it".to_owned(),
        other => other.desc().to_owned(),
    })?;
    let stat = fstat(&fd).map_err(|e| e.desc().to_owned())?;
    let is_dir = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
    let euid = nix::unistd::geteuid().as_raw();
    if !is_dir || stat.st_uid != euid || stat.st_mode & 0o077 != 0 {
        return Err(format!(
            "not tendril's own (it must be a directory of uid {euid} that no one else may \
             enter); remove it"
        ));
    }
    Ok(fd)
}

/// Writes `what` to a fresh name in `dir`; the name.
fn write_fresh(dir: &OwnedFd, what: &Rescued) -> Result<String, String> {
    for name in timestamped_names(&what.prefix, what.extension).take(ATTEMPTS) {
        let fd = match openat(
            dir,
            name.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        ) {
            Ok(fd) => fd,
            Err(Errno::EEXIST) => continue,
            Err(e) => return Err(e.desc().to_owned()),
        };
        let mut out = std::io::BufWriter::new(std::fs::File::from(fd));
        let written = (what.write)(&mut out)
            .and_then(|()| out.flush())
            .and_then(|()| out.get_ref().sync_all());
        return match written {
            Ok(()) => Ok(name),
            Err(e) => {
                let _ = unlinkat(dir, name.as_str(), UnlinkatFlags::NoRemoveDir);
                Err(e.to_string())
            }
        };
    }
    Err("every name is taken".to_owned())
}
