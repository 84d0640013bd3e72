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
use std::io::{self, Write};
use std::path::Path;

/// Indentation stops growing after this many levels (each level is two spaces).
pub const MAX_INDENT_LEVELS: usize = 32;

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
}

impl Profile {
    /// Reads a profile file, checking its format and version first.
    pub fn load(path: &Path) -> Result<Profile, ProfileError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read {
            path: name.clone(),
            source,
        })?;
        Profile::from_json(&text, &name)
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
pub(crate) mod tests {
    use super::*;
    use crate::profile::model::tests::chain;
    use crate::profile::model::{Calibration, MergedProfile, Node, Stats, ThreadProfile};

    pub(crate) fn small_profile() -> Profile {
        let mut root = Node::leaf("root", "app", 1, 100, 10);
        let mut mid = Node::leaf("mid \"quoted\"", "app", 3, 90, 30);
        mid.children
            .push(Node::leaf("leaf", "libc.so.6", 6, 60, 60));
        root.children.push(mid);
        Profile {
            duration_ns: 0,
            discovery: None,
            gross: Vec::new(),
            sampling: None,
            modules: Vec::new(),
            trace: None,
            format: Profile::FORMAT.to_owned(),
            version: Profile::VERSION,
            pid: 4242,
            exe: "/usr/bin/app".to_owned(),
            roots: vec!["root".to_owned()],
            scheme: "B".to_owned(),
            calibration: Calibration {
                tsc_hz: 3_000_000_000,
                inner_ns: 12.5,
                outer_ns: 20.0,
                inner_spread_ns: 0.0,
                outer_spread_ns: 0.0,
                ..Default::default()
            },
            stats: Stats {
                instrumented_functions: 3,
                invoked_functions: 3,
                events: 20,
                lost_events: 0,
                indirect_call_sites: 1,
                pause_ns: 0,
                unwound_exits: 0,
                unmatched_exits: 0,
                ..Stats::default()
            },
            threads: vec![
                ThreadProfile {
                    tid: 7,
                    name: "worker".to_owned(),
                    roots: vec![root.clone()],
                    ..ThreadProfile::default()
                },
                ThreadProfile {
                    tid: 8,
                    name: String::new(),
                    roots: Vec::new(),
                    ..ThreadProfile::default()
                },
            ],
            merged: MergedProfile { roots: vec![root] },
        }
    }

    fn to_text(profile: &Profile) -> String {
        let mut out = Vec::new();
        profile.write_json(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn writes_exactly_what_serde_json_pretty_writes() {
        let profile = small_profile();
        let expected = serde_json::to_string_pretty(&profile).unwrap() + "\n";
        assert_eq!(to_text(&profile), expected);
    }

    #[test]
    fn reads_back_what_it_writes() {
        let profile = small_profile();
        let read = Profile::from_json(&to_text(&profile), "x.json").unwrap();
        assert_eq!(read, profile);
    }

    #[test]
    fn reads_compact_json_with_unknown_fields_and_float_times() {
        let text = r#"{"format":"tendril-profile","version":1,"pid":1,"exe":"e","roots":["r"],
            "scheme":"B","future":{"a":[1,{"b":null}]},
            "calibration":{"tsc_hz":1000000000,"inner_ns":1,"outer_ns":2},
            "stats":{"instrumented_functions":1,"invoked_functions":1,"events":2,
                     "lost_events":0,"indirect_call_sites":0,"pause_ns":0},
            "threads":[{"tid":3,"name":"t","roots":[{"children":[{"name":"c","module":"m",
                "calls":1,"total_ns":1,"self_ns":1}],"name":"r","module":"m","calls":1,
                "total_ns":10.4,"self_ns":9.5,"colour":"red"}]}],
            "merged":{"roots":[{"name":"r","module":"m","calls":1,"total_ns":10,
                "self_ns":10}]}}"#;
        let profile = Profile::from_json(text, "x.json").unwrap();
        let mut thread_root = Node::leaf("r", "m", 1, 10, 10);
        thread_root.children.push(Node::leaf("c", "m", 1, 1, 1));
        assert_eq!(profile.threads[0].roots[0], thread_root);
        assert_eq!(profile.merged.roots[0], Node::leaf("r", "m", 1, 10, 10));
        assert_eq!(profile.stats.unwound_exits, 0);
        assert_eq!(profile.calibration.outer_ns, 2.0);
    }

    #[test]
    fn a_20_000_deep_tree_round_trips() {
        let mut profile = small_profile();
        profile.merged.roots = vec![chain("fib", 20_000)];
        let text = to_text(&profile);
        let read = Profile::from_json(&text, "deep.json").unwrap();
        assert_eq!(read, profile);
    }

    #[test]
    fn a_100_000_deep_tree_round_trips_in_linear_space() {
        let mut profile = small_profile();
        profile.threads[1].roots = vec![chain("fib", 100_000)];
        let text = to_text(&profile);
        // 9 lines per node, none longer than 100 bytes with the indentation capped.
        assert!(text.len() < 100_000 * 9 * 100, "{} bytes", text.len());
        let read = Profile::from_json(&text, "deep.json").unwrap();
        assert_eq!(read, profile);
    }

    #[test]
    fn indentation_stops_growing_after_max_indent_levels() {
        let mut profile = small_profile();
        profile.merged.roots = vec![chain("fib", 40)];
        let text = to_text(&profile);
        let pretty = serde_json::to_string_pretty(&profile).unwrap() + "\n";
        let indent = |line: &str| line.len() - line.trim_start_matches(' ').len();
        let deepest = text.lines().map(indent).max().unwrap();
        assert_eq!(deepest, 2 * MAX_INDENT_LEVELS);
        assert!(pretty.lines().map(indent).max().unwrap() > deepest);
        // Only the indentation differs from serde_json's pretty output.
        let trimmed = |text: &str| -> Vec<String> {
            text.lines()
                .map(|line| line.trim_start().to_owned())
                .collect()
        };
        assert_eq!(trimmed(&text), trimmed(&pretty));
        // Above the cap, the lines are serde_json's, indentation included.
        let above_cap = text
            .lines()
            .take_while(|line| indent(line) < deepest)
            .count();
        assert!(above_cap > 100);
        assert!(
            text.lines()
                .take(above_cap)
                .eq(pretty.lines().take(above_cap))
        );
        assert_eq!(Profile::from_json(&text, "x.json").unwrap(), profile);
    }

    #[test]
    fn a_100_000_deep_tree_round_trips_on_a_256_kib_stack() {
        let worker = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(|| {
                let mut profile = small_profile();
                profile.merged.roots = vec![chain("fib", 100_000)];
                let text = to_text(&profile);
                let read = Profile::from_json(&text, "deep.json").unwrap();
                let cut = Profile::from_json(&text[..text.len() / 2], "cut.json");
                (read == profile, cut.unwrap_err().to_string())
            })
            .unwrap();
        let (same, cut_error) = worker.join().unwrap();
        assert!(same);
        assert!(
            cut_error.starts_with("cut.json is a damaged tendril profile: EOF while parsing"),
            "{cut_error}"
        );
    }

    fn error_of(text: &str) -> String {
        Profile::from_json(text, "x.json").unwrap_err().to_string()
    }

    #[test]
    fn says_when_a_file_is_not_a_profile() {
        let no_format = "x.json is not a tendril profile (no \"format\": \"tendril-profile\")";
        assert_eq!(error_of(r#"{"name": "left-pad", "version": 1}"#), no_format);
        assert_eq!(error_of(r#"{"format": "pprof", "version": 1}"#), no_format);
        assert_eq!(
            error_of("\u{7f}ELF binary"),
            "x.json is not a tendril profile (not a JSON object; no \"format\": \
             \"tendril-profile\")"
        );
        assert_eq!(
            error_of("\n  [1, 2]"),
            "x.json is not a tendril profile (not a JSON object; no \"format\": \
             \"tendril-profile\")"
        );
    }

    #[test]
    fn says_which_version_a_file_is() {
        assert_eq!(
            error_of(r#"{"format": "tendril-profile", "version": 7, "threads": 5}"#),
            "x.json is a version 7 profile; this tendril reads version 1"
        );
        assert_eq!(
            error_of(r#"{"format": "tendril-profile"}"#),
            "x.json is a damaged tendril profile: no \"version\" number at the top level"
        );
    }

    #[test]
    fn says_where_a_file_is_damaged() {
        let head = r#"{"format": "tendril-profile", "version": 1,"#;
        assert_eq!(
            error_of(&format!(
                "{head}\n\"merged\": {{\"roots\": [{{\"name\": \"a\", \"calls\": 1}}]}}}}"
            )),
            "x.json is a damaged tendril profile: missing field `module` at line 2 column 46"
        );
        assert_eq!(
            error_of(&format!(
                "{head}\n\"merged\": {{\"roots\": [{{\"name\": 1}}]}}}}"
            )),
            "x.json is a damaged tendril profile: invalid type: integer `1`, expected a string \
             at line 2 column 32"
        );
        assert_eq!(
            error_of(&format!(
                "{head}\n\"merged\": {{\"roots\": [{{\"calls\": -3}}]}}}}"
            )),
            "x.json is a damaged tendril profile: expected a number ≥ 0, not -3 at line 2 column 34"
        );
        assert_eq!(
            error_of(&format!("{head}\n \"pid\": -1}}")),
            "x.json is a damaged tendril profile: invalid value: integer `-1`, expected u32 \
             at line 2 column 11"
        );
        assert_eq!(
            error_of(&format!("{head}\n \"pid\": 1")),
            "x.json is a damaged tendril profile: EOF while parsing an object at line 2 column 9"
        );
        assert_eq!(
            error_of(&format!("{head}\n \"exe\": \"e\"}}")),
            "x.json is a damaged tendril profile: missing field `pid` at line 2 column 12"
        );
        let text = to_text(&small_profile());
        let lines = text.lines().count();
        assert_eq!(
            error_of(&format!("{text}x")),
            format!(
                "x.json is a damaged tendril profile: trailing characters at line {} column 1",
                lines + 1
            )
        );
    }

    #[test]
    fn says_not_a_profile_or_which_version_before_saying_damaged() {
        assert_eq!(
            error_of(r#"{"format": "pprof", "version": 1, "pid": -1}"#),
            "x.json is not a tendril profile (no \"format\": \"tendril-profile\")"
        );
        assert_eq!(
            error_of(r#"{"format": 5, "version": 1}"#),
            "x.json is not a tendril profile (no \"format\": \"tendril-profile\")"
        );
        let mut profile = small_profile();
        profile.version = 2;
        assert_eq!(
            error_of(&to_text(&profile)),
            "x.json is a version 2 profile; this tendril reads version 1"
        );
    }

    #[test]
    fn load_names_the_file_it_cannot_read() {
        let error = Profile::load(Path::new("/nonexistent/p.json")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "cannot read /nonexistent/p.json: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn save_never_writes_through_a_link() {
        let directory = std::env::temp_dir().join(format!("tendril-link-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let victim = directory.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let link = directory.join("profile.json");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let error = small_profile().save(&link).unwrap_err();
        assert!(matches!(error, ProfileError::Write { .. }), "{error}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        std::fs::remove_dir_all(&directory).unwrap();
    }

    #[test]
    fn save_then_load_gives_the_same_profile() {
        let profile = small_profile();
        let path =
            std::env::temp_dir().join(format!("tendril-profile-{}.json", std::process::id()));
        profile.save(&path).unwrap();
        let loaded = Profile::load(&path);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(loaded.unwrap(), profile);
    }
}
