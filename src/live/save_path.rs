//! Where the live UI's `w` (and `record` without `-o`) saves a profile:
//! `tendril-<pid>-<YYYYmmdd-HHMMSS>.json` in the current directory, as a full path so
//! the message that names it can be copied from anywhere.
//!
//! The one idea: the name says which process and when, in local time, and never
//! overwrites a file that is there (a second save in the same second gets `-2`).

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
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

/// Creates the first of `names` that does not exist yet, with `O_CREAT | O_EXCL`: a
/// name that is there — a file, or a link someone put there — is never opened or
/// followed, the next one is tried instead. tendril often runs as root in a directory
/// other users can write to, so it never writes through a name it did not create.
pub fn create_first_free(
    names: impl IntoIterator<Item = PathBuf>,
) -> Result<(PathBuf, File), FreshFileError> {
    let mut last = None;
    for path in names.into_iter().take(ATTEMPTS) {
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(file) => return Ok((path, file)),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => last = Some(path),
            Err(e) => return Err(FreshFileError::Failed(path, e)),
        }
    }
    Err(FreshFileError::AllTaken(last))
}

/// The names a snapshot of `pid` is saved under, in order: `tendril-<pid>-<time>.json`
/// in the current directory, then `-2`, `-3`… — for [`create_first_free`].
pub fn snapshot_paths(pid: i32) -> impl Iterator<Item = PathBuf> {
    let directory = std::env::current_dir().unwrap_or_default();
    let stem = format!("tendril-{pid}-{}", local_timestamp());
    let first = directory.join(format!("{stem}.json"));
    std::iter::once(first)
        .chain((2u64..).map(move |next| directory.join(format!("{stem}-{next}.json"))))
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
