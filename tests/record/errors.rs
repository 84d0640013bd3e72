//! `tendril record` and `run` given what they cannot do: one clear line and a non-zero
//! exit for bad input, and a launched program that cannot be recorded, or dies of a
//! signal, killed or reported as a shell would.

use crate::common::{self, Target, code_bytes_match_file, tendril};

#[test]
fn bad_input_is_one_clear_line() {
    let target = Target::spawn("calltree", &["1"]);
    let pid = target.pid().to_string();
    let error = |args: &[&str]| {
        let output = tendril().args(args).output().unwrap();
        assert!(!output.status.success(), "{args:?} succeeded");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        stderr
    };
    let no_root = error(&["record", &pid, "--root", "no_such_function"]);
    assert!(
        no_root.contains("no function matches 'no_such_function'"),
        "{no_root}"
    );
    // An output path that cannot be written fails before the attach; an existing
    // file is left as it was and no empty file is left behind.
    let dir = std::env::temp_dir().join(format!("tendril-bad-output-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kept = dir.join("kept.json");
    std::fs::write(&kept, "kept").unwrap();
    let dir_text = dir.display().to_string();
    for (output, reason) in [
        (
            "/nonexistent/dir/file.json",
            "the directory /nonexistent/dir does not exist",
        ),
        (dir_text.as_str(), "it is a directory"),
        ("/proc/version", "it is a kernel file"),
        (
            "/etc/passwd/file.json",
            "a part of its directory path is not a directory",
        ),
    ] {
        let line = error(&["record", &pid, "--root", "work_round", "-o", output]);
        assert!(
            line.starts_with(&format!(
                "tendril: cannot write the profile to {output}: {reason}"
            )),
            "{line}"
        );
    }
    let created = dir.join("created.json");
    for output in [&kept, &created] {
        let args = ["record", &pid, "--root", "no_such_function", "-o"];
        let mut command = tendril();
        let output_status = command.args(args).arg(output).output().unwrap();
        assert!(!output_status.status.success());
    }
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "kept");
    assert!(!created.exists(), "an empty output file was left behind");
    std::fs::remove_dir_all(&dir).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(
        !maps.contains("libtendril_agent"),
        "no agent for a bad root or output"
    );
    let unpatchable = error(&["record", &pid, "--root", "calltree:_fini"]);
    assert!(
        unpatchable.contains("no root could be instrumented"),
        "{unpatchable}"
    );
    code_bytes_match_file(target.pid()).unwrap();
    let not_a_profile = error(&["report", "/etc/passwd"]);
    assert!(
        not_a_profile.contains("not a tendril profile"),
        "{not_a_profile}"
    );
    let missing = error(&["report", "/no/such/file.json"]);
    assert!(
        missing.contains("cannot read /no/such/file.json"),
        "{missing}"
    );
    for (program, reason) in [
        ("/no/such/program", "no such file or directory"),
        ("no_such_program_in_path", "no such program in PATH"),
        ("/etc/passwd", "not executable"),
        ("/", "it is a directory"),
    ] {
        let line = error(&["run", "--", program]);
        assert!(
            line.starts_with(&format!("tendril: cannot start {program}: "))
                && line.contains(reason),
            "{line}"
        );
    }
}

/// The pid in "... killed PROGRAM (pid N) before it started".
fn killed_pid(line: &str) -> i32 {
    let (_, after) = line
        .rsplit_once("(pid ")
        .unwrap_or_else(|| panic!("no pid in {line}"));
    after.split(')').next().unwrap().parse().unwrap()
}

#[test]
fn run_kills_a_program_it_cannot_record_and_says_why() {
    let script = std::env::temp_dir().join(format!("tendril-run-{}.sh", std::process::id()));
    std::fs::write(&script, "#!/bin/sh\nsleep 30\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let calltree = common::fixture("calltree").display().to_string();
    let stripped = common::fixture("calltree_stripped").display().to_string();
    let i386 = common::fixture("i386_loop").display().to_string();
    let static_loop = common::fixture("static_loop").display().to_string();
    let script = script.display().to_string();
    let cases: [(&[&str], &str); 5] = [
        (
            &["--root", "no_such_function", "--", &calltree, "1"],
            "no function matches 'no_such_function' in ",
        ),
        (
            &["--", &stripped, "1"],
            "has no `main` symbol (stripped?) — name the function to record with --root",
        ),
        (&["--", &script], "which has no `main` symbol"),
        (&["--", &i386], "is not an x86-64 program (32-bit)"),
        (&["--", &static_loop], "is statically linked"),
    ];
    for (args, expected) in cases {
        let output = tendril().arg("run").args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(stderr.contains("before it started"), "{stderr}");
        // Killed and reaped by tendril: nothing is left running, not even a zombie.
        let pid = killed_pid(stderr.trim_end());
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "{args:?}: process {pid} is still there"
        );
    }
    let _ = std::fs::remove_file(&script);
}

#[test]
fn run_reports_a_program_killed_by_a_signal_as_a_shell_would() {
    let output = tendril()
        .args(["run", "--root", "parent", "-o", "/dev/null", "--"])
        .arg(common::fixture("timed"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = output;
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"run 1\nraise 15\n")
        .unwrap();
    let result = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(128 + 15), "{stderr}");
    assert!(
        stderr.contains("timed was killed by signal 15 (SIGTERM)"),
        "{stderr}"
    );
}
