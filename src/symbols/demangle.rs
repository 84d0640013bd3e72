//! Demangling of Rust and C++ symbol names for display and matching.
//!
//! Rust is tried first (legacy `_ZN…17h<hash>E` and v0 `_R…`, shown without the hash),
//! then the Itanium C++ ABI (`_Z…`); anything else is shown as is. A suffix starting at
//! `@` (symbol versions such as `@GLIBC_2.2.5`, or our own `@plt`) is not part of the
//! mangled name: it is split off, the rest is demangled and the suffix put back.

use cpp_demangle::{DemangleOptions, Symbol};

use super::Function;

/// The display name of `raw`: demangled if it is a Rust or C++ symbol, else `raw` itself.
pub fn demangle(raw: &str) -> String {
    let (base, suffix) = split_suffix(raw);
    match demangle_base(base) {
        Some(mut name) => {
            name.push_str(suffix);
            name
        }
        None => raw.to_string(),
    }
}

/// The C++ name of `raw` without its parameter list and return type
/// (`_ZN2ns3fooEi` → `ns::foo`, `_Z3fooIiEiT_` → `foo<int>`), keeping a clone suffix
/// (`ns::foo [clone .cold]`) so that a clone is not mistaken for its origin.
/// `None` when `raw` is not a C++ symbol or the short form equals the full one.
pub fn cpp_short_name(raw: &str) -> Option<String> {
    let (base, suffix) = split_suffix(raw);
    if !base.starts_with("_Z") || rustc_demangle::try_demangle(base).is_ok() {
        return None;
    }
    let sym = Symbol::new(base).ok()?;
    let full = sym.demangle().ok()?;
    let options = DemangleOptions::new().no_params().no_return_type();
    let mut short = sym.demangle_with_options(&options).ok()?;
    if let Some(clone) = full.find(" [clone ") {
        short.push_str(&full[clone..]);
    }
    short.push_str(suffix);
    (short != full).then_some(short)
}

/// Whether `raw` looks like a Rust or C++ symbol (`_Z…`, `_R…`, maybe with a `@`
/// suffix): a name whose display name is [`demangle`]d from it, where any other is
/// shown as stored. (One that only looks mangled demangles to itself.)
pub(super) fn is_mangled(raw: &str) -> bool {
    let (base, _) = split_suffix(raw);
    base.starts_with("_Z") || base.starts_with("_R")
}

/// Demangles the name of every one of `functions` now, on every core (for what lists
/// or compares every name; a name is otherwise demangled when first read).
pub(super) fn demangle_every_name(functions: &[Function]) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let part = functions.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        for functions in functions.chunks(part) {
            scope.spawn(move || functions.iter().for_each(|f| _ = f.name.as_str()));
        }
    });
}

fn split_suffix(raw: &str) -> (&str, &str) {
    match raw.find('@') {
        Some(at) if at > 0 => raw.split_at(at),
        _ => (raw, ""),
    }
}

fn demangle_base(base: &str) -> Option<String> {
    if let Ok(d) = rustc_demangle::try_demangle(base) {
        return Some(format!("{d:#}"));
    }
    cpp_demangle_base(base)
}

fn cpp_demangle_base(base: &str) -> Option<String> {
    if base.starts_with("_Z") {
        return Symbol::new(base).ok()?.demangle().ok();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_legacy_without_hash() {
        assert_eq!(
            demangle("_ZN4core3fmt9Formatter3pad17h0123456789abcdefE"),
            "core::fmt::Formatter::pad"
        );
    }

    #[test]
    fn rust_v0() {
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo"), "mycrate::foo");
    }

    #[test]
    fn cpp_with_params() {
        assert_eq!(
            demangle("_ZNKSt6vectorIiSaIiEE4sizeEv"),
            "std::vector<int, std::allocator<int> >::size() const"
        );
        assert_eq!(
            cpp_short_name("_ZNKSt6vectorIiSaIiEE4sizeEv").as_deref(),
            Some("std::vector<int, std::allocator<int> >::size")
        );
        assert_eq!(cpp_short_name("_Z3fooIiEiT_").as_deref(), Some("foo<int>"));
    }

    #[test]
    fn cpp_clone_keeps_suffix() {
        assert_eq!(demangle("_ZN2ns3fooEi.cold"), "ns::foo(int) [clone .cold]");
        assert_eq!(
            cpp_short_name("_ZN2ns3fooEi.cold").as_deref(),
            Some("ns::foo [clone .cold]")
        );
    }

    #[test]
    fn suffixes_are_kept() {
        assert_eq!(demangle("_ZN2ns3fooEi@plt"), "ns::foo(int)@plt");
        assert_eq!(demangle("memcpy@GLIBC_2.14"), "memcpy@GLIBC_2.14");
        assert_eq!(
            cpp_short_name("_ZN2ns3fooEi@plt").as_deref(),
            Some("ns::foo@plt")
        );
    }

    #[test]
    fn what_demangles_looks_mangled() {
        for raw in [
            "_ZN2ns3fooEi",
            "_ZN2ns3fooEi@plt",
            "main",
            "memcpy@GLIBC_2.14",
            "_RNvCs1234_7mycrate3foo",
            "_ZN4core3fmt9Formatter3pad17h0123456789abcdefE",
        ] {
            assert_eq!(is_mangled(raw), demangle(raw) != raw, "{raw}");
        }
        assert!(is_mangled("_Zx"), "looks mangled");
        assert_eq!(demangle("_Zx"), "_Zx", "but is shown as stored");
    }

    #[test]
    fn plain_names_unchanged() {
        assert_eq!(demangle("main"), "main");
        assert_eq!(demangle("_Zgarbage"), "_Zgarbage");
        assert_eq!(cpp_short_name("main"), None);
        assert_eq!(cpp_short_name("_RNvCs1234_7mycrate3foo"), None);
    }
}
