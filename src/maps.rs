//! Parsing `/proc/PID/maps`: the target's memory mappings.

use std::path::PathBuf;

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub readable: bool,
    pub writable: bool,
    pub executable: bool,
    /// Offset of the mapping in its file.
    pub offset: u64,
    /// The file, as a path inside the target's mount namespace; `None` for anonymous
    /// mappings and pseudo-mappings such as `[stack]` (see `pseudo`).
    pub path: Option<PathBuf>,
    /// `[stack]`, `[heap]`, `[vdso]`… for kernel-named mappings.
    pub pseudo: Option<String>,
    /// The file was deleted (or replaced) after it was mapped.
    pub deleted: bool,
}

impl Mapping {
    pub fn contains(&self, address: u64) -> bool {
        (self.start..self.end).contains(&address)
    }

    /// The file name part of the path (`libc.so.6`), if file-backed.
    pub fn file_name(&self) -> Option<&str> {
        self.path
            .as_ref()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
    }
}

/// Reads and parses `/proc/PID/maps`.
pub fn read_maps(pid: i32) -> std::io::Result<Vec<Mapping>> {
    Ok(parse_maps(&std::fs::read_to_string(format!(
        "/proc/{pid}/maps"
    ))?))
}

/// Parses the text of a maps file; malformed lines are skipped.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mapping> {
    // address perms offset dev inode pathname — the pathname may contain spaces.
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?.as_bytes();
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let _device = fields.next()?;
    let inode: u64 = fields.next()?.parse().ok()?;
    let name = fields.next().unwrap_or("").trim_start();
    let (path, pseudo, deleted) = if name.starts_with('[') {
        (None, Some(name.to_string()), false)
    } else if name.starts_with('/') && inode != 0 {
        match name.strip_suffix(" (deleted)") {
            Some(stripped) => (Some(PathBuf::from(stripped)), None, true),
            None => (Some(PathBuf::from(name)), None, false),
        }
    } else {
        (None, None, false)
    };
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        readable: perms.first() == Some(&b'r'),
        writable: perms.get(1) == Some(&b'w'),
        executable: perms.get(2) == Some(&b'x'),
        offset,
        path,
        pseudo,
        deleted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_files_pseudo_and_anonymous_mappings() {
        let text = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234 /usr/bin/my prog
7f0000000000-7f0000021000 r-xp 00001000 fd:01 99 /lib/libc.so.6 (deleted)
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
7f1000000000-7f1000001000 rw-p 00000000 00:00 0 
";
        let maps = parse_maps(text);
        assert_eq!(maps.len(), 4);
        assert_eq!(
            maps[0].path.as_deref(),
            Some(std::path::Path::new("/usr/bin/my prog"))
        );
        assert!(maps[1].executable && maps[1].deleted && maps[1].offset == 0x1000);
        assert_eq!(maps[1].file_name(), Some("libc.so.6"));
        assert_eq!(maps[2].pseudo.as_deref(), Some("[stack]"));
        assert!(maps[3].path.is_none() && maps[3].pseudo.is_none());
        assert!(maps[2].contains(0x7ffd00000010) && !maps[2].contains(0x7ffd00021000));
    }
}
