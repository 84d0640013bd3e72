//! A session's requests: reading them, and what the agent does for each.
//!
//! One request line at a time (capped, see `line_io`), answered with exactly one
//! response line; a `StartRecording` (and an `UpdateTable`) brings its function table
//! after the line, and a `StartRecording` gets the rings' descriptor back with its answer.

use super::connections::{SESSION_END_TIMEOUT, identity, mark_greeted, open_sessions};
use super::line_io::{RequestLine, read_request_line, read_table, send_with_descriptor};
use super::state::STATE;
use crate::patching::patcher::{self, PatchRequest};
use crate::sys::error::AgentError;
use crate::{
    runtime::calibration, runtime::counting, runtime::discovery, runtime::in_situ,
    runtime::lingering, runtime::recording, runtime::threads,
};
use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tendril_wire::{
    Hook, LoaderCounts, PROTOCOL_VERSION, PatchOutcome, PatchTarget, Request, Response,
};

pub(super) fn run_session(session: u64, stream: UnixStream) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    let mut greeted = false;
    loop {
        let Some((request, table)) = next_request(&mut reader, &mut writer, &mut line) else {
            return;
        };
        let (response, rings) = match request {
            Err(e) => (
                Response::Error {
                    message: format!("malformed request: {e}"),
                },
                None,
            ),
            Ok(Request::Hello { version }) if version != PROTOCOL_VERSION => (
                Response::Error {
                    message: format!(
                        "the agent resident in this process is version {PROTOCOL_VERSION}, \
                         this tendril is {version}; use tendril {PROTOCOL_VERSION} or restart the target"
                    ),
                },
                None,
            ),
            Ok(Request::Hello { .. }) => {
                greeted = true;
                mark_greeted(session);
                (ready(), None)
            }
            Ok(_) if !greeted => (
                Response::Error {
                    message: "say hello first".into(),
                },
                None,
            ),
            Ok(request) => answer(session, request, table),
        };
        let answer = tendril_wire::encode(&response);
        let sent = match &rings {
            Some(fd) => send_with_descriptor(&writer, &answer, fd),
            None => writer.write_all(&answer),
        };
        if sent.is_err() {
            return;
        }
    }
}

/// A request as read: decoded (or why not), and the function table that followed it.
type RequestRead = (Result<Request, String>, Option<Vec<u8>>);

/// The next request on the connection, and the function table that follows it if it
/// has one; `None` when the connection ends (closed, or on a request refused for its
/// size or its table, whose refusal this writes).
fn next_request(
    reader: &mut BufReader<UnixStream>,
    writer: &mut UnixStream,
    line: &mut Vec<u8>,
) -> Option<RequestRead> {
    line.clear();
    match read_request_line(reader, line) {
        Ok(RequestLine::Complete) => {}
        Ok(RequestLine::Ended) | Err(_) => return None,
        Ok(RequestLine::TooLong) => {
            // The rest of the line stays unread: the connection is closed on it.
            let refusal = Response::Error {
                message: format!(
                    "request longer than {} MiB refused; the connection is closed",
                    tendril_wire::MAX_REQUEST_BYTES >> 20
                ),
            };
            let _ = writer.write_all(&tendril_wire::encode(&refusal));
            return None;
        }
    }
    let request = tendril_wire::decode::<Request>(line).map_err(|e| e.to_string());
    // A table follows its request on the connection: take it before anything else,
    // so the next line is a request again (or end a connection that lies about it).
    let table = match &request {
        Ok(Request::StartRecording { table_bytes, .. } | Request::UpdateTable { table_bytes }) => {
            match read_table(reader, *table_bytes) {
                Ok(table) => Some(table),
                Err(error) => {
                    let refusal = Response::Error {
                        message: error.to_string(),
                    };
                    let _ = writer.write_all(&tendril_wire::encode(&refusal));
                    return None;
                }
            }
        }
        _ => None,
    };
    Some((request, table))
}

/// The answer to a request of a greeted session (with `table` if one followed it), and
/// the descriptor sent with it, if any (the rings, or one of their segments).
fn answer(
    session: u64,
    request: Request,
    table: Option<Vec<u8>>,
) -> (Response, Option<std::os::fd::OwnedFd>) {
    let error = |message: String| Response::Error { message };
    let response = match request {
        Request::Hello { .. } => ready(),
        Request::Detach => detach(session),
        Request::Patch {
            targets,
            code_ranges,
        } => patch(session, &targets, &code_ranges),
        Request::Unpatch { addresses } => unpatch(session, &addresses),
        Request::ReadCounters { ids } => Response::Counters {
            threads: counting::read_counters(&ids),
            loader: loader_counts(),
        },
        Request::ResolveSymbols { names } => Response::Resolved {
            addresses: names.iter().map(|name| resolve_symbol(name)).collect(),
        },
        Request::UnknownTargets => Response::UnknownTargets {
            met: crate::runtime::pointer_targets::unknown_targets(session),
        },
        Request::StartRecording {
            discover,
            follow_pointers,
            ..
        } => {
            let table = table.unwrap_or_default();
            return match start_recording(session, table, discover, follow_pointers) {
                Ok((response, fd)) => (response, Some(fd)),
                Err(e) => (error(e.to_string()), None),
            };
        }
        Request::StopRecording => stop_recording(session),
        Request::SetTiming { addresses, timed } => Response::TimingSet {
            refused: crate::patching::timing::set_timing(session, &addresses, timed),
        },
        Request::RingSegment { index } => {
            return match crate::runtime::ring_segments::segment_descriptor(index as usize) {
                Some(fd) => (Response::RingSegment { index }, Some(fd)),
                None => (error(format!("the rings have no segment {index}")), None),
            };
        }
        Request::UpdateTable { .. } => {
            match discovery::update_table(session, table.unwrap_or_default()) {
                Ok(functions) => Response::TableUpdated { functions },
                Err(message) => error(message),
            }
        }
        Request::CopyWithCounters {
            address,
            size,
            code_ranges,
            cold_parts,
            paths,
        } => match crate::patching::function_copies::install(
            session,
            address,
            size,
            &code_ranges,
            &cold_parts,
            paths,
        ) {
            Ok(layout) => Response::EdgesInstalled { layout },
            Err(e) => error(e.to_string()),
        },
        Request::CopyBehindRecordingHook {
            address,
            size,
            cold_parts,
            paths,
        } => match crate::patching::function_copies::install_behind_hook(
            session,
            address,
            size,
            &cold_parts,
            paths,
        ) {
            Ok((layout, code)) => Response::EdgesBehindHook { layout, code },
            Err(e) => error(e.to_string()),
        },
    };
    (response, None)
}

/// Ends every other session — their controllers see their connections close — lets
/// each restore what it patched (and stop its recording), then restores whatever is
/// left. Answers with the number of functions that got their bytes back, in this
/// call or in the ended sessions', and what still waits to come out.
fn detach(session: u64) -> Response {
    let patched = patcher::patched_count() + patcher::pending_restore().0;
    let others: Vec<u64> = open_sessions()
        .iter()
        .filter(|open| open.id != session)
        .map(|open| {
            let _ = open.stream.shutdown(std::net::Shutdown::Both);
            open.id
        })
        .collect();
    let deadline = Instant::now() + SESSION_END_TIMEOUT;
    while Instant::now() < deadline && open_sessions().iter().any(|open| others.contains(&open.id))
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    patcher::restore(None);
    let unloaded = patcher::take_unloaded(None);
    let (pending, reason) = patcher::pending_restore();
    lingering::finish_in_background();
    Response::Detached {
        restored: patched
            .saturating_sub(patcher::patched_count() + pending)
            .saturating_sub(unloaded.len()),
        unloaded,
        pending,
        pending_reason: reason.map(|r| r.to_string()),
    }
}

fn unpatch(session: u64, addresses: &[u64]) -> Response {
    let restored = patcher::restore_functions(session, addresses);
    let unloaded = patcher::take_unloaded(Some(session));
    let (pending, reason) = patcher::pending_restore();
    lingering::finish_in_background();
    Response::Unpatched {
        restored,
        unloaded,
        pending,
        pending_reason: reason.map(|r| r.to_string()),
    }
}

fn ready() -> Response {
    let (_, pid) = identity();
    let (pending_restore, reason) = patcher::pending_restore();
    Response::Ready {
        version: PROTOCOL_VERSION.into(),
        pid,
        threads: threads::target_thread_count(),
        patched: patcher::patched_count(),
        pending_restore,
        pending_reason: reason.map(|r| r.to_string()),
    }
}

/// Starts a recording with `table` (see `tendril_wire::function_table`); answers with
/// the response and the rings' descriptor for the controller.
fn start_recording(
    session: u64,
    table: Vec<u8>,
    discover: bool,
    follow_pointers: bool,
) -> Result<(Response, std::os::fd::OwnedFd), AgentError> {
    if STATE
        .recording_session
        .compare_exchange(0, session, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Err(AgentError::Request(
            "another tendril is recording this process; stop it first".into(),
        ));
    }
    let started = (|| -> Result<(Response, std::os::fd::OwnedFd), AgentError> {
        let rings = recording::open_rings()?;
        discovery::start(session, table, discover, follow_pointers)?;
        // Counts an earlier recording's untimed hooks left in the threads' tables.
        crate::runtime::untimed_table::forget_all();
        recording::start();
        crate::runtime::room_ahead::make_room_for_threads();
        let cost = calibration::calibrate()?;
        // Without it the start calibration stays in use (the profile then says
        // nothing of batches); not worth refusing the recording for.
        let _ = in_situ::start();
        recording::set_header(
            tendril_wire::rings::header::INNER_TICKS,
            cost.inner_ticks as u64,
        );
        recording::set_header(
            tendril_wire::rings::header::OUTER_TICKS,
            cost.outer_ticks as u64,
        );
        let response = Response::RecordingStarted {
            inner_ticks: cost.inner_ticks,
            outer_ticks: cost.outer_ticks,
            inner_spread_ticks: cost.inner_spread_ticks,
            outer_spread_ticks: cost.outer_spread_ticks,
            untimed_ticks: cost.untimed_ticks,
            untimed_spread_ticks: cost.untimed_spread_ticks,
            loader: loader_counts(),
        };
        Ok((response, rings))
    })();
    started.inspect_err(|_| {
        stop_recording(session);
    })
}

pub(super) fn stop_recording(session: u64) -> Response {
    if STATE.recording_session.load(Ordering::Acquire) != session {
        return Response::Error {
            message: "this session is not recording".into(),
        };
    }
    recording::stop();
    in_situ::stop();
    let restored = patcher::restore(Some(session));
    let unloaded = patcher::take_unloaded(Some(session));
    let refused = discovery::stop();
    STATE.recording_session.store(0, Ordering::Release);
    let (pending, reason) = patcher::pending_restore();
    lingering::finish_in_background();
    Response::RecordingStopped {
        restored,
        refused,
        unloaded,
        loader: loader_counts(),
        pending,
        pending_reason: reason.map(|r| r.to_string()),
    }
}

/// The dynamic loader's counts of libraries added and removed so far.
fn loader_counts() -> LoaderCounts {
    let (loads, unloads) = crate::sys::loaded_modules::generation();
    LoaderCounts { loads, unloads }
}

/// Where the dynamic loader resolves `name` for the program (`dlsym(RTLD_DEFAULT)`),
/// which for an IFUNC runs its resolver and gives the implementation.
fn resolve_symbol(name: &str) -> Option<u64> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: dlsym reads a valid NUL-terminated name; RTLD_DEFAULT searches the global
    // scope. It runs on an agent thread, never while target threads are parked.
    let address = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!address.is_null()).then_some(address as u64)
}

/// The most roots discovered ahead of their hooks and patched in a batch of their own.
/// A recording of a whole library's functions (`libc.so.6:*`, 3,600 roots) goes in as
/// one batch and discovers its roots as they run, as before: patched in two batches,
/// its recordings of a target that starts and ends threads took four times as long
/// (the cause is not known yet).
const MOST_ROOTS_AHEAD: usize = 64;

fn patch(session: u64, targets: &[PatchTarget], code_ranges: &[(u64, u64)]) -> Response {
    // The roots go in last, in a batch of their own, after Scheme B's discovery of
    // them: the moment a root is live, every thread of a busy server may enter it and
    // reach its callees, whose first calls discover them with the loader's lock, which
    // a batch still going in would hold for its stop.
    let is_root = |t: &PatchTarget| matches!(t.hook, Hook::RecordRoot | Hook::RecordRootOutermost);
    let roots: Vec<u64> = targets
        .iter()
        .filter(|t| is_root(t))
        .map(|t| t.address)
        .collect();
    let ahead = !roots.is_empty() && roots.len() <= MOST_ROOTS_AHEAD;
    if ahead {
        discovery::discover_ahead(&roots);
    }
    // Each part: the roots (`Some(true)`), the others (`Some(false)`), or all (`None`).
    let parts: &[Option<bool>] = if ahead {
        &[Some(false), Some(true)]
    } else {
        &[None]
    };
    let mut results: Vec<Option<Result<u32, AgentError>>> = targets.iter().map(|_| None).collect();
    for &roots_now in parts {
        let part: Vec<usize> = (0..targets.len())
            .filter(|&i| roots_now.is_none_or(|roots| is_root(&targets[i]) == roots))
            .collect();
        if part.is_empty() {
            continue;
        }
        // Returns are hooked only once the unwinder's hooks are in (see `patcher`).
        let unwinder_refused = (0..targets.len()).find_map(|i| match &results[i] {
            Some(Err(reason)) if targets[i].hook.is_agents_own() => Some(reason.clone()),
            _ => None,
        });
        if let Some(reason) = unwinder_refused {
            for &i in &part {
                results[i] = Some(Err(reason.clone()));
            }
            continue;
        }
        let requests: Vec<PatchRequest> = part
            .iter()
            .map(|&i| PatchRequest {
                address: targets[i].address,
                size: targets[i].size,
                kind: targets[i].hook,
            })
            .collect();
        let modules: Vec<Option<String>> =
            part.iter().map(|&i| targets[i].module.clone()).collect();
        let patched =
            crate::patching::patch_targets::patch_mapped(session, &requests, &modules, code_ranges);
        for (&i, result) in part.iter().zip(patched) {
            results[i] = Some(result);
        }
    }
    let outcomes = targets
        .iter()
        .zip(results)
        .map(|(target, result)| {
            let result = result.expect("every target is in one part");
            PatchOutcome {
                address: target.address,
                id: result.as_ref().ok().copied(),
                refused: result.err().map(|reason| reason.to_string()),
            }
        })
        .collect();
    Response::Patched { outcomes }
}
