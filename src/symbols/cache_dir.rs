//! The invoking user's symbol cache directory, reached without following links.
//!
//! The one idea: tendril often runs as root against other users' processes, so the
//! cache is only ever touched through a directory descriptor that was reached by a walk
//! that follows no link and passes only through directories nobody else can change.
//! The path (`$TENDRIL_CACHE_DIR`, else `$XDG_CACHE_HOME/tendril`, else
//! `$HOME/.cache/tendril`) is walked from `/` one component at a time with
//! `O_NOFOLLOW | O_DIRECTORY`, so a path with a link anywhere in it has no cache. Every directory on the way must belong to
//! the invoking user (effective uid) or to root; one that others can write must be
//! sticky (`/tmp`), and the cache directory itself (made 0700 when missing) must not be
//! writable by group or others. Anything else — a link planted by another user, a
//! directory of another owner — disables the cache for this run: symbols are then
//! parsed afresh, never written. Files are read with `O_NOFOLLOW` and written to a
//! fresh temporary name (`O_CREAT | O_EXCL`), then renamed into place.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{OFlag, open, openat, renameat};
use nix::sys::stat::{Mode, SFlag, fstat, mkdirat};
use nix::unistd::{UnlinkatFlags, geteuid, unlinkat};

/// Overrides the cache directory (tests and benchmarks); `off` disables the cache.
pub const CACHE_DIR_VAR: &str = "TENDRIL_CACHE_DIR";

/// The cache directory of the invoking user, held open.
pub struct CacheDir {
    dir: OwnedFd,
}

impl CacheDir {
    /// Opens (making the last components when missing) the invoking user's cache
    /// directory; `None` when there is none or it is not safe to use.
    pub fn open() -> Option<CacheDir> {
        let path = cache_path()?;
        Self::open_at(&path)
    }

    /// Opens the cache directory at `path` (see the module comment for the checks).
    pub fn open_at(path: &Path) -> Option<CacheDir> {
        let uid = geteuid().as_raw();
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
        let mut dir = open("/", flags, Mode::empty()).ok()?;
        let mut parent_open_to_others = trusted(&dir, uid)?;
        let names: Vec<&OsStr> = path
            .components()
            .filter_map(|c| match c {
                Component::Normal(name) => Some(name),
                _ => None,
            })
            .collect();
        for name in names {
            dir = match openat(&dir, name, flags, Mode::empty()) {
                Ok(next) => next,
                Err(Errno::ENOENT) => {
                    mkdirat(&dir, name, Mode::from_bits_truncate(0o700)).ok()?;
                    openat(&dir, name, flags, Mode::empty()).ok()?
                }
                Err(_) => return None,
            };
            parent_open_to_others = trusted(&dir, uid)?;
        }
        // The cache directory itself: nobody but its owner may add or swap names in it.
        (!parent_open_to_others).then_some(CacheDir { dir })
    }

    /// The contents of the file `name`, if it is a regular file no larger than `limit`.
    pub fn read(&self, name: &str, limit: u64) -> Option<Vec<u8>> {
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let fd = openat(&self.dir, name, flags, Mode::empty()).ok()?;
        let stat = fstat(&fd).ok()?;
        let regular = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG;
        if !regular || stat.st_size < 0 || stat.st_size as u64 > limit {
            return None;
        }
        let mut bytes = Vec::with_capacity(stat.st_size as usize);
        std::io::Read::read_to_end(&mut std::io::Read::take(File::from(fd), limit), &mut bytes)
            .ok()?;
        Some(bytes)
    }

    /// Writes `bytes` as the file `name` (see [`Self::write_with`]).
    #[cfg(test)]
    pub fn write(&self, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        self.write_with(name, |file| std::io::Write::write_all(file, bytes))
    }

    /// Writes the file `name` with `fill`: to a fresh temporary file first, then renamed
    /// over `name`, so a reader sees the old file or the whole new one.
    pub fn write_with(
        &self,
        name: &str,
        fill: impl FnOnce(&mut File) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        static WRITES: AtomicU64 = AtomicU64::new(0);
        let n = WRITES.fetch_add(1, Ordering::Relaxed);
        let temp = format!(".{name}.{}.{n}.tmp", std::process::id());
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = openat(
            &self.dir,
            temp.as_str(),
            flags,
            Mode::from_bits_truncate(0o600),
        )?;
        let written = fill(&mut File::from(fd));
        let renamed = written.and_then(|()| {
            renameat(&self.dir, temp.as_str(), &self.dir, name).map_err(std::io::Error::from)
        });
        if renamed.is_err() {
            let _ = unlinkat(&self.dir, temp.as_str(), UnlinkatFlags::NoRemoveDir);
        }
        renamed
    }
}

/// Whether the opened directory may be walked: owned by `uid` or root. Returns whether
/// others may write in it (`Some(true)` only for a sticky directory such as `/tmp`,
/// whose entries others cannot remove or rename); `None` refuses it.
fn trusted(dir: &OwnedFd, uid: u32) -> Option<bool> {
    let stat = fstat(dir).ok()?;
    let is_dir = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
    if !is_dir || (stat.st_uid != uid && stat.st_uid != 0) {
        return None;
    }
    let open_to_others = stat.st_mode & 0o022 != 0;
    let sticky = stat.st_mode & 0o1000 != 0;
    if open_to_others && !sticky {
        return None;
    }
    Some(open_to_others)
}

/// `$TENDRIL_CACHE_DIR`, `$XDG_CACHE_HOME/tendril` or `$HOME/.cache/tendril`; only
/// absolute paths count (the XDG rule), and `TENDRIL_CACHE_DIR=off` disables the cache.
fn cache_path() -> Option<PathBuf> {
    let absolute = |var: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    if let Some(dir) = std::env::var_os(CACHE_DIR_VAR) {
        return (dir != "off")
            .then(|| PathBuf::from(dir))
            .filter(|p| p.is_absolute());
    }
    if let Some(xdg) = absolute("XDG_CACHE_HOME") {
        return Some(xdg.join("tendril"));
    }
    absolute("HOME").map(|home| home.join(".cache").join("tendril"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("tendril-cachedir-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        dir
    }

    #[test]
    fn makes_a_private_directory_and_round_trips_a_file() {
        let base = scratch("roundtrip");
        let cache = CacheDir::open_at(&base.join("a/tendril")).expect("a usable cache");
        let mode = std::fs::metadata(base.join("a/tendril"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        cache.write("x.idx", b"hello").unwrap();
        assert_eq!(cache.read("x.idx", 100).as_deref(), Some(&b"hello"[..]));
        assert_eq!(cache.read("x.idx", 3), None, "too large for the limit");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn refuses_a_directory_others_can_write() {
        let base = scratch("open");
        let dir = base.join("tendril");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(CacheDir::open_at(&dir).is_none());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn never_reads_through_a_link() {
        let base = scratch("link");
        let cache = CacheDir::open_at(&base).unwrap();
        std::fs::write(base.join("real"), b"secret").unwrap();
        std::os::unix::fs::symlink(base.join("real"), base.join("x.idx")).unwrap();
        assert_eq!(cache.read("x.idx", 100), None);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
