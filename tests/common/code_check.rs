//! `code_bytes_match_file`: proof that a process runs exactly the code of its files.
//!
//! The one idea: an executable, file-backed, private mapping (`r-xp`) of a correct
//! process holds the file's bytes unchanged, so reading it through `/proc/PID/mem` and
//! comparing it with the file finds every byte a patcher left behind.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// One line of `/proc/PID/maps`.
struct Mapping<'a> {
    start: u64,
    end: u64,
    perms: &'a str,
    offset: u64,
    path: &'a str,
}

impl<'a> Mapping<'a> {
    /// Parses `start-end perms offset dev inode [path]`; the path may contain spaces.
    fn parse(line: &'a str) -> Option<Mapping<'a>> {
        let mut rest = line;
        let mut field = || {
            let trimmed = rest.trim_start();
            let end = trimmed.find(' ').unwrap_or(trimmed.len());
            rest = &trimmed[end..];
            &trimmed[..end]
        };
        let (start, end) = field().split_once('-')?;
        let perms = field();
        let offset = field();
        let (_device, _inode) = (field(), field());
        Some(Mapping {
            start: u64::from_str_radix(start, 16).ok()?,
            end: u64::from_str_radix(end, 16).ok()?,
            perms,
            offset: u64::from_str_radix(offset, 16).ok()?,
            path: rest.trim(),
        })
    }
}

/// Checks every executable file-backed mapping of process `pid` (`r-xp`, backed by a
/// regular file, except the tendril agent `libtendril_agent*`): its bytes in memory must
/// equal the file's bytes at the mapping's offset, up to the end of the file. The file is
/// opened through `/proc/PID/map_files`, so it is the very file mapped even if its path
/// has since been replaced. Returns the first difference found, naming the module, the
/// file offset and the address. Needs the right to read the process's memory (root).
pub fn code_bytes_match_file(pid: i32) -> Result<(), String> {
    check_mappings(pid, |path| !path.contains("libtendril_agent"))
}

/// Waits (up to `timeout`) until `tendril status PID` shows no hook of tendril's waiting
/// to come out (`pending_restore`): a restore may leave the unwinder's hooks in while a
/// thread is inside tendril's code, and they come out by themselves just after.
pub fn wait_until_no_hook_is_left_in(pid: i32, timeout: std::time::Duration) {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let output = super::tendril()
            .args(["status", &pid.to_string()])
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let status = String::from_utf8_lossy(&output.stdout).into_owned();
        if !status.contains("pending_restore") {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the hooks stayed in: {status}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The same check for the tendril agent's own library only: the functions of its own
/// that it hooks to calibrate (at a recording's start, and on the target's threads
/// while it runs) must have their bytes back once the recording is over.
#[allow(dead_code)]
pub fn agent_code_matches_file(pid: i32) -> Result<(), String> {
    check_mappings(pid, |path| path.contains("libtendril_agent"))
}

fn check_mappings(pid: i32, chosen: impl Fn(&str) -> bool) -> Result<(), String> {
    let maps_path = format!("/proc/{pid}/maps");
    let maps =
        std::fs::read_to_string(&maps_path).map_err(|e| format!("cannot read {maps_path}: {e}"))?;
    let mem_path = format!("/proc/{pid}/mem");
    let mem = File::open(&mem_path).map_err(|e| format!("cannot open {mem_path}: {e}"))?;

    let mut checked = 0;
    for mapping in maps.lines().filter_map(Mapping::parse) {
        if mapping.perms != "r-xp" || !mapping.path.starts_with('/') || !chosen(mapping.path) {
            continue;
        }
        let module = mapping.path.trim_end_matches(" (deleted)");
        let mapped_file = format!(
            "/proc/{pid}/map_files/{:x}-{:x}",
            mapping.start, mapping.end
        );
        let Ok(file) = File::open(&mapped_file) else {
            continue;
        };
        let Ok(metadata) = file.metadata() else {
            continue;
        };
        if !metadata.is_file() || mapping.offset >= metadata.len() {
            continue;
        }
        let len = (mapping.end - mapping.start).min(metadata.len() - mapping.offset);

        let mut in_file = vec![0; len as usize];
        file.read_exact_at(&mut in_file, mapping.offset)
            .map_err(|e| format!("cannot read {module} at offset {:#x}: {e}", mapping.offset))?;
        let mut in_memory = vec![0; len as usize];
        mem.read_exact_at(&mut in_memory, mapping.start)
            .map_err(|e| {
                format!(
                    "cannot read {mem_path} at {:#x} ({module}): {e}",
                    mapping.start
                )
            })?;

        if let Some(first) = in_memory.iter().zip(&in_file).position(|(m, f)| m != f) {
            let differing = in_memory
                .iter()
                .zip(&in_file)
                .filter(|(m, f)| m != f)
                .count();
            let runs: Vec<String> = (0..in_memory.len())
                .filter(|&i| {
                    in_memory[i] != in_file[i] && (i == 0 || in_memory[i - 1] == in_file[i - 1])
                })
                .take(12)
                .map(|i| format!("+{:#x}", mapping.offset + i as u64))
                .collect();
            return Err(format!(
                "{module}+{:#x} (address {:#x}) holds {:#04x} in memory but {:#04x} in the file; \
                 {differing} byte(s) of this mapping differ, in runs from {}",
                mapping.offset + first as u64,
                mapping.start + first as u64,
                in_memory[first],
                in_file[first],
                runs.join(" "),
            ));
        }
        checked += 1;
    }
    if checked == 0 {
        return Err(format!(
            "process {pid} has no executable file-backed mapping to check"
        ));
    }
    Ok(())
}
