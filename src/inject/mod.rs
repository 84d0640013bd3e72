//! Getting a greeted control session with the agent inside a target process.
//!
//! If an agent is already resident and listening, [`attach`] just connects to it (and
//! checks that the socket's listener is the target itself). If not, the agent library
//! is handed to the target in a memfd the target makes (see `agent_memfd`) and loaded
//! with a remote `dlopen` on one borrowed thread (see `safe_point` for how the thread
//! and the moment are chosen), on a stack mapped for it (`remote_call`); the thread's
//! registers are restored afterwards, so an interrupted system call restarts. The
//! agent's constructor makes the target user's runtime directory if needed and opens
//! the control socket there (see `runtime_dir` for how tendril reads it): tendril
//! itself creates nothing in the target's filesystem, which the target's user may have
//! shaped with a mount namespace.
//!
//! An agent whose control thread runs but whose socket does not answer (its file was
//! deleted) is not loaded again: it binds a new socket within a fraction of a second,
//! and tendril waits for that.

mod agent_memfd;
pub mod agent_priority;
mod failed_load;
mod loader;
mod remote_call;
mod runtime_dir;
mod safe_point;
pub mod seccomp;
mod stack_walk;
mod stale_files;
pub mod tracee;

pub use tracee::Tracee;

use crate::agent_bundle;
use crate::agent_connection::{AgentConnection, AgentConnectionError};
use crate::process::{self, AttachError, TargetProcess};
use crate::symbols::maps::{self, Mapping};
use remote_call::RemoteFrame;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long the borrowed thread may spend inside `dlopen`.
const DLOPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a just-started process may take to map its libc.
const LOADER_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a freshly loaded agent may take to open its socket.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a session with the agent could not be had.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error(transparent)]
    Attach(#[from] AttachError),
    #[error("process {pid}: {source}")]
    Session {
        pid: i32,
        source: AgentConnectionError,
    },
}

/// The agent's control socket for `target`, as a path tendril can connect to.
pub fn control_socket(target: &TargetProcess) -> PathBuf {
    target.path_in_target(&tendril_wire::control_socket_path(
        target.uid,
        target.ns_pid,
    ))
}

/// Connects to the agent resident in `pid`, if there is one; never injects.
pub fn connect_existing(pid: i32) -> Result<Option<(TargetProcess, AgentConnection)>, InjectError> {
    agent_priority::run_ahead_of_the_target();
    let mut found = connect_existing_inner(pid)?;
    if let Some((_, session)) = found.as_mut() {
        agent_priority::raise_for(pid, session);
    }
    Ok(found)
}

fn connect_existing_inner(
    pid: i32,
) -> Result<Option<(TargetProcess, AgentConnection)>, InjectError> {
    let target = process::inspect(pid)?;
    refuse_stopped(pid)?;
    let socket = control_socket(&target);
    match AgentConnection::open(&socket, target.pid) {
        Ok(session) => Ok(Some((target, session))),
        Err(AgentConnectionError::Io(_)) if control_thread_runs(pid) => {
            let session = wait_for_agent(&target, &socket, AgentState::Resident)?;
            Ok(Some((target, session)))
        }
        Err(AgentConnectionError::Io(_)) => Ok(None),
        Err(source) => Err(InjectError::Session { pid, source }),
    }
}

/// Whether the agent's control thread runs in `pid` (its name is the agent's thread
/// prefix and `control`, cut to the 15 bytes of a thread name).
fn control_thread_runs(pid: i32) -> bool {
    process::thread_ids(pid).is_ok_and(|tids| {
        tids.into_iter()
            .any(|tid| process::thread_name(pid, tid) == "tendril-control")
    })
}

/// Returns a session with the agent in `pid`, loading the agent first if needed.
pub fn attach(pid: i32) -> Result<(TargetProcess, AgentConnection), InjectError> {
    agent_priority::run_ahead_of_the_target();
    let (target, mut session) = attach_inner(pid).map_err(|error| match error {
        // Whatever step failed, a process that is gone or exiting explains it best.
        InjectError::Attach(AttachError::Other { .. } | AttachError::PermissionDenied(_))
            if process::is_gone_or_exiting(pid) =>
        {
            AttachError::Exited(pid).into()
        }
        other => other,
    })?;
    agent_priority::raise_for(target.pid, &mut session);
    Ok((target, session))
}

fn attach_inner(pid: i32) -> Result<(TargetProcess, AgentConnection), InjectError> {
    let target = process::inspect(pid)?;
    refuse_stopped(pid)?;
    stale_files::sweep(&target);
    let socket = control_socket(&target);
    match AgentConnection::open(&socket, target.pid) {
        Ok(session) => return Ok((target, session)),
        Err(AgentConnectionError::Io(_)) if control_thread_runs(pid) => {
            // The agent binds a new socket (and makes the runtime directory again if it
            // went with it).
            let session = wait_for_agent(&target, &socket, AgentState::Resident)?;
            return Ok((target, session));
        }
        Err(AgentConnectionError::Io(_)) => {}
        Err(source) => return Err(InjectError::Session { pid, source }),
    }
    load_agent(&target)?;
    let session = wait_for_agent(&target, &socket, AgentState::JustStarted)?;
    Ok((target, session))
}

/// A stopped process can neither run a remote `dlopen` nor let its agent answer: both
/// would wait for a `kill -CONT` that may never come.
fn refuse_stopped(pid: i32) -> Result<(), AttachError> {
    if process::is_stopped(pid) {
        return Err(AttachError::Stopped(pid));
    }
    Ok(())
}

/// Loads the agent into the target (or restarts a resident agent's control thread, as
/// in a forked child that inherited the library but not the thread).
fn load_agent(target: &TargetProcess) -> Result<(), AttachError> {
    let pid = target.pid;
    process::check_executable(target)?;
    runtime_dir::refuse_unusable(target)?;
    if let Some(runtime_dir) = runtime_dir::open_existing(target) {
        runtime_dir::remove_startup_error(target, &runtime_dir);
    }
    let (maps, entry_points) = wait_for_loader(target)?;
    let resident: Vec<&Mapping> = maps
        .iter()
        .filter(|m| {
            m.file_name()
                .is_some_and(crate::agent_bundle::is_agent_module)
        })
        .collect();
    // Only a loaded agent has its code mapped: what a failed load left is not one.
    let resident = if failed_load::is_resident(&resident) {
        resident
    } else {
        Vec::new()
    };
    // The build is in the name: another build's agent cannot be replaced.
    if let Some(other) = resident
        .iter()
        .find(|m| !m.file_name().is_some_and(agent_bundle::is_this_agent))
    {
        return Err(AttachError::Other {
            pid,
            message: format!(
                "another tendril build's agent ({}) is resident and silent; restart the target to use this tendril",
                other.path.display()
            ),
        });
    }
    let mut tracee = safe_point::seize_thread_at_safe_point(pid, &entry_points)?;
    load_with(target, &mut tracee, &entry_points, &resident)?;
    tracee.restore_and_detach()
}

/// Loads the agent into a program that this process started and traces, stopped
/// before its first instruction (`tendril run`). The thread stays stopped and traced
/// (with its registers as they were) until the returned tracee is dropped, so tendril
/// can set up the recording before the program runs.
pub fn load_agent_before_start(pid: i32) -> Result<Tracee, AttachError> {
    let target = process::inspect(pid)?;
    let (_, entry_points) = wait_for_loader(&target)?;
    let mut tracee = Tracee::adopt_stopped(pid, pid);
    tracee.save_registers()?;
    load_with(&target, &mut tracee, &entry_points, &[])?;
    tracee.restore_registers()?;
    Ok(tracee)
}

/// Loads the agent on a stopped, saved thread, on a stack mapped for the call (when the
/// target's libc has `mmap`): `dlopen` of a memfd holding it, or when a build of it is
/// `resident`, a call of its start function.
fn load_with(
    target: &TargetProcess,
    tracee: &mut Tracee,
    entry_points: &loader::LoaderEntryPoints,
    resident: &[&Mapping],
) -> Result<(), AttachError> {
    seccomp::check(tracee)?;
    let mut frame = RemoteFrame::new(tracee);
    if let Some((mmap, munmap)) = entry_points.mmap {
        frame.use_fresh_stack(mmap, munmap)?;
    }
    match call_loader(target, &mut frame, entry_points, resident) {
        Ok(()) => frame.release_fresh_stack(),
        // The target answered (dlopen failed, the memfd was refused): unmap the stack.
        Err(LoadFailure::Refused(error)) => {
            frame.release_fresh_stack()?;
            Err(error)
        }
        // A call that did not come back (a fault, a timeout) may leave something on
        // the stack it ran on: it stays mapped.
        Err(LoadFailure::Stuck(error)) => Err(error),
    }
}

/// Why loading the agent failed: the target refused (it answered), or a call did not
/// come back.
enum LoadFailure {
    Refused(AttachError),
    Stuck(AttachError),
}

/// `dlopen` of a memfd holding the agent, or when a build of it is `resident`, a call
/// of its start function, on `frame`.
fn call_loader(
    target: &TargetProcess,
    frame: &mut RemoteFrame,
    entry_points: &loader::LoaderEntryPoints,
    resident: &[&Mapping],
) -> Result<(), LoadFailure> {
    let pid = target.pid;
    if resident.is_empty() {
        let memfd = agent_memfd::deliver(pid, frame, entry_points).map_err(LoadFailure::Refused)?;
        let mut path = memfd.path().into_bytes();
        path.push(0);
        let path_address = frame.push_bytes(&path).map_err(LoadFailure::Stuck)?;
        let handle = frame.call(
            entry_points.dlopen,
            &[path_address, libc::RTLD_NOW as u64],
            DLOPEN_TIMEOUT,
        );
        let reason = match handle {
            Ok(0) => Some(describe_dlopen_failure(frame, entry_points)),
            _ => None,
        };
        memfd.close(frame, entry_points);
        if let Some(reason) = reason {
            let hint = if reason.contains("No such file or directory") {
                " (is /proc mounted in the target's mount namespace?)"
            } else {
                ""
            };
            let left = failed_load::unmap_leftovers(frame, entry_points, pid);
            return Err(LoadFailure::Refused(AttachError::Other {
                pid,
                message: format!(
                    "the target could not load tendril's agent from a memfd: {reason}{hint}{left}"
                ),
            }));
        }
        handle.map_err(LoadFailure::Stuck)?;
    } else {
        let start = agent_start_function(target, resident).map_err(LoadFailure::Refused)?;
        frame
            .call(start, &[], DLOPEN_TIMEOUT)
            .map_err(LoadFailure::Stuck)?;
    }
    Ok(())
}

/// The target's mappings and loader entry points. A process caught right after `exec`
/// may not have its libc mapped yet: give its dynamic loader a moment.
fn wait_for_loader(
    target: &TargetProcess,
) -> Result<(Vec<Mapping>, loader::LoaderEntryPoints), AttachError> {
    let pid = target.pid;
    let deadline = Instant::now() + LOADER_TIMEOUT;
    loop {
        let maps = maps::read_maps(pid).map_err(|e| AttachError::Other {
            pid,
            message: e.to_string(),
        })?;
        match loader::find_entry_points(target, &maps) {
            Ok(entry_points) => return Ok((maps, entry_points)),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => return Err(e),
        }
    }
}

/// Asks the target's `dlerror()` why `dlopen` failed.
fn describe_dlopen_failure(
    frame: &mut RemoteFrame,
    entry_points: &loader::LoaderEntryPoints,
) -> String {
    let Some(dlerror) = entry_points.dlerror else {
        return "dlopen failed".into();
    };
    let Ok(message_address) = frame.call(dlerror, &[], DLOPEN_TIMEOUT) else {
        return "dlopen failed".into();
    };
    if message_address == 0 {
        return "dlopen failed".into();
    }
    let mut buffer = vec![0u8; 512];
    let read = frame.read_memory(message_address, &mut buffer);
    let text = &buffer[..read];
    let text = &text[..text.iter().position(|&b| b == 0).unwrap_or(text.len())];
    String::from_utf8_lossy(text).into_owned()
}

/// Address of `tendril_agent_start` in a resident agent.
fn agent_start_function(target: &TargetProcess, resident: &[&Mapping]) -> Result<u64, AttachError> {
    let fail = || AttachError::Other {
        pid: target.pid,
        message: "the resident agent has no start function".into(),
    };
    let elf = goblin::elf::Elf::parse(agent_bundle::AGENT_BYTES).map_err(|_| fail())?;
    let bias = loader::mapping_bias(&elf, resident).ok_or_else(fail)?;
    elf.dynsyms
        .iter()
        .find(|sym| {
            elf.dynstrtab.get_at(sym.st_name) == Some("tendril_agent_start") && sym.st_value != 0
        })
        .map(|sym| bias.wrapping_add(sym.st_value))
        .ok_or_else(fail)
}

/// Where the agent stands while tendril waits for its socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AgentState {
    /// Just loaded or started: its control thread is opening the socket.
    JustStarted,
    /// Its control thread runs, but the socket did not answer (its file was deleted):
    /// the control thread binds a new one.
    Resident,
}

/// Waits until the agent accepts connections on its socket.
fn wait_for_agent(
    target: &TargetProcess,
    socket: &Path,
    state: AgentState,
) -> Result<AgentConnection, InjectError> {
    let pid = target.pid;
    // The agent's own account of why it cannot listen, read without following links.
    let startup_error = || {
        runtime_dir::open_existing(target)
            .and_then(|dir| runtime_dir::read_startup_error(target, &dir))
    };
    let unreachable = |reason: Option<String>, error: std::io::Error| -> InjectError {
        let socket_in_target = tendril_wire::control_socket_path(target.uid, target.ns_pid);
        let message = unreachable_message(state, reason, &socket_in_target, &error);
        AttachError::Other { pid, message }.into()
    };
    let deadline = Instant::now() + SOCKET_TIMEOUT;
    loop {
        match AgentConnection::open(socket, pid) {
            Ok(session) => return Ok(session),
            Err(AgentConnectionError::Io(_)) if Instant::now() < deadline => {}
            Err(AgentConnectionError::Io(e)) => {
                let reason = startup_error();
                return Err(unreachable(reason, e));
            }
            Err(source) => return Err(InjectError::Session { pid, source }),
        }
        // A resident agent may still recover (the runtime directory is back): its
        // error counts only once the wait is over.
        if state == AgentState::JustStarted
            && let Some(reason) = startup_error()
        {
            return Err(unreachable(
                Some(reason),
                std::io::ErrorKind::NotConnected.into(),
            ));
        }
        if process::is_gone_or_exiting(pid) {
            return Err(AttachError::Exited(pid).into());
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// What tendril says when the agent's socket does not answer: what happened and what to
/// do. `reason` is the agent's own account (its error file), if it wrote one; `error`
/// is what the last connection attempt on `socket` met.
fn unreachable_message(
    state: AgentState,
    reason: Option<String>,
    socket: &Path,
    error: &std::io::Error,
) -> String {
    let waited = SOCKET_TIMEOUT.as_secs();
    let socket = socket.display();
    match (state, reason) {
        (AgentState::JustStarted, Some(reason)) => {
            format!("the agent was loaded but did not start: {reason}")
        }
        (AgentState::JustStarted, None) => format!(
            "the agent was loaded but its control socket {socket} did not answer within \
             {waited} s ({error}); the agent, running as the target's user, makes that \
             directory itself: check that the target's /tmp is writable by its user, then \
             try again"
        ),
        (AgentState::Resident, Some(reason)) => format!(
            "the agent resident in this process cannot be reached: {reason}; fix that and \
             try again, or restart the target"
        ),
        (AgentState::Resident, None) => format!(
            "the agent resident in this process cannot be reached: its control socket \
             {socket} is gone or does not answer ({error}) and the agent did not bind a new \
             one within {waited} s (an agent from an older tendril does not); try again, or \
             restart the target if it keeps failing"
        ),
    }
}
