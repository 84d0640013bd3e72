//! Errors of the symbol loader.
//!
//! Every message says what happened and, where the user can do something about it, what
//! to do. I/O errors on `/proc` files are classified (missing process, permission denied)
//! at the point where the path is known, so callers never see a bare `ENOENT`.

use std::io;
use std::path::{Path, PathBuf};

/// What can go wrong while reading the functions of a process or of one ELF file.
#[derive(Debug, thiserror::Error)]
pub enum SymbolError {
    /// `/proc/PID` does not exist.
    #[error("no process with pid {pid}")]
    NoProcess { pid: i32 },

    /// The process has no mappings at all: it has exited and not been reaped yet, or it
    /// is a kernel thread.
    #[error(
        "process {pid} has no memory mappings — it has exited (a zombie) or is a kernel thread"
    )]
    NoMappings { pid: i32 },

    /// A `/proc` file or an ELF file could not be read for lack of permission.
    #[error("cannot read {}: permission denied — run as the same user or as root", path.display())]
    PermissionDenied { path: PathBuf },

    /// Any other I/O failure.
    #[error("cannot read {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },

    /// `/proc/PID/maps` had a line we could not understand.
    #[error("cannot parse line {line_no} of /proc/{pid}/maps: {line:?}")]
    BadMaps {
        pid: i32,
        line_no: usize,
        line: String,
    },

    /// The file is not an ELF image goblin can parse.
    #[error("{} is not a readable ELF file: {reason}", path.display())]
    BadElf { path: PathBuf, reason: String },

    /// The file is an ELF image, but not x86-64.
    #[error("{} is not an x86-64 ELF file (machine {machine}); only x86-64 is supported", path.display())]
    WrongArch { path: PathBuf, machine: u16 },

    /// The pattern has glob characters but is not a valid glob (and matches nothing
    /// literally either).
    #[error("invalid glob '{pattern}': {problem}")]
    InvalidGlob { pattern: String, problem: String },

    /// A `module:name` pattern whose module is none of the process's modules.
    /// `suggestions` holds up to five close module names, `modules` all of them.
    #[error("{}", no_module_message(module, suggestions, modules))]
    NoModule {
        module: String,
        suggestions: Vec<String>,
        modules: Vec<String>,
    },

    /// `find` found nothing. `suggestions` holds up to five close names.
    #[error("{}", no_match_message(pattern, suggestions))]
    NoMatch {
        pattern: String,
        suggestions: Vec<String>,
    },
}

impl SymbolError {
    /// Classifies an I/O error on `path`: `EACCES`/`EPERM` become
    /// [`SymbolError::PermissionDenied`], everything else [`SymbolError::Io`].
    pub(crate) fn io(path: &Path, source: io::Error) -> SymbolError {
        match source.kind() {
            io::ErrorKind::PermissionDenied => SymbolError::PermissionDenied {
                path: path.to_path_buf(),
            },
            _ => SymbolError::Io {
                path: path.to_path_buf(),
                source,
            },
        }
    }

    /// Like [`SymbolError::io`] for a file under `/proc/PID`: a missing file there means
    /// the process is gone (or never existed).
    pub(crate) fn proc_io(pid: i32, path: &Path, source: io::Error) -> SymbolError {
        // ESRCH shows up when the process exits between open and read.
        if source.kind() == io::ErrorKind::NotFound || source.raw_os_error() == Some(libc::ESRCH) {
            SymbolError::NoProcess { pid }
        } else {
            SymbolError::io(path, source)
        }
    }
}

fn no_match_message(pattern: &str, suggestions: &[String]) -> String {
    if suggestions.is_empty() {
        format!("no function matches '{pattern}'")
    } else {
        format!(
            "no function matches '{pattern}' — did you mean: {}?",
            suggestions.join(", ")
        )
    }
}

/// Most module names listed when none is close to the one asked for.
const MODULES_LISTED: usize = 5;

fn no_module_message(module: &str, suggestions: &[String], modules: &[String]) -> String {
    format!(
        "no module matches '{module}' — {}",
        module_hint(suggestions, modules)
    )
}

/// "did you mean: ...?" with close module names, else the first few modules.
pub(crate) fn module_hint(suggestions: &[String], modules: &[String]) -> String {
    if !suggestions.is_empty() {
        return format!("did you mean: {}?", suggestions.join(", "));
    }
    let listed = modules[..modules.len().min(MODULES_LISTED)].join(", ");
    if modules.len() > MODULES_LISTED {
        format!(
            "its {} modules include {listed} and {} more",
            modules.len(),
            modules.len() - MODULES_LISTED
        )
    } else {
        format!("its modules are {listed}")
    }
}
