//! `Recording`: a `tendril record` running against a fixture, and the profile it wrote.
//!
//! The one idea: as with `Counting`, a test starts the recording, waits until tendril
//! says the roots are instrumented (`tendril: recording ...` on stderr), makes the
//! fixture do a known amount of work, ends the recording with SIGINT as Ctrl-C does,
//! and reads the profile file.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;
use tendril::profile::{Node, Profile, walk};

use super::tendril;

/// How long tendril may take to attach, calibrate and patch.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A `tendril record` in progress.
pub struct Recording {
    child: Child,
    stderr_lines: Receiver<String>,
    stderr_seen: Vec<String>,
    output: PathBuf,
}

/// What a finished recording left.
pub struct Recorded {
    pub profile: Profile,
    pub stderr: String,
}

impl Recording {
    /// Starts `tendril record <pid> <args...> -o <temporary file>` and waits until it
    /// records.
    pub fn start(pid: i32, args: &[&str]) -> Recording {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let output = std::env::temp_dir().join(format!(
            "tendril-test-{}-{}.json",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let mut child = tendril()
            .arg("record")
            .arg(pid.to_string())
            .args(args)
            .arg("-o")
            .arg(&output)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot run tendril record");
        let stderr = child.stderr.take().unwrap();
        let (sender, stderr_lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let mut recording = Recording {
            child,
            stderr_lines,
            stderr_seen: Vec::new(),
            output,
        };
        loop {
            match recording.stderr_lines.recv_timeout(START_TIMEOUT) {
                Ok(line) => {
                    let started = line.starts_with("tendril: recording ");
                    recording.stderr_seen.push(line);
                    if started {
                        return recording;
                    }
                }
                Err(_) => {
                    let _ = recording.child.kill();
                    let _ = recording.child.wait();
                    recording
                        .stderr_seen
                        .extend(recording.stderr_lines.try_iter());
                    panic!(
                        "tendril record did not start: {}",
                        recording.stderr_seen.join("\n")
                    );
                }
            }
        }
    }

    /// Ends the recording with SIGINT and reads the profile.
    pub fn finish(mut self) -> Recorded {
        // SAFETY: kill only sends a signal; the child has not been reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait().expect("cannot wait for tendril record");
        std::thread::sleep(Duration::from_millis(50));
        self.stderr_seen.extend(self.stderr_lines.try_iter());
        let stderr = self.stderr_seen.join("\n");
        assert!(status.success(), "tendril record failed: {stderr}");
        let profile = Profile::load(&self.output)
            .unwrap_or_else(|e| panic!("cannot read the profile: {e}\n{stderr}"));
        let _ = std::fs::remove_file(&self.output);
        Recorded { profile, stderr }
    }
}

/// The node reached by following `path` (function names) from `roots`.
pub fn node_at<'a>(roots: &'a [Node], path: &[&str]) -> Option<&'a Node> {
    let (first, rest) = path.split_first()?;
    let mut node = roots.iter().find(|n| n.name == *first)?;
    for name in rest {
        node = node.children.iter().find(|n| n.name == *name)?;
    }
    Some(node)
}

/// Every node of the trees, depth first.
pub fn all_nodes(roots: &[Node]) -> Vec<&Node> {
    let mut nodes = Vec::new();
    let _ = walk::<()>(roots, |visit| {
        if let tendril::profile::Visit::Enter { node, .. } = visit {
            nodes.push(node);
        }
        Ok(())
    });
    nodes
}
