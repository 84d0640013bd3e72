//! Where `record` and `run` write the profile without `-o`: a new file
//! `tendril-<PID>-<YYYYmmdd-HHMMSS>.json` in the current directory, named on stderr —
//! never JSON on the terminal, and never through a name someone else put there.

use crate::common;

use common::{Target, node_at, tendril};
use std::path::{Path, PathBuf};
use tendril::profile::Profile;

/// The files in `directory`.
fn files_in(directory: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(directory)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect()
}

/// A fresh, empty directory for one test.
fn empty_directory(what: &str) -> PathBuf {
    let directory =
        std::env::temp_dir().join(format!("tendril-{what}-default-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&directory);
    std::fs::create_dir_all(&directory).unwrap();
    directory
}

#[test]
fn record_without_an_output_writes_a_file_named_after_the_process_and_says_where() {
    let target = Target::spawn("calltree", &["1"]);
    let pid = target.pid().to_string();
    let directory = empty_directory("record");
    let output = tendril()
        .current_dir(&directory)
        .args(["record", &pid, "--root", "work_round", "--duration", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(output.stdout.is_empty(), "no JSON on stdout");
    let files = files_in(&directory);
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with(&format!("tendril-{pid}-")) && name.ends_with(".json"),
        "{name}"
    );
    assert!(
        stderr.contains(&format!("profile written to {}", files[0].display())),
        "{stderr}"
    );
    let profile = Profile::load(&files[0]).unwrap();
    assert!(node_at(&profile.merged.roots, &["work_round"]).is_some());
    common::check_profile(&profile);
    // `-o -` still writes the JSON to stdout.
    let output = tendril()
        .current_dir(&directory)
        .args([
            "record",
            &pid,
            "--root",
            "work_round",
            "--duration",
            "1",
            "-o",
            "-",
        ])
        .output()
        .unwrap();
    assert!(output.status.success());
    assert!(output.stdout.starts_with(b"{"), "the profile on stdout");
    assert_eq!(std::fs::read_dir(&directory).unwrap().count(), 1);
    let _ = std::fs::remove_dir_all(&directory);
}

#[test]
fn run_without_an_output_writes_a_file_named_after_the_program_and_says_where() {
    let directory = empty_directory("run");
    let mut child = tendril()
        .current_dir(&directory)
        .args(["run", "--root", "parent", "--"])
        .arg(common::fixture("timed"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"run 3\nexit 0\n")
        .unwrap();
    let result = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(result.status.success(), "{stderr}");
    // The program's own output only: no JSON.
    assert!(!result.stdout.contains(&b'{'), "no JSON on stdout");
    let files = files_in(&directory);
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    // The program's pid, as "running PROGRAM (pid N)" named it.
    let pid = stderr
        .split_once("(pid ")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(pid, _)| pid.to_owned())
        .unwrap_or_else(|| panic!("no pid in {stderr}"));
    assert!(
        name.starts_with(&format!("tendril-{pid}-")) && name.ends_with(".json"),
        "{name}"
    );
    assert!(
        stderr.contains(&format!("profile written to {}", files[0].display())),
        "{stderr}"
    );
    let profile = Profile::load(&files[0]).unwrap();
    assert_eq!(
        node_at(&profile.merged.roots, &["parent"]).unwrap().calls,
        3
    );
    let _ = std::fs::remove_dir_all(&directory);
}
