//! Builds the fixture programs of `fixtures/` on first use, into `target/fixtures/`.
//!
//! The one idea: many tests, in several processes, may want the same fixture at the same
//! time, so every build runs in a scratch directory of its own and its result is
//! `rename`d into place, which is atomic. A fixture is rebuilt when its binary is older
//! than its source or than this file (which holds the build commands).

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::SystemTime;

/// How a fixture is built from its source file in `fixtures/`.
enum Recipe {
    /// `gcc -O2 -g -pthread` (GCC rather than `cc`: the fixtures rely on GCC's `-fipa-ra`).
    C,
    /// `gcc -O2 -g -pthread -fexceptions`: C whose cleanups (`pthread_cleanup_push`)
    /// are landing pads of the unwinder, as C++ destructors are.
    CExceptions,
    /// `gcc -O2 -g -static`: no dynamic loader, no libc.so.
    CStatic,
    /// `gcc -O2 -g -pthread ... -ldl`: C that loads libraries with `dlopen`.
    CDlopen,
    /// `gcc -O2 -g -shared -fPIC`: a shared library (the fixture's name is its file name).
    CSharedLibrary,
    /// `g++ -O2 -g -shared -fPIC` of the named source into `lib<stem>.so` next to the
    /// program, then the program linked with it (`-Wl,-rpath,$ORIGIN`).
    CxxWithLibrary(&'static str),
    /// `gcc -O2 -g -fomit-frame-pointer -pthread`: only `.eh_frame` can unwind it.
    CNoFramePointers,
    /// `gcc -O2 -g -pthread` of the source and the named second one into one program.
    CTwoUnits(&'static str),
    /// `g++ -O2 -g -pthread`.
    Cxx,
    /// `rustc -O -g --edition 2021 -C panic=unwind`.
    Rust,
    /// `strip` applied to the already built fixture named here (it keeps `.eh_frame`).
    StrippedCopyOf(&'static str),
    /// `as --32` and `ld -m elf_i386`: a 32-bit program without libc.
    I386,
    /// `CGO_ENABLED=0 go build` of one file: a static Go program (no `.eh_frame`).
    Go,
    /// The same with `-ldflags=-s`: no symbol table, only `.gopclntab` names functions.
    GoStripped,
    /// `go build` of the package in the directory `source` (a `go.mod`, Go and C
    /// files): a cgo program, dynamically linked with libc.
    GoPackage,
}

struct Fixture {
    name: &'static str,
    source: &'static str,
    recipe: Recipe,
}

const FIXTURES: [Fixture; 39] = [
    Fixture {
        name: "throw_through",
        source: "throw_through.cpp",
        recipe: Recipe::Cxx,
    },
    Fixture {
        name: "branches",
        source: "branches.c",
        recipe: Recipe::C,
    },
    Fixture {
        name: "indirect",
        source: "indirect.c",
        recipe: Recipe::CDlopen,
    },
    Fixture {
        name: "indirect_plugin.so",
        source: "indirect_plugin.c",
        recipe: Recipe::CSharedLibrary,
    },
    Fixture {
        name: "virtuals",
        source: "virtuals.cpp",
        recipe: Recipe::CxxWithLibrary("virtuals_codec.cpp"),
    },
    Fixture {
        name: "rust_dyn",
        source: "rust_dyn.rs",
        recipe: Recipe::Rust,
    },
    Fixture {
        name: "calltree",
        source: "calltree.c",
        recipe: Recipe::C,
    },
    Fixture {
        name: "calltree_stripped",
        source: "calltree.c",
        recipe: Recipe::StrippedCopyOf("calltree"),
    },
    Fixture {
        name: "exceptions",
        source: "exceptions.cpp",
        recipe: Recipe::Cxx,
    },
    Fixture {
        name: "rust_panics",
        source: "rust_panics.rs",
        recipe: Recipe::Rust,
    },
    Fixture {
        name: "blocked",
        source: "blocked.c",
        recipe: Recipe::C,
    },
    Fixture {
        name: "mallocs",
        source: "mallocs.c",
        recipe: Recipe::C,
    },
    Fixture {
        name: "unwinding",
        source: "unwinding.c",
        recipe: Recipe::CExceptions,
    },
    Fixture {
        name: "stale_exit",
        source: "stale_exit.c",
        recipe: Recipe::C,
    },
    Fixture {
        name: "tightcall",
        source: "tightcall.c",
        recipe: Recipe::C,
    },
    Fixture {
        name: "timed",
        source: "timed.c",
        recipe: Recipe::C,
    },
    Fixture {
        name: "off_cpu",
        source: "off_cpu.c",
        recipe: Recipe::C,
    },
    Fixture {
        name: "descend",
        source: "descend.c",
        recipe: Recipe::C,
    },
    Fixture {
        name: "manyfuncs",
        source: "manyfuncs.c",
        recipe: Recipe::C,
    },
    Fixture {
        name: "departing",
        source: "departing.c",
        recipe: Recipe::C,
    },
    Fixture {
        name: "static_loop",
        source: "static_loop.c",
        recipe: Recipe::CStatic,
    },
    Fixture {
        name: "coroutines",
        source: "coroutines.c",
        recipe: Recipe::C,
    },
    Fixture {
        name: "forking",
        source: "forking.c",
        recipe: Recipe::C,
    },
    Fixture {
        name: "hooked_threads",
        source: "hooked_threads.c",
        recipe: Recipe::C,
    },
    Fixture {
        name: "sampled",
        source: "sampled.c",
        recipe: Recipe::CNoFramePointers,
    },
    Fixture {
        name: "jit",
        source: "jit.c",
        recipe: Recipe::CNoFramePointers,
    },
    Fixture {
        name: "sampled_stripped",
        source: "sampled.c",
        recipe: Recipe::StrippedCopyOf("sampled"),
    },
    Fixture {
        name: "signal_blocking",
        source: "signal_blocking.c",
        recipe: Recipe::C,
    },
    Fixture {
        name: "twin_statics",
        source: "twin_statics.c",
        recipe: Recipe::CTwoUnits("twin_statics_other.c"),
    },
    Fixture {
        name: "hostile_names",
        source: "hostile_names.c",
        recipe: Recipe::C,
    },
    Fixture {
        name: "i386_loop",
        source: "i386_loop.S",
        recipe: Recipe::I386,
    },
    Fixture {
        name: "many_threads",
        source: "many_threads.c",
        recipe: Recipe::C,
    },
    Fixture {
        name: "plug_host",
        source: "plug_host.c",
        recipe: Recipe::CDlopen,
    },
    Fixture {
        name: "libplug_a.so",
        source: "plug_a.c",
        recipe: Recipe::CSharedLibrary,
    },
    Fixture {
        name: "libplug_b.so",
        source: "plug_b.c",
        recipe: Recipe::CSharedLibrary,
    },
    Fixture {
        name: "go_leaf",
        source: "go_leaf.go",
        recipe: Recipe::Go,
    },
    Fixture {
        name: "go_leaf_stripped",
        source: "go_leaf.go",
        recipe: Recipe::GoStripped,
    },
    Fixture {
        name: "go_cgo",
        source: "go_cgo",
        recipe: Recipe::GoPackage,
    },
    Fixture {
        name: "seccomp_filtered",
        source: "seccomp_filtered.c",
        recipe: Recipe::C,
    },
];

/// Whether a Go toolchain (`go`) is installed; if not, says so on stderr, for a test
/// that skips itself (`.ci/run` installs golang-go, so CI always runs them).
pub fn have_go(test: &str) -> bool {
    let found = Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|output| output.status.success());
    if !found {
        eprintln!("note: {test} skipped: no Go toolchain (`apt-get install golang-go`)");
    }
    found
}

/// The names `fixture` accepts.
pub const FIXTURE_NAMES: [&str; FIXTURES.len()] = {
    let mut names = [""; FIXTURES.len()];
    let mut i = 0;
    while i < FIXTURES.len() {
        names[i] = FIXTURES[i].name;
        i += 1;
    }
    names
};

/// The path of the built fixture `name` (see `FIXTURE_NAMES`), building it first if its
/// binary is missing or out of date. Panics with the compiler's messages if the build fails.
pub fn fixture(name: &str) -> PathBuf {
    static BUILT: [OnceLock<PathBuf>; FIXTURES.len()] = [const { OnceLock::new() }; FIXTURES.len()];

    let Some(index) = FIXTURES.iter().position(|f| f.name == name) else {
        panic!("no fixture named {name:?}; the fixtures are {FIXTURE_NAMES:?}");
    };
    BUILT[index]
        .get_or_init(|| {
            let fixture = &FIXTURES[index];
            let binary = fixtures_dir().join(fixture.name);
            if !is_up_to_date(fixture, &binary)
                && let Err(message) = build(fixture, &binary)
            {
                panic!("cannot build fixture {name}: {message}");
            }
            binary
        })
        .clone()
}

fn workspace_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn fixtures_dir() -> PathBuf {
    workspace_dir().join("target").join("fixtures")
}

fn modified(path: &Path) -> Option<SystemTime> {
    fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Whether `binary` exists and is newer than everything it is built from.
fn is_up_to_date(fixture: &Fixture, binary: &Path) -> bool {
    let Some(built) = modified(binary) else {
        return false;
    };
    let mut inputs = vec![
        workspace_dir().join("fixtures").join(fixture.source),
        workspace_dir().join(file!()),
    ];
    if let Recipe::StrippedCopyOf(original) = fixture.recipe {
        inputs.push(self::fixture(original));
    }
    if let Recipe::CxxWithLibrary(library) = fixture.recipe {
        inputs.push(workspace_dir().join("fixtures").join(library));
        inputs.push(fixtures_dir().join(library_file_name(library)));
    }
    if let Recipe::CTwoUnits(second) = fixture.recipe {
        inputs.push(workspace_dir().join("fixtures").join(second));
    }
    if let Recipe::GoPackage = fixture.recipe {
        let package = workspace_dir().join("fixtures").join(fixture.source);
        let files = fs::read_dir(&package).into_iter().flatten().flatten();
        inputs.extend(files.map(|entry| entry.path()));
    }
    // An input that cannot be found (this file, under an unusual layout) does not count.
    inputs
        .iter()
        .filter_map(|input| modified(input))
        .all(|input| input <= built)
}

/// Builds `fixture` in a private scratch directory, then renames the result to `binary`.
fn build(fixture: &Fixture, binary: &Path) -> Result<(), String> {
    static SCRATCH_COUNTER: AtomicU32 = AtomicU32::new(0);

    let dir = binary.parent().expect("the fixture directory");
    fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let scratch = dir.join(format!(
        ".build-{}-{}-{}",
        fixture.name,
        std::process::id(),
        SCRATCH_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    match fs::create_dir(&scratch) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", scratch.display())),
    }

    let result = compile(fixture, &scratch).and_then(|output| {
        // A library the program needs goes into place first, then the program.
        if let Recipe::CxxWithLibrary(library) = fixture.recipe {
            let name = library_file_name(library);
            move_into_place(&scratch.join(&name), &dir.join(&name))?;
        }
        move_into_place(&output, binary)
    });
    let _ = fs::remove_dir_all(&scratch);
    result
}

/// Makes `built` readable and executable by everyone (some tests run fixtures as
/// another user) and renames it to `destination`.
fn move_into_place(built: &Path, destination: &Path) -> Result<(), String> {
    fs::set_permissions(built, fs::Permissions::from_mode(0o755))
        .and_then(|()| fs::rename(built, destination))
        .map_err(|e| format!("cannot move {} into place: {e}", built.display()))
}

/// `lib<stem>.so` for a library source `<stem>.cpp`.
fn library_file_name(source: &str) -> String {
    let stem = source.rsplit_once('.').map_or(source, |(stem, _)| stem);
    format!("lib{stem}.so")
}

/// Runs the recipe's commands in `scratch` and returns the path of the program built.
fn compile(fixture: &Fixture, scratch: &Path) -> Result<PathBuf, String> {
    let source = workspace_dir().join("fixtures").join(fixture.source);
    let source = source.to_str().expect("the workspace path is UTF-8");
    let output = scratch.join(fixture.name);
    let out = output.to_str().expect("the workspace path is UTF-8");

    let c_args = |mode| vec!["-O2", "-g", "-Wall", "-Wextra", mode, "-o", out, source];
    match fixture.recipe {
        Recipe::C => run(scratch, "gcc", &c_args("-pthread"))?,
        Recipe::CTwoUnits(second) => {
            let second = workspace_dir().join("fixtures").join(second);
            let mut args = c_args("-pthread");
            args.push(second.to_str().expect("the workspace path is UTF-8"));
            run(scratch, "gcc", &args)?
        }
        Recipe::CStatic => run(scratch, "gcc", &c_args("-static"))?,
        Recipe::CDlopen => {
            let mut args = c_args("-pthread");
            args.push("-ldl");
            run(scratch, "gcc", &args)?
        }
        Recipe::CSharedLibrary => {
            let mut args = c_args("-shared");
            args.insert(0, "-fPIC");
            run(scratch, "gcc", &args)?
        }
        Recipe::CxxWithLibrary(library) => {
            let name = library_file_name(library);
            let library_source = workspace_dir().join("fixtures").join(library);
            let library_source = library_source
                .to_str()
                .expect("the workspace path is UTF-8");
            let library_args = [
                "-O2",
                "-g",
                "-Wall",
                "-Wextra",
                "-shared",
                "-fPIC",
                "-o",
                &name,
                library_source,
            ];
            run(scratch, "g++", &library_args)?;
            let stem = name.trim_start_matches("lib").trim_end_matches(".so");
            let link = format!("-l{stem}");
            let mut args = c_args("-L.");
            args.extend([link.as_str(), "-Wl,-rpath,$ORIGIN"]);
            run(scratch, "g++", &args)?
        }
        Recipe::CNoFramePointers => {
            let mut args = c_args("-pthread");
            args.insert(0, "-fomit-frame-pointer");
            run(scratch, "gcc", &args)?
        }
        Recipe::CExceptions => {
            let mut args = c_args("-pthread");
            args.insert(0, "-fexceptions");
            run(scratch, "gcc", &args)?
        }
        Recipe::Cxx => run(scratch, "g++", &c_args("-pthread"))?,
        Recipe::Rust => {
            let args = [
                "-O",
                "-g",
                "--edition",
                "2021",
                "-C",
                "panic=unwind",
                "-o",
                out,
                source,
            ];
            run(scratch, "rustc", &args)?
        }
        Recipe::StrippedCopyOf(original) => {
            let original = self::fixture(original);
            let original = original.to_str().expect("the workspace path is UTF-8");
            run(scratch, "strip", &["-o", out, original])?
        }
        Recipe::I386 => {
            let object = format!("{out}.o");
            run(scratch, "as", &["--32", "-o", &object, source])?;
            run(scratch, "ld", &["-m", "elf_i386", "-o", out, &object])?
        }
        Recipe::Go => go_build(scratch, false, &["-o", out, source])?,
        Recipe::GoStripped => go_build(scratch, false, &["-ldflags=-s", "-o", out, source])?,
        // The package is built where it is: `go build` reads its go.mod there.
        Recipe::GoPackage => go_build(Path::new(source), true, &["-o", out, "."])?,
    }
    Ok(output)
}

/// `go build ARGS` in `dir`, offline, with a build cache of the fixtures' own (under
/// `target/`, so a second build takes a second or two), no version-control stamp (the
/// tree may belong to another user) and cgo on or off.
fn go_build(dir: &Path, cgo: bool, args: &[&str]) -> Result<(), String> {
    let cache = fixtures_dir().join(".go-cache");
    let path = fixtures_dir().join(".go-path");
    let command_line = format!("go build {}", args.join(" "));
    let output = Command::new("go")
        .arg("build")
        .arg("-buildvcs=false")
        .args(args)
        .current_dir(dir)
        .env("GOCACHE", &cache)
        .env("GOPATH", &path)
        .env("GOFLAGS", "")
        .env("GOPROXY", "off")
        .env("GOTOOLCHAIN", "local")
        .env("GOTELEMETRY", "off")
        .env("CGO_ENABLED", if cgo { "1" } else { "0" })
        .output()
        .map_err(|e| format!("cannot run `{command_line}`: {e} (is golang-go installed?)"))?;
    if !output.status.success() {
        return Err(format!(
            "`{command_line}` failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(())
}

/// Runs one build command; a failure returns the command line and what it printed.
/// Warnings do not fail the build, but are shown in the test's output.
fn run(dir: &Path, program: &str, args: &[&str]) -> Result<(), String> {
    let command_line = format!("{program} {}", args.join(" "));
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("cannot run `{command_line}`: {e} (is {program} installed?)"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!(
            "`{command_line}` failed ({}):\n{stderr}",
            output.status
        ));
    }
    if !stderr.trim().is_empty() {
        eprintln!("warnings from `{command_line}`:\n{stderr}");
    }
    Ok(())
}
