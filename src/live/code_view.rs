//! The live view's annotated code (issue 18): `e` on a node puts a counted copy of its
//! function behind the recording's hook, and its counts are read a few times a second
//! and shown as the listing `tendril edges` prints — exact block, branch, table and path
//! counts of the calls made inside the call graph, growing while the recording goes on.
//!
//! The one idea: the copy goes in through the recorder (its connection owns the hook),
//! in the background like every action that waits for the agent; from then on the
//! counts are read on a connection of their own, by a thread of their own, so the event
//! loop neither waits for the agent nor takes the recorder away from the rings. The
//! copy stays behind the hook after Esc (its counting costs the target a fraction of a
//! nanosecond per edge) and goes out with the hook: at a pause, a root change, the end.

use super::code_counts::{CodeWatch, Opened, read_counts};
use super::profiling_state::ProfilingState;
use super::stage::Recording;
use crate::edge_analysis::{cold_bytes, name_of, returns_twice_callee};
use crate::recording::Recorder;
use std::sync::mpsc::TryRecvError;
use std::sync::{Arc, Mutex};
use tendril_tui::App;

impl ProfilingState {
    /// `e`: copies the function the node names (by its address, when the node has one)
    /// behind its hook, in the background.
    pub(super) fn show_code(
        &mut self,
        name: String,
        module: String,
        address: Option<u64>,
        app: &mut App,
    ) {
        self.code = CodeWatch::Closed;
        match &self.recording {
            Recording::Live(recorder) if !recorder.is_recording() => {
                return app.close_code("paused: resume with p to count a function's edges");
            }
            Recording::Live(_) => {}
            other => return app.close_code(other.not_live_note()),
        }
        let slot = Arc::new(Mutex::new(None));
        let filled = Arc::clone(&slot);
        let note = format!("copying {name} with counters behind its hook…");
        self.run_on_recorder(
            "copying a function",
            note,
            move |recorder| {
                let opened = open(recorder, &name, &module, address);
                let message = match &opened {
                    Ok(_) => format!(
                        "{name}: its calls inside the call graph are counted exactly; Esc goes back"
                    ),
                    Err(why) => why.clone(),
                };
                *filled.lock().unwrap_or_else(|p| p.into_inner()) = Some(opened);
                message
            },
            app,
        );
        self.code = CodeWatch::Opening(slot);
    }

    /// Esc: stops reading the counts (the copy stays behind the hook).
    pub(super) fn close_code(&mut self) {
        self.code = CodeWatch::Closed;
    }

    /// Starts the reader once the copy is in, and hands the UI the newest counts.
    pub(super) fn check_code(&mut self, app: &mut App) {
        match std::mem::take(&mut self.code) {
            CodeWatch::Closed => {}
            CodeWatch::Opening(slot) => {
                let taken = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
                self.code = match taken {
                    None if matches!(self.recording, Recording::Busy(_)) => {
                        CodeWatch::Opening(slot)
                    }
                    // The job ended without filling it (it died with the recorder).
                    None => {
                        app.close_code("the function could not be copied");
                        CodeWatch::Closed
                    }
                    Some(Err(why)) => {
                        app.close_code(why);
                        CodeWatch::Closed
                    }
                    Some(Ok(opened)) => match self.pid {
                        Some(pid) => CodeWatch::Open(Box::new(read_counts(opened, pid))),
                        None => CodeWatch::Closed,
                    },
                };
            }
            CodeWatch::Open(open) => {
                let mut latest = None;
                loop {
                    match open.updates().try_recv() {
                        Ok(update) => latest = Some(update),
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => {
                            latest.get_or_insert(Err("counting stopped".into()));
                            break;
                        }
                    }
                }
                match latest {
                    None => self.code = CodeWatch::Open(open),
                    Some(Err(why)) => app.close_code(why),
                    Some(Ok(threads)) => {
                        app.update_code(open.snapshot(&threads));
                        self.code = CodeWatch::Open(open);
                    }
                }
            }
        }
    }
}

/// Puts the copy of the recorded function `name` (in `module`, at `address` if known)
/// behind its hook.
fn open(
    recorder: &mut Recorder,
    name: &str,
    module: &str,
    address: Option<u64>,
) -> Result<Opened, String> {
    let Some(function) = recorder.recorded_function(name, module, address) else {
        return Err(format!(
            "{name} is not instrumented by this recording, so its code cannot be counted"
        ));
    };
    let pid = recorder.pid();
    let copy = recorder
        .copy_behind_hook(&function, true)
        .map_err(|e| e.to_string())?;
    // Read in the original bytes the agent sent (the live entry is patched): a callee
    // that returns twice makes the counted paths meaningless, so they are not shown.
    let twice = returns_twice_callee(pid, recorder.symbols(), function.addr, &copy.code);
    let symbols = recorder.symbols();
    let end = function.addr + copy.code.len() as u64;
    let names = iced_x86::Decoder::with_ip(64, &copy.code, function.addr, 0)
        .into_iter()
        .map(|instruction| instruction.near_branch_target())
        .filter(|&target| target != 0 && !(function.addr..end).contains(&target))
        .filter_map(|target| Some((target, name_of(symbols, target)?)))
        .collect();
    Ok(Opened::new(
        copy,
        names,
        twice.map(|callee| {
            format!("it calls {callee}, which returns twice; a path register cannot follow that")
        }),
        cold_bytes(pid, symbols, &function),
    ))
}
