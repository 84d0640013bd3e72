//! The Go functions a recording's code calls: not followed, and listed with the reason.
//!
//! The one idea: discovery never instruments Go code (the function table marks it
//! excluded: `refusals::GO_CODE`), so a subtree stops where C code calls into Go — a
//! cgo program's exported Go function is reached through `crosscall2`. The agent skips
//! such a callee without a word, so the controller finds them itself: in a process
//! with Go code it decodes, once each, the functions the recording saw run, for their
//! direct callees (and calls through GOT slots), and lists those that are Go code in
//! the profile's `discovery.not_followed`. A process without Go code costs nothing.

use super::code_reading::{all_targets, callees_of};
use super::*;
use crate::profile::NotFollowed;
use std::collections::{BTreeSet, HashSet};

/// The Go functions found called from the recorded functions so far.
#[derive(Debug, Default)]
pub struct GoCallees {
    /// Whether the process has Go code at all (nothing is decoded otherwise).
    has_go: bool,
    scanned: HashSet<u64>,
    found: BTreeSet<u64>,
}

impl GoCallees {
    pub fn new(symbols: &ProcessSymbols) -> GoCallees {
        GoCallees {
            has_go: symbols.functions().iter().any(|f| f.go_code),
            ..GoCallees::default()
        }
    }

    /// Decodes the functions at `addresses` not decoded yet.
    fn scan(&mut self, symbols: &ProcessSymbols, addresses: impl Iterator<Item = u64>) {
        for address in addresses {
            if !self.scanned.insert(address) {
                continue;
            }
            let Some(found) = callees_of(symbols, address) else {
                continue;
            };
            for target in all_targets(symbols.pid(), found) {
                if symbols
                    .lookup(target)
                    .is_some_and(|callee| callee.addr == target && callee.go_code)
                {
                    self.found.insert(target);
                }
            }
        }
    }
}

impl Recorder {
    /// The Go functions that the functions recorded so far call, with the reason they
    /// are not followed.
    pub(super) fn go_callees_not_followed(&mut self) -> Vec<NotFollowed> {
        if !self.go_callees.has_go {
            return Vec::new();
        }
        let Some(seen) = self.recorded_functions() else {
            return Vec::new();
        };
        self.go_callees.scan(&self.symbols, seen.into_iter());
        self.go_callees
            .found
            .iter()
            .filter_map(|&address| self.symbols.lookup(address))
            .map(|callee| NotFollowed {
                target: format!("{} ({})", callee.name, callee.module),
                reason: refusals::GO_CODE.to_string(),
            })
            .collect()
    }
}
