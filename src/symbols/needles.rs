//! Whether a pattern could match a name's demangled form, judged from its mangled form.
//!
//! The one idea: demangling copies every identifier of a name verbatim from its mangled
//! form (Itanium C++ and both Rust manglings spell an identifier out as
//! `<length><identifier>`, Rust's non-ASCII ones keeping their ASCII letters in order);
//! what it adds is punctuation, numbers, and words of its own: keywords, built-in
//! types, `std` abbreviations (`Sa` is `std::allocator`), `{closure#0}`, `vtable for`.
//! So a run of letters, digits and `_` that a pattern's literal text needs must appear
//! in the mangled name, unless the demangler could have written it: a number, a single
//! character, or a part of one of its words. A search tests those runs (the needles)
//! against the mangled name and demangles only the names that hold them all.
//! `a_demangled_word_is_in_the_mangled_name_or_the_demanglers_own` checks the rule on
//! every symbol of real libraries, and with it the bound a miss's hints skip long names
//! by ([`display_prefix_len_at_least`]: a plain name's parts, read without demangling).

/// Words the demanglers write that are not in the mangled name (cpp_demangle and
/// rustc_demangle; checked against real libraries by the test below). A needle that is
/// part of one of them tests nothing.
#[rustfmt::skip]
const DEMANGLER_WORDS: &[&str] = &[
    // C++ built-in types and qualifiers.
    "unsigned", "signed", "wchar_t", "char8_t", "char16_t", "char32_t", "__int128",
    "__float128", "__float80", "_Float16", "_Float32", "_Float64", "_Float128", "__bf16",
    "double", "float", "short", "long", "bool", "void", "auto", "decltype", "nullptr_t",
    "const", "volatile", "restrict", "__restrict", "__vector", "pixel", "_Accum", "_Fract",
    "_Sat", "decimal32", "decimal64", "decimal128", "half", "ull", "ul", "ll",
    "transaction_safe",
    // `std` abbreviations.
    "std", "allocator", "basic_string", "char_traits", "basic_istream", "basic_ostream",
    "basic_iostream", "string", "istream", "ostream", "iostream",
    // Special names, operators, expressions.
    "vtable", "VTT", "construction", "typeinfo", "name", "for", "in", "non", "virtual",
    "thunk", "to", "covariant", "return", "guard", "variable", "reference", "temporary",
    "transaction", "clone", "TLS", "init", "function", "wrapper", "hidden", "alias", "java",
    "resource", "operator", "new", "delete", "sizeof", "alignof", "typeid", "throw",
    "noexcept", "co_await", "dynamic_cast", "static_cast", "const_cast", "reinterpret_cast",
    "this", "nullptr", "true", "false", "lambda", "unnamed", "type", "anonymous",
    "namespace", "literal", "default", "arg", "parm", "template", "param", "typename",
    "struct", "union", "enum", "class", "abi", "offset", "override",
    // Rust.
    "closure", "shim", "reify", "impl", "dyn", "unsafe", "extern", "fn", "as", "mut", "i8",
    "i16", "i32", "i64", "i128", "isize", "u8", "u16", "u32", "u64", "u128", "usize", "f16",
    "f32", "f64", "f128", "str", "char", "recursion", "limit", "reached",
];

/// The runs of a pattern's literal text that a matching name's mangled form must hold.
#[derive(Debug, Default)]
pub(super) struct Needles {
    needles: Vec<String>,
    /// Whether a needle is sought in any ASCII case (its text is lowercase).
    any_case: bool,
}

impl Needles {
    /// The needles of `text` taken literally (a name that is `text`, or whose part is).
    pub(super) fn of_literal(text: &str) -> Needles {
        Needles {
            needles: runs(text)
                .filter(|run| tests_something(run))
                .map(String::from)
                .collect(),
            any_case: false,
        }
    }

    /// The needles of `text` sought in any ASCII case (a name that holds `text` in
    /// another case, as "did you mean" hints look for).
    pub(super) fn in_any_case(text: &str) -> Needles {
        Needles {
            any_case: true,
            ..Needles::of_literal(&text.to_ascii_lowercase())
        }
    }

    /// The needles of the glob `glob` (`*` and `?` end a run; a glob with a character
    /// class has none, as reading its runs would need the glob's own parser).
    pub(super) fn of_glob(glob: &str) -> Needles {
        if glob.contains('[') {
            return Needles::default();
        }
        Needles::of_literal(glob)
    }

    /// Whether a name whose mangled form is `mangled` could match: it holds every needle.
    pub(super) fn could_match(&self, mangled: &str) -> bool {
        let holds = |needle: &String| match self.any_case {
            false => mangled.contains(needle.as_str()),
            true => (mangled.as_bytes().windows(needle.len()))
                .any(|window| window.eq_ignore_ascii_case(needle.as_bytes())),
        };
        self.needles.iter().all(holds)
    }
}

/// A length that the display name of `mangled`, cut before its first `(`, has at least
/// (in characters): its names joined by `::`, read straight from an Itanium or Rust
/// legacy mangled name whose name is all plain `<length><name>`s (`_ZN4llvm3fooEv`:
/// `llvm::foo`, 9), a Rust hash (not shown) left out. 0 for any other name: one with
/// template arguments (which may hold a `(`, or come after a return type), a
/// substitution, an operator, a Rust escape such as `$LT$`; and counting stops before an
/// anonymous namespace, which opens with a `(`, so such a name counts 0 too.
pub(super) fn display_prefix_len_at_least(mangled: &str) -> usize {
    let Some(rest) = mangled.strip_prefix("_Z") else {
        return 0;
    };
    let (nested, mut rest) = match rest.strip_prefix('N') {
        Some(nested) => (true, nested.trim_start_matches(['r', 'V', 'K', 'R', 'O'])),
        None => (false, rest),
    };
    let mut names: Vec<&str> = Vec::new();
    while let Some(digits) = rest.find(|c: char| !c.is_ascii_digit()).filter(|&d| d > 0) {
        let Ok(len) = rest[..digits].parse::<usize>() else {
            break;
        };
        let Some(name) = digits
            .checked_add(len)
            .and_then(|end| rest.get(digits..end))
        else {
            break;
        };
        let plain = name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !plain || name.starts_with("_GLOBAL__N") {
            break;
        }
        names.push(name);
        rest = &rest[digits + len..];
        if !nested {
            break;
        }
    }
    // A name with template arguments may be shown after a return type, or hold a `(`
    // in them: only a name read whole is counted.
    let whole = match nested {
        true => rest.starts_with('E'),
        false => !rest.starts_with('I'),
    };
    if !whole {
        return 0;
    }
    let rust_hash = |name: &&str| {
        name.len() == 17
            && name.starts_with('h')
            && name[1..].bytes().all(|b| b.is_ascii_hexdigit())
    };
    if nested && names.last().is_some_and(rust_hash) {
        names.pop();
    }
    let letters: usize = names.iter().map(|name| name.len()).sum();
    letters + 2 * names.len().saturating_sub(1)
}

/// The maximal runs of ASCII letters, digits and `_` in `text`.
fn runs(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|run| !run.is_empty())
}

/// Whether a name's mangled form must hold `run` if its demangled form does: not if
/// the demangler could have written it (a number such as `5ul` or `0x7fff`, a lifetime
/// such as `'_12`, a single character, a part of one of its words).
fn tests_something(run: &str) -> bool {
    let rest = run.trim_start_matches('_').to_ascii_lowercase();
    let number = rest.starts_with(|c: char| c.is_ascii_digit());
    let generated = |word: &&str| word.to_ascii_lowercase().contains(&rest);
    !number && rest.len() > 1 && !DEMANGLER_WORDS.iter().any(generated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbols::{ModuleSymbols, demangle};

    #[test]
    fn the_display_prefix_is_read_from_plain_names_only() {
        assert_eq!(display_prefix_len_at_least("_ZN4llvm3fooEv"), 9);
        assert_eq!(display_prefix_len_at_least("_ZNK4llvm3Foo3getEv"), 14);
        assert_eq!(display_prefix_len_at_least("_Z3fooi"), 3);
        let rust = "_ZN4core3fmt9Formatter3pad17h0123456789abcdefE";
        assert_eq!(
            display_prefix_len_at_least(rust),
            "core::fmt::Formatter::pad".len()
        );
        let anonymous = "_ZN4llvm12_GLOBAL__N_13FooEv";
        assert_eq!(display_prefix_len_at_least(anonymous), 0, "read only whole");
        assert_eq!(display_prefix_len_at_least("_ZN4llvm6VectorIiE4sizeEv"), 0);
        assert_eq!(display_prefix_len_at_least("_Z3fooIiEvT_"), 0);
        assert_eq!(display_prefix_len_at_least("_ZN12foo$LT$T$GT$3barE"), 0);
        assert_eq!(display_prefix_len_at_least("_RNvCs1234_7mycrate3foo"), 0);
        assert_eq!(display_prefix_len_at_least("malloc"), 0);
        assert_eq!(display_prefix_len_at_least("_ZN99shortE"), 0);
        assert_eq!(display_prefix_len_at_least("_ZN18446744073709551615xE"), 0);
    }

    #[test]
    fn needles_in_any_case_are_found_in_any_case() {
        let hint = Needles::in_any_case("runpasses");
        assert!(hint.could_match("_ZN4llvm9RunPassesEv"));
        assert!(!hint.could_match("_ZN4llvm8RunPasseEv"));
        assert!(
            Needles::in_any_case("vtt").needles.is_empty(),
            "a demangler's word"
        );
    }

    #[test]
    fn needles_are_the_runs_only_a_source_name_could_hold() {
        let needles = |n: Needles| n.needles;
        assert_eq!(
            needles(Needles::of_literal("llvm::RunPasses(int)")),
            ["llvm", "RunPasses"]
        );
        assert_eq!(needles(Needles::of_glob("*json_dump*")), ["json_dump"]);
        assert!(needles(Needles::of_glob("ns::[ab]oo")).is_empty());
        let generated = "std::map<unsigned int, std::allocator<int> >::emplace() const";
        assert_eq!(needles(Needles::of_literal(generated)), ["map", "emplace"]);
        assert!(needles(Needles::of_literal("{closure#0} '_12 5ul 0x7f x")).is_empty());
        let found = Needles::of_literal("ns::foo(int)");
        assert!(found.could_match("_ZN2ns3fooEi"));
        assert!(!found.could_match("_ZN2ns3barEi"));
    }

    /// Every run of every demangled name of `module` is in its mangled name or could
    /// have been written by the demangler; the runs that break the rule.
    fn words_the_rule_misses(module: &ModuleSymbols) -> Vec<(String, String)> {
        let mut missed = Vec::new();
        for f in &module.functions {
            let Some(mangled) = f.name.mangled() else {
                continue;
            };
            let demangled = demangle(mangled);
            for run in runs(&demangled) {
                if tests_something(run) && !mangled.contains(run) {
                    missed.push((run.to_string(), mangled.to_string()));
                }
            }
            let cut = match demangled.find('(') {
                Some(0) | None => demangled.as_str(),
                Some(i) => &demangled[..i],
            };
            if display_prefix_len_at_least(mangled) > cut.to_lowercase().chars().count() {
                missed.push((
                    format!("{cut} is shorter than its bound"),
                    mangled.to_string(),
                ));
            }
        }
        missed
    }

    #[test]
    fn a_demangled_word_is_in_the_mangled_name_or_the_demanglers_own() {
        // Rust (this test binary, legacy mangling and v0) and C++ (libstdc++); more
        // libraries in TENDRIL_DEMANGLE_CHECK (paths, `:`-separated), as rustc's.
        let extra = std::env::var("TENDRIL_DEMANGLE_CHECK").unwrap_or_default();
        let mut paths = vec![std::env::current_exe().unwrap()];
        // Installed with g++, which builds the C++ fixtures.
        paths.push("/usr/lib/x86_64-linux-gnu/libstdc++.so.6".into());
        paths.extend(extra.split(':').filter(|p| !p.is_empty()).map(Into::into));
        for path in paths {
            let module = ModuleSymbols::from_file(&path, 0).unwrap();
            let mangled = module
                .functions
                .iter()
                .filter(|f| f.name.mangled().is_some());
            assert!(
                mangled.count() > 100,
                "{} has mangled names",
                path.display()
            );
            let missed = words_the_rule_misses(&module);
            let mut words: Vec<&str> = missed.iter().map(|(run, _)| run.as_str()).collect();
            words.sort_unstable();
            words.dedup();
            let example = missed.first();
            assert!(
                missed.is_empty(),
                "{}: {words:?}, as in {example:?}",
                path.display()
            );
        }
    }
}
