//! The counts behind the live view's annotated code: the state of the code view, the
//! thread that reads the copy's counters on a connection of its own a few times a
//! second, and the listing those counts make (`tendril edges`' own).
//!
//! The one idea: reading counters needs only the agent, not the recorder, so it never
//! takes the recorder away from the rings, and the event loop only ever picks up the
//! newest counts the thread has sent.

use crate::agent_connection::AgentConnectionError;
use crate::edge_analysis::derived::{About, EdgeProfile};
use crate::edge_analysis::listing::{self, Listing};
use crate::edge_analysis::summed;
use crate::quantities::amount;
use crate::recording::HookedCopy;
use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tendril_tui::{CodeLine, CodeSnapshot};
use tendril_wire::{Request, Response, ThreadCounters};

/// How often the counts are read.
const READ_INTERVAL: Duration = Duration::from_millis(250);

/// What the code view is doing.
#[derive(Default)]
pub enum CodeWatch {
    #[default]
    Closed,
    /// The copy is going in (a background job on the recorder fills the slot).
    Opening(Arc<Mutex<Option<Result<Opened, String>>>>),
    Open(Box<OpenCode>),
}

/// A copy behind its hook, and the names of the places its code branches to outside
/// itself (read from the recorder's symbols while it was at hand).
pub struct Opened {
    copy: HookedCopy,
    names: HashMap<u64, String>,
    /// Why paths are not counted, when the function calls one that returns twice.
    no_paths: Option<String>,
    /// The bytes of its `.cold` parts: (start, bytes).
    cold: Vec<(u64, Vec<u8>)>,
}

impl Opened {
    pub fn new(
        copy: HookedCopy,
        names: HashMap<u64, String>,
        no_paths: Option<String>,
        cold: Vec<(u64, Vec<u8>)>,
    ) -> Opened {
        Opened {
            copy,
            names,
            no_paths,
            cold,
        }
    }
}

/// The code on screen and the thread reading its counts.
pub struct OpenCode {
    opened: Opened,
    pid: i32,
    since: Instant,
    ids: Vec<u32>,
    updates: Receiver<Result<Vec<ThreadCounters>, String>>,
    /// Dropping it ends the reader at its next wait.
    _stop: SyncSender<()>,
}

/// Starts the thread that reads the copy's counters on a connection of its own.
pub fn read_counts(opened: Opened, pid: i32) -> OpenCode {
    let ids = opened.copy.layout.counters();
    let (sender, updates) = mpsc::sync_channel(4);
    let (stop, stopped) = mpsc::sync_channel::<()>(0);
    let request = Request::ReadCounters { ids: ids.clone() };
    let reader = move || {
        let mut session = match crate::inject::connect_existing(pid) {
            Ok(Some((_, session))) => session,
            Ok(None) => return drop(sender.send(Err("the agent is gone".into()))),
            Err(error) => return drop(sender.send(Err(format!("cannot read counts: {error}")))),
        };
        loop {
            let update = match session.request(&request) {
                Ok(Response::Counters { threads, .. }) => Ok(threads),
                Ok(other) => Err(AgentConnectionError::Protocol(format!("{other:?}")).to_string()),
                Err(error) => Err(format!("cannot read counts: {error}")),
            };
            let failed = update.is_err();
            // An error means the connection is closed; a send fails once the view is.
            if sender.send(update).is_err() || failed {
                return;
            }
            if stopped.recv_timeout(READ_INTERVAL) != Err(RecvTimeoutError::Timeout) {
                return;
            }
        }
    };
    let updates = match std::thread::Builder::new()
        .name("tendril-counts".into())
        .spawn(reader)
    {
        Ok(_) => updates,
        Err(error) => {
            let (sender, failed) = mpsc::sync_channel(1);
            let _ = sender.send(Err(format!("cannot read counts: {error}")));
            failed
        }
    };
    OpenCode {
        opened,
        pid,
        since: Instant::now(),
        ids,
        updates,
        _stop: stop,
    }
}

impl OpenCode {
    /// The newest counts (or why there are none), as the reader sends them.
    pub fn updates(&self) -> &Receiver<Result<Vec<ThreadCounters>, String>> {
        &self.updates
    }

    /// The listing with the counts `threads` read.
    pub fn snapshot(&self, threads: &[ThreadCounters]) -> CodeSnapshot {
        let copy = &self.opened.copy;
        let counts: HashMap<u32, u64> = (self.ids.iter().enumerate())
            .map(|(index, &id)| (id, summed(threads, index)))
            .collect();
        let mut layout = copy.layout.clone();
        if let Some(why) = &self.opened.no_paths {
            layout.paths = Err(why.clone());
        }
        let profile = EdgeProfile::derive(&layout, |id| counts.get(&id).copied().unwrap_or(0));
        let about = About {
            function: copy.function.name.to_string(),
            module: copy.function.module.to_string(),
            pid: self.pid,
            size: copy.function.size,
            elapsed: self.since.elapsed(),
            threads: threads
                .iter()
                .filter(|thread| thread.calls.first().is_some_and(|&calls| calls > 0))
                .count(),
        };
        let name_of = |address: u64| self.opened.names.get(&address).cloned();
        let listing = Listing {
            about: &about,
            code: &copy.code,
            cold: &self.opened.cold,
            name_of: &name_of,
        };
        CodeSnapshot {
            title: format!(
                "{} ({}): {} inside the call graph, counted live · Esc back",
                about.function,
                about.module,
                amount(profile.calls, "call", "calls"),
            ),
            lines: listing::lines(&listing, &profile)
                .into_iter()
                .map(|(hot, text)| CodeLine { text, hot })
                .collect(),
        }
    }
}
