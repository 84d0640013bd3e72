//! Every function of every ELF module mapped into a live process.
//!
//! The one idea: a function is known from whatever the module still carries —
//! `.symtab`, `.dynsym`, the PLT stubs (`name@plt`, found by decoding them), and for
//! stripped code the `.eh_frame` FDEs, which give each function's start and length even
//! when no name survives (`module+0xOFFSET`). Go code has no FDEs, but every Go binary
//! keeps its functions' names and bounds in `.gopclntab` ([`go_pclntab`]), which also
//! marks them as Go's ([`Function::go_code`]: never patched). Files are read through `/proc/PID/root`, so
//! targets in containers work, and relocated by each module's load bias.
//!
//! * [`ProcessSymbols`] loads a whole process (`/proc/PID/maps`), looks addresses up and
//!   finds functions by pattern ([`ProcessSymbols::find`] documents the pattern syntax).
//! * [`ModuleSymbols`] loads one ELF file at a given load bias.
//! * [`SymbolText`]: a function's names are ranges of its module's one string table,
//!   shared, so a module of 300,000 functions costs a handful of allocations.
//! * [`run_symbols_command`] is `tendril symbols <PID> [PATTERN] [--json]`.
//! * [`jit`] names code generated at run time, from the perf maps and jitdumps runtimes
//!   write for profilers.

mod builder;
mod cache;
mod cache_dir;
mod command;
mod demangle;
mod error;
pub(crate) mod fde;
pub mod go_pclntab;
mod index;
pub mod jit;
pub mod maps;
mod module;
mod needles;
mod pattern;
mod plt;
mod process;
mod progress;
mod text;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use cache_dir::CACHE_DIR_VAR;
pub use command::run_symbols_command;
pub use demangle::{cpp_short_name, demangle};
pub use error::SymbolError;
pub use module::{ModuleSymbols, PltStub, load_bias};
pub use process::{ProcessSymbols, SkippedModule};
pub use progress::show_progress_on_this_thread;
pub use text::SymbolText;

/// A module of the process: one ELF file (or the vDSO) and where it is mapped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    /// File name (`libc.so.6`), or `[vdso]`.
    pub name: String,
    /// Path as seen inside the target.
    pub path: PathBuf,
    /// Runtime address minus ELF virtual address.
    pub load_bias: u64,
    /// Lowest mapped address.
    pub start: u64,
    /// One past the highest mapped address.
    pub end: u64,
}

/// One function of the target, at its runtime address. Its texts share their module's
/// string table ([`SymbolText`]): a function costs no allocation of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    /// Runtime address of the first instruction.
    pub addr: u64,
    /// Size in bytes; 0 for symbols that declare none (e.g. `_init`).
    pub size: u64,
    /// File name of the module (`libc.so.6`, `[vdso]`).
    pub module: SymbolText,
    /// Path of the module as seen inside the target (one allocation per module).
    pub module_path: Arc<Path>,
    /// Display name: demangled (Rust without its hash), `name@plt`, or `module+0xOFFSET`.
    pub name: SymbolText,
    /// The symbol as stored (mangled), or the synthetic name for PLT stubs and FDEs.
    pub raw_name: SymbolText,
    /// Where the function was found.
    pub source: SymbolSource,
    /// A GNU indirect function: the symbol's address is a resolver that picks the
    /// implementation at load time (`memcpy` and friends in glibc); calls go to the
    /// implementation, not here.
    pub ifunc: bool,
    /// Compiled by Go: its code lies in the module's `.gopclntab` functions. Go's
    /// runtime walks its stacks by return address, so such code is never patched
    /// (`refusals`).
    pub go_code: bool,
}

impl Function {
    /// A 16-byte function from the full symbol table of `module` (under `/usr/lib`),
    /// for unit tests.
    #[cfg(test)]
    pub fn for_tests(module: &str, raw_name: &str, addr: u64) -> Function {
        Function {
            addr,
            size: 16,
            module: module.into(),
            module_path: PathBuf::from(format!("/usr/lib/{module}")).into(),
            name: demangle(raw_name).into(),
            raw_name: raw_name.into(),
            source: SymbolSource::Symtab,
            ifunc: false,
            go_code: false,
        }
    }

    /// One past the last byte (`addr + size`).
    pub fn end(&self) -> u64 {
        self.addr.saturating_add(self.size)
    }

    /// Whether `addr` lies inside the function (never, for a zero-size symbol).
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.addr && addr < self.end()
    }

    /// For a PLT stub, the symbol it calls (`memcpy` for `memcpy@plt`).
    pub fn plt_target(&self) -> Option<&str> {
        match self.source {
            SymbolSource::Plt => self.raw_name.strip_suffix("@plt"),
            _ => None,
        }
    }
}

/// Where a [`Function`] came from, in order of trust (the derived order is used when
/// several names share an address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SymbolSource {
    /// The full symbol table (absent from stripped files).
    Symtab,
    /// The full symbol table of a stripped file's separate debug file (found by build
    /// id under `/usr/lib/debug`, where `-dbg`/`-debuginfo` packages install them).
    DebugFile,
    /// The dynamic symbol table (exported and imported symbols).
    Dynsym,
    /// A PLT stub, named `target@plt`.
    Plt,
    /// An `.eh_frame` FDE no symbol covers, named `module+0xOFFSET`.
    Fde,
    /// A Go function no symbol covers, named from the module's `.gopclntab`.
    GoPclntab,
}

impl SymbolSource {
    /// Lowercase name, as in JSON output: `symtab`, `debug`, `dynsym`, `plt`, `fde`,
    /// `gopclntab`.
    pub fn as_str(self) -> &'static str {
        match self {
            SymbolSource::Symtab => "symtab",
            SymbolSource::DebugFile => "debug",
            SymbolSource::Dynsym => "dynsym",
            SymbolSource::Plt => "plt",
            SymbolSource::Fde => "fde",
            SymbolSource::GoPclntab => "gopclntab",
        }
    }
}

impl fmt::Display for SymbolSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
