//! The contract between the tendril controller and the agent it injects.
//!
//! Both sides link this crate, so the control protocol, the version check and the
//! runtime-directory conventions are written exactly once. The control channel is a Unix
//! stream socket carrying one JSON message per line: the controller sends a [`Request`],
//! the agent answers with exactly one [`Response`]. Control traffic is rare and small;
//! the hot event path goes through shared-memory rings, whose layout is here too. This
//! crate holds only what crosses the socket and the rings; what both sides read off a
//! function's machine code (its callees, its path numbers) is `tendril-callgraph`.
//!
//! Three requests carry more than their line: [`Request::StartRecording`] and
//! [`Request::UpdateTable`] are followed by the function table's bytes (`table_bytes` of
//! them), and the answer to the first,
//! [`Response::RecordingStarted`] carries the rings' memory as a file descriptor
//! (`SCM_RIGHTS`). So no file of a recording ever lies in a directory the target's user
//! controls. Neither side trusts the other's sizes: a request line is at most
//! [`MAX_REQUEST_BYTES`], a table at most [`MAX_TABLE_BYTES`].

pub mod edges;
pub mod events;
pub mod function_table;
pub mod rings;

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Version of the wire protocol and agent. A controller only talks to an agent of the
/// same version: a resident agent cannot be replaced inside a running process.
pub const PROTOCOL_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "+wire12");

/// The longest request line the agent reads (newline included). A `Patch` target and
/// its code range take under 100 bytes of JSON, so a `Patch` of every function of libc
/// (`libc.so.6:*`, a few thousand) is well under 1 MiB; this leaves room for batches of
/// about 170,000 functions, and bounds what a connection can make the target allocate. A longer line is answered with an
/// [`Response::Error`] and the connection is closed, unread.
pub const MAX_REQUEST_BYTES: usize = 16 << 20;

/// The largest function table a `StartRecording` may carry: 2 million functions.
pub const MAX_TABLE_BYTES: u64 = 64 << 20;

/// A message from the controller to the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum Request {
    /// First message of every connection: says which protocol the controller speaks.
    Hello { version: String },
    /// Restore every byte the agent has patched, in every session.
    Detach,
    /// Patch these functions, all in one stop of the process.
    Patch {
        targets: Vec<PatchTarget>,
        /// (start, size) of every known function near the targets (the targets
        /// included): code that might branch into a patched entry, and the bounds
        /// that tell padding from code.
        code_ranges: Vec<(u64, u64)>,
    },
    /// Restore these functions (patched by this session).
    Unpatch { addresses: Vec<u64> },
    /// The call and return counters of these function ids, per thread.
    ReadCounters { ids: Vec<u32> },
    /// Where the dynamic loader resolves these symbol names in the target (for an
    /// IFUNC, the implementation it chose).
    ResolveSymbols { names: Vec<String> },
    /// The calls through pointers the recording met whose target is no function of its
    /// table (JIT code), answered with [`Response::UnknownTargets`].
    UnknownTargets,
    /// Switch these functions, recorded by this session, to the untimed hook (`timed`
    /// false: `Hook::Untimed`, each call a `Call` event) or back to the timed one.
    /// Answered by [`Response::TimingSet`].
    SetTiming { addresses: Vec<u64>, timed: bool },
    /// The memory of the rings' extra segment `index` (1-based, as the rings' header
    /// counts them); answered by [`Response::RingSegment`] with its descriptor.
    RingSegment { index: u32 },
    /// Start a recording: create (once) the rings, take the function table (the
    /// `table_bytes` bytes that follow this line on the connection, at most
    /// [`MAX_TABLE_BYTES`]; see [`function_table`]), calibrate the hooks. With
    /// `discover`, a function's callees are instrumented when it first runs in the call
    /// graph (Scheme B); otherwise only what is patched is recorded. With
    /// `follow_pointers` (and `discover`), each recorded function that calls through
    /// pointers runs from a copy that checks those calls, and a target is instrumented
    /// the first time such a call reaches it. The roots are patched afterwards, with
    /// [`Hook::RecordRoot`].
    StartRecording {
        table_bytes: u64,
        discover: bool,
        #[serde(default)]
        follow_pointers: bool,
    },
    /// End the recording: restore every function this session patched.
    StopRecording,
    /// Replace the recording's function table (followed by `table_bytes` bytes, as for
    /// `StartRecording`): modules loaded since it started (`dlopen`) join it, so
    /// discovery can decode and follow their functions. Answered with `TableUpdated`.
    UpdateTable { table_bytes: u64 },
    /// Copy the function at `address` (`size` bytes) with edge counters, and the path
    /// register when `paths` is set, and point its entry at the copy (see [`edges`]).
    /// `code_ranges` as for [`Request::Patch`]; `cold_parts` (start, size) are the
    /// `.cold` parts the compiler split off the function, copied with it. Answered with
    /// [`Response::EdgesInstalled`]; [`Request::Unpatch`] of `address` restores the
    /// entry.
    CopyWithCounters {
        address: u64,
        size: u64,
        code_ranges: Vec<(u64, u64)>,
        #[serde(default)]
        cold_parts: Vec<(u64, u64)>,
        paths: bool,
    },
    /// Put a copy of the function at `address` (`size` bytes), with edge counters for
    /// the calls made inside the call graph (and the path register when `paths` is
    /// set), behind the recording hook this session has on it: the live view's
    /// annotated code. Answered with [`Response::EdgesBehindHook`]; a restore of the
    /// function (a pause, a root change, the end of the recording) takes the copy out
    /// with the hook.
    CopyBehindRecordingHook {
        address: u64,
        size: u64,
        #[serde(default)]
        cold_parts: Vec<(u64, u64)>,
        paths: bool,
    },
}

/// How a patched function is hooked: the one hook vocabulary, shared by the controller's
/// requests, the agent's trampoline builder and its patch engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Hook {
    /// Count calls (entry hook only).
    Count,
    /// Count calls and normal returns (entry hook and return hook).
    CountReturns,
    /// tendril's own hook on an unwinder entry point (`_Unwind_RaiseException`...): the
    /// real return addresses go back on the stack before the unwinder walks it.
    UnwinderStarts,
    /// tendril's own hook on a function a catch calls (`__cxa_begin_catch`...): the
    /// return hooks of the frames that survived go back in.
    ExceptionCaught,
    /// tendril's own stand-in for `_Unwind_Backtrace`, which walks the stack without
    /// unwinding it: hooks come out for the walk and go back in after it.
    Backtrace,
    /// Record entry and exit events of a root: entering it starts the call graph on
    /// the calling thread.
    RecordRoot,
    /// Record entry and exit events inside the call graph only.
    Record,
    /// Inside the call graph, record each call as a `Call` event (its return address,
    /// no timestamp, no return hook): a function too short to time, counted in context
    /// and timed as part of its caller.
    Untimed,
    /// A root whose calls inside its own call graph are untimed: its outermost call
    /// runs the [`Hook::RecordRoot`] hook (timed, it starts the graph), a call inside
    /// the graph is recorded as [`Hook::Untimed`] records it (recursion too short to
    /// time).
    RecordRootOutermost,
}

impl Hook {
    /// Whether this is one of tendril's own hooks (on the unwinder and the C++
    /// runtime) rather than one that measures the function.
    pub fn is_agents_own(self) -> bool {
        matches!(
            self,
            Hook::UnwinderStarts | Hook::ExceptionCaught | Hook::Backtrace
        )
    }

    /// Whether the hook records events (of a root or inside the call graph).
    pub fn records(self) -> bool {
        matches!(
            self,
            Hook::RecordRoot | Hook::Record | Hook::Untimed | Hook::RecordRootOutermost
        )
    }
}

/// One function to patch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatchTarget {
    /// The function's address in the target.
    pub address: u64,
    /// Its size in bytes (symbol or FDE).
    pub size: u64,
    pub hook: Hook,
    /// The path of the file the controller found the function in, as the target's
    /// `/proc/PID/maps` names it: the agent patches only if that file is still mapped
    /// there (a library unloaded since, and maybe another loaded at its address, is
    /// refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
}

/// What became of one [`PatchTarget`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatchOutcome {
    pub address: u64,
    /// The function's id (its counters' index), when it is patched.
    pub id: Option<u32>,
    /// Why it was not patched.
    pub refused: Option<String>,
}

/// The dynamic loader's counts of the libraries it has added and removed since the
/// process started (`dl_phdr_info`'s `dlpi_adds` and `dlpi_subs`; 0 where the C library
/// keeps none): two readings tell how many libraries came and went between them, even
/// those that came and went too fast to be seen in `/proc/PID/maps`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderCounts {
    pub loads: u64,
    pub unloads: u64,
}

/// One thread's counters, in the order of the ids asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadCounters {
    pub tid: i32,
    /// The thread's name (`comm`), when known.
    pub name: String,
    pub calls: Vec<u64>,
    pub returns: Vec<u64>,
    /// Hooked frames left without returning (exceptions, longjmp, cancellation).
    pub unwound_frames: u64,
    /// Calls that got no return hook because the shadow stack was full.
    pub shadow_overflows: u64,
}

/// A message from the agent to the controller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "response", rename_all = "snake_case")]
pub enum Response {
    /// Answer to [`Request::Hello`] when the versions match.
    Ready {
        version: String,
        /// The target's pid as the agent sees it (its own pid namespace).
        pid: i32,
        /// Threads of the target, not counting the agent's own threads.
        threads: usize,
        /// Functions currently patched.
        patched: usize,
        /// tendril's own hooks on the unwinder that a restore had to leave in: they
        /// come out by themselves once `pending_reason` no longer holds.
        #[serde(default)]
        pending_restore: usize,
        #[serde(default)]
        pending_reason: Option<String>,
    },
    /// Answer to [`Request::Detach`]: how many functions got their original bytes back,
    /// and how many of tendril's unwinder hooks still wait to come out (and why).
    Detached {
        restored: usize,
        /// Functions whose library was unloaded while they were patched: their bytes
        /// went with it, and nothing was written where they were.
        #[serde(default)]
        unloaded: Vec<u64>,
        #[serde(default)]
        pending: usize,
        #[serde(default)]
        pending_reason: Option<String>,
    },
    /// Answer to [`Request::Patch`], one outcome per target, in order.
    Patched { outcomes: Vec<PatchOutcome> },
    /// Answer to [`Request::Unpatch`].
    Unpatched {
        restored: usize,
        /// As in [`Response::Detached`].
        #[serde(default)]
        unloaded: Vec<u64>,
        /// tendril's own unwinder hooks that had to stay in for now (see
        /// [`Response::Detached`]).
        #[serde(default)]
        pending: usize,
        #[serde(default)]
        pending_reason: Option<String>,
    },
    /// Answer to [`Request::ReadCounters`].
    Counters {
        threads: Vec<ThreadCounters>,
        #[serde(default)]
        loader: LoaderCounts,
    },
    /// Answer to [`Request::ResolveSymbols`], one address (or none) per name.
    Resolved { addresses: Vec<Option<u64>> },
    /// Answer to [`Request::UnknownTargets`]: (call site, target) pairs, each once.
    UnknownTargets { met: Vec<(u64, u64)> },
    /// Answer to [`Request::StartRecording`]: the hooks' calibrated cost in TSC ticks
    /// (the minimum over the calibration's batches), and how far a typical batch's cost
    /// lay above it (median − minimum: the uncertainty of the cost removed per call).
    /// The line comes with one file descriptor (`SCM_RIGHTS`): the rings' memory, a
    /// memfd of [`rings::FILE_BYTES`] sealed against shrinking and growing.
    RecordingStarted {
        inner_ticks: f64,
        outer_ticks: f64,
        #[serde(default)]
        inner_spread_ticks: f64,
        #[serde(default)]
        outer_spread_ticks: f64,
        /// What one call through the untimed hook costs its caller, and its spread.
        #[serde(default)]
        untimed_ticks: f64,
        #[serde(default)]
        untimed_spread_ticks: f64,
        #[serde(default)]
        loader: LoaderCounts,
    },
    /// Answer to [`Request::StopRecording`]: functions restored, and the callees that
    /// could not be instrumented, with the reason.
    RecordingStopped {
        restored: usize,
        refused: Vec<(u64, String)>,
        /// As in [`Response::Detached`].
        #[serde(default)]
        unloaded: Vec<u64>,
        #[serde(default)]
        loader: LoaderCounts,
        /// tendril's own unwinder hooks that had to stay in for now (see
        /// [`Response::Detached`]); they come out by themselves.
        #[serde(default)]
        pending: usize,
        #[serde(default)]
        pending_reason: Option<String>,
    },
    /// Answer to [`Request::SetTiming`]: per address, whether it was switched, or why
    /// not (in the request's order).
    TimingSet { refused: Vec<Option<String>> },
    /// Answer to [`Request::RingSegment`]; the line comes with the segment's descriptor
    /// (`SCM_RIGHTS`): a memfd of [`rings::SEGMENT_BYTES`], sealed against shrinking and
    /// growing.
    RingSegment { index: u32 },
    /// Answer to [`Request::UpdateTable`]: the number of functions the table now holds.
    TableUpdated { functions: u64 },
    /// Answer to [`Request::CopyWithCounters`]: the copy's blocks and counters.
    EdgesInstalled { layout: edges::EdgeLayout },
    /// Answer to [`Request::CopyBehindRecordingHook`]: the copy's blocks and counters
    /// (its calls counter counts the calls inside the call graph), and the function's
    /// original bytes (its entry is patched, so reading it from outside would show the
    /// hook's jump).
    EdgesBehindHook {
        layout: edges::EdgeLayout,
        code: Vec<u8>,
    },
    /// The request was refused; the message says why and what to do.
    Error { message: String },
}

/// The per-user private runtime directory, as a path inside the target's mount
/// namespace. The directory is created with mode 0700 and owned by `uid`; the agent
/// refuses to listen in it otherwise. It holds only what the agent (running as `uid`)
/// makes: its control socket and its startup-error note.
pub fn runtime_dir(uid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/tendril-{uid}"))
}

/// The agent's control socket for the process whose pid (in its own pid namespace) is
/// `pid`, as a path inside the target's mount namespace.
pub fn control_socket_path(uid: u32, pid: i32) -> PathBuf {
    runtime_dir(uid).join(format!("agent-{pid}.sock"))
}

/// Where the agent writes the reason it could not start, so the controller can report it.
pub fn agent_error_path(uid: u32, pid: i32) -> PathBuf {
    runtime_dir(uid).join(format!("agent-{pid}.err"))
}

/// Encode one message as a single JSON line (with the trailing newline).
pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    let mut line = serde_json::to_vec(message).expect("wire messages always serialise");
    line.push(b'\n');
    line
}

/// Decode one JSON line (with or without its trailing newline).
pub fn decode<'a, T: Deserialize<'a>>(line: &'a [u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(line.trim_ascii_end())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_as_single_lines() {
        let request = Request::Hello {
            version: PROTOCOL_VERSION.into(),
        };
        let line = encode(&request);
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(decode::<Request>(&line).unwrap(), request);

        let response = Response::Ready {
            version: "v".into(),
            pid: 7,
            threads: 3,
            patched: 0,
            pending_restore: 2,
            pending_reason: Some("thread 9 is inside tendril's hook code".into()),
        };
        assert_eq!(decode::<Response>(&encode(&response)).unwrap(), response);
    }

    #[test]
    fn paths_are_per_user_and_per_pid() {
        assert_eq!(
            control_socket_path(1000, 42),
            PathBuf::from("/tmp/tendril-1000/agent-42.sock")
        );
        assert_ne!(runtime_dir(0), runtime_dir(1000));
    }
}
