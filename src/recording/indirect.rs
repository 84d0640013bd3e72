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
    /// Candidates left out by the cap on how many are patched up front.
    pub capped: Vec<NotFollowed>,
}

/// The most address-taken functions instrumented when a recording starts. Patching
/// 4,000 of them keeps a start under half a second (BENCHMARKS.md, "Calls through
/// pointers"); a program with tens of thousands would take seconds to start.
pub const MAX_UP_FRONT: usize = 4000;

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

    /// The candidates to patch with [`Hook::Record`]: those not already in `patched`, the
    /// module `first` (the executable) first, at most [`MAX_UP_FRONT`]; the rest are
    /// noted as not followed.
    pub fn to_patch<'a>(
        &mut self,
        symbols: &'a ProcessSymbols,
        patched: &[(&Function, Hook)],
        first: &str,
    ) -> Vec<&'a Function> {
        let already: HashSet<u64> = patched.iter().map(|(f, _)| f.addr).collect();
        let all = functions_at(symbols, &self.taken.addresses);
        // Candidates already in `patched` (Scheme A's closure takes them) use the budget.
        let budget =
            MAX_UP_FRONT.saturating_sub(all.iter().filter(|f| already.contains(&f.addr)).count());
        let mut candidates: Vec<&Function> = all
            .into_iter()
            .filter(|f| !already.contains(&f.addr))
            .collect();
        // Stable: address order within each group.
        candidates.sort_by_key(|f| f.module != first);
        self.capped.clear();
        if candidates.len() > budget {
            let mut left_out: Vec<(String, usize)> = Vec::new();
            for function in &candidates[budget..] {
                match left_out.iter_mut().find(|(m, _)| *m == function.module) {
                    Some((_, count)) => *count += 1,
                    None => left_out.push((function.module.to_string(), 1)),
                }
            }
            self.capped = left_out
                .into_iter()
                .map(|(module, count)| NotFollowed {
                    target: format!("{count} address-taken functions of {module}"),
                    reason: format!(
                        "beyond the first {MAX_UP_FRONT} instrumented up front (more \
                         would make the start take seconds)"
                    ),
                })
                .collect();
            candidates.truncate(budget);
        }
        candidates
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
        for capped in &self.capped {
            line += &format!("; {} not followed: {}", capped.target, capped.reason);
        }
        if !self.not_followed.is_empty() {
            line += &format!(
                "; {} not followed (the profile lists them with the reason)",
                self.not_followed.len()
            );
        }
        line
    }

    /// Everything not followed: refused, unreadable, and left out by the cap.
    pub fn all_not_followed(&self) -> Vec<NotFollowed> {
        self.capped
            .iter()
            .chain(&self.not_followed)
            .cloned()
            .collect()
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
