//! Where the live UI's `w` (and `record` without `-o`) saves a profile:
//! `tendril-<pid>-<YYYYmmdd-HHMMSS>.json` in the current directory, as a full path so
//! the message that names it can be copied from anywhere.
//!
//! The one idea: the name says which process and when, in local time, and never
//! overwrites a file that is there (a second save in the same second gets `-2`).

use std::path::PathBuf;

/// `tendril-<pid>-<YYYYmmdd-HHMMSS>.json` in the current directory (with `-2`, `-3`…
/// added if that file exists), from the root.
pub fn snapshot_path(pid: i32) -> PathBuf {
    snapshot_paths(pid)
        .find(|path| !path.exists())
        .expect("the names go on without end")
}

/// The names [`snapshot_path`] tries, in order: `tendril-<pid>-<time>.json`, then
/// `-2`, `-3`… — for a caller that creates the file itself, without following a
/// name someone else put there (`OutputFile::create_fresh`).
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
        let path = snapshot_path(4242);
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
