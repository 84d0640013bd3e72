//! The agent library embedded in this binary, and installing it where a target can load it.
//!
//! The agent goes into the target user's private runtime directory (mode 0700, owned by
//! that user), under a name that carries a digest of its bytes, so two tendril builds
//! never overwrite each other's agent while a process has it mapped. Paths are resolved
//! through `/proc/PID/root`, so a target in a container gets the file in its own `/tmp`.

use crate::process::{AttachError, TargetProcess};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

include!(concat!(env!("OUT_DIR"), "/agent_bundle.rs"));

/// The name every build of the agent library starts with.
const AGENT_LIBRARY_PREFIX: &str = "libtendril_agent";

/// Whether a module (by file name) is a tendril agent, of this build or another: its
/// code is tendril's own, and is never instrumented.
pub fn is_agent_module(file_name: &str) -> bool {
    file_name.starts_with(AGENT_LIBRARY_PREFIX)
}

/// File name of the agent library built into this tendril.
pub fn agent_file_name() -> String {
    format!("{AGENT_LIBRARY_PREFIX}-{AGENT_DIGEST}.so")
}

/// Creates (or checks) the target user's runtime directory; returns its path as tendril
/// sees it.
pub fn prepare_runtime_dir(target: &TargetProcess) -> Result<PathBuf, AttachError> {
    let dir = target.path_in_target(&tendril_wire::runtime_dir(target.uid));
    let fail = |message: String| AttachError::Other {
        pid: target.pid,
        message,
    };
    match std::fs::create_dir(&dir) {
        Ok(()) => {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| fail(format!("cannot set the mode of {}: {e}", dir.display())))?;
            std::os::unix::fs::chown(&dir, Some(target.uid), Some(target.gid)).map_err(|e| {
                fail(format!(
                    "cannot give {} to uid {}: {e}",
                    dir.display(),
                    target.uid
                ))
            })?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(fail(format!("cannot create {}: {e}", dir.display()))),
    }
    let meta = std::fs::symlink_metadata(&dir)
        .map_err(|e| fail(format!("cannot inspect {}: {e}", dir.display())))?;
    if !meta.is_dir() || meta.uid() != target.uid || meta.mode() & 0o777 != 0o700 {
        return Err(fail(format!(
            "{} must be a directory owned by uid {} with mode 0700; remove it and try again",
            dir.display(),
            target.uid
        )));
    }
    Ok(dir)
}

/// Writes the agent into the runtime directory unless it is already there; returns the
/// path the target must `dlopen` (a path inside the target's mount namespace).
pub fn install_agent(
    target: &TargetProcess,
    runtime_dir: &std::path::Path,
) -> Result<PathBuf, AttachError> {
    let name = agent_file_name();
    let installed = runtime_dir.join(&name);
    let fail = |message: String| AttachError::Other {
        pid: target.pid,
        message,
    };
    let up_to_date =
        std::fs::metadata(&installed).is_ok_and(|m| m.len() == AGENT_BYTES.len() as u64);
    if !up_to_date {
        let temporary = runtime_dir.join(format!(".{name}.{}", std::process::id()));
        std::fs::write(&temporary, AGENT_BYTES)
            .and_then(|()| std::os::unix::fs::chown(&temporary, Some(target.uid), Some(target.gid)))
            .and_then(|()| std::fs::rename(&temporary, &installed))
            .map_err(|e| {
                let _ = std::fs::remove_file(&temporary);
                fail(format!(
                    "cannot install the agent in {}: {e}",
                    runtime_dir.display()
                ))
            })?;
    }
    Ok(tendril_wire::runtime_dir(target.uid).join(name))
}
