//! The JIT code a recording's functions call: never patched, shown as marked leaves.
//!
//! The one idea: code generated at run time lives in anonymous memory, which the agent
//! never patches (it patches only executable file mappings, and the function table
//! holds only the modules' functions, so discovery never even plans it). Like Go
//! callees (`go_callees`), the controller finds such calls itself, without the agent:
//! in a process with JIT code it decodes, once each, the functions the recording saw
//! run, for direct callees and calls through pointers (`call [rip+x]`, or `mov reg,
//! [rip+x]` then `call reg`: a function pointer the program set to its generated code,
//! read now), and keeps those whose target is code the runtime's perf map or jitdump
//! names. Under every node of such a caller the profile gets a leaf of that name,
//! module `[jit]`, marked `jit`, with no calls and no time — the call is not measured,
//! and its time stays in the caller's self time — and `discovery.not_followed` lists it
//! with the reason. The leaf says the caller's code calls it, not that this context
//! did. A call whose target is only in a register computed at run time (an
//! interpreter's dispatch, Python's trampolines) is seen by the agent's pointer check
//! instead, as it is made: the agent keeps the (site, target) pairs whose target is no
//! function of its table, and the controller asks for them about once a second while
//! the process has JIT code, and once more before the recording stops. Not shown:
//! calls into anonymous code no file names (the agent's own trampolines are such code,
//! and a patched entry jumps into one).

use super::code_reading::{all_targets, callees_of, for_each_tree};
use super::*;
use crate::profile::{Node, NotFollowed};
use crate::symbols::jit::{JIT_MODULE, JitSymbols};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

/// How often the JIT names are read again, and the agent asked for its unknown targets.
const REFRESH_INTERVAL: Duration = Duration::from_secs(1);
/// Why a call into JIT code is not followed.
pub const JIT_CODE: &str =
    "code generated at run time (JIT), never patched: its calls and time are its caller's";

/// The JIT code the recorded functions call.
#[derive(Debug)]
pub struct JitCallees {
    jit: JitSymbols,
    scanned: HashSet<u64>,
    /// Caller's entry → the JIT code it calls.
    found: BTreeMap<u64, BTreeSet<u64>>,
    /// When the agent was last asked for the calls through pointers it met into code
    /// its table does not know.
    asked_agent: Option<Instant>,
}

impl JitCallees {
    pub fn new(pid: i32) -> JitCallees {
        JitCallees {
            jit: JitSymbols::for_process(pid),
            scanned: HashSet::new(),
            found: BTreeMap::new(),
            asked_agent: None,
        }
    }

    /// Decodes the functions at `addresses` not decoded yet (nothing while the process
    /// has no JIT code).
    fn scan(&mut self, symbols: &ProcessSymbols, addresses: impl Iterator<Item = u64>) {
        if self
            .jit
            .since_refresh()
            .is_none_or(|since| since >= REFRESH_INTERVAL)
        {
            self.jit.refresh();
        }
        if self.jit.is_empty() {
            return;
        }
        for address in addresses {
            if !self.scanned.insert(address) {
                continue;
            }
            let Some(found) = callees_of(symbols, address) else {
                continue;
            };
            for target in all_targets(symbols.pid(), found) {
                let in_module =
                    symbols.lookup(target).is_some() || symbols.module_at(target).is_some();
                // Named code only: the agent's trampolines are anonymous code too,
                // and a patched function's entry jumps into one.
                if !in_module && self.jit.lookup(target).is_some() {
                    self.found.entry(address).or_default().insert(target);
                }
            }
        }
    }

    /// Notes the calls through pointers the agent's checks met into code no function of
    /// its table is (`met`: site, target): those a perf map or jitdump names become
    /// leaves under the function of their site.
    fn note_pointer_targets(&mut self, symbols: &ProcessSymbols, met: &[(u64, u64)]) {
        for &(site, target) in met {
            let Some(caller) = symbols.lookup(site) else {
                continue;
            };
            let in_module = symbols.lookup(target).is_some() || symbols.module_at(target).is_some();
            if !in_module && self.jit.lookup(target).is_some() {
                self.found.entry(caller.addr).or_default().insert(target);
            }
        }
    }

    /// The leaf for a call into `target`.
    fn leaf(&self, target: u64, with_cpu: bool) -> Node {
        let named = self.jit.name_at(target);
        let name = named
            .as_ref()
            .map_or_else(|| format!("[jit] {target:#x}"), |n| n.name.clone());
        let mut node = Node::leaf(&name, JIT_MODULE, 0, 0, 0);
        node.address = named.and_then(|n| n.start);
        node.jit = true;
        if with_cpu {
            (node.cpu_ns, node.self_cpu_ns) = (Some(0), Some(0));
        }
        node
    }

    /// Adds the leaves under every node of a caller in `roots`.
    fn add_leaves(&self, roots: &mut [Node]) {
        let mut pending: Vec<&mut Node> = roots.iter_mut().collect();
        while let Some(node) = pending.pop() {
            if let Some(targets) = node.address.and_then(|a| self.found.get(&a)) {
                let with_cpu = node.cpu_ns.is_some();
                node.children
                    .extend(targets.iter().map(|&t| self.leaf(t, with_cpu)));
            }
            pending.extend(node.children.iter_mut().filter(|child| !child.jit));
        }
    }

    /// The calls into JIT code found, as not followed.
    fn not_followed(&self) -> Vec<NotFollowed> {
        let targets: BTreeSet<u64> = self.found.values().flatten().copied().collect();
        targets
            .into_iter()
            .map(|target| NotFollowed {
                target: format!("{} ({JIT_MODULE})", self.leaf(target, false).name),
                reason: JIT_CODE.to_string(),
            })
            .collect()
    }
}

impl Recorder {
    /// Adds to `profile` the calls its functions make into JIT code: leaves under their
    /// callers, and entries of `discovery.not_followed`.
    pub(super) fn add_jit_callees(&mut self, profile: &mut Profile) {
        let Some(seen) = self.recorded_functions() else {
            return;
        };
        self.jit_callees.scan(&self.symbols, seen.into_iter());
        let due =
            (self.jit_callees.asked_agent).is_none_or(|asked| asked.elapsed() >= REFRESH_INTERVAL);
        if due {
            self.ask_for_unknown_targets();
        }
        if self.jit_callees.found.is_empty() {
            return;
        }
        for_each_tree(profile, |roots| self.jit_callees.add_leaves(roots));
        if let Some(discovery) = profile.discovery.as_mut() {
            discovery
                .not_followed
                .extend(self.jit_callees.not_followed());
        }
    }

    /// Asks the agent for the calls through pointers it met into code its table does
    /// not know, and notes those into JIT code: only while recording a process that has
    /// JIT code, and never of a stopped one (its agent cannot answer).
    pub(super) fn ask_for_unknown_targets(&mut self) {
        if self.jit_callees.jit.since_refresh().is_none() {
            self.jit_callees.jit.refresh();
        }
        if !self.recording
            || self.jit_callees.jit.is_empty()
            || crate::process::is_halted(self.target.pid)
            || self.session.closed_by_agent()
        {
            return;
        }
        self.jit_callees.asked_agent = Some(Instant::now());
        if let Ok(Response::UnknownTargets { met }) = self.session.request(&Request::UnknownTargets)
        {
            self.jit_callees.note_pointer_targets(&self.symbols, &met);
        }
    }
}
