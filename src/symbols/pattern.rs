//! Function patterns: exact names, globs, and `module:name`, plus "did you mean" hints.
//!
//! C++ names are full of `::`, and ABI tags (`[abi:cxx11]`) even hold single colons, so a
//! pattern is only split into `module:name` at its first lone colon when the part before
//! it actually names a loaded module. The syntax is documented on
//! [`ProcessSymbols::find`](super::ProcessSymbols::find).

use std::collections::HashSet;

use glob::Pattern;

use super::demangle::cpp_short_name;
use super::error::SymbolError;
use super::needles::{Needles, display_prefix_len_at_least};
use super::{Function, Module, SymbolSource};

/// One side of a pattern: a literal, or a glob (which also accepts its literal text).
#[derive(Debug)]
struct Matcher {
    text: String,
    glob: Option<Pattern>,
    /// Why the text is not a valid glob although it has glob characters: it still
    /// matches literally (`operator[]`), and the reason is given if nothing does.
    invalid_glob: Option<String>,
    /// What a mangled name must hold for its demangled form to match.
    needles: Needles,
}

impl Matcher {
    fn new(text: &str) -> Matcher {
        let (glob, invalid_glob) = if text.contains(['*', '?', '[']) {
            match Pattern::new(text) {
                Ok(glob) => (Some(glob), None),
                Err(error) => (None, Some(glob_problem(&error))),
            }
        } else {
            (None, None)
        };
        let needles = match glob {
            Some(_) => Needles::of_glob(text),
            None => Needles::of_literal(text),
        };
        Matcher {
            text: text.to_string(),
            glob,
            invalid_glob,
            needles,
        }
    }

    fn matches(&self, candidate: &str) -> bool {
        candidate == self.text || self.glob.as_ref().is_some_and(|g| g.matches(candidate))
    }

    /// Whether `f` matches by display name, raw name, or C++ name without parameters.
    /// A mangled name is demangled only if it holds the pattern's needles.
    fn matches_function(&self, f: &Function) -> bool {
        if self.matches(&f.raw_name) {
            return true;
        }
        if f.name
            .mangled()
            .is_some_and(|m| !self.needles.could_match(m))
        {
            return false;
        }
        if self.matches(&f.name) {
            return true;
        }
        // The short C++ name is a substring of the display name: skip the demangler
        // when a literal cannot possibly match.
        let worth_it = f.raw_name.starts_with("_Z")
            && (self.glob.is_some() || f.name.contains(self.text.as_str()));
        worth_it && cpp_short_name(&f.raw_name).is_some_and(|short| self.matches(&short))
    }
}

/// Why `glob` rejected a pattern, in words, with what to write instead.
fn glob_problem(error: &glob::PatternError) -> String {
    let at = error.pos + 1;
    if error.msg.contains("range") {
        format!(
            "the `[` at character {at} opens a character class (like [abc]) that is not closed — write [[] to match a `[` itself"
        )
    } else if error.msg.contains("wildcard") {
        format!(
            "the `*`s at character {at} are a path wildcard — a single `*` already matches any characters"
        )
    } else {
        format!("{} (at character {at})", error.msg)
    }
}

/// A parsed pattern.
#[derive(Debug)]
struct Query {
    module: Option<Matcher>,
    name: Matcher,
    /// The text before a lone colon, when it looks like a module name but names none of
    /// the process's modules (`nosuchmod:malloc`); reported if the whole pattern, taken
    /// as a name, matches nothing either.
    unknown_module: Option<String>,
}

impl Query {
    fn parse(pattern: &str, modules: &[Module]) -> Query {
        let mut unknown_module = None;
        if let Some(colon) = lone_colon(pattern) {
            let module = Matcher::new(&pattern[..colon]);
            let names_a_module = !module.text.is_empty()
                && modules
                    .iter()
                    .any(|m| module.matches(&m.name) || module.matches(&m.path.to_string_lossy()));
            if names_a_module {
                let name = &pattern[colon + 1..];
                return Query {
                    module: Some(module),
                    name: Matcher::new(if name.is_empty() { "*" } else { name }),
                    unknown_module: None,
                };
            }
            if looks_like_a_module(&module.text) {
                unknown_module = Some(module.text);
            }
        }
        Query {
            module: None,
            name: Matcher::new(pattern),
            unknown_module,
        }
    }

    /// Why the pattern is not a valid glob, if it is not.
    fn invalid_glob(&self) -> Option<&str> {
        let module = self.module.as_ref().and_then(|m| m.invalid_glob.as_deref());
        module.or(self.name.invalid_glob.as_deref())
    }

    fn module_matches(&self, f: &Function) -> bool {
        self.module
            .as_ref()
            .is_none_or(|m| m.matches(&f.module) || m.matches(&f.module_path.to_string_lossy()))
    }
}

/// Whether `text` could be meant as a module: a file name or path, maybe a glob
/// (`libfoo.so.1`, `/usr/lib/x.so`, `libc*`) — not a piece of a C++ name (`f[abi`).
fn looks_like_a_module(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-+/*?".contains(c))
}

/// Byte index of the first `:` that is not next to another `:`.
fn lone_colon(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    (0..b.len())
        .find(|&i| b[i] == b':' && (i == 0 || b[i - 1] != b':') && b.get(i + 1) != Some(&b':'))
}

pub(super) fn find<'a>(
    functions: &'a [Function],
    modules: &[Module],
    pattern: &str,
) -> Result<Vec<&'a Function>, SymbolError> {
    if let Some(address) = parse_address(pattern) {
        return at_address(functions, address).ok_or_else(|| SymbolError::NoMatch {
            pattern: pattern.to_string(),
            suggestions: Vec::new(),
        });
    }
    let query = Query::parse(pattern, modules);
    let found: Vec<&Function> = functions
        .iter()
        .filter(|f| query.module_matches(f) && query.name.matches_function(f))
        .collect();
    if found.is_empty() {
        if let Some(problem) = query.invalid_glob() {
            return Err(SymbolError::InvalidGlob {
                pattern: pattern.to_string(),
                problem: problem.to_string(),
            });
        }
        if let Some(module) = query.unknown_module {
            return Err(SymbolError::NoModule {
                suggestions: module_suggestions(modules, &module),
                module,
                modules: modules.iter().map(|m| m.name.clone()).collect(),
            });
        }
        return Err(SymbolError::NoMatch {
            pattern: pattern.to_string(),
            suggestions: suggestions(functions, &query),
        });
    }
    Ok(found)
}

/// A pattern that is a hexadecimal address (`0x5581a2c01210`): no name can be one.
fn parse_address(pattern: &str) -> Option<u64> {
    let digits = pattern.strip_prefix("0x")?;
    let hexadecimal = !digits.is_empty() && digits.chars().all(|c| c.is_ascii_hexdigit());
    u64::from_str_radix(digits, 16).ok().filter(|_| hexadecimal)
}

/// The functions that start at `address` (every name of that entry), else those whose
/// code holds it; `None` if none does. This names one of two functions that share a
/// name and module (two `static` functions of different files), which no name can.
fn at_address(functions: &[Function], address: u64) -> Option<Vec<&Function>> {
    let starting: Vec<&Function> = functions.iter().filter(|f| f.addr == address).collect();
    if !starting.is_empty() {
        return Some(starting);
    }
    let holding: Vec<&Function> = functions
        .iter()
        .filter(|f| f.addr < address && address < f.end())
        .collect();
    (!holding.is_empty()).then_some(holding)
}

/// Whether `pattern` has a module part (`module:name`) and it matches `module`: the
/// user named that module on purpose, rather than a glob reaching into it.
pub(super) fn names_module(pattern: &str, modules: &[Module], module: &Module) -> bool {
    Query::parse(pattern, modules)
        .module
        .is_some_and(|m| m.matches(&module.name) || m.matches(&module.path.to_string_lossy()))
}

const MAX_SUGGESTIONS: usize = 5;
const MIN_SIMILARITY: f64 = 0.75;
/// Module names are short and share prefixes (`lib`): a looser bar finds `libc.so.6`
/// for `libc` without finding every `lib*`.
const MIN_MODULE_SIMILARITY: f64 = 0.7;

/// Up to five distinct names close to the query's name (Jaro-Winkler, case-insensitive,
/// glob characters ignored), best first, from the query's module if it has one. For a
/// glob, only names that hold its letters in another case or elsewhere (`json*` →
/// `_PyJson_Encode`): a name merely as long and alike (`fsopen` for `json*`) is no
/// hint of what a glob was meant to find.
fn suggestions(functions: &[Function], query: &Query) -> Vec<String> {
    let is_glob = query.name.text.contains(['*', '?', '[']);
    let needle: String = query
        .name
        .text
        .chars()
        .filter(|c| !matches!(c, '*' | '?' | '[' | ']'))
        .flat_map(char::to_lowercase)
        .collect();
    if needle.is_empty() {
        return Vec::new();
    }
    let needle_len = needle.chars().count();
    let in_any_case = Needles::in_any_case(&needle);
    let mut seen = HashSet::new();
    let mut scored: Vec<(f64, &str)> = Vec::new();
    for f in functions {
        if f.source == SymbolSource::Fde || !query.module_matches(f) {
            continue;
        }
        // A mangled name is demangled only if it could be a hint: holding the needle's
        // words, or (for a name) not too long to compare with it.
        if let Some(mangled) = f.name.mangled()
            && !in_any_case.could_match(mangled)
            && (is_glob || display_prefix_len_at_least(mangled) > 2 * needle_len)
        {
            continue;
        }
        let name = without_params(&f.name);
        if !seen.insert(name) {
            continue;
        }
        let lower = name.to_lowercase();
        if is_glob {
            // Shorter names first: the closest to the letters given.
            if lower.contains(&needle) {
                scored.push((-(lower.len() as f64), name));
            }
            continue;
        }
        let score = strsim::jaro_winkler(&needle, &lower);
        if score >= MIN_SIMILARITY && comparable(&needle, &lower) {
            scored.push((score, name));
        }
    }
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    scored
        .into_iter()
        .take(MAX_SUGGESTIONS)
        .map(|(_, name)| name.to_string())
        .collect()
}

/// Whether `candidate` could be what `needle` was meant to be: of a comparable length
/// (Jaro-Winkler alone rates `jn` close to `json_dumps`, from two shared letters and
/// the first one), or containing it, or contained in it.
fn comparable(needle: &str, candidate: &str) -> bool {
    let (a, b) = (needle.chars().count(), candidate.chars().count());
    let (short, long) = (a.min(b), a.max(b));
    2 * short >= long || candidate.contains(needle) || needle.contains(candidate) && short >= 4
}

/// Up to five module names close to `module` (Jaro-Winkler, case-insensitive, glob
/// characters ignored), best first.
fn module_suggestions(modules: &[Module], module: &str) -> Vec<String> {
    let needle: String = module
        .chars()
        .filter(|c| !matches!(c, '*' | '?'))
        .flat_map(char::to_lowercase)
        .collect();
    let mut scored: Vec<(f64, &str)> = modules
        .iter()
        .map(|m| {
            (
                strsim::jaro_winkler(&needle, &m.name.to_lowercase()),
                m.name.as_str(),
            )
        })
        .filter(|&(score, _)| score >= MIN_MODULE_SIMILARITY)
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    scored.dedup_by(|a, b| a.1 == b.1);
    scored
        .into_iter()
        .take(MAX_SUGGESTIONS)
        .map(|(_, name)| name.to_string())
        .collect()
}

/// A display name cut before its first `(` (good enough for a hint; `(anonymous
/// namespace)` names keep their prefix up to it).
fn without_params(name: &str) -> &str {
    match name.find('(') {
        Some(0) | None => name,
        Some(i) => &name[..i],
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn a_search_demangles_only_the_names_that_hold_its_words() {
        let exe = std::env::current_exe().unwrap();
        let own = crate::symbols::ModuleSymbols::from_file(&exe, 0).unwrap();
        let mangled = own.functions.iter().filter(|f| f.name.mangled().is_some());
        let mangled = mangled.count();
        assert!(
            mangled > 1000,
            "this binary's Rust names are mangled: {mangled}"
        );
        let found = find(&own.functions, &[], "tendril::symbols::index::stored_name").unwrap();
        assert_eq!(found[0].name, "tendril::symbols::index::stored_name");
        let demangled = found[0].name.demangled_in_its_table();
        assert!(
            demangled * 100 < mangled,
            "{demangled} of {mangled} demangled"
        );
        let globbed = find(&own.functions, &[], "*symbols::index::stored_na*").unwrap();
        assert_eq!(globbed[0].name, "tendril::symbols::index::stored_name");
        // A miss's hints still find the names close to it, mangled as they are.
        for typo in ["tendril::symbols::index::stored_nme", "*INDEX::STORED_NAM*"] {
            match find(&own.functions, &[], typo) {
                Err(SymbolError::NoMatch { suggestions, .. }) => assert!(
                    suggestions.contains(&"tendril::symbols::index::stored_name".to_string()),
                    "{typo}: {suggestions:?}"
                ),
                other => panic!("{typo}: {other:?}"),
            }
        }
    }

    fn module(name: &str) -> Module {
        Module {
            name: name.into(),
            path: PathBuf::from(format!("/usr/lib/{name}")),
            load_bias: 0,
            start: 0,
            end: 0,
        }
    }

    fn function(module: &str, raw: &str, addr: u64) -> Function {
        Function::for_tests(module, raw, addr)
    }

    #[test]
    fn invalid_globs_still_match_literally() {
        let modules = [module("app")];
        let fs = [function("app", "_ZN1VixEm", 0x10)];
        let found = find(&fs, &modules, "V::operator[]").unwrap();
        assert_eq!(found[0].raw_name, "_ZN1VixEm");
        // A C++ ABI tag is not taken for a module.
        match find(&fs, &modules, "f[abi:cxx11]") {
            Err(SymbolError::NoMatch { .. }) => {}
            other => panic!("expected NoMatch, got {other:?}"),
        }
    }

    #[test]
    fn an_address_names_the_function_at_or_around_it() {
        let modules = [module("app")];
        // Two `static` functions of one name (16 bytes each, from `function`).
        let fs = [
            function("app", "step", 0x10),
            function("app", "step", 0x20),
            function("app", "other", 0x40),
        ];
        let addresses = |pattern: &str| -> Vec<u64> {
            let found = find(&fs, &modules, pattern).unwrap();
            found.iter().map(|f| f.addr).collect()
        };
        assert_eq!(addresses("step"), [0x10, 0x20]);
        assert_eq!(addresses("0x20"), [0x20]);
        assert_eq!(addresses("0x2f"), [0x20]);
        assert_eq!(addresses("0x10"), [0x10]);
        for nothing_there in ["0x30", "0x0", "0xffffffffffffffff"] {
            match find(&fs, &modules, nothing_there) {
                Err(SymbolError::NoMatch {
                    pattern,
                    suggestions,
                }) => assert!(pattern == nothing_there && suggestions.is_empty()),
                other => panic!("{nothing_there}: expected NoMatch, got {other:?}"),
            }
        }
        // Not an address: a glob, a sign, and an overflowing number are names.
        for name in ["0x1*", "0x+10", "0x10000000000000000"] {
            match find(&fs, &modules, name) {
                Err(SymbolError::NoMatch { pattern, .. }) => assert_eq!(pattern, name),
                other => panic!("{name}: expected NoMatch, got {other:?}"),
            }
        }
    }

    #[test]
    fn lone_colons() {
        assert_eq!(lone_colon("libc.so.6:malloc"), Some(9));
        assert_eq!(lone_colon("std::vector<int>::size"), None);
        assert_eq!(lone_colon("libstdc++.so.6:std::foo"), Some(14));
        assert_eq!(lone_colon("foo[abi:cxx11]"), Some(7));
    }

    #[test]
    fn module_split_only_for_known_modules() {
        let modules = [module("libc.so.6"), module("app")];
        let q = Query::parse("libc.so.6:malloc", &modules);
        assert_eq!(q.module.unwrap().text, "libc.so.6");
        assert_eq!(q.name.text, "malloc");
        let q = Query::parse("libc*:mall*", &modules);
        assert!(q.module.is_some() && q.name.glob.is_some());
        let q = Query::parse("foo[abi:cxx11]", &modules);
        assert!(q.module.is_none());
        assert_eq!(q.name.text, "foo[abi:cxx11]");
        let q = Query::parse("ns::foo", &modules);
        assert!(q.module.is_none());
        let q = Query::parse("app:", &modules);
        assert_eq!(q.name.text, "*");
    }

    #[test]
    fn a_glob_is_suggested_only_names_that_hold_its_letters() {
        let functions: Vec<Function> = ["fsopen", "swapon", "_PyJson_Encode", "JSONParse"]
            .iter()
            .enumerate()
            .map(|(i, name)| function("libpython3.so", name, 0x1000 * (i as u64 + 1)))
            .collect();
        match find(&functions, &[module("libpython3.so")], "json*") {
            Err(SymbolError::NoMatch { suggestions, .. }) => {
                assert_eq!(suggestions, ["JSONParse", "_PyJson_Encode"]);
            }
            other => panic!("{other:?}"),
        }
        match find(&functions, &[module("libpython3.so")], "xml*") {
            Err(SymbolError::NoMatch { suggestions, .. }) => assert!(suggestions.is_empty()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn suggestions_are_names_of_a_comparable_length() {
        let functions: Vec<Function> = ["jn", "json_dump", "dumps", "j0"]
            .iter()
            .enumerate()
            .map(|(i, name)| function("libpython3.so", name, 0x1000 * (i as u64 + 1)))
            .collect();
        match find(&functions, &[module("libpython3.so")], "json_dumps") {
            Err(SymbolError::NoMatch { suggestions, .. }) => {
                assert_eq!(suggestions, ["json_dump"]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn matching_and_suggestions() {
        let modules = [module("libc.so.6"), module("app")];
        let fs = [
            function("app", "_ZN2ns3fooEi", 0x10),
            function("app", "deep", 0x20),
            function("app", "deeper", 0x30),
            function("libc.so.6", "malloc", 0x40),
        ];
        let names = |p: &str| -> Vec<String> {
            find(&fs, &modules, p)
                .unwrap()
                .iter()
                .map(|f| f.name.to_string())
                .collect()
        };
        assert_eq!(names("ns::foo"), ["ns::foo(int)"]);
        assert_eq!(names("ns::foo(int)"), ["ns::foo(int)"]);
        assert_eq!(names("_ZN2ns3fooEi"), ["ns::foo(int)"]);
        assert_eq!(names("dee*"), ["deep", "deeper"]);
        assert_eq!(names("libc*:mall*"), ["malloc"]);
        assert_eq!(names("app:"), ["ns::foo(int)", "deep", "deeper"]);
        match find(&fs, &modules, "deeo") {
            Err(SymbolError::NoMatch { suggestions, .. }) => {
                assert_eq!(suggestions[..2], ["deep", "deeper"]);
            }
            other => panic!("expected NoMatch, got {other:?}"),
        }
        // Not a valid glob, and nothing matches literally: said as such.
        match find(&fs, &modules, "[") {
            Err(SymbolError::InvalidGlob { problem, .. }) => {
                assert!(problem.contains("not closed"), "{problem}");
            }
            other => panic!("expected InvalidGlob, got {other:?}"),
        }
        // A module that is not loaded, with the close ones.
        match find(&fs, &modules, "libc:malloc") {
            Err(SymbolError::NoModule {
                module,
                suggestions,
                modules,
            }) => {
                assert_eq!(module, "libc");
                assert_eq!(suggestions, ["libc.so.6"]);
                assert_eq!(modules, ["libc.so.6", "app"]);
            }
            other => panic!("expected NoModule, got {other:?}"),
        }
        assert!(names_module("libc*:mall*", &modules, &modules[0]));
        assert!(!names_module("libc*:mall*", &modules, &modules[1]));
        assert!(!names_module("mall*", &modules, &modules[0]));
        assert!(!names_module("*", &modules, &modules[1]));
        match find(&fs, &modules, "app:malloc") {
            Err(SymbolError::NoMatch { suggestions, .. }) => {
                assert!(!suggestions.contains(&"malloc".to_string()));
            }
            other => panic!("expected NoMatch, got {other:?}"),
        }
    }
}
