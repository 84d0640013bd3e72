//! `Counting`: a `tendril count` running against a fixture, and its parsed report.
//!
//! The one idea: a test starts the count, waits until tendril says the hooks are in
//! (its `tendril: counting ...` line on stderr), makes the fixture do a known amount of
//! work, then ends the count with Ctrl-C (SIGINT) as a user would and reads the report.

use std::process::Stdio;
use std::time::Duration;

use super::running::RunningTendril;
use super::tendril;

/// How long tendril may take to attach and patch.
const START_TIMEOUT: Duration = Duration::from_secs(600);

/// A `tendril count` in progress.
pub struct Counting {
    running: RunningTendril,
}

/// One row of the report: calls, returns (with `--returns`), and the function's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub calls: u64,
    pub returns: Option<u64>,
    pub name: String,
}

/// What `tendril count` printed.
#[derive(Debug)]
pub struct CountReport {
    pub rows: Vec<Row>,
    pub total: u64,
    /// The `not counted: ...` lines.
    pub not_counted: Vec<String>,
    pub stdout: String,
    pub stderr: String,
}

impl Counting {
    /// Starts `tendril count <pid> <args...>` and waits until it counts.
    pub fn start(pid: i32, args: &[&str]) -> Counting {
        let mut command = tendril();
        command
            .arg("count")
            .arg(pid.to_string())
            .args(args)
            .stdout(Stdio::piped());
        Counting {
            running: RunningTendril::start(command, "tendril: counting calls", START_TIMEOUT),
        }
    }

    pub fn pid(&self) -> u32 {
        self.running.pid()
    }

    /// Ends the count with SIGINT, as Ctrl-C does, and parses the report.
    pub fn finish(self) -> CountReport {
        self.running.interrupt();
        let (status, stdout, stderr) = self.running.wait();
        assert!(status.success(), "tendril count failed: {stderr}\n{stdout}");
        assert!(
            stdout.lines().count() >= 2,
            "tendril count printed no report: {stderr}\n{stdout}"
        );
        parse_report(stdout, stderr)
    }

    /// Kills tendril with SIGKILL: it gets no chance to restore anything itself.
    pub fn kill(self) {
        self.running.kill();
    }
}

fn parse_report(stdout: String, stderr: String) -> CountReport {
    let mut rows = Vec::new();
    let mut total = 0;
    let mut not_counted = Vec::new();
    let mut lines = stdout.lines();
    let header = lines.next().unwrap_or_default();
    let with_returns = header.contains("RETURNS");
    for line in lines {
        if line.starts_with("not counted: ") {
            not_counted.push(line.to_string());
            continue;
        }
        if line.starts_with("note: ") {
            continue;
        }
        let mut words = line.split_whitespace();
        let Some(calls) = words.next().and_then(|w| w.parse().ok()) else {
            continue;
        };
        let returns = if with_returns {
            words.next().and_then(|w| w.parse().ok())
        } else {
            None
        };
        let name = words.collect::<Vec<_>>().join(" ");
        if name.starts_with("total (") {
            total = calls;
        } else {
            rows.push(Row {
                calls,
                returns,
                name,
            });
        }
    }
    CountReport {
        rows,
        total,
        not_counted,
        stdout,
        stderr,
    }
}

impl CountReport {
    /// The row of the function shown as `name`; panics if there is none.
    pub fn row(&self, name: &str) -> &Row {
        self.rows
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no row for {name} in:\n{}", self.stdout))
    }

    pub fn calls(&self, name: &str) -> u64 {
        self.row(name).calls
    }

    pub fn returns(&self, name: &str) -> u64 {
        self.row(name)
            .returns
            .unwrap_or_else(|| panic!("no RETURNS column in:\n{}", self.stdout))
    }
}
