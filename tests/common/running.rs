//! `RunningTendril`: a tendril command started by a test, whose stderr is read line by
//! line as it comes, and which the test ends with SIGINT as Ctrl-C would.
//!
//! The one idea: commands like `count` and `record` say on stderr when their hooks are
//! in (`tendril: counting ...`, `tendril: recording ...`); a test waits for that line
//! before it makes the fixture work, so the work is measured whole.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// A tendril process started by a test.
pub struct RunningTendril {
    child: Child,
    stderr_lines: Receiver<String>,
    stderr_seen: Vec<String>,
}

impl RunningTendril {
    /// Runs `command` (its stderr piped here) and waits for a stderr line starting with
    /// `started`; panics with what it printed if tendril exits first, or is still
    /// silent after `timeout`.
    pub fn start(mut command: Command, started: &str, timeout: Duration) -> RunningTendril {
        let mut child = command
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot run tendril");
        let stderr = child.stderr.take().unwrap();
        let (sender, stderr_lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let mut running = RunningTendril {
            child,
            stderr_lines,
            stderr_seen: Vec::new(),
        };
        // Waits for the line while tendril runs: attaching and patching thousands of
        // functions takes what it takes on a busy machine. `timeout` only bounds a
        // tendril that hangs.
        let deadline = Instant::now() + timeout;
        loop {
            match running
                .stderr_lines
                .recv_timeout(Duration::from_millis(500))
            {
                Ok(line) => {
                    let is_start = line.starts_with(started);
                    running.stderr_seen.push(line);
                    if is_start {
                        return running;
                    }
                }
                Err(RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
                Err(_) => {
                    let _ = running.child.kill();
                    let (_, stdout, stderr) = running.wait();
                    panic!("tendril did not print '{started}...':\n{stderr}\n{stdout}");
                }
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for a stderr line starting with `prefix` (lines before it are kept for
    /// [`RunningTendril::wait`]); panics if tendril ends first or says nothing of the
    /// kind within `timeout`.
    pub fn wait_for_line(&mut self, prefix: &str, timeout: Duration) -> String {
        self.wait_for_line_where(prefix, |_| true, timeout)
    }

    /// [`RunningTendril::wait_for_line`], for a line starting with `prefix` that
    /// `also` accepts.
    pub fn wait_for_line_where(
        &mut self,
        prefix: &str,
        also: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> String {
        let wanted = |line: &str| line.starts_with(prefix) && also(line);
        if let Some(line) = self.stderr_seen.iter().find(|l| wanted(l)) {
            return line.clone();
        }
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            match self.stderr_lines.recv_timeout(Duration::from_millis(200)) {
                Ok(line) => {
                    self.stderr_seen.push(line.clone());
                    if wanted(&line) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        panic!(
            "tendril did not print '{prefix}...':\n{}",
            self.stderr_seen.join("\n")
        );
    }

    /// Sends SIGINT, as Ctrl-C does.
    pub fn interrupt(&self) {
        // SAFETY: kill only sends a signal; the child has not been reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
    }

    /// Kills tendril with SIGKILL: it gets no chance to restore anything itself.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for tendril to exit; returns its status, stdout (if piped) and stderr.
    pub fn wait(mut self) -> (ExitStatus, String, String) {
        let mut stdout = String::new();
        if let Some(mut out) = self.child.stdout.take() {
            let _ = out.read_to_string(&mut stdout);
        }
        let status = self.child.wait().expect("cannot wait for tendril");
        // The reader thread passes on the last lines until it reads the end of stderr
        // (tendril has exited, so it comes).
        self.stderr_seen.extend(self.stderr_lines.iter());
        (status, stdout, self.stderr_seen.join("\n"))
    }
}
