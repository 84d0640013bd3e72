//! Following calls through pointers: which address-taken functions a recording
//! instruments up front, and what became of them.
//!
//! The one idea (docs/DESIGN.md, "Calls through pointers"): the call site is left
//! alone. Every function whose address the program takes ([`address_taken`]) gets the
//! ordinary recording hook when the recording starts, in the same batch as the roots.
//! Outside the call graph that hook steps aside (about a nanosecond); inside it, the
//! function is recorded under whichever instrumented frame is open on the thread — its
//! real caller — and Scheme B discovers its callees on its first call, as for any
//! function. So virtual calls, callbacks, dispatch tables, `dyn Trait` and closures are
//! followed with no hook at the (2-byte, return-address-ending) call site at all, and the
//! unwinder sees exactly the frames it always sees.
//!
//! [`address_taken`]: super::address_taken

use super::address_taken::{self, AddressTaken};
use crate::profile::NotFollowed;
use crate::symbols::{Function, ProcessSymbols};
use std::collections::HashSet;
use tendril_wire::{Hook, PatchOutcome};

/// The candidate targets of a recording and what patching them gave.
#[derive(Debug, Default)]
pub struct IndirectTargets {
    /// The address-taken functions of the modules known so far.
    pub taken: AddressTaken,
    /// Address-taken functions instrumented.
    pub instrumented: u64,
    /// Address-taken functions that could not be instrumented, and modules whose
    /// pointers could not be read: calls through pointers into them are not followed.
    pub not_followed: Vec<NotFollowed>,
}

impl IndirectTargets {
    /// Finds the address-taken functions of every module of `symbols`.
    pub fn find(symbols: &ProcessSymbols) -> IndirectTargets {
        Self::found(address_taken::find(symbols, |_| true))
    }

    /// Wraps a candidate set, noting the modules that could not be read.
    pub fn found(taken: AddressTaken) -> IndirectTargets {
        let mut targets = IndirectTargets::default();
        targets.note_unreadable(&taken);
        targets.taken = taken;
        targets
    }

    /// Notes the modules of `taken` whose pointers could not be read.
    pub fn note_unreadable(&mut self, taken: &AddressTaken) {
        self.not_followed
            .extend(taken.unreadable.iter().map(|(module, reason)| NotFollowed {
                target: module.clone(),
                reason: format!("its pointers could not be read: {reason}"),
            }));
    }

    /// The candidates to patch with [`Hook::Record`]: those not already in `patched`.
    pub fn to_patch<'a>(
        &self,
        symbols: &'a ProcessSymbols,
        patched: &[(&Function, Hook)],
    ) -> Vec<&'a Function> {
        let already: HashSet<u64> = patched.iter().map(|(f, _)| f.addr).collect();
        functions_at(symbols, &self.taken.addresses)
            .into_iter()
            .filter(|f| !already.contains(&f.addr))
            .collect()
    }

    /// Notes what patching the candidates in `patched` gave (`outcomes` in the same
    /// order): how many are instrumented, and why the others are not.
    pub fn note_outcomes(&mut self, patched: &[(&Function, Hook)], outcomes: &[PatchOutcome]) {
        for ((function, hook), outcome) in patched.iter().zip(outcomes) {
            if !hook.records() || !self.taken.contains(function.addr) {
                continue;
            }
            match &outcome.refused {
                None => self.instrumented += 1,
                Some(reason) => self.not_followed.push(NotFollowed {
                    target: format!("{} ({})", function.name, function.module),
                    reason: reason.clone(),
                }),
            }
        }
    }

    /// One line for the user: what is followed, and what not.
    pub fn summary(&self) -> String {
        let modules = self.taken.per_module.iter().filter(|(_, n)| *n > 0).count();
        let mut line = format!(
            "calls through pointers: {} address-taken functions in {} modules instrumented \
             (found in {} ms)",
            self.instrumented,
            modules,
            self.taken.elapsed.as_millis()
        );
        if !self.not_followed.is_empty() {
            line += &format!(
                "; {} not followed (the profile lists them with the reason)",
                self.not_followed.len()
            );
        }
        line
    }

    /// Forgets the outcomes of an earlier start (the candidates stay).
    pub fn forget_outcomes(&mut self) {
        self.instrumented = 0;
        self.not_followed.retain(|n| !n.target.contains(" ("));
    }
}

/// The first function of `symbols` starting at each of `addresses` (sorted).
pub fn functions_at<'a>(symbols: &'a ProcessSymbols, addresses: &[u64]) -> Vec<&'a Function> {
    addresses
        .iter()
        .filter_map(|&address| symbols.lookup(address).filter(|f| f.addr == address))
        .collect()
}
