//! The process picker's list: every user-space process tendril could attach to, read
//! from `/proc`.
//!
//! The one idea: the list is a plain scan of `/proc/<pid>/{stat,status,cmdline}`, tolerant
//! of processes that exit mid-scan (they are skipped); kernel threads, zombies and tendril
//! itself are left out because nobody can attach to them.

use std::collections::HashMap;
use tendril_tui::ProcessEntry;

/// `PF_KTHREAD` in `/proc/PID/stat`'s flags field.
const PF_KTHREAD: u64 = 0x0020_0000;

/// The running user-space processes, by pid, tendril itself excluded.
pub fn list_processes() -> Vec<ProcessEntry> {
    let own_pid = std::process::id();
    let mut users = UserNames::default();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut processes: Vec<ProcessEntry> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != own_pid)
        .filter_map(|pid| read_process(pid, &mut users))
        .collect();
    processes.sort_by_key(|process| process.pid);
    processes
}

/// One process, or `None` if it is gone, a kernel thread or a zombie.
fn read_process(pid: u32, users: &mut UserNames) -> Option<ProcessEntry> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (before, after) = stat.rsplit_once(')')?;
    let comm = before.split_once('(').map_or("", |(_, comm)| comm);
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields after the command name: state is the first, flags the seventh.
    let state = fields.first()?;
    let flags: u64 = fields.get(6)?.parse().ok()?;
    if flags & PF_KTHREAD != 0 || matches!(*state, "Z" | "X" | "x") {
        return None;
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |key: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
            .map(str::trim)
    };
    let uid: u32 = field("Uid")?.split_whitespace().next()?.parse().ok()?;
    let threads = field("Threads").and_then(|t| t.parse().ok()).unwrap_or(1);
    let command_line = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|bytes| command_line(&bytes))
        .unwrap_or_default();
    Some(ProcessEntry {
        pid,
        user: users.name(uid),
        threads,
        command_line: if command_line.is_empty() {
            format!("[{comm}]")
        } else {
            command_line
        },
    })
}

/// `/proc/PID/cmdline` (NUL-separated arguments) as one line.
fn command_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let words: Vec<&str> = text.split('\0').filter(|word| !word.is_empty()).collect();
    words.join(" ")
}

/// User names by uid, looked up once each (`/etc/passwd` or whatever NSS says).
#[derive(Default)]
struct UserNames(HashMap<u32, String>);

impl UserNames {
    fn name(&mut self, uid: u32) -> String {
        self.0
            .entry(uid)
            .or_insert_with(|| {
                nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                    .ok()
                    .flatten()
                    .map_or_else(|| uid.to_string(), |user| user.name)
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_has_real_processes_but_not_tendril_or_kernel_threads() {
        let processes = list_processes();
        let own = std::process::id();
        assert!(processes.iter().all(|p| p.pid != own));
        // pid 2 is kthreadd on Linux, the parent of every kernel thread.
        assert!(processes.iter().all(|p| p.pid != 2));
        assert!(processes.windows(2).all(|w| w[0].pid < w[1].pid));
        // Our parent (cargo's test runner or a shell) is a user-space process.
        let parent = nix::unistd::getppid().as_raw() as u32;
        let entry = processes
            .iter()
            .find(|p| p.pid == parent)
            .unwrap_or_else(|| panic!("parent {parent} missing from {processes:?}"));
        assert!(entry.threads >= 1);
        assert!(!entry.command_line.is_empty());
        let my_user = nix::unistd::User::from_uid(nix::unistd::getuid())
            .unwrap()
            .map_or_else(|| nix::unistd::getuid().to_string(), |u| u.name);
        assert_eq!(entry.user, my_user);
    }

    #[test]
    fn command_lines_are_joined_with_spaces() {
        assert_eq!(command_line(b"calltree\x004\x00"), "calltree 4");
        assert_eq!(command_line(b""), "");
    }
}
