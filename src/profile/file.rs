//! Reading and writing the profile file (JSON, docs/DESIGN.md §5) for call trees of any depth.
//!
//! The one idea: the file goes through serde_json and the derived serde impls, which
//! recurse once per tree level, and a recursive function 100,000 calls deep is a normal
//! tree. So the recursion limit is lifted (serde_json's `unbounded_depth`) and both
//! directions run through `serde_stacker`, which moves the recursion onto freshly
//! allocated stack segments whenever the current stack runs low. The writer is serde_json's
//! pretty layout with the indentation capped at [`MAX_INDENT_LEVELS`], so a deep file
//! grows linearly with depth, not quadratically; for shallower trees the output is
//! exactly `serde_json::to_string_pretty`, except that a string's characters a terminal
//! would obey are written as `\uXXXX` escapes (`terminal_text::SafeStrings`: the same
//! strings to any JSON reader, safe to print).

use super::model::Profile;
use crate::terminal_text::SafeStrings;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::ser::Formatter;
use std::io::{self, Read, Write};
use std::path::Path;

/// Indentation stops growing after this many levels (each level is two spaces).
pub const MAX_INDENT_LEVELS: usize = 32;

/// The largest file read as a profile: far above what tendril writes (a 100,000-deep
/// tree is under 100 MB, a full trace 70 MB), far below what would exhaust memory.
pub const MAX_PROFILE_BYTES: u64 = 1 << 30;

/// Why a profile file could not be read or written. Each message is one line.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: io::Error },
    #[error("cannot write {path}: {source}")]
    Write { path: String, source: io::Error },
    #[error("{source_name} is not a tendril profile ({reason})")]
    NotAProfile { source_name: String, reason: String },
    #[error(
        "{source_name} is a version {version} profile; this tendril reads version {}",
        Profile::VERSION
    )]
    UnsupportedVersion { source_name: String, version: u64 },
    #[error("{source_name} is a damaged tendril profile: {problem}")]
    Damaged {
        source_name: String,
        problem: String,
    },
    /// `size`: `3221225472 bytes`, or `more than …` for a pipe or a device.
    #[error(
        "{path} is not a tendril profile: it holds {size}, and tendril reads profiles of \
         at most {} MiB",
        MAX_PROFILE_BYTES >> 20
    )]
    TooLarge { path: String, size: String },
}

impl Profile {
    /// Reads a profile file, checking its format and version first. A file larger than
    /// [`MAX_PROFILE_BYTES`] (by its size, before a byte is read), or one that does not
    /// start as a JSON object, is refused without being read whole.
    pub fn load(path: &Path) -> Result<Profile, ProfileError> {
        let name = path.display().to_string();
        let read_error = |source| ProfileError::Read {
            path: name.clone(),
            source,
        };
        let mut file = std::fs::File::open(path).map_err(read_error)?;
        let size = file.metadata().map_err(read_error)?.len();
        if size > MAX_PROFILE_BYTES {
            let size = format!("{size} bytes");
            return Err(ProfileError::TooLarge { path: name, size });
        }
        // A pipe or a device has no size: read up to the bound, and look at the start
        // first, so `/dev/zero` is refused at once.
        let mut bytes = Vec::new();
        let mut limited = (&mut file).take(MAX_PROFILE_BYTES + 1);
        limited
            .by_ref()
            .take(4096)
            .read_to_end(&mut bytes)
            .map_err(read_error)?;
        if let Some(&first) = bytes.trim_ascii_start().first()
            && first != b'{'
        {
            return Err(
                ReadProblem::NotAProfile(format!("not a JSON object; {NO_FORMAT}"))
                    .into_error(&name),
            );
        }
        limited.read_to_end(&mut bytes).map_err(read_error)?;
        if bytes.len() as u64 > MAX_PROFILE_BYTES {
            let size = format!("more than {MAX_PROFILE_BYTES} bytes");
            return Err(ProfileError::TooLarge { path: name, size });
        }
        match String::from_utf8(bytes) {
            Ok(text) => Profile::from_json(&text, &name),
            Err(_) => Err(ReadProblem::NotAProfile("not UTF-8 text".to_owned()).into_error(&name)),
        }
    }

    /// Parses a profile from JSON text; `source_name` (e.g. the file name) starts every
    /// error message.
    pub fn from_json(text: &str, source_name: &str) -> Result<Profile, ProfileError> {
        read_profile(text).map_err(|problem| problem.into_error(source_name))
    }

    /// Writes the profile file (pretty JSON) at `path`, replacing a file there but never
    /// following a symbolic link at that name (`O_NOFOLLOW`: the write fails instead).
    pub fn save(&self, path: &Path) -> Result<(), ProfileError> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|source| ProfileError::Write {
                path: path.display().to_string(),
                source,
            })?;
        self.write_to_file(file, path)
    }

    /// Writes the profile (pretty JSON) into `file`, opened for it at `path` (named in
    /// errors). The caller creates the file, so it decides how names are trusted
    /// (`live::save_path::create_first_free` never follows a name that is there).
    pub fn write_to_file(&self, file: std::fs::File, path: &Path) -> Result<(), ProfileError> {
        let write_error = |source| ProfileError::Write {
            path: path.display().to_string(),
            source,
        };
        let mut out = io::BufWriter::new(file);
        self.write_json(&mut out).map_err(write_error)?;
        out.flush().map_err(write_error)
    }

    /// Writes the profile as pretty JSON followed by a newline.
    pub fn write_json(&self, out: &mut impl Write) -> io::Result<()> {
        let formatter = SafeStrings(CappedPretty::default());
        let mut json = serde_json::Serializer::with_formatter(&mut *out, formatter);
        self.serialize(serde_stacker::Serializer::new(&mut json))?;
        out.write_all(b"\n")
    }
}

/// A problem found while reading, before it is given the source's name.
enum ReadProblem {
    NotAProfile(String),
    Version(u64),
    Damaged(String),
}

impl ReadProblem {
    fn into_error(self, source_name: &str) -> ProfileError {
        let source_name = source_name.to_owned();
        match self {
            ReadProblem::NotAProfile(reason) => ProfileError::NotAProfile {
                source_name,
                reason,
            },
            ReadProblem::Version(version) => ProfileError::UnsupportedVersion {
                source_name,
                version,
            },
            ReadProblem::Damaged(problem) => ProfileError::Damaged {
                source_name,
                problem,
            },
        }
    }
}

const NO_FORMAT: &str = "no \"format\": \"tendril-profile\"";

/// Just the two top-level fields that say whether a file is a profile this tendril reads.
/// serde_json skips the other values without recursing, so any file's header is read.
#[derive(Deserialize)]
struct Header {
    format: Option<Value>,
    version: Option<Value>,
}

impl Header {
    /// Whether the file is a tendril profile of the version this tendril reads.
    fn check(&self) -> Result<(), ReadProblem> {
        if !matches!(&self.format, Some(Value::String(format)) if format == Profile::FORMAT) {
            return Err(ReadProblem::NotAProfile(NO_FORMAT.to_owned()));
        }
        match self.version.as_ref().and_then(Value::as_u64) {
            Some(version) if version == u64::from(Profile::VERSION) => Ok(()),
            Some(version) => Err(ReadProblem::Version(version)),
            None => Err(ReadProblem::Damaged(
                "no \"version\" number at the top level".to_owned(),
            )),
        }
    }
}

fn read_profile(text: &str) -> Result<Profile, ReadProblem> {
    if !text
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .starts_with('{')
    {
        return Err(ReadProblem::NotAProfile(format!(
            "not a JSON object; {NO_FORMAT}"
        )));
    }
    match deserialize_deep::<Profile>(text) {
        Ok(profile) => {
            let header = Header {
                format: Some(Value::String(profile.format.clone())),
                version: Some(Value::from(profile.version)),
            };
            header.check()?;
            Ok(profile)
        }
        Err(error) => {
            // "Not a profile" and "another version" say more than the damage they cause,
            // so they are reported first when the file is well-formed enough to tell.
            if let Ok(header) = serde_json::from_str::<Header>(text) {
                header.check()?;
            }
            Err(ReadProblem::Damaged(error.to_string()))
        }
    }
}

/// Deserialises a whole JSON document of any nesting depth: no recursion limit, and the
/// stack grows on demand.
///
/// The text is read through `io::Read`, not as a `&str`: while an error propagates,
/// serde_json makes (and drops) a positioned error at every enclosing array and object,
/// and over a `&str` each position costs a scan of the text before it, which is hours for
/// a damaged 100,000-deep tree. The `io::Read` reader tracks line and column as it goes.
fn deserialize_deep<T: DeserializeOwned>(text: &str) -> serde_json::Result<T> {
    let mut json = serde_json::Deserializer::from_reader(text.as_bytes());
    json.disable_recursion_limit();
    let value = T::deserialize(serde_stacker::Deserializer::new(&mut json))?;
    json.end()?;
    Ok(value)
}

/// serde_json's `PrettyFormatter` layout (two spaces a level), except that the
/// indentation stops growing after [`MAX_INDENT_LEVELS`] levels.
#[derive(Default)]
struct CappedPretty {
    level: usize,
    has_value: bool,
}

impl CappedPretty {
    fn indent<W: ?Sized + Write>(&self, out: &mut W) -> io::Result<()> {
        const SPACES: [u8; 2 * MAX_INDENT_LEVELS] = [b' '; 2 * MAX_INDENT_LEVELS];
        out.write_all(&SPACES[..2 * self.level.min(MAX_INDENT_LEVELS)])
    }

    fn open<W: ?Sized + Write>(&mut self, out: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.level += 1;
        self.has_value = false;
        out.write_all(bracket)
    }

    fn close<W: ?Sized + Write>(&mut self, out: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.level -= 1;
        if self.has_value {
            out.write_all(b"\n")?;
            self.indent(out)?;
        }
        out.write_all(bracket)
    }

    fn item<W: ?Sized + Write>(&self, out: &mut W, first: bool) -> io::Result<()> {
        out.write_all(if first { b"\n" } else { b",\n" })?;
        self.indent(out)
    }
}

impl Formatter for CappedPretty {
    fn begin_array<W: ?Sized + Write>(&mut self, out: &mut W) -> io::Result<()> {
        self.open(out, b"[")
    }

    fn end_array<W: ?Sized + Write>(&mut self, out: &mut W) -> io::Result<()> {
        self.close(out, b"]")
    }

    fn begin_array_value<W: ?Sized + Write>(&mut self, out: &mut W, first: bool) -> io::Result<()> {
        self.item(out, first)
    }

    fn end_array_value<W: ?Sized + Write>(&mut self, _out: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + Write>(&mut self, out: &mut W) -> io::Result<()> {
        self.open(out, b"{")
    }

    fn end_object<W: ?Sized + Write>(&mut self, out: &mut W) -> io::Result<()> {
        self.close(out, b"}")
    }

    fn begin_object_key<W: ?Sized + Write>(&mut self, out: &mut W, first: bool) -> io::Result<()> {
        self.item(out, first)
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, out: &mut W) -> io::Result<()> {
        out.write_all(b": ")
    }

    fn end_object_value<W: ?Sized + Write>(&mut self, _out: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests;
