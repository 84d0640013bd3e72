//! The process picker's list: every user-space process tendril could attach to, read
//! from `/proc`.
//!
//! The one idea: the list is a plain scan of `/proc/<pid>/{stat,status,cmdline}`, tolerant
//! of processes that exit mid-scan (they are skipped); kernel threads, zombies and tendril
//! itself are left out because nobody can attach to them.

use crate::process::{StatLine, status_field};
use std::collections::HashMap;
use tendril_tui::ProcessEntry;

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

/// The process picker's entry for one process, or `None` if it is gone, a kernel
/// thread or a zombie.
pub fn process_entry(pid: u32) -> Option<ProcessEntry> {
    read_process(pid, &mut UserNames::default())
}

/// One process, or `None` if it is gone, a kernel thread or a zombie.
fn read_process(pid: u32, users: &mut UserNames) -> Option<ProcessEntry> {
    let stat_text = crate::process::read_proc_text(format!("/proc/{pid}/stat")).ok()?;
    let stat = StatLine::parse(&stat_text)?;
    if stat.is_kernel_thread() || stat.has_exited() {
        return None;
    }
    let status = crate::process::read_proc_text(format!("/proc/{pid}/status")).ok()?;
    let uid: u32 = status_field(&status, "Uid")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let threads = status_field(&status, "Threads")
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    let command_line = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|bytes| command_line(&bytes))
        .unwrap_or_default();
    Some(ProcessEntry {
        pid,
        user: users.name(uid),
        threads,
        command_line: if command_line.is_empty() {
            format!("[{}]", stat.comm)
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
    fn one_process_reads_like_its_row_in_the_list() {
        let parent = nix::unistd::getppid().as_raw() as u32;
        let entry = process_entry(parent).expect("our parent is a user-space process");
        let listed = list_processes()
            .into_iter()
            .find(|p| p.pid == parent)
            .expect("our parent is listed");
        // The thread count may change between the two reads; the rest cannot.
        assert_eq!(
            (&entry.user, &entry.command_line),
            (&listed.user, &listed.command_line)
        );
        // pid 2 is kthreadd, a kernel thread.
        assert_eq!(process_entry(2), None);
    }

    #[test]
    fn command_lines_are_joined_with_spaces() {
        assert_eq!(command_line(b"calltree\x004\x00"), "calltree 4");
        assert_eq!(command_line(b""), "");
    }
}
