//! The files tendril writes its output to (issue 31): never through a link someone put
//! at the name, refused up front on a full file system (the target untouched), and, if
//! the disk fills up while recording, saved in a directory of tendril's own rather than
//! lost — the error saying the OS's reason and where the profile went.
//!
//! The full file systems are small tmpfs mounts the tests make (they run as root); where
//! mounting is not allowed (a container without CAP_SYS_ADMIN) those tests say so and
//! pass without checking.

use crate::common;

use common::{RunningTendril, Target, tendril};
use std::ffi::CString;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;
use tendril::profile::Profile;

const ROUND_TIMEOUT: Duration = Duration::from_secs(20);
const START_TIMEOUT: Duration = Duration::from_secs(600);

/// A fresh, empty directory for one test, writable by everyone as `/tmp` is.
fn shared_directory(what: &str) -> PathBuf {
    let directory = std::env::temp_dir().join(format!("tendril-out-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&directory);
    std::fs::create_dir_all(&directory).unwrap();
    std::fs::set_permissions(&directory, std::fs::Permissions::from_mode(0o1777)).unwrap();
    directory
}

/// Whether the agent was ever loaded into `pid`.
fn has_agent(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .contains("libtendril_agent")
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `tendril-<pid>-<YYYYmmdd-HHMMSS>.json` for the local time `seconds` from now.
fn default_name(pid: i32, seconds: i64) -> String {
    // SAFETY: time(NULL) has no preconditions; localtime_r gets valid pointers, and an
    // all-zero `tm` is a valid value of the plain C struct.
    let tm = unsafe {
        let now = libc::time(std::ptr::null_mut()) + seconds;
        let mut tm: libc::tm = std::mem::zeroed();
        assert!(!libc::localtime_r(&now, &mut tm).is_null());
        tm
    };
    format!(
        "tendril-{pid}-{:04}{:02}{:02}-{:02}{:02}{:02}.json",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

#[test]
fn links_planted_at_the_default_names_are_passed_over_and_said() {
    let target = Target::spawn("calltree", &["1"]);
    let pid = target.pid();
    let directory = shared_directory("planted");
    let victim = directory.join("victim");
    std::fs::write(&victim, "keep").unwrap();
    // Someone else guessed the names of the next two minutes.
    for seconds in -1..120 {
        let link = directory.join(default_name(pid, seconds));
        std::os::unix::fs::symlink(&victim, link).unwrap();
    }
    let output = tendril()
        .current_dir(&directory)
        .args(["record", &pid.to_string(), "--root", "work_round"])
        .args(["--duration", "0.2"])
        .output()
        .unwrap();
    let stderr = stderr_of(&output);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    assert!(
        stderr.contains("is a symbolic link someone put there; tendril writes no file"),
        "{stderr}"
    );
    let written: Vec<PathBuf> = std::fs::read_dir(&directory)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| !path.is_symlink() && *path != victim)
        .collect();
    assert_eq!(written.len(), 1, "{written:?}");
    assert!(
        written[0].to_string_lossy().ends_with("-2.json"),
        "{written:?}"
    );
    Profile::load(&written[0]).unwrap();
    std::fs::remove_dir_all(&directory).unwrap();
}

#[test]
fn an_output_that_is_a_link_is_refused_before_anything_starts() {
    let target = Target::spawn("calltree", &["1"]);
    let pid = target.pid().to_string();
    let directory = shared_directory("link");
    let victim = directory.join("victim");
    std::fs::write(&victim, "keep").unwrap();
    let link = directory.join("out.json");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let link = link.to_str().unwrap();
    let profile = directory.join("profile.json");
    std::fs::write(&profile, r#"{"format":"tendril-profile","version":1}"#).unwrap();
    let commands: [&[&str]; 4] = [
        &["record", &pid, "--root", "work_round", "-o", link],
        &["edges", &pid, "leaf_add", "-o", link],
        &["sample", &pid, "-o", link],
        &["report", profile.to_str().unwrap(), "-o", link],
    ];
    for args in commands {
        let output = tendril().args(args).output().unwrap();
        let stderr = stderr_of(&output);
        assert!(!output.status.success(), "{args:?}: {stderr}");
        assert_eq!(
            stderr.trim_end(),
            format!(
                "tendril: cannot write the profile to {link}: it is a symbolic link, and \
                 tendril writes no file through a link (give the path it points to)"
            ),
            "{args:?}"
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    }
    assert!(!has_agent(target.pid()), "the target was touched");
    std::fs::remove_dir_all(&directory).unwrap();
}

/// A tmpfs of `size` mounted on a fresh directory, unmounted (and the directory
/// removed) when dropped.
struct Tmpfs {
    directory: PathBuf,
}

impl Tmpfs {
    /// `None` (and a note) where mounting is not allowed.
    fn mount(what: &str, size: &str) -> Option<Tmpfs> {
        let directory = shared_directory(what);
        let path = CString::new(directory.to_str().unwrap()).unwrap();
        let options = CString::new(format!("size={size},mode=1777")).unwrap();
        // SAFETY: every pointer is a valid NUL-terminated string for the call.
        let mounted = unsafe {
            libc::mount(
                c"none".as_ptr(),
                path.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                options.as_ptr().cast(),
            )
        };
        if mounted != 0 {
            eprintln!(
                "not checked: cannot mount a tmpfs ({}); run the tests as root",
                std::io::Error::last_os_error()
            );
            let _ = std::fs::remove_dir(&directory);
            return None;
        }
        Some(Tmpfs { directory })
    }

    /// Fills the file system to the last byte.
    fn fill(&self) {
        let mut filler = std::fs::File::create(self.directory.join("filler")).unwrap();
        let block = [0u8; 4096];
        while filler.write_all(&block).is_ok() {}
        // The last partial block.
        while filler.write_all(&block[..1]).is_ok() {}
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let path = CString::new(self.directory.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; MNT_DETACH unmounts even if busy.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        let _ = std::fs::remove_dir_all(&self.directory);
    }
}

#[test]
fn a_full_file_system_is_refused_before_the_recording_starts() {
    let Some(full) = Tmpfs::mount("full", "256k") else {
        return;
    };
    full.fill();
    let target = Target::spawn("calltree", &["1"]);
    let pid = target.pid().to_string();
    let named = full.directory.join("profile.json");
    let named = named.to_str().unwrap();
    for (args, cwd) in [
        (
            vec!["record", &pid, "--root", "work_round", "-o", named],
            None,
        ),
        (
            vec!["record", &pid, "--root", "work_round"],
            Some(&full.directory),
        ),
    ] {
        let mut command = tendril();
        command.args(&args);
        if let Some(cwd) = cwd {
            command.current_dir(cwd);
        }
        let output = command.output().unwrap();
        let stderr = stderr_of(&output);
        assert!(!output.status.success(), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with("tendril: cannot write the profile to "),
            "{stderr}"
        );
        assert!(
            stderr.contains(": its file system is full (0 KiB free) — free some space"),
            "{stderr}"
        );
    }
    assert!(!has_agent(target.pid()), "the target was touched");
    let left: Vec<_> = std::fs::read_dir(&full.directory).unwrap().collect();
    assert_eq!(left.len(), 1, "only the filler: {left:?}");
}

#[test]
fn a_disk_that_fills_up_while_recording_loses_no_profile() {
    let Some(disk) = Tmpfs::mount("filling", "1m") else {
        return;
    };
    let mut target = Target::spawn("calltree", &["1"]);
    let pid = target.pid().to_string();
    let asked = disk.directory.join("profile.json");
    let mut command = tendril();
    command.args(["record", &pid, "--root", "work_round", "-o"]);
    command.arg(&asked);
    let recording = RunningTendril::start(command, "tendril: recording", START_TIMEOUT);
    disk.fill();
    // Whole rounds that began after the hooks went in (the lines printed while tendril
    // attached are dropped).
    target.whole_rounds(1, ROUND_TIMEOUT);
    recording.interrupt();
    let (status, _, stderr) = recording.wait();
    assert!(!status.success(), "{stderr}");
    let last = stderr.lines().last().unwrap();
    let prefix = format!(
        "tendril: cannot write the profile to {}: No space left on device (os error 28); it \
         is saved in ",
        asked.display()
    );
    let rest = last
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{stderr}"));
    let (saved, _) = rest.split_once(" instead (tendril report ").unwrap();
    let saved = Path::new(saved);
    assert!(
        saved.starts_with(tendril::commands::rescue::rescue_dir("/var/tmp"))
            || saved.starts_with(tendril::commands::rescue::rescue_dir("/tmp"))
            || saved.starts_with(tendril::commands::rescue::rescue_dir("/dev/shm")),
        "{stderr}"
    );
    let mode = std::fs::metadata(saved).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}", saved.display());
    let profile = Profile::load(saved).unwrap();
    assert!(common::node_at(&profile.merged.roots, &["work_round"]).is_some());
    std::fs::remove_file(saved).unwrap();
    // Nothing half-written is left where it was asked for.
    assert!(!asked.exists());
}
