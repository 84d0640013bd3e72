//! What a user does to a running recording without ending it: pause and resume it,
//! reset its data, change its roots. Each goes through the same two steps as a whole
//! recording — the agent stops (`end`) and starts again (`begin`) — and the open frames
//! are ended where the agent stopped, so nothing recorded later nests under them.

use super::Recorder;
use crate::agent_connection::AgentConnectionError;
use crate::profile::CctBuilder;
use crate::recording::RecordError;
use crate::recording::gross::GrossTimes;
use crate::recording::rings::Rings;
use crate::recording::tsc;
use crate::targets;
use std::time::Instant;
use tendril_wire::{Request, Response};

impl Recorder {
    /// Pauses collection: the code is restored; the data so far stays.
    pub fn pause(&mut self) -> Result<(), RecordError> {
        self.end()
    }

    /// Stops the recording in the agent (every patch restored); the data stays.
    pub(super) fn end(&mut self) -> Result<(), RecordError> {
        let pid = self.target.pid;
        if !self.recording {
            return Ok(());
        }
        // The last calls into JIT code the agent met, before it forgets them.
        self.ask_for_unknown_targets();
        self.recording = false;
        self.hooks_left_in = None;
        let stopped = self.session.request(&Request::StopRecording);
        self.stopped_at = self.rings.as_ref().and_then(Rings::stopped_at);
        self.poll();
        self.stop_watching();
        let refused = match stopped.map_err(|source| RecordError::Session { pid, source })? {
            Response::RecordingStopped {
                refused,
                unloaded,
                loader,
                pending,
                pending_reason,
                ..
            } => {
                self.late_modules.stopped(loader, unloaded.len());
                self.hooks_left_in = (pending > 0).then(|| {
                    format!(
                        "{pending} of tendril's hooks on the unwinder are still in ({}); they come out by themselves",
                        pending_reason.as_deref().unwrap_or("a thread is inside tendril's code")
                    )
                });
                refused
            }
            other => {
                return Err(RecordError::Session {
                    pid,
                    source: AgentConnectionError::Protocol(format!("{other:?}")),
                });
            }
        };
        self.refused
            .extend(refused.into_iter().map(|(address, reason)| {
                let name = self
                    .symbols
                    .lookup(address)
                    .map_or_else(|| format!("{address:#x}"), |f| f.name.to_string());
                (name, reason)
            }));
        Ok(())
    }

    /// After a pause (or a refused change of roots): tendril's unwinder hooks the agent
    /// had to leave in for a moment, said as a sentence; `None` when every byte is back.
    pub fn hooks_left_in(&self) -> Option<&str> {
        if self.recording {
            return None;
        }
        self.hooks_left_in.as_deref()
    }

    /// Resumes collection after [`Recorder::pause`], with the same roots.
    pub fn resume(&mut self) -> Result<(), RecordError> {
        if self.recording {
            return Ok(());
        }
        let known = if self.gross_only {
            Vec::new()
        } else {
            self.functions_seen()
        };
        self.begin_with(&known)
    }

    /// Forgets the data collected so far (the recording goes on).
    pub fn reset(&mut self) {
        if let Some(builder) = &self.builder {
            let calibration = builder.calibration();
            let ignored = builder.ignored_functions();
            self.builder = CctBuilder::new(calibration).ok();
            let measure_cpu = self.off_cpu.is_some();
            if let Some(builder) = self.builder.as_mut() {
                builder.set_root_functions(self.root_ids.iter().copied());
                // The in-situ calibration's events stay out of the fresh trees too.
                builder.ignore_functions(ignored);
                if measure_cpu {
                    builder.measure_cpu();
                }
            }
        }
        if let Some(gross) = &mut self.gross {
            *gross = GrossTimes::new(self.tsc_hz, gross.inner_ticks());
        }
        // The new builder times everything; the judge starts again too.
        self.retime_all();
        self.ring_threads.clear();
        self.last_timestamps.clear();
        self.trace = None;
        self.events = 0;
        self.started = Instant::now();
        self.started_tsc = tsc::read();
    }

    /// Records from other roots from now on (patterns as for `--root`); the data so
    /// far is forgotten. The target stays attached throughout. While paused, the new
    /// roots are kept for [`Recorder::resume`] and named at once.
    ///
    /// If the new roots cannot be instrumented, the previous roots and the data stay,
    /// and the recording is left paused (the code restored): `resume` records the
    /// previous roots again.
    pub fn set_roots(&mut self, patterns: &[String]) -> Result<(), RecordError> {
        let mut names: Vec<String> = Vec::new();
        for function in targets::match_patterns(&self.symbols, patterns)? {
            if !names.iter().any(|n| *n == function.name) {
                names.push(function.name.to_string());
            }
        }
        if !self.recording {
            self.root_patterns = patterns.to_vec();
            self.root_names = names;
            self.reset();
            return Ok(());
        }
        self.end()?;
        let previous = std::mem::replace(&mut self.root_patterns, patterns.to_vec());
        if let Err(error) = self.begin() {
            self.root_patterns = previous;
            return Err(error);
        }
        // The events of the new roots are still in the rings: they go to fresh trees.
        self.reset();
        Ok(())
    }
}
