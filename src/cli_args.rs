//! The command line's shared argument groups (`sample` and `top`'s sampling, `record`
//! and `run`'s profile) and its value enums, with what each becomes in the library.

use std::path::PathBuf;
use std::time::Duration;

/// What `sample` and `top` share: how often and by which clock.
#[derive(clap::Args, Debug)]
pub(crate) struct SamplingArgs {
    /// Samples per second of each thread's CPU time.
    #[arg(long, value_name = "HZ", default_value_t = 499,
          value_parser = clap::value_parser!(u32).range(1..=20_000))]
    pub(crate) rate: u32,
    /// Wall-clock time: also charge the time each thread is switched out (asleep,
    /// blocked, waiting for a core) to where it went to sleep.
    #[arg(long)]
    pub(crate) wall: bool,
}

impl SamplingArgs {
    pub(crate) fn options(&self) -> tendril::sampling::SamplerOptions {
        tendril::sampling::SamplerOptions {
            rate_hz: self.rate,
            clock: if self.wall {
                tendril::sampling::Clock::Wall
            } else {
                tendril::sampling::Clock::Cpu
            },
            ..Default::default()
        }
    }
}

/// What `record` and `run` share: how the graph is instrumented and where the profile
/// goes.
#[derive(clap::Args, Debug)]
pub(crate) struct ProfileArgs {
    /// How the graph below the roots is instrumented: b (lazily, as functions first
    /// run) or a (the whole static call graph, up front).
    #[arg(long, value_enum, default_value_t = SchemeArg::B)]
    pub(crate) scheme: SchemeArg,
    /// Write the profile to FILE (`-`: stdout). Default: a new file
    /// tendril-<PID>-<YYYYmmdd-HHMMSS>.json in the current directory, named on stderr
    /// (for `run`, PID is the program's).
    #[arg(short, long, value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,
    /// Only time the roots themselves: a distribution of their gross times, at
    /// almost no cost.
    #[arg(long)]
    pub(crate) gross_only: bool,
    /// Follow calls through pointers by instrumenting every address-taken function of
    /// the process up front, as tendril did before it checked them in the graph's own
    /// functions (the default; scheme a always uses this).
    #[arg(long)]
    pub(crate) pointer_candidates: bool,
    /// Also keep the raw enter and exit events of the first SECONDS (default 1; at
    /// most 1,000,000 events) as per-thread timelines for the chrome and speedscope
    /// exports.
    #[arg(
        long,
        value_name = "SECONDS",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "1",
        value_parser = tendril::commands::duration::parse_seconds
    )]
    pub(crate) trace: Option<Duration>,
    #[command(flatten)]
    pub(crate) timing: TimingArgs,
}

/// Adaptive timing: functions too short to time are counted in their callers.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct TimingArgs {
    /// Time every call: no function is switched to counting only.
    #[arg(long, conflicts_with_all = ["time", "min_time"])]
    pub(crate) time_all: bool,
    /// Keep functions matching PATTERN timed, however short (repeatable; patterns as
    /// for --root).
    #[arg(long, value_name = "PATTERN")]
    pub(crate) time: Vec<String>,
    /// Count, rather than time, a function whose calls (callees included) take under NS
    /// nanoseconds on average. Default: what the hooks' calibration allows (shown in
    /// the report's header).
    #[arg(long, value_name = "NS", value_parser = parse_min_time)]
    pub(crate) min_time: Option<f64>,
    /// Measure CPU time even when the target switches threads so often that recording
    /// each switch costs it more than a tenth of a core (by default times are then
    /// wall-clock, and the profile says why).
    #[arg(long)]
    pub(crate) cpu_time: bool,
}

pub(crate) fn parse_min_time(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(ns) if ns.is_finite() && ns >= 0.0 => Ok(ns),
        _ => Err(format!("`{text}` is not a number of nanoseconds ≥ 0")),
    }
}

impl From<TimingArgs> for tendril::recording::TimingOptions {
    fn from(args: TimingArgs) -> Self {
        tendril::recording::TimingOptions {
            time_all: args.time_all,
            keep_timed: args.time,
            min_time_ns: args.min_time,
            cpu_time_always: args.cpu_time,
        }
    }
}

/// `report --clock`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ClockArg {
    /// Wall-clock time: waiting in a system call, on a lock or for a CPU included.
    Wall,
    /// On-CPU time: the time the thread ran.
    Cpu,
}

impl From<ClockArg> for tendril::profile::Clock {
    fn from(clock: ClockArg) -> Self {
        match clock {
            ClockArg::Wall => tendril::profile::Clock::Wall,
            ClockArg::Cpu => tendril::profile::Clock::Cpu,
        }
    }
}

/// `report --format`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FormatArg {
    /// The merged call tree, indented.
    Tree,
    /// Self time per function over all its contexts.
    Hot,
    /// Folded stacks (`a;b;c <self ns>`), for flamegraph.pl and inferno.
    Folded,
    /// The profile file itself.
    Json,
    /// gzip-compressed pprof profile.proto (go tool pprof, Pyroscope, Parca).
    Pprof,
    /// speedscope's file format (sampled; plus timelines with a trace).
    Speedscope,
    /// Trace Event Format for Perfetto and chrome://tracing.
    Chrome,
    /// An SVG flame graph (inferno), to open in a browser.
    Svg,
}

impl From<FormatArg> for tendril::profile::ReportFormat {
    fn from(format: FormatArg) -> Self {
        use tendril::profile::ReportFormat;
        match format {
            FormatArg::Tree => ReportFormat::Tree,
            FormatArg::Hot => ReportFormat::Hot,
            FormatArg::Folded => ReportFormat::Folded,
            FormatArg::Json => ReportFormat::Json,
            FormatArg::Pprof => ReportFormat::Pprof,
            FormatArg::Speedscope => ReportFormat::Speedscope,
            FormatArg::Chrome => ReportFormat::Chrome,
            FormatArg::Svg => ReportFormat::Svg,
        }
    }
}

/// `diff --format`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DiffFormatArg {
    Text,
    Folded,
}

/// JFluid's instrumentation schemes, as named on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SchemeArg {
    /// The whole static call graph of the roots, up front.
    A,
    /// A function's callees when it first runs in the graph.
    B,
}

impl From<SchemeArg> for tendril::recording::Scheme {
    fn from(scheme: SchemeArg) -> Self {
        match scheme {
            SchemeArg::A => tendril::recording::Scheme::A,
            SchemeArg::B => tendril::recording::Scheme::B,
        }
    }
}
