//! `/proc/PID/maps`: which files are mapped where, and how to open them from outside.
//!
//! Mappings are grouped by path into mapped objects; only objects with at least one
//! executable mapping are code (this drops data files, fonts and the locale archive).
//! Files are opened through `/proc/PID/root/<path>`, so a target in another mount
//! namespace (a container) resolves its own paths; a file deleted or replaced since it
//! was mapped is reached through `/proc/PID/map_files/<start>-<end>` when permitted.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use super::error::SymbolError;

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub executable: bool,
    /// File offset of `start`.
    pub offset: u64,
    pub inode: u64,
    /// The path field, e.g. `/usr/lib/libc.so.6`, `[vdso]`, `/tmp/x (deleted)`, or empty.
    pub path: PathBuf,
}

impl Mapping {
    /// The mapped file, without a ` (deleted)` suffix; `None` for anonymous memory and
    /// kernel mappings such as `[stack]` or `[vdso]`.
    pub fn file(&self) -> Option<&std::path::Path> {
        let bytes = self.path.as_os_str().as_bytes();
        if !bytes.starts_with(b"/") || self.inode == 0 {
            return None;
        }
        let bytes = bytes.strip_suffix(b" (deleted)").unwrap_or(bytes);
        Some(std::path::Path::new(OsStr::from_bytes(bytes)))
    }

    /// The file name of the mapped file (`libc.so.6`).
    pub fn file_name(&self) -> Option<&str> {
        self.file()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
    }
}

/// What backs a group of mappings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectKind {
    /// A file; `deleted` when the maps line carried ` (deleted)`.
    File { deleted: bool },
    /// The kernel's `[vdso]` image, readable from `/proc/PID/mem`.
    Vdso,
}

/// All mappings of one file (or of the vDSO), in address order.
#[derive(Debug, Clone)]
pub struct MappedObject {
    /// The path as the target sees it, without ` (deleted)`; `[vdso]` for the vDSO.
    pub path: PathBuf,
    pub kind: ObjectKind,
    pub mappings: Vec<Mapping>,
}

/// Reads and parses `/proc/PID/maps`.
pub fn read_maps(pid: i32) -> Result<Vec<Mapping>, SymbolError> {
    let path = PathBuf::from(format!("/proc/{pid}/maps"));
    let text = std::fs::read(&path).map_err(|e| SymbolError::proc_io(pid, &path, e))?;
    text.split(|&b| b == b'\n')
        .enumerate()
        .filter(|(_, line)| !line.is_empty())
        .map(|(i, line)| {
            parse_line(line).ok_or_else(|| SymbolError::BadMaps {
                pid,
                line_no: i + 1,
                line: String::from_utf8_lossy(line).into_owned(),
            })
        })
        .collect()
}

/// Parses `start-end perms offset dev inode [path]`.
fn parse_line(line: &[u8]) -> Option<Mapping> {
    let mut rest = line;
    let mut field = || -> Option<&[u8]> {
        let trimmed = rest.trim_ascii_start();
        let end = trimmed
            .iter()
            .position(|b| b.is_ascii_whitespace())
            .unwrap_or(trimmed.len());
        let (f, r) = trimmed.split_at(end);
        rest = r;
        (!f.is_empty()).then_some(f)
    };
    let range = std::str::from_utf8(field()?).ok()?;
    let perms = field()?;
    let offset = std::str::from_utf8(field()?).ok()?;
    let _dev = field()?;
    let inode = std::str::from_utf8(field()?).ok()?;
    let (start, end) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        executable: perms.get(2) == Some(&b'x'),
        offset: u64::from_str_radix(offset, 16).ok()?,
        inode: inode.parse().ok()?,
        path: PathBuf::from(OsStr::from_bytes(rest.trim_ascii())),
    })
}

const DELETED: &[u8] = b" (deleted)";

/// Groups mappings into code objects: absolute-path files and `[vdso]` with at least
/// one executable mapping, in order of their lowest address.
pub fn code_objects(mappings: &[Mapping]) -> Vec<MappedObject> {
    let mut objects: Vec<MappedObject> = Vec::new();
    for m in mappings {
        let raw = m.path.as_os_str().as_bytes();
        let (path, kind) = if raw == b"[vdso]" {
            (m.path.clone(), ObjectKind::Vdso)
        } else if raw.starts_with(b"/") {
            match raw.strip_suffix(DELETED) {
                Some(p) => (
                    PathBuf::from(OsStr::from_bytes(p)),
                    ObjectKind::File { deleted: true },
                ),
                None => (m.path.clone(), ObjectKind::File { deleted: false }),
            }
        } else {
            continue;
        };
        match objects.iter_mut().find(|o| o.path == path) {
            Some(o) => o.mappings.push(m.clone()),
            None => objects.push(MappedObject {
                path,
                kind,
                mappings: vec![m.clone()],
            }),
        }
    }
    objects.retain(|o| o.mappings.iter().any(|m| m.executable) && !is_jitdump(&o.path));
    objects
}

/// A jitdump (`jit-PID.dump`): runtimes map it executable so that profilers find it,
/// but it is no code (`symbols::jit` reads it).
fn is_jitdump(path: &std::path::Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("jit-")?.strip_suffix(".dump"))
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

/// Opens the file behind `object` as the target sees it. Tries, in order:
/// `/proc/PID/root/<path>` (not for deleted files, and only if its inode is the mapped
/// one), `/proc/PID/map_files/<range>`, the rooted file despite an inode mismatch
/// (overlay file systems report other inodes), and the plain path.
pub fn open_object(pid: i32, object: &MappedObject) -> Result<File, SymbolError> {
    let ObjectKind::File { deleted } = object.kind else {
        return Err(SymbolError::io(
            &object.path,
            std::io::ErrorKind::Unsupported.into(),
        ));
    };
    let first = &object.mappings[0];
    let mut rooted = PathBuf::from(format!("/proc/{pid}/root"));
    rooted.push(object.path.strip_prefix("/").unwrap_or(&object.path));
    let rooted_file = match (!deleted).then(|| File::open(&rooted)) {
        Some(Ok(f)) if f.metadata().is_ok_and(|md| md.ino() == first.inode) => return Ok(f),
        other => other,
    };
    let by_range = format!("/proc/{pid}/map_files/{:x}-{:x}", first.start, first.end);
    if let Ok(f) = File::open(by_range) {
        return Ok(f);
    }
    match rooted_file {
        Some(Ok(f)) => Ok(f),
        Some(Err(rooted_err)) => {
            File::open(&object.path).map_err(|_| SymbolError::io(&rooted, rooted_err))
        }
        None => Err(SymbolError::Io {
            path: object.path.clone(),
            source: std::io::Error::other(
                "deleted after it was mapped, and /proc/PID/map_files is not readable \
                 — run as root to read deleted files",
            ),
        }),
    }
}

/// Reads `[start, end)` of the target's memory (used for the vDSO image).
pub fn read_memory(pid: i32, start: u64, end: u64) -> Result<Vec<u8>, SymbolError> {
    use std::os::unix::fs::FileExt;
    let path = PathBuf::from(format!("/proc/{pid}/mem"));
    let file = File::open(&path).map_err(|e| SymbolError::proc_io(pid, &path, e))?;
    let mut buf = vec![0u8; (end - start) as usize];
    file.read_exact_at(&mut buf, start)
        .map_err(|e| SymbolError::proc_io(pid, &path, e))?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn parses_lines() {
        let m = parse_line(
            b"7f1c2a400000-7f1c2a428000 r-xp 00028000 fd:01 1234   /usr/lib/my lib.so (deleted)",
        )
        .unwrap();
        assert_eq!(m.start, 0x7f1c2a400000);
        assert_eq!(m.end, 0x7f1c2a428000);
        assert!(m.executable);
        assert_eq!(m.offset, 0x28000);
        assert_eq!(m.inode, 1234);
        assert_eq!(m.path, Path::new("/usr/lib/my lib.so (deleted)"));
        let anon = parse_line(b"7ffd1000-7ffd2000 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!(anon.path, Path::new(""));
        assert!(parse_line(b"garbage").is_none());
    }

    #[test]
    fn groups_code_objects() {
        let maps = b"1000-2000 r--p 00000000 fd:01 7 /bin/x\n\
                     2000-3000 r-xp 00001000 fd:01 7 /bin/x\n\
                     3000-4000 r--p 00000000 fd:01 9 /usr/lib/locale/locale-archive\n\
                     5000-6000 r-xp 00000000 00:00 0 [vdso]\n\
                     6000-7000 r-xp 00000000 fd:01 8 /tmp/gone (deleted)\n\
                     8000-9000 r-xp 00000000 fd:01 10 /srv/jit-42.dump\n";
        let mappings: Vec<_> = maps
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| parse_line(l).unwrap())
            .collect();
        let objects = code_objects(&mappings);
        let paths: Vec<_> = objects.iter().map(|o| o.path.to_str().unwrap()).collect();
        assert_eq!(paths, ["/bin/x", "[vdso]", "/tmp/gone"]);
        assert_eq!(objects[0].mappings.len(), 2);
        assert_eq!(objects[2].kind, ObjectKind::File { deleted: true });
    }
}
