//! The JIT symbols of this test process: its own perf map and jitdump, written as a
//! runtime writes them, and read as they grow.

use super::*;
use std::io::Write;

fn own_pid() -> i32 {
    std::process::id() as i32
}

#[test]
fn later_code_replaces_what_it_overlaps() {
    let mut jit = JitSymbols::new(own_pid());
    assert!(jit.insert(0x1000, 0x100, "a".into()));
    assert!(jit.insert(0x1100, 0x100, "b".into()));
    assert!(jit.insert(0x1200, 0x100, "c".into()));
    assert_eq!(jit.lookup(0x10ff), Some((0x1000, "a")));
    assert_eq!(jit.lookup(0x1300), None);
    // Code reused: one new function over the end of `a` and all of `b`.
    assert!(jit.insert(0x1080, 0x100, "d".into()));
    assert_eq!(jit.lookup(0x1000), None);
    assert_eq!(jit.lookup(0x1150), Some((0x1080, "d")));
    assert_eq!(jit.lookup(0x1180), None);
    assert_eq!(jit.lookup(0x1200), Some((0x1200, "c")));
    assert!(!jit.insert(0x2000, 0, "empty".into()));
    assert_eq!(jit.len(), 2);
}

/// This process's perf map and jitdump, removed when the test ends.
struct OwnFiles {
    map: PathBuf,
    dump: PathBuf,
}

impl Drop for OwnFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.map);
        let _ = std::fs::remove_file(&self.dump);
    }
}

/// One test for both files: they are named by this process's pid.
#[test]
fn a_perf_map_and_a_jitdump_are_read_as_they_grow() {
    let pid = own_pid();
    let files = OwnFiles {
        map: PathBuf::from(format!("/tmp/perf-{pid}.map")),
        dump: std::env::temp_dir().join(format!("jit-{pid}.dump")),
    };
    // Code none names yet: anonymous and executable.
    let code = memmap2::MmapMut::map_anon(4096)
        .unwrap()
        .make_exec()
        .unwrap();
    let at = code.as_ptr() as u64;
    let mut jit = JitSymbols::for_process(pid);
    assert_eq!(
        jit.name_at(at + 5),
        Some(JitName {
            name: format!("[jit] {:#x}", at + 5),
            start: None
        })
    );
    assert_eq!(jit.name_at(8), None);

    let mut map = std::fs::File::create(&files.map).unwrap();
    write!(
        map,
        "{at:x} 10 py::top:/srv/app.py\n{:x} 10 py::le",
        at + 0x10
    )
    .unwrap();
    assert!(jit.refresh());
    assert_eq!(jit.name_at(at + 4).unwrap().name, "py::top:/srv/app.py");
    assert_eq!(
        jit.name_at(at + 0x14).unwrap().name,
        format!("[jit] {:#x}", at + 0x14)
    );
    // The rest of the line.
    writeln!(map, "af:/srv/app.py").unwrap();
    let generation = jit.generation();
    assert!(jit.refresh());
    assert!(jit.generation() > generation);
    assert_eq!(
        jit.name_at(at + 0x14),
        Some(JitName {
            name: "py::leaf:/srv/app.py".into(),
            start: Some(at + 0x10)
        })
    );
    assert!(!jit.refresh(), "nothing new");

    // A jitdump, mapped executable as runtimes map theirs.
    let mut dump = jitdump::writer::header();
    dump.extend(jitdump::writer::load(
        at + 0x100,
        0x40,
        "jit_function",
        &[0xc3],
    ));
    std::fs::write(&files.dump, &dump).unwrap();
    let marker = std::fs::File::open(&files.dump).unwrap();
    // SAFETY: a private, read-only mapping of a file this test wrote and keeps.
    let mapped = unsafe { memmap2::MmapOptions::new().map_exec(&marker) }.unwrap();
    assert!(jit.refresh());
    assert_eq!(jit.lookup(at + 0x120), Some((at + 0x100, "jit_function")));
    // It grows: the code moved.
    dump.extend(jitdump::writer::moved(at + 0x100, at + 0x200, 0x40));
    std::fs::write(&files.dump, &dump).unwrap();
    assert!(jit.refresh());
    assert_eq!(jit.lookup(at + 0x120), None);
    assert_eq!(jit.lookup(at + 0x220), Some((at + 0x200, "jit_function")));
    let sources: Vec<PathBuf> = jit.sources().into_iter().map(|(path, _)| path).collect();
    assert_eq!(sources, [files.map.clone(), files.dump.clone()]);
    assert!(jit.take_notes().is_empty());
    drop(mapped);
}
