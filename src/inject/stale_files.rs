//! Removing the files of processes that are gone from a user's runtime directory.
//!
//! Each file an agent makes belongs to one process, named by its pid: its control
//! socket and startup-error note (`agent-PID.sock`, `agent-PID.err`). Older tendril
//! builds also left function tables and rings files (`functions-PID-…` there,
//! `rings-PID-…` in `/dev/shm/tendril-UID`); they are swept the same way. A process killed outright, or one that simply exits,
//! cannot remove them, so every attach removes those whose process no longer exists.
//!
//! The directory is the target user's: it is held open (see `runtime_dir`) and names
//! are removed with `unlinkat` relative to it, which removes a link itself and never
//! follows one, so nothing outside the directory can be removed through it.

use super::runtime_dir;
use crate::process::TargetProcess;
use nix::unistd::{UnlinkatFlags, unlinkat};
use std::os::fd::OwnedFd;
use std::path::Path;

/// Removes, from the runtime directory of `target`'s user, the files of processes that
/// no longer exist. The pids in the names are those of the target's pid namespace:
/// they can only be checked from inside it, so for a target in another namespace
/// nothing is removed.
pub fn sweep(target: &TargetProcess) {
    if target.ns_pid != target.pid {
        return;
    }
    let legacy_rings = std::path::PathBuf::from(format!("/dev/shm/tendril-{}", target.uid));
    for path in [tendril_wire::runtime_dir(target.uid), legacy_rings] {
        if let Some(dir) = runtime_dir::open_private_dir(target, &path) {
            sweep_dir(&dir, process_exists);
        }
    }
}

fn process_exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes the files in the held directory `dir` whose owner, by `exists`, is gone.
fn sweep_dir(dir: &OwnedFd, exists: impl Fn(i32) -> bool) {
    use std::os::fd::AsRawFd;
    // The held descriptor's own entry in /proc names the directory that was opened,
    // not the path it was opened by.
    let Ok(entries) = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if let Some(pid) = name.to_str().and_then(owner_pid)
            && !exists(pid)
        {
            let _ = unlinkat(dir, name.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
    }
}

/// The pid a per-process file belongs to, from its name.
fn owner_pid(name: &str) -> Option<i32> {
    let rest = ["agent-", "functions-", "rings-"]
        .iter()
        .find_map(|prefix| name.strip_prefix(prefix))?;
    rest.split(['-', '.']).next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_give_their_owners() {
        assert_eq!(owner_pid("agent-4242.sock"), Some(4242));
        assert_eq!(owner_pid("agent-4242.err"), Some(4242));
        assert_eq!(owner_pid("functions-17-99.bin"), Some(17));
        assert_eq!(owner_pid("rings-8-3.shm"), Some(8));
        assert_eq!(owner_pid("libtendril_agent-0123abcd.so"), None);
        assert_eq!(owner_pid("agent-x.sock"), None);
    }

    #[test]
    fn only_files_of_gone_processes_are_removed_and_links_are_not_followed() {
        let base = std::env::temp_dir().join(format!("tendril-sweep-test-{}", std::process::id()));
        let dir = base.join("dir");
        let outside = base.join("outside");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&outside, b"keep").unwrap();
        let names = [
            "agent-10.sock",
            "agent-10.err",
            "rings-10-1.shm",
            "functions-10-5.bin",
            "agent-20.sock",
            "rings-20-2.shm",
            "libtendril_agent-abc.so",
        ];
        for name in names {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        std::os::unix::fs::symlink(&outside, dir.join("agent-30.err")).unwrap();
        let held: OwnedFd = std::fs::File::open(&dir).unwrap().into();
        sweep_dir(&held, |pid| pid == 20);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["agent-20.sock", "libtendril_agent-abc.so", "rings-20-2.shm"]
        );
        assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
        std::fs::remove_dir_all(&base).unwrap();
    }
}
