//! `-o FILE` of `record`, `run`, `sample`, `edges` and `report`, and the default
//! `tendril-<pid>-<time>.json`: the output's destination, checked before the target is
//! touched.
//!
//! The one idea: open the file at the start — without truncating one that exists — so a
//! path that cannot be written (a missing directory, a directory, `/proc/version`, a
//! full file system) is one line before any recording, not after it. A file is created
//! with `O_CREAT | O_EXCL | O_NOFOLLOW` and an existing one opened with `O_NOFOLLOW`:
//! root never writes through a link someone put at the name (in `/tmp`, say). The file
//! is emptied only when the output is written; a file tendril created is removed again
//! if nothing ever reaches it. A profile that still cannot be written at the end (the
//! disk filled up meanwhile) is saved in a directory of tendril's own (`rescue`), and
//! the error says where.

use crate::commands::rescue;
use crate::live::save_path::{FreshFileError, create_first_free};
use crate::profile::Profile;
use crate::terminal_text::say;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, ErrorKind, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Room a file system must have for a new output: less, and it is full for a profile.
pub const MIN_ROOM: u64 = 64 * 1024;

/// Where the profile goes: a checked, open file, or stdout.
pub enum ProfileOutput {
    File(OutputFile),
    Stdout,
}

impl ProfileOutput {
    /// Checks and opens `path` (stdout when `None` or `-`).
    pub fn open(path: Option<&Path>) -> anyhow::Result<ProfileOutput> {
        Ok(match path {
            Some(path) if path != Path::new("-") => ProfileOutput::File(OutputFile::open(path)?),
            _ => ProfileOutput::Stdout,
        })
    }

    /// Checks and opens `path` (stdout for `-`); without one, creates a new file named
    /// after the process and the time (`tendril-<pid>-<time>.json`, see
    /// [`OutputFile::create_fresh`]), as perf and py-spy write a file rather than a
    /// profile on the terminal.
    pub fn open_or_fresh(path: Option<&Path>, pid: i32) -> anyhow::Result<ProfileOutput> {
        match path {
            Some(path) => ProfileOutput::open(Some(path)),
            None => Ok(ProfileOutput::File(OutputFile::create_fresh(
                crate::live::save_path::snapshot_paths(pid),
            )?)),
        }
    }

    /// The file the profile goes to (`None`: stdout).
    pub fn path(&self) -> Option<&Path> {
        match self {
            ProfileOutput::File(file) => Some(&file.path),
            ProfileOutput::Stdout => None,
        }
    }

    /// Writes the profile JSON. If that fails, the profile is saved in a directory of
    /// tendril's own instead ([`rescue`]) and the error says why and where it went.
    pub fn write(self, profile: &Profile) -> anyhow::Result<()> {
        self.write_unrepeatable(&rescue::Rescued {
            prefix: format!("tendril-{}", profile.pid),
            extension: "json",
            write: &|mut out| profile.write_json(&mut out),
        })
    }

    /// Writes what `what.write` writes, which cannot be made again (a profile, an edge
    /// count): if the destination fails, it is saved in a directory of tendril's own
    /// ([`rescue`]) and the error says why and where it went.
    pub fn write_unrepeatable(self, what: &rescue::Rescued) -> anyhow::Result<()> {
        let (destination, failed) = match self {
            ProfileOutput::File(file) => {
                let destination = file.path.display().to_string();
                (destination, file.write_with(what.write).err())
            }
            ProfileOutput::Stdout => {
                let mut out = std::io::stdout().lock();
                let written = (what.write)(&mut out).and_then(|()| out.flush());
                ("stdout".to_owned(), written.err())
            }
        };
        match failed {
            None => Ok(()),
            Some(error) => Err(rescued(what, &destination, &error)),
        }
    }
}

/// The error for output that could not be written to `destination`, once it is saved
/// elsewhere (or could not be).
fn rescued(what: &rescue::Rescued, destination: &str, error: &std::io::Error) -> anyhow::Error {
    match rescue::save_elsewhere(what) {
        Ok(path) => {
            let path = path.display();
            let report = if what.extension == "json" {
                format!(" (tendril report {path})")
            } else {
                String::new()
            };
            anyhow::anyhow!(
                "cannot write the profile to {destination}: {error}; it is saved in {path} \
                 instead{report}"
            )
        }
        Err(failures) => anyhow::anyhow!(
            "cannot write the profile to {destination}: {error}; nor in tendril's own \
             directories ({}): the profile is lost",
            failures.join("; ")
        ),
    }
}

/// An output file opened for writing, not yet truncated.
pub struct OutputFile {
    path: PathBuf,
    file: File,
    /// tendril created it (and removes it unless the output is written).
    created: bool,
    written: bool,
}

impl OutputFile {
    /// Opens `path` for writing, creating it if needed (never through a link), and
    /// checks that it takes writes and that its file system has room.
    pub fn open(path: &Path) -> anyhow::Result<OutputFile> {
        let shown = path.display();
        let fail =
            |reason: String| anyhow::anyhow!("cannot write the profile to {shown}: {reason}");
        let flags = libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let created = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(flags)
            .open(path);
        let (file, created) = match created {
            Ok(file) => (file, true),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                match OpenOptions::new()
                    .write(true)
                    .custom_flags(flags)
                    .open(path)
                {
                    Ok(file) => (file, false),
                    Err(e) => return Err(fail(describe(path, &e))),
                }
            }
            Err(e) => return Err(fail(describe(path, &e))),
        };
        let output = OutputFile {
            path: path.to_path_buf(),
            file,
            created,
            written: false,
        };
        output.check().map_err(fail)?;
        Ok(output)
    }

    /// Whether the open file takes a profile: not a kernel file, writable, and on a
    /// file system with room.
    fn check(&self) -> Result<(), String> {
        // /proc and /sys files open for writing but refuse a profile.
        if let Ok(fs) = nix::sys::statfs::fstatfs(&self.file) {
            let kind = fs.filesystem_type();
            if kind == nix::sys::statfs::PROC_SUPER_MAGIC || kind == nix::sys::statfs::SYSFS_MAGIC {
                return Err(
                    "it is a kernel file (/proc or /sys), not a place for a profile".into(),
                );
            }
        }
        // A write of nothing changes nothing, and fails where a real write would.
        if let Err(e) = nix::unistd::write(&self.file, &[]) {
            return Err(describe(&self.path, &std::io::Error::from(e)));
        }
        let regular = self.file.metadata().is_ok_and(|m| m.is_file());
        if let Ok(fs) = nix::sys::statvfs::fstatvfs(&self.file)
            && regular
        {
            let room = fs.blocks_available() * fs.fragment_size();
            if room < MIN_ROOM {
                return Err(format!(
                    "its file system is full ({} KiB free) — free some space or give another \
                     place with -o FILE",
                    room / 1024
                ));
            }
        }
        Ok(())
    }

    /// Creates the first of `names` that does not exist yet, never through a name that
    /// is there (see [`create_first_free`]), and checks it as [`OutputFile::open`] does.
    pub fn create_fresh(names: impl IntoIterator<Item = PathBuf>) -> anyhow::Result<OutputFile> {
        match create_first_free(names) {
            Ok(fresh) => {
                for link in &fresh.links_passed {
                    say!(
                        "{} is a symbolic link someone put there; tendril writes no file \
                         through a link, so the profile goes to {}",
                        link.display(),
                        fresh.path.display()
                    );
                }
                let output = OutputFile {
                    path: fresh.path,
                    file: fresh.file,
                    created: true,
                    written: false,
                };
                output.check().map_err(|reason| {
                    anyhow::anyhow!(
                        "cannot write the profile to {}: {reason}",
                        output.path.display()
                    )
                })?;
                Ok(output)
            }
            Err(FreshFileError::Failed(path, e)) => {
                let reason = describe(&path, &e);
                anyhow::bail!(
                    "cannot write the profile to {}: {reason} (give another place with -o FILE)",
                    path.display()
                )
            }
            Err(FreshFileError::AllTaken(last)) => anyhow::bail!(
                "cannot write the profile: {} and the names after it exist already — give -o FILE",
                last.map_or_else(|| "every name".into(), |p| p.display().to_string())
            ),
        }
    }

    /// Replaces the file's contents with `bytes` (an export of a profile).
    pub fn write_bytes(self, bytes: &[u8]) -> anyhow::Result<()> {
        let path = self.path.display().to_string();
        self.write_with(&|out| out.write_all(bytes))
            .map_err(|e| anyhow::anyhow!("cannot write the profile to {path}: {e}"))
    }

    /// Replaces the file's contents with what `write` writes. On failure the file is
    /// removed if tendril made it, and left empty otherwise: no half output stays.
    fn write_with(
        mut self,
        write: &dyn Fn(&mut dyn Write) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        self.empty()?;
        let mut out = BufWriter::new(&self.file);
        let written = write(&mut out).and_then(|()| out.flush());
        drop(out);
        match written {
            Ok(()) => {
                self.written = true;
                Ok(())
            }
            Err(error) => {
                let _ = self.empty();
                Err(error)
            }
        }
    }

    /// Truncates a regular file to nothing (a device such as /dev/null has no length).
    fn empty(&self) -> std::io::Result<()> {
        if self.file.metadata().is_ok_and(|m| m.is_file()) {
            self.file.set_len(0)?;
        }
        Ok(())
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if self.created && !self.written {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Why `path` cannot be opened for writing, in words.
fn describe(path: &Path, error: &std::io::Error) -> String {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if error.raw_os_error() == Some(libc::ELOOP) {
        return "it is a symbolic link, and tendril writes no file through a link (give the \
                path it points to)"
            .into();
    }
    match error.kind() {
        ErrorKind::NotFound => format!("the directory {} does not exist", parent.display()),
        ErrorKind::NotADirectory => "a part of its directory path is not a directory".into(),
        ErrorKind::IsADirectory => "it is a directory; give a file name".into(),
        ErrorKind::PermissionDenied => "permission denied".into(),
        ErrorKind::ReadOnlyFilesystem => "the file system is read-only".into(),
        ErrorKind::StorageFull => "no space left on the file system".into(),
        _ => error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_file_never_goes_through_a_name_that_is_there() {
        let directory =
            std::env::temp_dir().join(format!("tendril-fresh-output-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&directory);
        std::fs::create_dir_all(&directory).unwrap();
        let victim = directory.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let names: Vec<PathBuf> = ["a.json", "b.json", "c.json"]
            .iter()
            .map(|name| directory.join(name))
            .collect();
        // Someone put a link at the first name and a file at the second.
        std::os::unix::fs::symlink(&victim, &names[0]).unwrap();
        std::fs::write(&names[1], "theirs").unwrap();
        let output = OutputFile::create_fresh(names.clone()).unwrap();
        assert_eq!(output.path, names[2]);
        // An existing link named with -o is refused, not followed.
        let error = OutputFile::open(&names[0]).err().unwrap().to_string();
        assert!(error.contains("it is a symbolic link"), "{error}");
        output.write_bytes(b"profile").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(&names[1]).unwrap(), "theirs");
        assert_eq!(std::fs::read_to_string(&names[2]).unwrap(), "profile");
        // Every name taken: one line that says what to do.
        let error = OutputFile::create_fresh(names[..2].to_vec())
            .err()
            .unwrap()
            .to_string();
        assert!(error.ends_with("exist already — give -o FILE"), "{error}");
        // A dangling link is a name that is there too: nothing is made where it points.
        let dangling = directory.join("dangling.json");
        std::os::unix::fs::symlink(directory.join("nowhere"), &dangling).unwrap();
        assert!(OutputFile::create_fresh(vec![dangling]).is_err());
        assert!(!directory.join("nowhere").exists());
        // Not written: the file it made is gone again.
        drop(OutputFile::create_fresh(vec![directory.join("d.json")]).unwrap());
        assert!(!directory.join("d.json").exists());
        std::fs::remove_dir_all(&directory).unwrap();
    }
}
