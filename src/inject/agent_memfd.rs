//! Handing the agent library to the target through a memfd the target creates.
//!
//! The one idea: nothing tendril writes may land where the target's user can redirect
//! it. Their mount namespace is theirs to shape (`unshare -Urm` and a bind mount put
//! any directory at `/tmp`), so a file written "in the target's /tmp" by root could
//! land in a root-only directory of the host. A memfd is no file of any directory:
//! 1. on the borrowed thread, the target calls `memfd_create` (through libc's
//!    `syscall`, which every libc exports);
//! 2. tendril takes a duplicate of that descriptor with `pidfd_getfd` (the same open
//!    file, with the target's access mode: if the target swapped something else in
//!    under that number, tendril gets that, read-only or not a memfd, and refuses);
//! 3. checks that it is an empty, unlinked memfd, writes the agent's bytes into it and
//!    seals it against any change;
//! 4. the target `dlopen`s `/proc/self/fd/N` and closes the descriptor (the mapping
//!    stays).
//!
//! The path in step 4 is resolved in the target's namespace: a user who mounts
//! something else over its `/proc` loads something else into their own process, and
//! nothing outside it.

use super::loader::LoaderEntryPoints;
use super::remote_call::RemoteFrame;
use crate::agent_bundle::{self, AGENT_BYTES};
use crate::process::AttachError;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// How long a call of the target's `syscall` may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A memfd in the target holding the agent: its descriptor number there.
pub struct AgentMemfd {
    fd: u64,
}

impl AgentMemfd {
    /// The path the target `dlopen`s.
    pub fn path(&self) -> String {
        format!("/proc/self/fd/{}", self.fd)
    }

    /// Closes the descriptor in the target (the library, once loaded, stays mapped).
    pub fn close(self, frame: &mut RemoteFrame, entry_points: &LoaderEntryPoints) {
        if let Some(syscall) = entry_points.syscall {
            let _ = frame.call(syscall, &[libc::SYS_close as u64, self.fd], CALL_TIMEOUT);
        }
    }
}

/// Creates the memfd in the target and fills it with the agent (see the module comment).
pub fn deliver(
    pid: i32,
    frame: &mut RemoteFrame,
    entry_points: &LoaderEntryPoints,
) -> Result<AgentMemfd, AttachError> {
    let fail = |message: String| AttachError::Other { pid, message };
    let syscall = entry_points.syscall.ok_or_else(|| {
        fail("the target's libc has no `syscall` function to make a memfd with".into())
    })?;
    let mut name = agent_bundle::agent_file_name().into_bytes();
    name.push(0);
    let name_address = frame.push_bytes(&name)?;
    let flags = (libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) as u64;
    let result = frame.call(
        syscall,
        &[libc::SYS_memfd_create as u64, name_address, flags],
        CALL_TIMEOUT,
    )? as i64;
    if !(0..=i32::MAX as i64).contains(&result) {
        return Err(fail(
            "the target could not create a memfd for tendril's agent (memfd_create failed: an \
             old kernel, or a seccomp filter refuses it); nothing was loaded"
                .into(),
        ));
    }
    let memfd = AgentMemfd { fd: result as u64 };
    match fill(pid, result as i32) {
        Ok(()) => Ok(memfd),
        Err(message) => {
            memfd.close(frame, entry_points);
            Err(fail(format!(
                "cannot hand tendril's agent to the target: {message}; nothing was loaded"
            )))
        }
    }
}

/// Takes the target's descriptor `target_fd`, checks that it is the fresh memfd, writes
/// the agent into it and seals it.
fn fill(pid: i32, target_fd: i32) -> Result<(), String> {
    let ours = duplicate(pid, target_fd)?;
    check_fresh_memfd(&ours)?;
    let mut file = std::fs::File::from(ours);
    std::io::Write::write_all(&mut file, AGENT_BYTES)
        .map_err(|e| format!("cannot write the agent into the memfd: {e}"))?;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on a descriptor this function owns, with an integer argument.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(format!(
            "cannot seal the memfd: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// A duplicate of descriptor `target_fd` of process `pid`: the same open file.
fn duplicate(pid: i32, target_fd: i32) -> Result<OwnedFd, String> {
    // SAFETY: pidfd_open takes a pid and flags, and returns a new descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        return Err(format!(
            "pidfd_open failed ({}); tendril needs Linux 5.6 or later",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: pidfd_open returned a new descriptor this function now owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    // SAFETY: pidfd_getfd takes a pidfd, the target's descriptor number and flags, and
    // returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target_fd, 0) };
    if fd < 0 {
        return Err(format!(
            "pidfd_getfd failed ({}); tendril needs Linux 5.6 or later",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: pidfd_getfd returned a new descriptor the caller now owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The descriptor must be an empty memfd that no directory names: what `memfd_create`
/// just made, not something the target put under its number since.
fn check_fresh_memfd(fd: &OwnedFd) -> Result<(), String> {
    let stat = nix::sys::stat::fstat(fd).map_err(|e| format!("cannot inspect the memfd: {e}"))?;
    let is_file = stat.st_mode & libc::S_IFMT == libc::S_IFREG;
    // SAFETY: fcntl on a descriptor the caller owns; F_GET_SEALS takes no argument and
    // fails (EINVAL) on anything but a file that supports sealing, as a memfd does.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if !is_file || stat.st_size != 0 || stat.st_nlink != 0 || seals != 0 {
        return Err("the descriptor the target returned is not the fresh memfd it made".into());
    }
    Ok(())
}
