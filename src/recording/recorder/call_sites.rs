//! Naming the caller of each untimed call: a `Call` event carries the return address of
//! its call site, and the trees want the id of the function that made the call
//! (`profile::untimed_calls`).
//!
//! The one idea: a program has few call sites that call untimed functions, and each is
//! met millions of times, so each return address is resolved once — the symbol
//! containing it, then the id the agent gave that symbol's function — and cached.

use super::super::rings::Rings;
use crate::profile::untimed_calls::{UNKNOWN_CALLER, resolved_call};
use crate::symbols::ProcessSymbols;
use std::collections::HashMap;
use tendril_wire::events::{Event, EventKind};

/// Ids scanned past the last one in use before the registry is taken to end there
/// (ids an edge counter took leave holes in it).
const REGISTRY_SCAN_SLACK: u32 = 4096;

/// Return addresses resolved so far, and the agent's registry read so far.
#[derive(Debug, Default)]
pub(super) struct CallSites {
    caller_of: HashMap<u64, u32>,
    /// Return addresses in functions the agent had not hooked, with how far the
    /// registry had been read then: looked up again once it has grown.
    not_hooked: HashMap<u64, u32>,
    id_of_function: HashMap<u64, u32>,
    /// Ids below this have been read from the registry.
    registry_read: u32,
}

impl CallSites {
    /// `events` with each Call event's return address replaced by its caller's id;
    /// `None` when there is no Call event among them.
    pub(super) fn resolve(
        &mut self,
        events: &[Event],
        symbols: &ProcessSymbols,
        rings: &Rings,
    ) -> Option<Vec<Event>> {
        let first = events
            .iter()
            .position(|e| e.kind() == Some(EventKind::Call))?;
        let mut resolved = events.to_vec();
        for event in &mut resolved[first..] {
            if event.kind() == Some(EventKind::Call) {
                let (return_address, _) = event.call_site();
                let caller = self.caller(return_address, symbols, rings);
                *event = resolved_call(event, caller);
            }
        }
        Some(resolved)
    }

    fn caller(&mut self, return_address: u64, symbols: &ProcessSymbols, rings: &Rings) -> u32 {
        if let Some(&caller) = self.caller_of.get(&return_address) {
            return caller;
        }
        // The call instruction ends at the return address: its last byte is the caller's.
        let Some(function) = symbols.lookup(return_address.wrapping_sub(1)) else {
            self.caller_of.insert(return_address, UNKNOWN_CALLER);
            return UNKNOWN_CALLER;
        };
        let function = function.addr;
        if let Some(&known) = self.not_hooked.get(&return_address)
            && known == self.registry_read
            && rings.function_address(self.registry_read).is_none()
        {
            // Not hooked when last looked, and nothing was registered since.
            return UNKNOWN_CALLER;
        }
        let caller = self.id_of(function, rings);
        match caller {
            UNKNOWN_CALLER => {
                self.not_hooked.insert(return_address, self.registry_read);
            }
            _ => {
                self.not_hooked.remove(&return_address);
                self.caller_of.insert(return_address, caller);
            }
        }
        caller
    }

    /// The id the agent gave the function at `address`, if it gave one.
    fn id_of(&mut self, address: u64, rings: &Rings) -> u32 {
        if let Some(&id) = self.id_of_function.get(&address) {
            return id;
        }
        let mut id = self.registry_read;
        let mut last_in_use = id;
        while id < last_in_use.saturating_add(REGISTRY_SCAN_SLACK) {
            if let Some(registered) = rings.function_address(id) {
                self.id_of_function.insert(registered, id);
                last_in_use = id;
                self.registry_read = id + 1;
            } else if id as usize >= tendril_wire::rings::MAX_FUNCTIONS {
                break;
            }
            id += 1;
        }
        self.id_of_function
            .get(&address)
            .copied()
            .unwrap_or(UNKNOWN_CALLER)
    }
}
