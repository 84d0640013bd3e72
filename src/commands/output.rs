//! `-o FILE` of `record` and `run`: the profile's destination, checked before the target
//! is touched.
//!
//! The one idea: open the file at the start — without truncating one that exists — so a
//! path that cannot be written (a missing directory, a directory, `/proc/version`) is
//! one line before any recording, not after it. The file is emptied only when the
//! profile is written; a file tendril created is removed again if no profile ever
//! reaches it.

use crate::profile::Profile;
use anyhow::Context;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, ErrorKind, Write};
use std::path::{Path, PathBuf};

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

    /// Checks and opens `path`; without one, `default` (stdout for `-`).
    pub fn open_or(path: Option<&Path>, default: PathBuf) -> anyhow::Result<ProfileOutput> {
        ProfileOutput::open(Some(path.unwrap_or(&default)))
    }

    /// The file the profile goes to (`None`: stdout).
    pub fn path(&self) -> Option<&Path> {
        match self {
            ProfileOutput::File(file) => Some(&file.path),
            ProfileOutput::Stdout => None,
        }
    }

    /// Writes the profile JSON.
    pub fn write(self, profile: &Profile) -> anyhow::Result<()> {
        match self {
            ProfileOutput::File(file) => file.write(profile),
            ProfileOutput::Stdout => {
                let mut out = std::io::stdout().lock();
                profile
                    .write_json(&mut out)
                    .and_then(|()| out.flush())
                    .context("cannot write the profile to stdout")
            }
        }
    }
}

/// An output file opened for writing, not yet truncated.
pub struct OutputFile {
    path: PathBuf,
    file: File,
    /// tendril created it (and removes it unless a profile is written).
    created: bool,
    written: bool,
}

impl OutputFile {
    /// Opens `path` for writing, creating it if needed, and checks that it takes writes.
    pub fn open(path: &Path) -> anyhow::Result<OutputFile> {
        let shown = path.display();
        let fail =
            |reason: String| anyhow::anyhow!("cannot write the profile to {shown}: {reason}");
        let (file, created) = match OpenOptions::new().write(true).create_new(true).open(path) {
            Ok(file) => (file, true),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                match OpenOptions::new().write(true).open(path) {
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
        // /proc and /sys files open for writing but refuse a profile.
        if let Ok(fs) = nix::sys::statfs::fstatfs(&output.file) {
            let kind = fs.filesystem_type();
            if kind == nix::sys::statfs::PROC_SUPER_MAGIC || kind == nix::sys::statfs::SYSFS_MAGIC {
                return Err(fail(
                    "it is a kernel file (/proc or /sys), not a place for a profile".into(),
                ));
            }
        }
        // A write of nothing changes nothing, and fails where a real write would.
        if let Err(e) = nix::unistd::write(&output.file, &[]) {
            return Err(fail(describe(path, &std::io::Error::from(e))));
        }
        Ok(output)
    }

    /// Replaces the file's contents with `bytes` (an export of a profile).
    pub fn write_bytes(mut self, bytes: &[u8]) -> anyhow::Result<()> {
        let fail = || format!("cannot write the profile to {}", self.path.display());
        if self.file.metadata().is_ok_and(|m| m.is_file()) {
            self.file.set_len(0).with_context(fail)?;
        }
        (&self.file).write_all(bytes).with_context(fail)?;
        self.written = true;
        Ok(())
    }

    /// Replaces the file's contents with the profile JSON.
    pub fn write(mut self, profile: &Profile) -> anyhow::Result<()> {
        let fail = || format!("cannot write the profile to {}", self.path.display());
        if self.file.metadata().is_ok_and(|m| m.is_file()) {
            self.file.set_len(0).with_context(fail)?;
        }
        let mut out = BufWriter::new(&self.file);
        profile
            .write_json(&mut out)
            .and_then(|()| out.flush())
            .with_context(fail)?;
        drop(out);
        self.written = true;
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
    match error.kind() {
        ErrorKind::NotFound => format!("the directory {} does not exist", parent.display()),
        ErrorKind::NotADirectory => "a part of its directory path is not a directory".into(),
        ErrorKind::IsADirectory => "it is a directory; give a file name".into(),
        ErrorKind::PermissionDenied => "permission denied".into(),
        ErrorKind::ReadOnlyFilesystem => "the file system is read-only".into(),
        _ => error.to_string(),
    }
}
