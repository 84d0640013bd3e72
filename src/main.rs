//! The `tendril` command line.

mod cli_args;

use clap::{Parser, Subcommand};
use cli_args::{ClockArg, DiffFormatArg, FormatArg, ProfileArgs, SamplingArgs, TimingArgs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tendril::terminal_text::say_line;

/// tendril — profile a running native program, call by call.
#[derive(Parser)]
#[command(
    name = "tendril",
    version,
    about,
    long_about = None,
    after_help = "Plain `tendril`, without a command, opens the terminal UI's process picker: \
                  choose a running process, see where it spends its time (sampled from the \
                  outside), choose a root function there, and watch its call tree grow live. \
                  `tendril PID` does the same for that process (`tendril attach PID`)."
)]
struct Cli {
    /// Without a command: choose a running process to profile, in the terminal UI.
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Start the bundled demo program and profile it live in the terminal UI.
    ///
    /// Without a terminal on stdout, record it for 3 s and print the call tree instead.
    Demo,
    /// Profile a running process live in the terminal UI.
    ///
    /// The process is sampled first (the Sampled view: nothing is loaded into it); Enter
    /// on a function, or the root picker, chooses the root (or give it with --root);
    /// watch the call tree grow, dig in, detach.
    Attach {
        /// Process id of the target.
        pid: i32,
        /// Start with this root function (exact name, glob, `module:name` or address;
        /// repeat for several) instead of choosing in the root picker.
        #[arg(long = "root", value_name = "SYM")]
        roots: Vec<String>,
        #[command(flatten)]
        timing: TimingArgs,
    },
    /// Browse a saved profile in the terminal UI (read-only).
    View {
        /// A profile written by `record`, `run` or the live view.
        file: PathBuf,
    },
    /// List the functions of every module mapped into a running process.
    Symbols {
        /// Process id of the target.
        pid: i32,
        /// Only functions matching: exact name, glob (`dee*`), `module:name` or an
        /// address (`0x…`: the function at or around it).
        pattern: Option<String>,
        /// Print a JSON array instead of aligned lines.
        #[arg(long)]
        json: bool,
    },
    /// Load the agent into a running process (if needed) and print its status line.
    Status {
        /// Process id of the target.
        pid: i32,
    },
    /// Restore every byte the agent in a process has patched; the agent stays dormant.
    Detach {
        /// Process id of the target.
        pid: i32,
    },
    /// Count calls of matching functions exactly, then restore the code.
    Count {
        /// Process id of the target.
        pid: i32,
        /// Functions to count: exact name, glob (`dee*`), `module:name` or an address
        /// (`0x…`: the function at or around it).
        #[arg(required = true)]
        patterns: Vec<String>,
        /// Stop after this many seconds (default: until Ctrl-C).
        #[arg(
            long,
            value_name = "SECS",
            allow_negative_numbers = true,
            value_parser = tendril::commands::duration::parse_seconds
        )]
        duration: Option<Duration>,
        /// Print JSON, with counts per thread.
        #[arg(long)]
        json: bool,
        /// Also hook returns and count them (calls minus returns: frames left by an
        /// exception, longjmp or thread exit, or still running).
        #[arg(long)]
        returns: bool,
    },
    /// Count one function's control-flow edges and paths exactly (blocks, branches,
    /// jump-table entries, loop trips, Ball–Larus paths), then restore the code and
    /// print its annotated disassembly with the hottest paths.
    Edges(tendril::commands::edges::EdgesOptions),
    /// Profile the call graph below root functions, then restore the code and write
    /// the profile (JSON).
    Record {
        /// Process id of the target.
        pid: i32,
        /// A root function: exact name, glob, `module:name` or address (repeat for
        /// several).
        #[arg(long = "root", required = true, value_name = "SYM")]
        roots: Vec<String>,
        #[command(flatten)]
        profile: ProfileArgs,
        /// Stop after this many seconds (default: until Ctrl-C).
        #[arg(
            long,
            value_name = "SECS",
            allow_negative_numbers = true,
            value_parser = tendril::commands::duration::parse_seconds
        )]
        duration: Option<Duration>,
    },
    /// Start a program and record it from its first instruction (roots: `main` unless
    /// given); exits with the program's status (128 + N if signal N killed it).
    Run {
        /// A root function (repeat for several); default `main`.
        #[arg(long = "root", value_name = "SYM")]
        roots: Vec<String>,
        #[command(flatten)]
        profile: ProfileArgs,
        /// Stop recording after this many seconds (the program goes on).
        #[arg(
            long,
            value_name = "SECS",
            allow_negative_numbers = true,
            value_parser = tendril::commands::duration::parse_seconds
        )]
        duration: Option<Duration>,
        /// The program and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "CMD")]
        program: Vec<String>,
    },
    /// Print a saved profile as text (tree, hot spots, folded stacks, JSON), or export
    /// it for other tools (pprof, speedscope, chrome/Perfetto, an SVG flame graph).
    Report {
        /// A profile written by `record`, `run` or the live view.
        file: PathBuf,
        #[arg(long, value_enum, default_value_t = FormatArg::Tree)]
        format: FormatArg,
        /// Write the output here instead of stdout.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Leave out calling contexts whose total is under PCT% of all roots' total.
        #[arg(long, value_name = "PCT", value_parser = parse_percent)]
        threshold: Option<f64>,
        /// Show calling contexts at most N levels deep (1: only the roots).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        depth: Option<u64>,
        /// Only this thread's tree (thread ids are in the JSON and the live view).
        #[arg(long, value_name = "TID")]
        thread: Option<u32>,
        /// Which time to show: wall-clock (waiting included) or on-CPU (the time the
        /// thread ran). pprof carries both and opens on this one.
        #[arg(long, value_enum, default_value_t = ClockArg::Wall)]
        clock: ClockArg,
        /// The header's details too (tree and hot spots): the pauses' causes, the
        /// calibration's parts, the functions not followed by reason.
        #[arg(short, long)]
        verbose: bool,
    },
    /// Compare two profiles: each call path's change in total and self time, largest
    /// change first.
    Diff {
        /// The profile before.
        a: PathBuf,
        /// The profile after.
        b: PathBuf,
        /// text: a table; folded: `path selfA selfB` lines for inferno's differential
        /// flame graph (`inferno-flamegraph`).
        #[arg(long, value_enum, default_value_t = DiffFormatArg::Text)]
        format: DiffFormatArg,
    },
    /// Sample every thread of a running process from the outside (nothing is loaded
    /// into it, nothing in it changes) and write a sampled profile.
    Sample {
        /// Process id of the target.
        pid: i32,
        #[command(flatten)]
        sampling: SamplingArgs,
        /// Stop after this many seconds (default: until Ctrl-C).
        #[arg(
            long,
            value_name = "SECS",
            allow_negative_numbers = true,
            value_parser = tendril::commands::duration::parse_seconds
        )]
        duration: Option<Duration>,
        /// Write the profile to FILE (`-`: stdout). Default:
        /// tendril-<PID>-<YYYYmmdd-HHMMSS>.json in the current directory.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// A live table of the functions a running process spends its time in, sampled
    /// from the outside and refreshed every second (q quits).
    Top {
        /// Process id of the target.
        pid: i32,
        #[command(flatten)]
        sampling: SamplingArgs,
    },
    /// How far two profiles' call trees agree: first line `overlap X.XXX  hotcover
    /// Y.YYY`, then the call paths that differ most.
    Compare {
        /// The reference profile (its hot paths are the ones hotcover looks for).
        a: PathBuf,
        /// The profile compared with it.
        b: PathBuf,
        /// Compare only the subtrees below SYM (default: an instrumented profile's roots
        /// when the other is sampled, else the whole trees).
        #[arg(long, value_name = "SYM")]
        root: Option<String>,
        /// List this many call paths.
        #[arg(long, value_name = "N", default_value_t = tendril::commands::compare::DEFAULT_ROWS)]
        top: usize,
    },
    /// The demo workload itself (run by `tendril demo`).
    #[command(hide = true)]
    DemoTarget,
}

/// `tendril PID` is `tendril attach PID`: a lone argument that is a number gets the
/// command put before it (anything else parses as it is).
fn with_attach_for_a_lone_pid(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let lone_pid = args.len() == 2
        && args[1]
            .to_str()
            .is_some_and(|arg| arg.parse::<i32>().is_ok_and(|pid| pid > 0));
    if lone_pid {
        args.insert(1, "attach".into());
    }
    args
}

/// Parses the command line; a usage error is one line (what is wrong, what was
/// probably meant, and the help of the subcommand given), like every other error of
/// tendril.
fn parse_command_line() -> Result<Cli, ExitCode> {
    use clap::error::ErrorKind;
    let args = with_attach_for_a_lone_pid(std::env::args_os().collect());
    match Cli::try_parse_from(&args) {
        Ok(cli) => Ok(cli),
        Err(error)
            if matches!(
                error.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) =>
        {
            let _ = error.print();
            Err(if error.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        Err(error) => {
            let rendered = error.render().to_string();
            // The message is the first paragraph (usage and tips follow a blank line).
            let message: Vec<&str> = rendered
                .lines()
                .take_while(|line| !line.trim().is_empty())
                .map(str::trim)
                .collect();
            let message = message.join(" ");
            let message = message.trim_start_matches("error: ");
            let meant =
                suggestion(&error).map_or(String::new(), |s| format!("; did you mean {s}?"));
            let help = match subcommand_given(&args) {
                Some(name) => format!("tendril {name} --help"),
                None => "tendril --help".to_string(),
            };
            say_line(&format!("{message}{meant} (see `{help}`)"));
            Err(ExitCode::from(2))
        }
    }
}

/// What clap suggests for a mistyped subcommand or option, quoted.
fn suggestion(error: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue};
    let value = error
        .get(ContextKind::SuggestedSubcommand)
        .or_else(|| error.get(ContextKind::SuggestedArg))?;
    match value {
        ContextValue::String(text) => Some(format!("'{text}'")),
        ContextValue::Strings(texts) => texts.first().map(|text| format!("'{text}'")),
        _ => None,
    }
}

/// The subcommand named on the command line (its first word that is one), if any.
fn subcommand_given(args: &[std::ffi::OsString]) -> Option<String> {
    use clap::CommandFactory;
    let command = Cli::command();
    let names: Vec<&str> = command.get_subcommands().map(|s| s.get_name()).collect();
    args.iter()
        .skip(1)
        .filter_map(|arg| arg.to_str())
        .find(|arg| !arg.starts_with('-'))
        .filter(|arg| names.contains(arg))
        .map(str::to_string)
}

fn main() -> ExitCode {
    let cli = match parse_command_line() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let Some(command) = cli.command else {
        return report(tendril::commands::picker::run());
    };
    // Loads made on this thread (before any full-screen view starts) may show a
    // progress line on a terminal; the live view's background loads never do.
    tendril::symbols::show_progress_on_this_thread();
    run_command(command)
}

/// Runs `command`; its exit status.
fn run_command(command: Command) -> ExitCode {
    let result = match command {
        Command::Demo => tendril::commands::demo::run(),
        Command::Attach { pid, roots, timing } => {
            tendril::commands::attach::run(pid, roots, timing.into())
        }
        Command::View { file } => tendril::commands::view::run(&file),
        Command::Symbols { pid, pattern, json } => tendril::symbols::run_symbols_command(
            pid,
            pattern.as_deref(),
            json,
            &mut std::io::stdout().lock(),
        ),
        Command::Status { pid } => tendril::commands::status::run(pid),
        Command::Detach { pid } => tendril::commands::detach::run(pid),
        Command::Count {
            pid,
            patterns,
            duration,
            json,
            returns,
        } => tendril::commands::count::run(&tendril::commands::count::CountOptions {
            pid,
            patterns,
            duration,
            json,
            returns,
        }),
        Command::Edges(options) => tendril::commands::edges::run(&options),
        Command::Record {
            pid,
            roots,
            profile,
            duration,
        } => record(pid, roots, profile, duration),
        Command::Run {
            roots,
            profile,
            duration,
            program,
        } => return run_program(program, roots, profile, duration),
        Command::Report {
            file,
            format,
            output,
            threshold,
            depth,
            thread,
            clock,
            verbose,
        } => {
            let prune = tendril::profile::Prune {
                thread,
                depth: depth.map(|d| d as usize),
                threshold_percent: threshold,
            };
            tendril::commands::report::run(
                &file,
                format.into(),
                output.as_deref(),
                prune,
                clock.into(),
                verbose,
            )
        }
        Command::Diff { a, b, format } => tendril::commands::diff::run(
            &a,
            &b,
            match format {
                DiffFormatArg::Text => tendril::commands::diff::DiffFormat::Text,
                DiffFormatArg::Folded => tendril::commands::diff::DiffFormat::Folded,
            },
        ),
        Command::Sample {
            pid,
            sampling,
            duration,
            output,
        } => tendril::commands::sample::run(&tendril::commands::sample::SampleCommand {
            pid,
            options: sampling.options(),
            duration,
            output,
        }),
        Command::Top { pid, sampling } => tendril::commands::top::run(pid, sampling.options()),
        Command::Compare { a, b, root, top } => {
            tendril::commands::compare::run(&a, &b, root.as_deref(), top)
        }
        Command::DemoTarget => tendril::demo_workload::run(),
    };
    report(result)
}

/// `tendril record`.
fn record(
    pid: i32,
    roots: Vec<String>,
    profile: ProfileArgs,
    duration: Option<Duration>,
) -> anyhow::Result<()> {
    tendril::commands::record::run(&tendril::commands::record::RecordCommand {
        options: tendril::recording::RecordOptions {
            pid,
            roots,
            scheme: profile.scheme.into(),
            gross_only: profile.gross_only,
            timing: profile.timing.into(),
            pointer_candidates: profile.pointer_candidates,
        },
        duration,
        output: profile.output,
        trace: profile.trace,
    })
}

/// `tendril run`: its exit status is the program's.
fn run_program(
    program: Vec<String>,
    roots: Vec<String>,
    profile: ProfileArgs,
    duration: Option<Duration>,
) -> ExitCode {
    let command = tendril::commands::run::RunCommand {
        program,
        roots,
        scheme: profile.scheme.into(),
        gross_only: profile.gross_only,
        timing: profile.timing.into(),
        pointer_candidates: profile.pointer_candidates,
        duration,
        output: profile.output,
        trace: profile.trace,
    };
    match tendril::commands::run::run(&command) {
        Ok(status) => ExitCode::from(status),
        Err(error) => {
            say_line(&error.to_string());
            ExitCode::FAILURE
        }
    }
}

/// A percentage from 0 to 100 (`--threshold`).
fn parse_percent(text: &str) -> Result<f64, String> {
    match text.trim_end_matches('%').parse::<f64>() {
        Ok(percent) if (0.0..=100.0).contains(&percent) => Ok(percent),
        _ => Err(format!("'{text}' is not a percentage from 0 to 100")),
    }
}

/// The exit code for a command's result, with its error printed as one line (escaped:
/// it may name the target's functions and files).
fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            say_line(&error.to_string());
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<std::ffi::OsString> {
        words.iter().map(Into::into).collect()
    }

    #[test]
    fn a_lone_pid_is_attach_pid_and_nothing_else_changes() {
        assert_eq!(
            with_attach_for_a_lone_pid(args(&["tendril", "4242"])),
            args(&["tendril", "attach", "4242"])
        );
        for unchanged in [
            &["tendril"][..],
            &["tendril", "symbols", "4242"],
            &["tendril", "4242", "x"],
            &["tendril", "0"],
            &["tendril", "-3"],
            &["tendril", "demo"],
        ] {
            assert_eq!(with_attach_for_a_lone_pid(args(unchanged)), args(unchanged));
        }
        let cli = Cli::try_parse_from(with_attach_for_a_lone_pid(args(&["tendril", "4242"])))
            .expect("parses");
        assert!(matches!(
            cli.command,
            Some(Command::Attach { pid: 4242, ref roots, .. }) if roots.is_empty()
        ));
    }
}
