//! The `tendril` command line.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// tendril — profile a running native program, call by call.
#[derive(Parser)]
#[command(name = "tendril", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the bundled demo program, attach to it and show where it spends its time.
    Demo,
    /// List the functions of every module mapped into a running process.
    Symbols {
        /// Process id of the target.
        pid: i32,
        /// Only functions matching: exact name, glob (`dee*`) or `module:name`.
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
    /// The demo workload itself (run by `tendril demo`).
    #[command(hide = true)]
    DemoTarget,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo => tendril::commands::demo::run(),
        Command::Symbols { pid, pattern, json } => tendril::symbols::run_symbols_command(
            pid,
            pattern.as_deref(),
            json,
            &mut std::io::stdout().lock(),
        ),
        Command::Status { pid } => tendril::commands::status::run(pid),
        Command::Detach { pid } => tendril::commands::detach::run(pid),
        Command::DemoTarget => tendril::demo_workload::run(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tendril: {error}");
            ExitCode::FAILURE
        }
    }
}
