//! Removing the files of processes that are gone from a user's runtime directories.
//!
//! Each file an agent makes belongs to one process, named by its pid: its control
//! socket and startup-error note (`agent-PID.sock`, `agent-PID.err`), a function table
//! being handed over (`functions-PID-TOKEN.bin`) and its event rings
//! (`rings-PID-SESSION.shm`, in memory). A process killed outright, or one that simply
//! exits, cannot remove them, so every attach removes those whose process no longer
//! exists. The agent library itself is shared and stays.

use crate::process::TargetProcess;
use std::path::Path;

/// Removes, from the runtime directories of `target`'s user, the files of processes
/// that no longer exist. The pids in the names are those of the target's pid
/// namespace: they can only be checked from inside it, so for a target in another
/// namespace nothing is removed.
pub fn sweep(target: &TargetProcess) {
    if target.ns_pid != target.pid {
        return;
    }
    for dir in [
        tendril_wire::runtime_dir(target.uid),
        tendril_wire::rings::shm_dir(target.uid),
    ] {
        sweep_dir(&target.path_in_target(&dir), process_exists);
    }
}

fn process_exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes the files in `dir` whose owner, by `exists`, is gone.
fn sweep_dir(dir: &Path, exists: impl Fn(i32) -> bool) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if let Some(pid) = name.to_str().and_then(owner_pid)
            && !exists(pid)
        {
            let _ = std::fs::remove_file(entry.path());
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
    fn only_files_of_gone_processes_are_removed() {
        let dir = std::env::temp_dir().join(format!("tendril-sweep-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
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
        sweep_dir(&dir, |pid| pid == 20);
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
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
