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
//! every symbol of real libraries.

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
pub(super) struct Needles(Vec<String>);

impl Needles {
    /// The needles of `text` taken literally (a name that is `text`, or whose part is).
    pub(super) fn of_literal(text: &str) -> Needles {
        Needles(
            runs(text)
                .filter(|run| tests_something(run))
                .map(String::from)
                .collect(),
        )
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
        self.0
            .iter()
            .all(|needle| mangled.contains(needle.as_str()))
    }
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
    let rest = run.trim_start_matches('_');
    let number = rest.starts_with(|c: char| c.is_ascii_digit());
    !number && rest.len() > 1 && !DEMANGLER_WORDS.iter().any(|word| word.contains(rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbols::{ModuleSymbols, demangle};

    #[test]
    fn needles_are_the_runs_only_a_source_name_could_hold() {
        let needles = |n: Needles| n.0;
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
