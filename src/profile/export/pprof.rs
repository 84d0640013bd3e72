//! pprof export: a gzip-compressed `profile.proto`, as `go tool pprof`, Pyroscope and
//! Parca read it.
//!
//! The one idea: one sample per calling context of the merged tree, its stack of
//! locations innermost first, with the context's calls, its corrected self time
//! (`wall`) and, when the profile has it, its self CPU time as values. Each function is
//! one location at its entry address, in the mapping of its module, with a named
//! function (so pprof needs no symbolization).
//!
//! The message types below are the `prost` form of google/pprof's
//! `proto/profile.proto` (package `perftools.profiles`), declared with
//! `#[derive(prost::Message)]` as `prost-build` would generate them, so building
//! tendril needs no `protoc`. Field numbers and types follow that file.

use super::{Frames, for_each_context};
use crate::profile::depth_cut::cut_deep_stacks;
use crate::profile::model::{Node, Profile, Timing, Visit, walk};
use flate2::Compression;
use flate2::write::GzEncoder;
use prost::Message;
use std::collections::HashMap;
use std::io::{self, Write};

/// `perftools.profiles.Profile`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PprofProfile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
    #[prost(string, tag = "15")]
    pub doc_url: String,
}

/// `perftools.profiles.ValueType`: indices into the string table.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// `perftools.profiles.Sample`: locations innermost first, one value per sample type.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// `perftools.profiles.Label`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

/// `perftools.profiles.Mapping`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

/// `perftools.profiles.Location`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

/// `perftools.profiles.Line`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
    #[prost(int64, tag = "3")]
    pub column: i64,
}

/// `perftools.profiles.Function`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

/// The string table: index 0 is "", each string stored once.
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Strings {
        let mut strings = Strings::default();
        strings.add("");
        strings
    }

    fn add(&mut self, text: &str) -> i64 {
        if let Some(&index) = self.index.get(text) {
            return index;
        }
        let index = self.table.len() as i64;
        self.table.push(text.to_owned());
        self.index.insert(text.to_owned(), index);
        index
    }
}

/// Whether every context of the merged tree has a self CPU time.
fn has_cpu_time(roots: &[Node]) -> bool {
    let mut all = !roots.is_empty();
    let _ = walk(roots, |step| -> Result<(), ()> {
        if let Visit::Enter { node, .. } = step
            && node.self_cpu_ns.is_none()
        {
            all = false;
            return Err(());
        }
        Ok(())
    });
    all
}

/// The profile as a `perftools.profiles.Profile` message.
pub fn to_pprof(profile: &Profile) -> PprofProfile {
    let profile = &*cut_deep_stacks(profile);
    let mut strings = Strings::new();
    let roots = &profile.merged.roots;
    let with_cpu = has_cpu_time(roots);
    let mut sample_type = vec![
        ValueType {
            r#type: strings.add("calls"),
            unit: strings.add("count"),
        },
        ValueType {
            r#type: strings.add("wall"),
            unit: strings.add("nanoseconds"),
        },
    ];
    if with_cpu {
        sample_type.push(ValueType {
            r#type: strings.add("cpu"),
            unit: strings.add("nanoseconds"),
        });
    }

    let mut frames = Frames::default();
    let sample = samples(roots, &mut frames, &mut strings, with_cpu);
    let (mapping, location, function) = locations(profile, &frames, &mut strings);

    let wall = sample_type[1];
    let comment = vec![strings.add(&format!(
        "tendril profile of pid {} ({}), scheme {}, roots: {}; times corrected for \
         tendril's own cost; one sample per calling context",
        profile.pid,
        profile.exe,
        profile.scheme,
        profile.roots.join(", ")
    ))];
    PprofProfile {
        sample_type,
        sample,
        mapping,
        location,
        function,
        string_table: strings.table,
        drop_frames: 0,
        keep_frames: 0,
        time_nanos: 0,
        duration_nanos: profile.duration_ns as i64,
        period_type: Some(wall),
        period: 1,
        comment,
        default_sample_type: wall.r#type,
        doc_url: String::new(),
    }
}

/// One sample per calling context of `roots`: its calls, self time (and self CPU
/// time), labelled `jit` or `timing=in_caller` where it applies; each context's frames
/// numbered in `frames`.
fn samples<'p>(
    roots: &'p [Node],
    frames: &mut Frames<'p>,
    strings: &mut Strings,
    with_cpu: bool,
) -> Vec<Sample> {
    let mut sample = Vec::new();
    // A call into JIT code (not measured in an instrumented tree) is labelled `jit`.
    let jit_label = Label {
        key: strings.add("jit"),
        str: strings.add("true"),
        ..Label::default()
    };
    // A context counted, not timed (adaptive timing): label timing=in_caller.
    let in_caller = Label {
        key: strings.add("timing"),
        str: strings.add("in_caller"),
        ..Label::default()
    };
    for_each_context(roots, frames, |stack, node| {
        let mut value = vec![node.calls as i64, node.self_ns as i64];
        if with_cpu {
            value.push(node.self_cpu_ns.unwrap_or(0) as i64);
        }
        sample.push(Sample {
            // Location ids are frame numbers + 1 (0 is not an id).
            location_id: stack.iter().rev().map(|&frame| frame as u64 + 1).collect(),
            value,
            label: [
                (node.jit, jit_label),
                (node.timing == Timing::InCaller, in_caller),
            ]
            .into_iter()
            .filter_map(|(set, label)| set.then_some(label))
            .collect(),
        });
    });
    sample
}

/// The mappings (one per module, with its address range when the profile has it), the
/// locations and the functions of `frames`, in the frames' numbering.
fn locations(
    profile: &Profile,
    frames: &Frames,
    strings: &mut Strings,
) -> (Vec<Mapping>, Vec<Location>, Vec<Function>) {
    let mut mapping: Vec<Mapping> = Vec::new();
    let mut mapping_of_module: HashMap<&str, u64> = HashMap::new();
    let mut location = Vec::with_capacity(frames.frames.len());
    let mut function = Vec::with_capacity(frames.frames.len());
    for (number, frame) in frames.frames.iter().enumerate() {
        let id = number as u64 + 1;
        let mapping_id = *mapping_of_module.entry(frame.module).or_insert_with(|| {
            let known = profile.modules.iter().find(|m| m.name == frame.module);
            let filename = known.map_or(frame.module, |m| m.path.as_str());
            mapping.push(Mapping {
                id: mapping.len() as u64 + 1,
                memory_start: known.map_or(0, |m| m.start),
                memory_limit: known.map_or(0, |m| m.end),
                file_offset: 0,
                filename: strings.add(filename),
                build_id: 0,
                has_functions: true,
                has_filenames: false,
                has_line_numbers: false,
                has_inline_frames: false,
            });
            mapping.len() as u64
        });
        let name = strings.add(frame.name);
        function.push(Function {
            id,
            name,
            system_name: name,
            filename: 0,
            start_line: 0,
        });
        location.push(Location {
            id,
            mapping_id,
            address: frame.address.unwrap_or(0),
            line: vec![Line {
                function_id: id,
                line: 0,
                column: 0,
            }],
            is_folded: false,
        });
    }
    (mapping, location, function)
}

/// Writes the profile as gzip-compressed `profile.proto`.
pub fn write_pprof(profile: &Profile, out: &mut impl Write) -> io::Result<()> {
    write_encoded(to_pprof(profile), out)
}

/// [`write_pprof`], opening on the CPU time (`default_sample_type`) when the profile
/// has one.
pub fn write_opening_on_cpu(profile: &Profile, out: &mut impl Write) -> io::Result<()> {
    let mut pprof = to_pprof(profile);
    let cpu = pprof.sample_type.iter().find(|t| {
        pprof
            .string_table
            .get(t.r#type as usize)
            .is_some_and(|s| s == "cpu")
    });
    if let Some(cpu) = cpu {
        pprof.default_sample_type = cpu.r#type;
    }
    write_encoded(pprof, out)
}

fn write_encoded(pprof: PprofProfile, out: &mut impl Write) -> io::Result<()> {
    let bytes = pprof.encode_to_vec();
    let mut gzip = GzEncoder::new(out, Compression::default());
    gzip.write_all(&bytes)?;
    gzip.finish()?;
    Ok(())
}
