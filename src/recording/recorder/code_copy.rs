//! A recorded function's copy with edge counters, put behind its recording hook while
//! the recording goes on: what the live view's annotated code reads (issue 18).
//!
//! The one idea: the recording's node names a function the agent has hooked; the agent
//! keeps that hook and runs a counted copy behind it, whose counters count only the
//! calls inside the call graph — the calls the tree counts. Only the request goes
//! through the recording's connection (it owns the hook); reading the counters does
//! not need it.

use super::Recorder;
use crate::agent_connection::AgentConnectionError;
use crate::recording::RecordError;
use crate::symbols::Function;
use tendril_wire::edges::EdgeLayout;
use tendril_wire::{Request, Response};

/// A function's copy behind its recording hook.
pub struct HookedCopy {
    pub function: Function,
    pub layout: EdgeLayout,
    /// The function's original bytes, from its entry.
    pub code: Vec<u8>,
}

impl Recorder {
    /// The function the recording names `name` in `module` (a node of its tree), if it
    /// has hooked it; at `address`, when given, since two functions may share a name and
    /// module (`static` functions of two files).
    pub fn recorded_function(
        &self,
        name: &str,
        module: &str,
        address: Option<u64>,
    ) -> Option<Function> {
        let rings = self.rings.as_ref()?;
        (0..)
            .map_while(|id| rings.function_address(id))
            .filter_map(|hooked| {
                (self.symbols.lookup(hooked)).filter(|function| function.addr == hooked)
            })
            .find(|function| {
                function.name == name
                    && function.module == module
                    && address.is_none_or(|address| function.addr == address)
            })
            .cloned()
    }

    /// Puts a copy of `function` with edge counters (and the path register if `paths`)
    /// behind its recording hook. Refused, with the reason, when the recording has no
    /// hook on it (any more) or its code cannot be copied.
    pub fn copy_behind_hook(
        &mut self,
        function: &Function,
        paths: bool,
    ) -> Result<HookedCopy, RecordError> {
        let pid = self.target.pid;
        let request = Request::CopyBehindRecordingHook {
            address: function.addr,
            size: function.size,
            cold_parts: crate::targets::cold_parts(&self.symbols, function),
            paths,
        };
        match self.session.request(&request) {
            Ok(Response::EdgesBehindHook { layout, code }) => Ok(HookedCopy {
                function: function.clone(),
                layout,
                code,
            }),
            Ok(other) => Err(RecordError::Session {
                pid,
                source: AgentConnectionError::Protocol(format!("{other:?}")),
            }),
            Err(AgentConnectionError::Refused(reason)) => Err(RecordError::Refused {
                pid,
                message: format!("cannot count {}'s edges: {reason}", function.name),
            }),
            Err(source) => Err(RecordError::Session { pid, source }),
        }
    }
}
