//! A file a runtime writes for profilers (`/tmp/perf-PID.map`, `jit-PID.dump`), opened
//! through the target's own view of the file system and followed as it grows.
//!
//! The one idea: the file is the target user's — and maybe another user's, planted
//! where the runtime will write — and tendril often runs as root, so it is opened the
//! way every file of a target's is: from `/proc/PID/root`, one component at a time,
//! following no link (`O_NOFOLLOW`, a planted link is refused, never followed), without
//! waiting (`O_NONBLOCK`: a FIFO in its place does not hang tendril), read only, and
//! kept only if it is a regular file of the target's user written since the target
//! started (an older one is an earlier process's of the same pid). Nothing is written.
//! The open descriptor is kept and read from the offset reached so far, up to a cap.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;

/// Who the target is, for the checks a file of its must pass.
#[derive(Debug, Clone)]
pub struct Owner {
    pub pid: i32,
    /// The target's real and effective uids: a file it made belongs to one of them.
    pub uids: Vec<u32>,
    /// When the target started (seconds since the epoch), if known.
    pub started: Option<i64>,
}

/// One followed file: where it is, its descriptor once it passed the checks, and how
/// far it has been read.
#[derive(Debug)]
pub struct TargetFile {
    /// The path inside the target's mount namespace.
    pub path: PathBuf,
    file: Option<File>,
    /// Bytes read (and understood) so far.
    pub offset: u64,
    /// The last reason the file was not read, said once.
    refused: Option<String>,
}

/// What [`TargetFile::open`] found.
pub enum Opened {
    /// Ready to read.
    Ready,
    /// Not there (yet): nothing to say.
    Absent,
    /// There, but not to be read, for this reason (new: to be said once).
    Refused(String),
    /// Refused for the same reason as last time.
    StillRefused,
}

impl TargetFile {
    pub fn new(path: PathBuf) -> TargetFile {
        TargetFile {
            path,
            file: None,
            offset: 0,
            refused: None,
        }
    }

    /// Whether the file passed the checks and is held open.
    pub fn is_open(&self) -> bool {
        self.file.is_some()
    }

    /// Opens the file if it is not open yet. `fallback`: another way to the same file
    /// (`/proc/PID/map_files/…` of the mapping a runtime made of it) when its path
    /// holds a link or lies on a mount this path does not reach.
    pub fn open(&mut self, owner: &Owner, fallback: Option<&Path>) -> Opened {
        if self.file.is_some() {
            return Opened::Ready;
        }
        let result = open_no_follow(owner.pid, &self.path).or_else(|error| {
            match (error.raw_os_error(), fallback) {
                (Some(libc::ELOOP | libc::ENOENT | libc::ENOTDIR), Some(path)) => {
                    open_read_only(path)
                }
                _ => Err(error),
            }
        });
        let reason = match result {
            Ok(file) => match check(&file, owner, &self.path) {
                Ok(()) => {
                    self.file = Some(file);
                    self.refused = None;
                    return Opened::Ready;
                }
                Err(reason) => reason,
            },
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Opened::Absent,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => format!(
                "{} is a symbolic link (or its directory is one): not followed, its names \
                 are not read",
                self.path.display()
            ),
            Err(e) => format!("cannot read {}: {e}", self.path.display()),
        };
        if self.refused.as_deref() == Some(reason.as_str()) {
            return Opened::StillRefused;
        }
        self.refused = Some(reason.clone());
        Opened::Refused(reason)
    }

    /// The file's size now (0 if it is not open or cannot be read).
    pub fn size(&self) -> u64 {
        self.file
            .as_ref()
            .and_then(|f| f.metadata().ok())
            .map_or(0, |m| m.len())
    }

    /// Reads up to `buffer.len()` bytes at `at`; the number read.
    pub fn read_at(&self, buffer: &mut [u8], at: u64) -> usize {
        let Some(file) = &self.file else {
            return 0;
        };
        let mut done = 0;
        while done < buffer.len() {
            match file.read_at(&mut buffer[done..], at + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        done
    }
}

/// Opens `path` (absolute, inside the target's mount namespace) under
/// `/proc/PID/root`, following no link on the way and none at the end.
fn open_no_follow(pid: i32, path: &Path) -> std::io::Result<File> {
    let parent = path.parent().unwrap_or(Path::new("/"));
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let dir = crate::process::open_dir_in_target(pid, parent)?;
    let fd: OwnedFd = openat(
        &dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    Ok(File::from(fd))
}

/// Opens a kernel-made path (`/proc/PID/map_files/…`), read only and without waiting.
fn open_read_only(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

/// A regular file of the target's user, written since the target started.
fn check(file: &File, owner: &Owner, path: &Path) -> Result<(), String> {
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !meta.file_type().is_file() {
        return Err(format!(
            "{} is not a regular file: not read",
            path.display()
        ));
    }
    if !owner.uids.contains(&meta.uid()) {
        return Err(format!(
            "{} belongs to uid {}, not to process {}'s user: not read",
            path.display(),
            meta.uid(),
            owner.pid
        ));
    }
    // (A second's margin: the start time is known to the clock tick, the boot time to
    // the second.)
    if owner
        .started
        .is_some_and(|started| meta.mtime() + 1 < started)
    {
        return Err(format!(
            "{} was last written before process {} started (an earlier process's): not read",
            path.display(),
            owner.pid
        ));
    }
    Ok(())
}

/// The target's real and effective uids and its start time.
pub fn owner_of(pid: i32) -> Owner {
    let status = crate::process::read_proc_text(format!("/proc/{pid}/status")).unwrap_or_default();
    let uids = crate::process::status_field(&status, "Uid")
        .map(|v| {
            v.split_whitespace()
                .take(2)
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    Owner {
        pid,
        uids,
        started: start_time(pid),
    }
}

/// When process `pid` started, in seconds since the epoch: its `starttime` (clock
/// ticks since boot, field 22 of `/proc/PID/stat`) plus the boot time (`btime`).
fn start_time(pid: i32) -> Option<i64> {
    let stat = crate::process::read_proc_text(format!("/proc/{pid}/stat")).ok()?;
    let (_, after_name) = stat.rsplit_once(')')?;
    // After the name, field 3 is the first: starttime (22) is the twentieth.
    let ticks: i64 = after_name.split_whitespace().nth(19)?.parse().ok()?;
    let boot: i64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| boot + ticks / hz)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn own() -> Owner {
        owner_of(std::process::id() as i32)
    }

    #[test]
    fn the_start_time_is_in_the_past() {
        let started = own().started.expect("a start time");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        assert!(
            started <= now + 1 && started > now - 24 * 3600,
            "{started} {now}"
        );
    }

    #[test]
    fn a_regular_file_is_read_and_a_link_is_refused_once() {
        let dir = std::env::temp_dir().join(format!("tendril-jit-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let real = dir.join("real.map");
        std::fs::File::create(&real)
            .unwrap()
            .write_all(b"1000 10 f\n")
            .unwrap();
        let link = dir.join("link.map");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&real, &link).unwrap();

        let owner = own();
        let mut file = TargetFile::new(real.clone());
        assert!(matches!(file.open(&owner, None), Opened::Ready));
        let mut bytes = [0u8; 64];
        assert_eq!(file.read_at(&mut bytes, 0), 10);
        assert_eq!(file.size(), 10);

        let mut linked = TargetFile::new(link.clone());
        let Opened::Refused(reason) = linked.open(&owner, None) else {
            panic!("a link is refused");
        };
        assert!(reason.contains("symbolic link"), "{reason}");
        assert!(matches!(linked.open(&owner, None), Opened::StillRefused));
        assert!(!linked.is_open());

        let mut missing = TargetFile::new(dir.join("missing.map"));
        assert!(matches!(missing.open(&owner, None), Opened::Absent));
        let other = Owner {
            uids: vec![12345],
            ..own()
        };
        let Opened::Refused(reason) = TargetFile::new(real).open(&other, None) else {
            panic!("another user's file is refused");
        };
        assert!(reason.contains("belongs to uid"), "{reason}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
