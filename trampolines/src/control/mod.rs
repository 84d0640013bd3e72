//! The agent's control thread: a Unix socket server the controller talks to.
//!
//! The socket lives in the per-user private runtime directory (see `tendril_wire`), which
//! must be a real directory owned by this process's uid with mode 0700; the agent refuses
//! to listen anywhere else. Every connection is checked with `SO_PEERCRED`: only this uid
//! and root may talk to the agent (root as a user namespace sees it: see
//! `root_as_seen_here`). Each connection is a session; when it ends — cleanly
//! or because the controller died — every patch it made is restored. A `detach` from
//! one session ends every other (a count or recording in progress), closing their
//! connections so their controllers learn of it, and restores everything.
//!
//! Resources stay bounded however many connections come: each session has one thread,
//! ended and joined when the session ends (`session_threads`); at most
//! [`MAX_SESSIONS`] are served at once, a connection beyond them gets one error line
//! saying so; a connection that does not say hello within [`HELLO_TIMEOUT`] is closed.
//! If the socket file is deleted, the control thread binds a new one (`listener`).
//! What a session asks and how it is answered is `requests` (reading capped lines and
//! passing descriptors: `line_io`); who is connected is `connections`; what happens
//! around a `fork()` is `fork`. The layer's statics are `state`.

mod connections;
mod fork;
mod line_io;
mod listener;
mod requests;
mod session_threads;
mod state;

use crate::control::connections::{
    OpenSession, forget_inherited_sessions, identity, mark_ending, name_uid, open_sessions,
};
use crate::control::listener::ControlListener;
use crate::control::requests::{run_session, stop_recording};
use crate::control::session_threads::SessionThreads;
use crate::control::state::STATE;
use crate::patching::patcher;
use crate::runtime::{self, lingering, threads};
use crate::sys::error::AgentError;
use crate::sys::frame_registrar;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tendril_wire::Response;

/// The most sessions the agent serves at once; a connection beyond them is refused
/// with the reason.
pub const MAX_SESSIONS: usize = 8;
/// How long a connection may take to complete the hello handshake before the agent
/// closes it, so connections that never say hello cannot hold a session for good.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the control thread checks that its socket file is still there and that
/// no connection overstays its hello deadline.
const CHECK_INTERVAL: Duration = Duration::from_millis(250);
/// How long a connection that finds every session taken waits for one that is ending
/// (its controller gone, its code being restored) to be over.
const ENDING_WAIT: Duration = Duration::from_secs(5);

/// Starts the control thread unless it runs in this process image already; 0 on
/// success, -1 on failure (the reason goes to the agent's error file).
pub fn start_once() -> i32 {
    if STATE.control_started.swap(true, Ordering::AcqRel) {
        return 0;
    }
    match std::panic::catch_unwind(spawn_control_thread) {
        Ok(Ok(())) => 0,
        Ok(Err(error)) => {
            STATE.control_started.store(false, Ordering::Release);
            report_startup_error(&error.to_string());
            -1
        }
        Err(_) => {
            STATE.control_started.store(false, Ordering::Release);
            -1
        }
    }
}

/// In a forked child: the parent's control thread is not there, so a later attach may
/// start one.
fn forget_control_in_forked_child() {
    STATE.control_started.store(false, Ordering::Release);
}

/// Binds the control socket and starts the thread that serves it.
fn spawn_control_thread() -> Result<(), AgentError> {
    crate::runtime::install();
    fork::register_fork_handler();
    let listener = ControlListener::bind(name_uid(), identity().1)?;
    let sessions = SessionThreads::new()
        .map_err(|e| AgentError::io("cannot set up the agent's session threads", e))?;
    forget_inherited_sessions();
    let helpers = Helpers {
        discoverer: SessionThreads::new()
            .map_err(|e| AgentError::io("cannot set up the agent's discoverer thread", e))?,
        registrar: SessionThreads::new()
            .map_err(|e| AgentError::io("cannot set up the agent's registrar thread", e))?,
    };
    threads::spawn_agent_thread("control", threads::Start::Immediately, move || {
        serve(listener, sessions, helpers)
    })
    .map(|_| ())
    .map_err(|e| AgentError::io("cannot start the agent's control thread", e))
}

/// Records why the agent could not start, for the controller to show. The note is a
/// new file of this process's user (a link planted at its name is not followed).
pub fn report_startup_error(message: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let path = tendril_wire::agent_error_path(name_uid(), identity().1);
    let _ = std::fs::remove_file(&path);
    if let Ok(mut note) = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
    {
        let _ = note.write_all(message.as_bytes());
    }
}

/// The control thread's loop; it never ends. It accepts connections (each a session on
/// its own thread, at most [`MAX_SESSIONS`]), joins the threads of sessions that ended,
/// closes connections that stay silent past [`HELLO_TIMEOUT`], and binds its socket
/// again if the file was deleted.
fn serve(mut listener: ControlListener, mut sessions: SessionThreads, mut helpers: Helpers) {
    let (uid, pid) = (name_uid(), identity().1);
    let mut last_rebind_error = None;
    loop {
        wait_for_activity(&listener, &sessions);
        sessions.reap();
        while let Some(stream) = listener.accept() {
            // Before the session: the controller raises the threads it finds then.
            keep_helpers(&mut helpers, true);
            admit(stream, &mut sessions);
        }
        keep_helpers(&mut helpers, sessions.len() > 0);
        close_silent_sessions();
        match listener.rebind_if_unreachable(uid, pid) {
            Ok(()) => last_rebind_error = None,
            Err(error) => {
                let message = error.to_string();
                if last_rebind_error.as_ref() != Some(&message) {
                    report_startup_error(&format!(
                        "the agent cannot recreate its control socket: {message}"
                    ));
                }
                last_rebind_error = Some(message);
            }
        }
    }
}

/// The agent's threads that run while a session is open: the discoverer
/// (`runtime::discoverer`) and the unwind registrar (`sys::frame_registrar`).
struct Helpers {
    discoverer: SessionThreads,
    registrar: SessionThreads,
}

/// Runs the helpers while a session is open (`wanted`), and ends them, joined while no
/// code changes, when none is.
fn keep_helpers(helpers: &mut Helpers, wanted: bool) {
    // Not started: the target's threads discover for themselves.
    keep_running(
        &mut helpers.discoverer,
        wanted,
        "discoverer",
        serve_discoverer,
        runtime::discoverer::ask_to_end,
    );
    // Not started: functions are patched without copies. Serving from now on (its
    // thread may start after the session's first copy is asked for).
    if wanted {
        frame_registrar::expect_serving();
    }
    keep_running(
        &mut helpers.registrar,
        wanted,
        "frames",
        frame_registrar::serve,
        frame_registrar::ask_to_end,
    );
}

fn serve_discoverer() {
    runtime::discoverer::serve(runtime::discovery::discover_for_another)
}

/// Runs `serve` on the agent thread `name`, alone in `threads`, while `wanted`; when not,
/// asks it to end (`ask_to_end`) and waits for it.
fn keep_running(
    threads: &mut SessionThreads,
    wanted: bool,
    name: &str,
    serve: fn(),
    ask_to_end: fn(),
) {
    threads.reap();
    match (wanted, threads.len()) {
        (true, 0) => {
            let _ = threads.start_named(name, 0, serve);
        }
        (false, 1..) => {
            ask_to_end();
            threads.wait_for_one_to_end(ENDING_WAIT);
        }
        _ => {}
    }
}

/// Waits up to [`CHECK_INTERVAL`] for a connection or a session thread that finished.
fn wait_for_activity(listener: &ControlListener, sessions: &SessionThreads) {
    let mut fds = [listener.fd(), sessions.finished_fd()].map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    // SAFETY: `fds` is an array of valid pollfds whose length is passed with it.
    unsafe {
        libc::poll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            CHECK_INTERVAL.as_millis() as libc::c_int,
        )
    };
}

/// Starts a session for a new connection, or refuses it with the reason when the agent
/// already serves [`MAX_SESSIONS`].
fn admit(stream: UnixStream, sessions: &mut SessionThreads) {
    let Some(peer_pid) = trusted_peer(&stream) else {
        return;
    };
    if sessions.len() >= MAX_SESSIONS && any_ending(sessions) {
        sessions.wait_for_one_to_end(ENDING_WAIT);
    }
    if sessions.len() >= MAX_SESSIONS {
        refuse(stream);
        return;
    }
    let session = STATE.next_session.fetch_add(1, Ordering::Relaxed);
    let Ok(handle) = stream.try_clone() else {
        return;
    };
    open_sessions().push(OpenSession {
        id: session,
        stream: handle,
        peer_pid,
        opened: Instant::now(),
        greeted: false,
        ending: false,
    });
    let started = sessions.start(session, move || {
        let _ = std::panic::catch_unwind(move || run_session(session, stream));
        mark_ending(session);
        // However the session ended, nothing it patched stays patched.
        if STATE.recording_session.load(Ordering::Acquire) == session {
            stop_recording(session);
        }
        patcher::restore(Some(session));
        lingering::finish_in_background();
        open_sessions().retain(|open| open.id != session);
        release_ring_memory();
    });
    if started.is_err() {
        open_sessions().retain(|open| open.id != session);
    }
}

/// Gives back the rings' memory when no recording runs (a session that recorded has
/// ended, its controller done reading). The recording slot is held meanwhile, so no
/// recording can start while the events' pages go.
fn release_ring_memory() {
    const RELEASING: u64 = u64::MAX;
    if STATE
        .recording_session
        .compare_exchange(0, RELEASING, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        crate::runtime::ring_segments::release_ring_memory();
        STATE.recording_session.store(0, Ordering::Release);
    }
}

/// Whether some session whose thread is not joined yet is over or ending: its thread
/// says so, or its peer has hung up (the thread will see that soon).
fn any_ending(sessions: &SessionThreads) -> bool {
    let open = open_sessions();
    sessions.sessions().any(|session| {
        open.iter()
            .find(|entry| entry.id == session)
            .is_none_or(|entry| entry.ending || peer_hung_up(&entry.stream))
    })
}

/// Whether the other end of `stream` has closed its side, without waiting.
fn peer_hung_up(stream: &UnixStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut connection = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: polls one valid pollfd without waiting.
    let ready = unsafe { libc::poll(&mut connection, 1, 0) };
    ready > 0 && connection.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// Answers a connection the agent has no room for with one error line, and closes it.
fn refuse(stream: UnixStream) {
    let peers: Vec<String> = open_sessions()
        .iter()
        .filter(|open| open.peer_pid > 0)
        .map(|open| open.peer_pid.to_string())
        .collect();
    let from = if peers.is_empty() {
        String::new()
    } else {
        format!(" (connected from processes {})", peers.join(", "))
    };
    let refusal = Response::Error {
        message: format!(
            "the agent already serves {MAX_SESSIONS} sessions, the most it serves at once{from}; \
             end one of them (Ctrl-C that tendril, or kill it) and try again"
        ),
    };
    // The line fits in the new connection's empty buffer; never wait for a peer.
    let _ = stream.set_nonblocking(true);
    let _ = (&stream).write_all(&tendril_wire::encode(&refusal));
}

/// Closes the connections that did not complete the hello handshake in time; their
/// sessions then end as if their controllers had left.
fn close_silent_sessions() {
    for open in open_sessions().iter_mut() {
        if !open.greeted && !open.ending && open.opened.elapsed() >= HELLO_TIMEOUT {
            let _ = open.stream.shutdown(std::net::Shutdown::Both);
            open.ending = true;
        }
    }
}

/// Only our own uid and root may control the agent: the peer's pid if it is one of
/// them (0 when it is in a pid namespace this process cannot see).
fn trusted_peer(stream: &UnixStream) -> Option<i32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a properly sized, writable ucred and `len` holds its size, as
    // getsockopt(SO_PEERCRED) requires; the fd is owned by `stream` and open.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    let (uid, _) = identity();
    (rc == 0 && (cred.uid == uid || cred.uid == root_as_seen_here())).then_some(cred.pid)
}

/// The uid the host's root has as this process sees it: 0, or inside a user namespace
/// that does not map it (a container, `unshare -U`) the overflow uid every unmapped uid
/// shows as. Only root and this process's user may reach the socket file through the
/// target's `/proc/PID/root` (mode 0600, and that link needs the right to trace), so
/// accepting the overflow uid there lets root in without letting in any other user.
fn root_as_seen_here() -> u32 {
    let map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    let ranges: Vec<(u64, u64, u64)> = map
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace().map(|f| f.parse::<u64>().ok());
            Some((fields.next()??, fields.next()??, fields.next()??))
        })
        .collect();
    if let Some(&(inside, _, _)) = ranges
        .iter()
        .find(|&&(_, outside, count)| outside == 0 && count > 0)
    {
        return inside as u32;
    }
    std::fs::read_to_string("/proc/sys/kernel/overflowuid")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(65534)
}
