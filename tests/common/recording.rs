//! `Recording`: a `tendril record` running against a fixture, and the profile it wrote.
//!
//! The one idea: as with `Counting`, a test starts the recording, waits until tendril
//! says the roots are instrumented (`tendril: recording ...` on stderr), makes the
//! fixture do a known amount of work, ends the recording with SIGINT as Ctrl-C does,
//! and reads the profile file. Tests that drive a recording in their own process start
//! it with `start_recorder`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tendril::profile::{Node, Profile, walk};
use tendril::recording::{RecordOptions, Recorder, Scheme};

use super::running::RunningTendril;
use super::tendril;

/// How long tendril may take to attach, calibrate and patch.
const START_TIMEOUT: Duration = Duration::from_secs(600);

/// A recording of the call graph below `root` in process `pid` (Scheme B, timed), run
/// in the test's own process, as `tendril record --root ROOT` runs it.
pub fn start_recorder(pid: i32, root: &str) -> Recorder {
    Recorder::start(&RecordOptions {
        pid,
        roots: vec![root.to_string()],
        scheme: Scheme::B,
        gross_only: false,
        timing: Default::default(),
        pointer_candidates: false,
    })
    .unwrap_or_else(|e| panic!("cannot record the fixture: {e}"))
}

/// A `tendril record` in progress.
pub struct Recording {
    running: RunningTendril,
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
        let mut command = tendril();
        command
            .arg("record")
            .arg(pid.to_string())
            .args(args)
            .arg("-o")
            .arg(&output)
            .stdout(Stdio::null());
        Recording {
            running: RunningTendril::start(command, "tendril: recording ", START_TIMEOUT),
            output,
        }
    }

    /// The pid of the `tendril record` process.
    pub fn pid(&self) -> u32 {
        self.running.pid()
    }

    /// Waits for tendril to print a line starting with `prefix` on stderr.
    pub fn wait_for_line(&mut self, prefix: &str, timeout: Duration) -> String {
        self.running.wait_for_line(prefix, timeout)
    }

    /// Waits for a line starting with `prefix` that `also` accepts.
    pub fn wait_for_line_where(
        &mut self,
        prefix: &str,
        also: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> String {
        self.running.wait_for_line_where(prefix, also, timeout)
    }

    /// Ends the recording with SIGINT and reads the profile, which must be consistent
    /// (`check_profile`).
    pub fn finish(self) -> Recorded {
        self.running.interrupt();
        let (status, _, stderr) = self.running.wait();
        assert!(status.success(), "tendril record failed: {stderr}");
        let profile = Profile::load(&self.output)
            .unwrap_or_else(|e| panic!("cannot read the profile: {e}\n{stderr}"));
        let _ = std::fs::remove_file(&self.output);
        super::check_profile(&profile);
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
