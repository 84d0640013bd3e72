//! Calls through pointers in a program of many classes (issue 33's generated fixture):
//! a shared library of 10,000 polymorphic classes and 10,000 address-taken functions,
//! and a root that reaches 20 of the classes through virtual calls and 10 of the
//! functions through a table. Every one of the 30 targets appears below the root with
//! its exact calls, the recording starts with no candidate set to patch, and every byte
//! goes back.
//!
//! The one idea: the C++ is generated here (no other tool needed) and built once with
//! `g++ -O0` (about 22 s of CPU on this machine kind; `-O1` took 38 s), into
//! `target/fixtures/many_classes/`, again only when this file changes.

use crate::common;

use common::{Recording, Target, code_bytes_match_file};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

const CLASSES: usize = 10_000;
const LINE_TIMEOUT: Duration = Duration::from_secs(120);

/// The library: class `C<i>` overrides `m`, function `f<i>` is in `table`.
fn library_source() -> String {
    let mut source =
        String::from("struct Base { virtual ~Base() {} virtual long m(long x) = 0; };\n");
    for i in 0..CLASSES {
        let _ = writeln!(
            source,
            "struct C{i} : Base {{ long m(long x) override {{ return x * {} + {}; }} }};\n\
             extern \"C\" long f{i}(long x) {{ return (x ^ {i}) + {}; }}",
            i % 97 + 3,
            i % 13,
            i % 7
        );
    }
    source.push_str("Base *make_object(int which) { switch (which) {\n");
    for i in 0..CLASSES {
        let _ = writeln!(source, "case {i}: return new C{i};");
    }
    source.push_str("default: return 0; } }\nextern long (*const table[])(long);\n");
    source.push_str("long (*const table[])(long) = {");
    for i in 0..CLASSES {
        let _ = write!(source, "f{i},");
    }
    source.push_str("};\n");
    source
}

/// The program: `scale_root(n)` makes n rounds of 20 virtual calls (classes 0, 500, …,
/// 9500) and 10 calls through the table (functions 0, 1000, …, 9000).
const PROGRAM: &str = r#"
#include <cstdio>
#include <unistd.h>
struct Base { virtual ~Base() {} virtual long m(long x) = 0; };
Base *make_object(int which);
extern long (*const table[])(long);
static Base *objects[20];
__attribute__((noinline)) long scale_root(long n) {
    long acc = 0;
    for (long r = 0; r < n; r++) {
        for (int o = 0; o < 20; o++) acc += objects[o]->m(acc + o);
        for (int t = 0; t < 10; t++) acc ^= table[t * 1000](acc + t);
    }
    return acc;
}
int main() {
    for (int o = 0; o < 20; o++) objects[o] = make_object(o * 500);
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    char line[64];
    long n;
    while (fgets(line, sizeof line, stdin))
        if (sscanf(line, "run %ld", &n) == 1) {
            printf("ran %ld acc %ld\n", n, scale_root(n));
            fflush(stdout);
        }
}
"#;

/// The program, built on first use (or when this file is newer than it).
fn many_classes() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fixtures/many_classes");
            let program = dir.join("many_classes");
            let this_file = Path::new(env!("CARGO_MANIFEST_DIR")).join(file!());
            let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
            if modified(&program).is_some_and(|built| modified(&this_file) <= Some(built)) {
                return program;
            }
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("classes.cpp"), library_source()).unwrap();
            std::fs::write(dir.join("main.cpp"), PROGRAM).unwrap();
            // Aligned entries: an entry whose first bytes straddle a cache line cannot
            // be patched, and would not be the mechanism under test.
            let built = Command::new("sh")
                .arg("-c")
                .arg(
                    "g++ -O0 -falign-functions=16 -fPIC -shared -o libclasses.so classes.cpp && \
                     g++ -O1 -g -o many_classes.new main.cpp -L. -lclasses \
                         -Wl,-rpath,'$ORIGIN' && mv many_classes.new many_classes",
                )
                .current_dir(&dir)
                .output()
                .expect("g++ runs");
            assert!(
                built.status.success(),
                "cannot build the many-classes fixture: {}",
                String::from_utf8_lossy(&built.stderr)
            );
            program
        })
        .clone()
}

#[test]
fn thirty_pointer_targets_among_ten_thousand_classes_are_recorded_with_exact_calls() {
    let program = many_classes();
    let mut target = Target::spawn_program(&program, &[]);
    let recording = Recording::start(target.pid(), &["--root", "scale_root"]);
    target.write_stdin("run 100\n");
    target.expect_line("ran 100 ", LINE_TIMEOUT);
    let recorded = recording.finish();
    let merged = &recorded.profile.merged.roots;
    let root = merged
        .iter()
        .find(|n| n.name.starts_with("scale_root"))
        .expect("the root");
    assert_eq!(root.calls, 1);
    let targets: Vec<(&str, u64)> = root
        .children
        .iter()
        .map(|n| (n.name.as_str(), n.calls))
        .collect();
    let virtuals = targets
        .iter()
        .filter(|(name, _)| name.ends_with("::m(long)"));
    let functions = targets.iter().filter(|(name, _)| name.starts_with('f'));
    assert_eq!(
        virtuals.clone().count(),
        20,
        "{targets:?}\n{}",
        recorded.stderr
    );
    assert_eq!(
        functions.clone().count(),
        10,
        "{targets:?}\n{}",
        recorded.stderr
    );
    assert!(
        virtuals.chain(functions).all(|&(_, calls)| calls == 100),
        "every target with exact calls: {targets:?}"
    );
    // Followed from the graph: the root and its 30 targets, not 20,000 candidates.
    let stats = &recorded.profile.stats;
    assert_eq!(stats.indirect_candidates, 0, "{stats:?}");
    assert!(stats.instrumented_functions < 100, "{stats:?}");
    code_bytes_match_file(target.pid()).unwrap();
    target.write_stdin("run 1\n");
    target.expect_line("ran 1 ", LINE_TIMEOUT);
}
