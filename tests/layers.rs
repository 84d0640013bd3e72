//! The crates' modules form layers that point one way: no module imports, directly or
//! through others, a module that imports it back.
//!
//! The one idea: a module's dependencies are the `crate::…` paths (and `super::…` paths)
//! its source names outside its `#[cfg(test)]` part, mapped to the module files of the
//! crate; a cycle is a strongly connected component of more than one module. This reads
//! source as text, like a reviewer does, so it needs nothing but the files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every crate of the workspace, by its `src` folder.
const CRATES: [&str; 5] = [
    "src",
    "callgraph/src",
    "trampolines/src",
    "tui/src",
    "wire/src",
];

/// Cycles that exist and are being taken apart (issue 10: the agent rebuilt as
/// layers). A ratchet: a new cycle fails the test, and so does a listed one that is
/// gone, so this list only ever shrinks.
const KNOWN_CYCLES: [&str; 0] = [];

/// The agent's layers, bottom first: a module may use its own layer and those below.
const AGENT_LAYERS: [&str; 6] = ["sys", "code", "hooks", "patching", "runtime", "control"];

#[test]
fn the_agents_layers_point_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("trampolines/src");
    let rank = |module: &str| {
        let top = module.split("::").next().unwrap_or_default();
        AGENT_LAYERS.iter().position(|layer| *layer == top)
    };
    let mut upward = Vec::new();
    for (module, dependencies) in module_graph(&src) {
        // The crate root declares the layers and starts the control thread.
        let Some(own) = rank(&module) else { continue };
        for dependency in dependencies {
            if rank(&dependency).is_none_or(|theirs| theirs > own) {
                upward.push(format!("{module} -> {dependency}"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "the agent's layers are {AGENT_LAYERS:?}, bottom first; these point up: {upward:#?}"
    );
}

/// The controller's layers, bottom first: each top-level module (a file or a folder of
/// `src/`) may use its own layer and those below. Every top-level module is in one.
const CONTROLLER_LAYERS: [(&str, &[&str]); 6] = [
    (
        "processes, text and the agent's files",
        &[
            "process",
            "terminal_text",
            "quantities",
            "interrupt",
            "agent_bundle",
            "agent_connection",
            "demo_workload",
        ],
    ),
    (
        "symbols and the profile model",
        &["symbols", "refusals", "profile"],
    ),
    (
        "choosing targets, attaching",
        &["targets", "inject", "departure"],
    ),
    (
        "recording, sampling, edge analysis",
        &["recording", "sampling", "edge_analysis"],
    ),
    ("the live UI", &["live"]),
    ("the commands", &["commands", "cli_args"]),
];

#[test]
fn the_controllers_layers_point_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let rank = |module: &str| {
        let top = module.split("::").next().unwrap_or_default();
        CONTROLLER_LAYERS
            .iter()
            .position(|(_, modules)| modules.contains(&top))
    };
    let mut upward = Vec::new();
    let mut unplaced = BTreeSet::new();
    for (module, dependencies) in module_graph(&src) {
        // The crate root declares the modules; main.rs is the command line.
        if module.is_empty() {
            continue;
        }
        let Some(own) = rank(&module) else {
            unplaced.insert(module.split("::").next().unwrap_or_default().to_string());
            continue;
        };
        for dependency in dependencies {
            match rank(&dependency) {
                Some(theirs) if theirs > own => upward.push(format!("{module} -> {dependency}")),
                _ => {}
            }
        }
    }
    assert!(
        unplaced.is_empty(),
        "put these modules of src/ in one of CONTROLLER_LAYERS: {unplaced:?}"
    );
    assert!(
        upward.is_empty(),
        "the controller's layers are, bottom first, {:#?}; these point up: {upward:#?}",
        CONTROLLER_LAYERS.map(|(name, _)| name)
    );
}

#[test]
fn no_crate_has_an_import_cycle_but_the_known_ones() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cycles = Vec::new();
    for folder in CRATES {
        let graph = module_graph(&workspace.join(folder));
        for cycle in strongly_connected_components(&graph) {
            cycles.push(format!("{folder}: {}", cycle.join(" <-> ")));
        }
    }
    let new: Vec<&String> = cycles
        .iter()
        .filter(|c| !KNOWN_CYCLES.contains(&c.as_str()))
        .collect();
    assert!(new.is_empty(), "import cycles:\n{new:#?}");
    let gone: Vec<&&str> = KNOWN_CYCLES
        .iter()
        .filter(|known| !cycles.iter().any(|c| c == *known))
        .collect();
    assert!(
        gone.is_empty(),
        "these cycles are gone or changed; take them off KNOWN_CYCLES: {gone:#?}"
    );
}

/// Cycles between the top-level folders of a crate (a module and everything below it)
/// that exist and are being taken apart (issue 34). A ratchet, as [`KNOWN_CYCLES`].
const KNOWN_FOLDER_CYCLES: [&str; 0] = [];

#[test]
fn no_crate_has_a_cycle_between_its_folders_but_the_known_ones() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cycles = Vec::new();
    for folder in CRATES {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (module, dependencies) in module_graph(&workspace.join(folder)) {
            let top = |module: &str| module.split("::").next().unwrap_or_default().to_string();
            let entry = graph.entry(top(&module)).or_default();
            entry.extend(
                dependencies
                    .iter()
                    .map(|d| top(d))
                    .filter(|d| *d != top(&module)),
            );
        }
        for cycle in strongly_connected_components(&graph) {
            cycles.push(format!("{folder}: {}", cycle.join(" <-> ")));
        }
    }
    let new: Vec<&String> = cycles
        .iter()
        .filter(|c| !KNOWN_FOLDER_CYCLES.contains(&c.as_str()))
        .collect();
    assert!(new.is_empty(), "cycles between folders:\n{new:#?}");
    let gone: Vec<&&str> = KNOWN_FOLDER_CYCLES
        .iter()
        .filter(|known| !cycles.iter().any(|c| c == *known))
        .collect();
    assert!(
        gone.is_empty(),
        "these cycles are gone or changed; take them off KNOWN_FOLDER_CYCLES: {gone:#?}"
    );
}

/// Where the agent's statics may be: each layer's `state.rs` owns all of that layer's
/// (one struct, one `static STATE`), and the crate root keeps the two that Rust and ELF
/// want at the top (the global allocator and the `.init_array` constructor).
const STATIC_OWNERS: [&str; 6] = [
    "sys/state.rs",
    "hooks/state.rs",
    "patching/state.rs",
    "runtime/state.rs",
    "control/state.rs",
    "lib.rs",
];
/// Modules compiled for tests only (`#[cfg(test)] mod …` in their parent): their
/// statics are the tests' own. Every `tests.rs` whose parent declares it so is one too
/// ([`is_test_module_file`]).
const TEST_ONLY_MODULES: [&str; 1] = ["hooks/unwind_probe.rs"];

/// Whether `file` is a `tests.rs` its parent module compiles for tests only: the parent
/// (`dir.rs` beside the folder `dir/` that holds it) says `#[cfg(test)]` then `mod tests;`.
fn is_test_module_file(file: &Path) -> bool {
    if file.file_name().is_none_or(|name| name != "tests.rs") {
        return false;
    }
    let Some(folder) = file.parent() else {
        return false;
    };
    let parent = folder.with_extension("rs");
    std::fs::read_to_string(parent).is_ok_and(|text| text.contains("#[cfg(test)]\nmod tests;"))
}

#[test]
fn every_static_of_the_agent_has_its_layers_state_as_owner() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("trampolines/src");
    let mut strays = Vec::new();
    for file in rust_files(&src) {
        let relative = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if STATIC_OWNERS.contains(&relative.as_str())
            || TEST_ONLY_MODULES.contains(&relative.as_str())
            || is_test_module_file(&file)
        {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let outside_tests = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (number, line) in outside_tests.lines().enumerate() {
            if declares_a_static(line) {
                strays.push(format!("{relative}:{}: {}", number + 1, line.trim()));
            }
        }
    }
    assert!(
        strays.is_empty(),
        "statics outside their layer's state.rs (move them into its struct): {strays:#?}"
    );
    for owner in STATIC_OWNERS {
        assert!(
            src.join(owner).is_file(),
            "{owner} is gone; update STATIC_OWNERS"
        );
    }
}

/// Whether `line` declares a static (`static`, `static mut`, `thread_local!`), at any
/// indentation and visibility.
fn declares_a_static(line: &str) -> bool {
    let code = line.trim_start();
    if code.starts_with("//") {
        return false;
    }
    let code = code
        .strip_prefix("pub(crate) ")
        .or_else(|| code.strip_prefix("pub(super) "))
        .or_else(|| code.strip_prefix("pub "))
        .unwrap_or(code);
    code.starts_with("static ") || code.starts_with("thread_local!")
}

#[test]
fn a_cycle_is_found_and_a_chain_is_not() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(m, deps)| (m.to_string(), deps.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(strongly_connected_components(&graph), [["a", "b", "c"]]);
    let names = |text: &str| {
        dependencies("x::y", text, &["x::y", "x::z", "w"].map(String::from))
            .into_iter()
            .collect::<Vec<_>>()
    };
    assert_eq!(names("use crate::w;\nuse super::z;"), ["w", "x::z"]);
    assert_eq!(names("use crate::{w, x::z::Thing};"), ["w", "x::z"]);
    assert!(names("#[cfg(test)]\nmod tests { use crate::w; }").is_empty());
    assert!(declares_a_static("    pub(super) static STATE: X = X;"));
    assert!(declares_a_static("static mut COUNT: u32 = 0;"));
    assert!(declares_a_static("thread_local! {"));
    assert!(!declares_a_static("/// the static closure"));
    assert!(!declares_a_static("fn f() -> &'static str {"));
}

/// Module name (`a::b`) → the modules it depends on.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files = rust_files(src);
    let modules: Vec<String> = files.iter().map(|f| module_name(src, f)).collect();
    files
        .iter()
        .zip(&modules)
        .map(|(file, module)| {
            let text = std::fs::read_to_string(file).unwrap();
            (module.clone(), dependencies(module, &text, &modules))
        })
        .collect()
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// `a/b.rs` and `a/b/mod.rs` are `a::b`; `lib.rs` and `main.rs` are the crate root ("").
fn module_name(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .filter(|part| !matches!(part.as_str(), "mod" | "lib" | "main"))
        .collect::<Vec<_>>()
        .join("::")
}

/// The modules of `known` that `text` (module `module`) names, outside its tests.
fn dependencies(module: &str, text: &str, known: &[String]) -> BTreeSet<String> {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    let mut paths = Vec::new();
    for (prefix, base) in [("crate::", String::new()), ("super::", parent(module))] {
        for (index, _) in text.match_indices(prefix) {
            let preceded_by_word = text[..index]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
            if preceded_by_word {
                continue;
            }
            let rest = &text[index + prefix.len()..];
            let join = |path: &str| {
                if base.is_empty() {
                    path.to_string()
                } else {
                    format!("{base}::{path}")
                }
            };
            if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                paths.extend(group.split(',').map(|p| join(p.trim())));
            } else {
                let end = rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .unwrap_or(rest.len());
                paths.push(join(&rest[..end]));
            }
        }
    }
    let mut found = BTreeSet::new();
    for path in paths {
        let segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
        // The longest prefix that is a module is the dependency.
        if let Some(target) = (1..=segments.len())
            .rev()
            .map(|n| segments[..n].join("::"))
            .find(|candidate| known.contains(candidate))
            && target != module
        {
            found.insert(target);
        }
    }
    found
}

fn parent(module: &str) -> String {
    module
        .rsplit_once("::")
        .map_or(String::new(), |(p, _)| p.to_string())
}

/// Tarjan's algorithm; components of more than one module, each sorted.
fn strongly_connected_components(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Search<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        components: Vec<Vec<String>>,
    }
    impl<'a> Search<'a> {
        fn visit(&mut self, node: &'a str) {
            let number = self.index.len();
            self.index.insert(node, number);
            self.low.insert(node, number);
            self.stack.push(node);
            for next in self.graph.get(node).into_iter().flatten() {
                let next = next.as_str();
                if !self.graph.contains_key(next) {
                    continue;
                }
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.stack.contains(&next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = Vec::new();
                while let Some(member) = self.stack.pop() {
                    component.push(member.to_string());
                    if member == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.components.push(component);
                }
            }
        }
    }
    let mut search = Search {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        components: Vec::new(),
    };
    for node in graph.keys() {
        if !search.index.contains_key(node.as_str()) {
            search.visit(node);
        }
    }
    search.components
}
