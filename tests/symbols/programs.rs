//! Programs the symbol tests run besides the common fixtures: variant builds of
//! `calltree.c` and copies of fixtures, started and killed like `common::Target`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Builds `fixtures/calltree.c` with extra link options into `dir`.
pub fn build_calltree_variant(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/calltree.c");
    let out = dir.join(name);
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-pthread"])
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&source)
        .status()
        .expect("cannot run gcc");
    assert!(status.success(), "gcc {flags:?} failed");
    out
}

/// Spawns a program file that this test process has just written. Another test thread
/// forking at that moment briefly holds the file open for writing in its child, and
/// `exec` then fails with ETXTBSY until that child has exec'd in turn: retry a while.
fn spawn_fresh_copy(command: &mut Command) -> Child {
    let mut attempts = 0;
    loop {
        match command.spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && attempts < 100 => {
                attempts += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            result => return result.expect("cannot start the program"),
        }
    }
}

/// A program that is not one of the common fixtures (a copy, a variant build), started
/// and waited for until its `ready` line; killed and reaped on drop.
pub struct Program {
    child: Child,
}

impl Program {
    pub fn start(path: &Path) -> Program {
        let mut child = spawn_fresh_copy(Command::new(path).arg("1").stdout(Stdio::piped()));
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let program = Program { child };
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert!(line.starts_with("ready"), "{}: {line}", path.display());
        // Keep reading so the program never blocks on (or dies of) a full or closed pipe.
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        program
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
