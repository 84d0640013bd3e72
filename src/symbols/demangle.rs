//! Demangling of Rust and C++ symbol names for display and matching.
//!
//! Rust is tried first (legacy `_ZN…17h<hash>E` and v0 `_R…`, shown without the hash),
//! then the Itanium C++ ABI (`_Z…`); anything else is shown as is. A suffix starting at
//! `@` (symbol versions such as `@GLIBC_2.2.5`, or our own `@plt`) is not part of the
//! mangled name: it is split off, the rest is demangled and the suffix put back.

use foldhash::HashMap;

use cpp_demangle::{DemangleOptions, Symbol};

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

/// [`demangle`] with a memory: a module's PLT stubs mostly call functions its own
/// dynamic symbol table also lists, and parsing a C++ name is the slow part of loading.
#[derive(Default)]
pub(super) struct Demangler {
    cache: HashMap<String, Option<String>>,
}

impl Demangler {
    pub(super) fn demangle(&mut self, raw: &str) -> String {
        let (base, suffix) = split_suffix(raw);
        if !base.starts_with("_Z") && !base.starts_with("_R") {
            return raw.to_string();
        }
        let demangled = match self.cache.get(base) {
            Some(cached) => cached.clone(),
            None => {
                let d = demangle_base(base);
                self.cache.insert(base.to_string(), d.clone());
                d
            }
        };
        match demangled {
            Some(name) => name + suffix,
            None => raw.to_string(),
        }
    }
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
    fn demangler_agrees() {
        let mut d = Demangler::default();
        for raw in [
            "_ZN2ns3fooEi",
            "_ZN2ns3fooEi@plt",
            "main",
            "_RNvCs1234_7mycrate3foo",
            "_Zx",
        ] {
            assert_eq!(d.demangle(raw), demangle(raw));
        }
    }

    #[test]
    fn plain_names_unchanged() {
        assert_eq!(demangle("main"), "main");
        assert_eq!(demangle("_Zgarbage"), "_Zgarbage");
        assert_eq!(cpp_short_name("main"), None);
        assert_eq!(cpp_short_name("_RNvCs1234_7mycrate3foo"), None);
    }
}
