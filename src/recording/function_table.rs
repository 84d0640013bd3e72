//! Writing the function table a recording's agent uses to discover callees (see
//! `tendril_wire::function_table`).
//!
//! The one idea: the agent can decode a function only if it knows where the function
//! ends, and can follow a PLT stub only if something knows where it leads; the
//! controller knows both from the symbols, so it hands them over in a file. Functions
//! that must never be instrumented — the dynamic loader's (they run while the process
//! is half set up, with their own calling conventions), the vDSO's, the agent's, and
//! those refused by name (`refusals`) — are marked excluded.

use crate::process::{AttachError, TargetProcess};
use crate::refusals::Refusals;
use crate::symbols::{Function, ProcessSymbols, SymbolSource};
use std::collections::HashMap;
use std::path::PathBuf;
use tendril_wire::function_table::{self, FLAG_EXCLUDED, FLAG_PLT, FunctionEntry};

/// The table for `symbols`.
pub fn entries(symbols: &ProcessSymbols) -> Vec<FunctionEntry> {
    let exported: HashMap<&str, &Function> = symbols
        .functions()
        .iter()
        .filter(|f| f.source != SymbolSource::Plt && f.size > 0 && !f.ifunc)
        .map(|f| (f.raw_name.as_str(), f))
        .collect();
    let refusals = Refusals::new(symbols);
    let mut entries: Vec<FunctionEntry> = Vec::with_capacity(symbols.functions().len());
    for function in symbols.functions() {
        if entries.last().is_some_and(|e| e.start == function.addr) {
            continue; // An alias: the first name at an address is the best one.
        }
        let mut flags = 0;
        let mut target = 0;
        if let Some(callee) = function.plt_target() {
            flags |= FLAG_PLT;
            target = exported
                .get(callee)
                .filter(|f| f.module != function.module)
                .map_or(0, |f| f.addr);
        }
        if is_excluded(&function.module) || refusals.reason(function).is_some() {
            flags |= FLAG_EXCLUDED;
        }
        entries.push(FunctionEntry {
            start: function.addr,
            size: function.size,
            flags,
            target,
        });
    }
    entries
}

/// Modules whose functions are never instrumented.
fn is_excluded(module: &str) -> bool {
    module.starts_with("ld-linux")
        || module.starts_with("ld-")
        || module == "[vdso]"
        || crate::agent_bundle::is_agent_module(module)
}

/// Writes the table into the target user's runtime directory; returns (the path as
/// tendril sees it, the path inside the target's mount namespace).
pub fn write(
    target: &TargetProcess,
    symbols: &ProcessSymbols,
    token: u64,
) -> Result<(PathBuf, String), AttachError> {
    let fail = |message: String| AttachError::Other {
        pid: target.pid,
        message,
    };
    crate::agent_bundle::prepare_runtime_dir(target)?;
    let in_target = function_table::table_path(target.uid, target.ns_pid, token);
    let path = target.path_in_target(&in_target);
    let bytes = function_table::encode(&entries(symbols));
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::remove_file(&path);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut file| file.write_all(&bytes).map(|()| file))
            .map_err(|e| fail(format!("cannot write {}: {e}", path.display())))?;
        file.flush()
            .map_err(|e| fail(format!("cannot write {}: {e}", path.display())))?;
    }
    std::os::unix::fs::chown(&path, Some(target.uid), Some(target.gid)).map_err(|e| {
        fail(format!(
            "cannot give {} to uid {}: {e}",
            path.display(),
            target.uid
        ))
    })?;
    Ok((path, in_target.display().to_string()))
}
