//! `Counting`: a `tendril count` running against a fixture, and its parsed report.
//!
//! The one idea: a test starts the count, waits until tendril says the hooks are in
//! (its `tendril: counting ...` line on stderr), makes the fixture do a known amount of
//! work, then ends the count with Ctrl-C (SIGINT) as a user would and reads the report.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use super::tendril;

/// How long tendril may take to attach and patch.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A `tendril count` in progress.
pub struct Counting {
    child: Child,
    stderr_lines: Receiver<String>,
    stderr_seen: Vec<String>,
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
        let mut child = tendril()
            .arg("count")
            .arg(pid.to_string())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot run tendril count");
        let stderr = child.stderr.take().unwrap();
        let (sender, stderr_lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let mut counting = Counting {
            child,
            stderr_lines,
            stderr_seen: Vec::new(),
        };
        loop {
            match counting.stderr_lines.recv_timeout(START_TIMEOUT) {
                Ok(line) => {
                    let started = line.starts_with("tendril: counting calls");
                    counting.stderr_seen.push(line);
                    if started {
                        return counting;
                    }
                }
                Err(_) => {
                    let _ = counting.child.kill();
                    let output = counting.finish_output();
                    panic!(
                        "tendril count did not start counting: {}\n{}",
                        output.stderr, output.stdout
                    );
                }
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Ends the count with SIGINT, as Ctrl-C does, and parses the report.
    pub fn finish(self) -> CountReport {
        // SAFETY: kill only sends a signal; the child has not been reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let report = self.finish_output();
        assert!(
            report.stdout.lines().count() >= 2,
            "tendril count printed no report: {}\n{}",
            report.stderr,
            report.stdout
        );
        report
    }

    /// Kills tendril with SIGKILL: it gets no chance to restore anything itself.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn finish_output(mut self) -> CountReport {
        let mut stdout = String::new();
        if let Some(mut out) = self.child.stdout.take() {
            let _ = out.read_to_string(&mut stdout);
        }
        let status = self.child.wait().expect("cannot wait for tendril count");
        std::thread::sleep(Duration::from_millis(50));
        self.stderr_seen.extend(self.stderr_lines.try_iter());
        let stderr = self.stderr_seen.join("\n");
        assert!(status.success(), "tendril count failed: {stderr}\n{stdout}");
        parse_report(stdout, stderr)
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
