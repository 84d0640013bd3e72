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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Status { pid } => tendril::commands::status::run(pid),
        Command::Detach { pid } => tendril::commands::detach::run(pid),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tendril: {error}");
            ExitCode::FAILURE
        }
    }
}
