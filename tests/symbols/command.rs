//! The `tendril symbols` command as a user meets it: aligned lines, JSON, suggestions
//! for a name that matches nothing, and one clear line for a process that is gone.

use crate::common::{Target, tendril};
use tendril::symbols::{ProcessSymbols, SymbolError, run_symbols_command};

#[test]
fn missing_process_is_a_clear_error() {
    let err = ProcessSymbols::load(i32::MAX).unwrap_err();
    assert!(matches!(err, SymbolError::NoProcess { .. }), "{err:?}");
    assert_eq!(err.to_string(), format!("no process with pid {}", i32::MAX));
}

#[test]
fn symbols_command_prints_aligned_lines_json_and_suggestions() {
    let target = Target::spawn("calltree", &["1"]);
    let pid = target.pid();

    let mut out = Vec::new();
    run_symbols_command(pid, Some("counted_*"), false, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    for line in &lines {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields.len(), 4, "{line}");
        assert!(
            fields[0].starts_with("0x") && fields[0].len() == 18,
            "{line}"
        );
        assert!(fields[1].parse::<u64>().unwrap() > 0);
        assert_eq!(fields[2], "calltree");
        assert!(fields[3].starts_with("counted_"));
    }

    let mut out = Vec::new();
    run_symbols_command(pid, Some("compute_block"), true, &mut out).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let item = &json.as_array().unwrap()[0];
    assert_eq!(item["name"], "compute_block");
    assert_eq!(item["raw_name"], "compute_block");
    assert_eq!(item["module"], "calltree");
    assert_eq!(item["source"], "symtab");
    assert!(item["addr"].as_u64().unwrap() > 0 && item["size"].as_u64().unwrap() > 0);

    let err = run_symbols_command(pid, Some("compute_blok"), false, &mut Vec::new()).unwrap_err();
    let message = err.to_string();
    assert!(
        message.starts_with(&format!(
            "no function matches 'compute_blok' in pid {pid} — did you mean: compute_block"
        )),
        "{message}"
    );
    assert!(!message.contains('\n'));

    // Every function when no pattern is given, sorted by address.
    let mut out = Vec::new();
    run_symbols_command(pid, None, false, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let addrs: Vec<u64> = text
        .lines()
        .map(|l| u64::from_str_radix(&l[2..18], 16).unwrap())
        .collect();
    assert!(addrs.len() > 1000 && addrs.windows(2).all(|w| w[0] <= w[1]));
}

#[test]
fn tendril_symbols_cli() {
    let target = Target::spawn("calltree", &["1"]);
    let pid = target.pid().to_string();

    let out = tendril()
        .args(["symbols", &pid, "compute_block"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(
        stdout.contains(" calltree ") && stdout.trim_end().ends_with("compute_block"),
        "{stdout}"
    );

    let out = tendril()
        .args(["symbols", &pid, "--json", "counted_*"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 3);

    let out = tendril()
        .args(["symbols", &pid, "compute_blok"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("did you mean: compute_block"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");

    let error = |args: &[&str], stdout: std::process::Stdio| {
        let out = tendril()
            .arg("symbols")
            .args(args)
            .stdout(stdout)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        stderr
    };
    let piped = std::process::Stdio::piped;
    let stderr = error(&[&pid, "["], piped());
    assert!(
        stderr.starts_with("tendril: invalid glob '[': the `[` at character 1"),
        "{stderr}"
    );
    let stderr = error(&[&pid, "nosuchmod:malloc"], piped());
    assert!(
        stderr.starts_with(&format!(
            "tendril: no module matches 'nosuchmod' in pid {pid} — "
        )),
        "{stderr}"
    );
    let stderr = error(&[&pid, "libc:malloc"], piped());
    assert!(stderr.contains("did you mean: libc.so.6"), "{stderr}");
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let stderr = error(&[&pid], full.into());
    assert!(
        stderr.starts_with("tendril: cannot write the listing: No space left on device"),
        "{stderr}"
    );

    // A 32-bit program is refused as `status` refuses it, not listed as empty.
    let i386 = Target::spawn_no_ready("i386_loop", &[]);
    let stderr = error(&[&i386.pid().to_string()], piped());
    assert!(
        stderr.contains("not an x86-64 program (32-bit)"),
        "{stderr}"
    );
}
