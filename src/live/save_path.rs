//! Where the live UI's `w` (and `record` without `-o`) saves a profile:
//! `tendril-<pid>-<YYYYmmdd-HHMMSS>.json` in the current directory, as a full path so
//! the message that names it can be copied from anywhere.
//!
//! The one idea: the name says which process and when, in local time, and never
//! overwrites a file that is there (a second save in the same second gets `-2`). A name
//! is guessable, and the directory may be one others write to (`/tmp`): a file or a
//! link someone put at it is never opened or followed, and a link there is said.

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

/// Names tried before giving up (each one was taken).
const ATTEMPTS: usize = 1000;

/// Why no fresh file could be created.
#[derive(Debug)]
pub enum FreshFileError {
    /// Every name tried exists already (the last one, if any was tried).
    AllTaken(Option<PathBuf>),
    /// Creating this name failed for another reason.
    Failed(PathBuf, std::io::Error),
}

/// A file made by [`create_first_free`].
#[derive(Debug)]
pub struct FreshFile {
    pub path: PathBuf,
    pub file: File,
    /// Names passed over because a symbolic link was there (someone may have planted
    /// it, to have tendril write where it points): to be said.
    pub links_passed: Vec<PathBuf>,
}

/// Creates the first of `names` that does not exist yet, with `O_CREAT | O_EXCL |
/// O_NOFOLLOW`: a name that is there — a file, or a link someone put there — is never
/// opened or followed, the next one is tried instead. tendril often runs as root in a
/// directory other users can write to, so it never writes through a name it did not
/// create.
pub fn create_first_free(
    names: impl IntoIterator<Item = PathBuf>,
) -> Result<FreshFile, FreshFileError> {
    let mut last = None;
    let mut links_passed = Vec::new();
    for path in names.into_iter().take(ATTEMPTS) {
        let created = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path);
        match created {
            Ok(file) => {
                return Ok(FreshFile {
                    path,
                    file,
                    links_passed,
                });
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                if path.symlink_metadata().is_ok_and(|m| m.is_symlink()) {
                    links_passed.push(path.clone());
                }
                last = Some(path);
            }
            Err(e) => return Err(FreshFileError::Failed(path, e)),
        }
    }
    Err(FreshFileError::AllTaken(last))
}

/// The names a snapshot of `pid` is saved under, in order: `tendril-<pid>-<time>.json`
/// in the current directory, then `-2`, `-3`… — for [`create_first_free`].
pub fn snapshot_paths(pid: i32) -> impl Iterator<Item = PathBuf> {
    let directory = std::env::current_dir().unwrap_or_default();
    snapshot_names(pid).map(move |name| directory.join(name))
}

/// The file names of [`snapshot_paths`]: `tendril-<pid>-<time>.json`, `…-2.json`, ….
pub fn snapshot_names(pid: i32) -> impl Iterator<Item = String> {
    timestamped_names(&format!("tendril-{pid}"), "json")
}

/// `<prefix>-<time>.<extension>`, then `…-2.<extension>`, `…-3.<extension>`….
pub fn timestamped_names(prefix: &str, extension: &str) -> impl Iterator<Item = String> + use<> {
    let stem = format!("{prefix}-{}", local_timestamp());
    let extension = extension.to_owned();
    std::iter::once(format!("{stem}.{extension}"))
        .chain((2u64..).map(move |n| format!("{stem}-{n}.{extension}")))
}

/// The local time as `YYYYmmdd-HHMMSS`.
fn local_timestamp() -> String {
    // SAFETY: time(NULL) has no preconditions.
    let now = unsafe { libc::time(std::ptr::null_mut()) };
    // SAFETY: an all-zero `tm` is a valid value of this plain C struct (its pointer
    // field `tm_zone` may be null).
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call; localtime_r is the thread-safe form.
    if unsafe { libc::localtime_r(&now, &mut tm) }.is_null() {
        return now.to_string();
    }
    format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_files_are_named_after_the_pid_and_the_time() {
        let path = snapshot_paths(4242).next().unwrap();
        assert!(path.is_absolute(), "{}", path.display());
        assert_eq!(path.parent(), std::env::current_dir().ok().as_deref());
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let stamp = name
            .strip_prefix("tendril-4242-")
            .and_then(|rest| rest.strip_suffix(".json"))
            .unwrap_or_else(|| panic!("{name}"));
        let (date, time) = stamp.split_once('-').unwrap_or_else(|| panic!("{name}"));
        assert_eq!(date.len(), 8, "{name}");
        assert!(date.starts_with("20"), "{name}");
        assert_eq!(time.len(), 6, "{name}");
        assert!(
            stamp.chars().all(|c| c.is_ascii_digit() || c == '-'),
            "{name}"
        );
    }
}
