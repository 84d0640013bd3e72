//! The target user's runtime directory (`/tmp/tendril-UID`, mode 0700, owned by that
//! user), where the agent — running as that user — keeps its control socket and its
//! startup-error note. The agent makes it: tendril creates nothing in the target's
//! filesystem, whose `/tmp` the target's user may have put anywhere with a mount
//! namespace of their own.
//!
//! The one idea: the directory belongs to the target's user, who may put anything in
//! it at any moment, so tendril (often root) never goes through it by path. It is
//! opened under the target's root without following links and checked with `fstat`,
//! and every later operation in it is relative to that held descriptor: a note is read
//! through `O_NOFOLLOW | O_NONBLOCK` and only if it is a small regular file, a stale
//! name is removed with `unlinkat` (which removes a link, never what it points at).
//! Nothing tendril writes goes in it.

use crate::process::{AttachError, TargetProcess};
use nix::fcntl::AtFlags;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fstat, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use std::io::Read;
use std::os::fd::OwnedFd;

/// The longest startup-error note tendril reads.
const NOTE_LIMIT: u64 = 4096;

/// Refuses, before anything is loaded, a runtime directory that is there but not the
/// user's private directory (a link, another owner, other modes): the agent would not
/// listen in it. A missing one is fine: the agent makes it.
pub fn refuse_unusable(target: &TargetProcess) -> Result<(), AttachError> {
    let path = tendril_wire::runtime_dir(target.uid);
    let parent = path.parent().unwrap_or(std::path::Path::new("/"));
    let Ok(parent) = target.open_dir_in_target(parent) else {
        return Ok(());
    };
    match fstatat(&parent, file_name(&path), AtFlags::AT_SYMLINK_NOFOLLOW) {
        Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(unusable(target, e.to_string())),
        Ok(stat) => {
            let is_dir = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
            if !is_dir || stat.st_uid != target.uid || stat.st_mode & 0o777 != 0o700 {
                return Err(unusable(
                    target,
                    format!(
                        "it is not a directory owned by uid {} with mode 0700",
                        target.uid
                    ),
                ));
            }
            Ok(())
        }
    }
}

/// The runtime directory of `target`'s user, held open, if it exists and is sound.
pub fn open_existing(target: &TargetProcess) -> Option<OwnedFd> {
    open_private_dir(target, &tendril_wire::runtime_dir(target.uid))
}

/// The directory `path` (inside the target's mount namespace), held open, if it is a
/// private (0700) directory of `target`'s user.
pub fn open_private_dir(target: &TargetProcess, path: &std::path::Path) -> Option<OwnedFd> {
    let dir = target.open_dir_in_target(path).ok()?;
    check(target, &dir).ok()?;
    Some(dir)
}

/// The directory must be a real directory of the target's user, private to them.
fn check(target: &TargetProcess, dir: &OwnedFd) -> Result<(), AttachError> {
    let stat = fstat(dir).map_err(|e| unusable(target, e.to_string()))?;
    let is_dir = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
    if !is_dir || stat.st_uid != target.uid || stat.st_mode & 0o777 != 0o700 {
        return Err(unusable(
            target,
            format!(
                "it is not a directory owned by uid {} with mode 0700",
                target.uid
            ),
        ));
    }
    Ok(())
}

fn unusable(target: &TargetProcess, why: String) -> AttachError {
    AttachError::Other {
        pid: target.pid,
        message: format!(
            "the runtime directory {} is unusable ({why}); remove it and try again",
            tendril_wire::runtime_dir(target.uid).display()
        ),
    }
}

/// The name of a file of the agent in the runtime directory (`agent-PID.err`...).
fn file_name(path: &std::path::Path) -> &std::ffi::OsStr {
    path.file_name().unwrap_or_default()
}

/// Removes the agent's startup-error note of `target`, if any.
pub fn remove_startup_error(target: &TargetProcess, dir: &OwnedFd) {
    let note = tendril_wire::agent_error_path(target.uid, target.ns_pid);
    let _ = unlinkat(dir, file_name(&note), UnlinkatFlags::NoRemoveDir);
}

/// The agent's startup-error note of `target`, if there is one: a regular file, read
/// without following a link and without waiting, at most [`NOTE_LIMIT`] bytes of it.
pub fn read_startup_error(target: &TargetProcess, dir: &OwnedFd) -> Option<String> {
    let note = tendril_wire::agent_error_path(target.uid, target.ns_pid);
    let fd = openat(
        dir,
        file_name(&note),
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let stat = fstat(&fd).ok()?;
    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return None;
    }
    let mut text = String::new();
    std::fs::File::from(fd)
        .take(NOTE_LIMIT)
        .read_to_string(&mut text)
        .ok()?;
    Some(text.trim().to_string())
}
