//! The symbol cache as a user relies on it: `tendril symbols` prints exactly what a
//! fresh parse prints whether the index is written, read, damaged or refused; the
//! cache is really used; and a cache directory planted as a link by another user is
//! never written through.

use crate::common;

use std::os::unix::fs::{PermissionsExt, lchown};
use std::path::{Path, PathBuf};

use common::{Target, tendril};

/// The unprivileged user that plants links (`nobody`).
const OTHER_USER: u32 = 65534;

/// A fresh private directory for one test.
fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tendril-cache-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

/// `tendril symbols PID --json` with the cache at `cache` (`off` for none).
fn symbols_json(pid: i32, cache: &Path) -> String {
    let out = tendril()
        .args(["symbols", &pid.to_string(), "--json"])
        .env("TENDRIL_CACHE_DIR", cache)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The index files in `dir`.
fn index_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "idx"))
        .collect();
    files.sort();
    files
}

#[test]
fn the_cache_is_written_then_read_and_lists_what_a_fresh_parse_lists() {
    let target = Target::spawn("calltree", &["1"]);
    let base = scratch("same");
    let cache = base.join("tendril");
    let fresh = symbols_json(target.pid(), Path::new("off"));
    assert!(fresh.contains("\"compute_block\""));

    let cold = symbols_json(target.pid(), &cache);
    assert_eq!(cold, fresh, "the cold run (which writes the cache) differs");
    let files = index_files(&cache);
    // calltree, libc and the dynamic loader all carry build ids.
    assert!(files.len() >= 3, "index files: {files:?}");
    let mode = std::fs::metadata(&cache).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);

    // Proof the warm run reads the index: one whose functions were renamed (and whose
    // checksum was recomputed, so it is whole) shows the new names.
    let calltree = files
        .iter()
        .find(|f| {
            std::fs::read(f)
                .unwrap()
                .windows(13)
                .any(|w| w == b"compute_block")
        })
        .expect("an index holds calltree's functions");
    let mut bytes = std::fs::read(calltree).unwrap();
    rename_in_index(&mut bytes, b"compute_block", b"compute_blocX");
    std::fs::write(calltree, &bytes).unwrap();
    let warm = symbols_json(target.pid(), &cache);
    assert!(
        warm.contains("\"compute_blocX\""),
        "the warm run did not use the cache"
    );
    std::fs::remove_dir_all(&base).unwrap();
}

/// Replaces `from` by `to` (same length) in an index's string table and puts a valid
/// checksum back, as a stand-in for a file only the cache could have answered from.
fn rename_in_index(bytes: &mut [u8], from: &[u8], to: &[u8]) {
    let payload = 24;
    let mut i = payload;
    while i + from.len() <= bytes.len() {
        if &bytes[i..i + from.len()] == from {
            bytes[i..i + from.len()].copy_from_slice(to);
        }
        i += 1;
    }
    let crc = crc32fast::hash(&bytes[payload..]);
    bytes[12..16].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn a_damaged_cache_file_is_ignored() {
    let target = Target::spawn("calltree", &["1"]);
    let base = scratch("damaged");
    let cache = base.join("tendril");
    let fresh = symbols_json(target.pid(), Path::new("off"));
    symbols_json(target.pid(), &cache);
    let files = index_files(&cache);
    assert!(!files.is_empty());
    for (i, file) in files.iter().enumerate() {
        let mut bytes = std::fs::read(file).unwrap();
        match i % 3 {
            0 => bytes.truncate(bytes.len() / 2),
            1 => {
                let last = bytes.len() - 1;
                bytes[last] ^= 0x55;
            }
            _ => bytes = b"TNDRSYM\0garbage".to_vec(),
        }
        std::fs::write(file, bytes).unwrap();
    }
    assert_eq!(symbols_json(target.pid(), &cache), fresh);
    // The damaged files were replaced by whole ones, which are then read.
    assert_eq!(symbols_json(target.pid(), &cache), fresh);
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn a_cache_directory_planted_as_a_link_by_another_user_is_not_followed() {
    let target = Target::spawn("calltree", &["1"]);
    let base = scratch("link");
    let victim = base.join("victim");
    std::fs::create_dir(&victim).unwrap();
    let cache = base.join("tendril");
    std::os::unix::fs::symlink(&victim, &cache).unwrap();
    lchown(&cache, Some(OTHER_USER), Some(OTHER_USER)).unwrap();
    let fresh = symbols_json(target.pid(), Path::new("off"));

    assert_eq!(symbols_json(target.pid(), &cache), fresh);
    assert!(
        std::fs::read_dir(&victim).unwrap().next().is_none(),
        "something was written through the link"
    );
    assert!(std::fs::symlink_metadata(&cache).unwrap().is_symlink());

    // A real directory that another user owns is not used either.
    std::fs::remove_file(&cache).unwrap();
    std::fs::create_dir(&cache).unwrap();
    std::os::unix::fs::chown(&cache, Some(OTHER_USER), Some(OTHER_USER)).unwrap();
    assert_eq!(symbols_json(target.pid(), &cache), fresh);
    assert!(
        index_files(&cache).is_empty(),
        "wrote into another user's directory"
    );
    std::fs::remove_dir_all(&base).unwrap();
}
