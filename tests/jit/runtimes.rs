//! Real runtimes, where installed: Python 3.12+ with `-X perf` (a perf trampoline per
//! Python function, which keeps no frame pointer) and Node with `--perf-basic-prof`
//! (V8's JIT code, with frame pointers), sampled; and Python recorded from its
//! evaluator, whose calls of the trampolines through a register become named `jit`
//! leaves. A runtime that is missing skips its test with a note on stderr.

use super::common::start_recorder;
use super::{SAMPLES_TIMEOUT, paths, sample_until, scratch_dir};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tendril::profile::{Node, Profile};

/// A runtime's process, killed and reaped when dropped.
struct Runtime {
    child: Child,
}

impl Runtime {
    /// Starts `command` and waits for its `ready` line on stdout.
    fn start(mut command: Command) -> Runtime {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the runtime starts");
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let runtime = Runtime { child };
        match lines.recv_timeout(SAMPLES_TIMEOUT) {
            Ok(line) if line.starts_with("ready") => runtime,
            other => panic!("the runtime did not say ready: {other:?}"),
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(format!("/tmp/perf-{}.map", self.child.id()));
    }
}

/// A Python of 3.12 or later built with perf trampolines: `TENDRIL_TEST_PYTHON`, else
/// `python3`, `python3.12`… on the PATH, else one of pyenv's.
fn python_with_perf_trampolines() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::env::var_os("TENDRIL_TEST_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.extend(
        ["python3", "python3.12", "python3.13", "python3.14"]
            .iter()
            .map(PathBuf::from),
    );
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".pyenv")));
    if let Some(Ok(versions)) = pyenv.map(|root| std::fs::read_dir(root.join("versions"))) {
        let mut found: Vec<PathBuf> = versions
            .filter_map(Result::ok)
            .map(|entry| entry.path().join("bin/python3"))
            .collect();
        found.sort();
        candidates.extend(found);
    }
    let check = "import sys; sys.exit(0 if sys.version_info >= (3, 12) and \
                 hasattr(sys, 'activate_stack_trampoline') else 1)";
    candidates.into_iter().find(|python| {
        Command::new(python)
            .args(["-c", check])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    })
}

const PYTHON_APP: &str = r#"
def leaf(n):
    s = 0
    for i in range(n):
        s += i * i % 7
    return s

def mid(n):
    return leaf(n) + leaf(n // 2)

def top():
    t = 0
    while True:
        t += mid(20000)

print("ready", flush=True)
top()
"#;

/// The samples at or below `py::leaf` nodes that are below `py::mid` below `py::top`,
/// on stacks walked from the outermost frame (a node's samples count those below it).
fn python_nesting(profile: &Profile) -> u64 {
    paths(profile)
        .iter()
        .filter(|(path, _)| !path.starts_with("[truncated stack]"))
        .filter(|(path, _)| {
            let names: Vec<&str> = path.split(';').collect();
            let at = |prefix: &str| names.iter().position(|n| n.starts_with(prefix));
            matches!(
                (at("py::top:"), at("py::mid:"), at("py::leaf:")),
                (Some(top), Some(mid), Some(leaf)) if top < mid && mid < leaf
            ) && names.last().is_some_and(|n| n.starts_with("py::leaf:"))
        })
        .map(|(_, samples)| samples)
        .sum()
}

#[test]
fn python_functions_are_named_and_nested_through_their_perf_trampolines() {
    let Some(python) = python_with_perf_trampolines() else {
        eprintln!("note: no Python 3.12+ with perf trampolines here: test skipped");
        return;
    };
    eprintln!("sampling {} -X perf", python.display());
    let dir = scratch_dir("python");
    let app = dir.join("app.py");
    std::fs::write(&app, PYTHON_APP).unwrap();
    let mut command = Command::new(&python);
    command.arg("-X").arg("perf").arg(&app);
    let runtime = Runtime::start(command);
    let (profile, notes) = sample_until(runtime.pid(), |p| python_nesting(p) >= 50);
    assert!(notes.is_empty(), "{notes:?}");
    assert!(!profile.merged.roots.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `jit`-marked nodes of `roots` whose name starts with `prefix`, with the name of
/// the node above each.
fn jit_leaves_named<'a>(roots: &'a [Node], prefix: &str) -> Vec<(&'a str, &'a Node)> {
    let mut found = Vec::new();
    let mut pending: Vec<&Node> = roots.iter().collect();
    while let Some(node) = pending.pop() {
        for child in &node.children {
            if child.jit && child.name.starts_with(prefix) {
                found.push((node.name.as_str(), child));
            }
            pending.push(child);
        }
    }
    found
}

#[test]
fn a_recording_of_python_shows_its_functions_as_jit_leaves_where_the_evaluator_calls_them() {
    let Some(python) = python_with_perf_trampolines() else {
        eprintln!("note: no Python 3.12+ with perf trampolines here: test skipped");
        return;
    };
    let dir = scratch_dir("python-recorded");
    let app = dir.join("app.py");
    std::fs::write(&app, PYTHON_APP).unwrap();
    let mut command = Command::new(&python);
    command.arg("-X").arg("perf").arg(&app);
    let runtime = Runtime::start(command);
    // The evaluator calls each Python function's trampoline through a register; the
    // recording meets the call as it is made, and the perf map names the target.
    let mut recorder = start_recorder(runtime.pid(), "_PyEval_EvalFrameDefault");
    let deadline = Instant::now() + SAMPLES_TIMEOUT;
    let leaves = loop {
        recorder.poll();
        let profile = recorder.snapshot();
        let leaves: Vec<(String, Node)> = jit_leaves_named(&profile.merged.roots, "py::leaf:")
            .into_iter()
            .map(|(caller, leaf)| (caller.to_string(), leaf.clone()))
            .collect();
        if !leaves.is_empty() {
            break leaves;
        }
        assert!(
            Instant::now() < deadline,
            "no py::leaf leaf within {SAMPLES_TIMEOUT:?}"
        );
        // Pace the polls; what ends the loop is the leaf showing up.
        std::thread::sleep(Duration::from_millis(50));
    };
    recorder.finish(false).expect("the recording ends");
    for (caller, leaf) in &leaves {
        assert_eq!(caller, "py_trampoline_evaluator", "{leaf:?}");
        assert_eq!((leaf.module.as_str(), leaf.calls), ("[jit]", 0));
    }
    drop(runtime);
    let _ = std::fs::remove_dir_all(&dir);
}

const NODE_APP: &str = r#"
function hotLoop(n) {
    let s = 0;
    for (let i = 0; i < n; i++) s += (i * i) % 7;
    return s;
}
function driver() {
    let t = 0;
    for (;;) t += hotLoop(100000);
}
console.log("ready");
driver();
"#;

#[test]
fn node_javascript_functions_are_named_from_the_perf_map() {
    let have_node = Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !have_node {
        eprintln!("note: no node here: test skipped");
        return;
    }
    let dir = scratch_dir("node");
    let app = dir.join("app.js");
    std::fs::write(&app, NODE_APP).unwrap();
    let mut command = Command::new("node");
    // Anything node writes beside it (a V8 log) lands in the scratch directory.
    command
        .current_dir(&dir)
        .args(["--perf-basic-prof", "--interpreted-frames-native-stack"])
        .arg(&app);
    let runtime = Runtime::start(command);
    // A JavaScript frame named from the map (`JS:*driver`, `JS:^hotLoop`…; TurboFan may
    // inline one into the other), on a stack walked from `_start`.
    let javascript = |p: &Profile| {
        paths(p)
            .iter()
            .filter(|(path, _)| path.starts_with("_start;"))
            .filter(|(path, _)| {
                let last = path.rsplit(';').next().unwrap_or_default();
                last.starts_with("JS:") && (last.contains("hotLoop") || last.contains("driver"))
            })
            .map(|(_, samples)| samples)
            .sum::<u64>()
    };
    let (profile, _) = sample_until(runtime.pid(), |p| javascript(p) >= 50);
    let misnamed: Vec<String> = paths(&profile)
        .into_iter()
        .map(|(path, _)| path)
        .filter(|path| path.contains("node+0x7f"))
        .collect();
    assert!(
        misnamed.is_empty(),
        "JIT code named as node's: {misnamed:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
