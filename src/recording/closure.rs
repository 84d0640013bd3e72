//! Scheme A: the static call graph of the roots, found before anything runs.
//!
//! The one idea: JFluid's eager scheme, for comparison with Scheme B — every function
//! reachable from a root through direct calls (and calls through GOT slots, read from
//! the target's memory now) is instrumented up front, whether it will ever run or not.
//! Calls through pointers are answered as JFluid answered virtual calls (class
//! hierarchy analysis: every override): once the graph holds an indirect call site,
//! every address-taken function joins it — itself, not its own static graph, which in
//! a large program is most of the program (45,000 functions and three minutes of
//! patching for tendril's debug demo).

use crate::refusals;
use crate::symbols::{Function, ProcessSymbols, SymbolSource};
use std::collections::{HashSet, VecDeque};
use std::os::unix::fs::FileExt;
use tendril_callgraph::callees;

/// The closure is cut off at this many functions.
const MAX_FUNCTIONS: usize = 100_000;
/// Longest body read.
const MAX_BODY: u64 = 1 << 20;

/// The static call graph below some roots.
#[derive(Debug, Default)]
pub struct Closure<'a> {
    /// Every function statically reachable from the roots (roots excluded), in
    /// discovery order.
    pub functions: Vec<&'a Function>,
    /// Indirect call sites in the roots and those functions.
    pub indirect_call_sites: u64,
}

/// The static call graph below `roots` (see [`Closure`]); `indirect_targets` (the
/// address-taken functions) join it, without their own graphs, if it has an indirect
/// call site.
pub fn static_closure<'a>(
    symbols: &'a ProcessSymbols,
    roots: &[&Function],
    indirect_targets: &[&'a Function],
) -> Closure<'a> {
    let Ok(memory) = std::fs::File::open(format!("/proc/{}/mem", symbols.pid())) else {
        return Closure::default();
    };
    let read = |address: u64, length: u64| -> Option<Vec<u8>> {
        let mut buffer = vec![0u8; length as usize];
        memory.read_exact_at(&mut buffer, address).ok()?;
        Some(buffer)
    };
    let read_pointer =
        |address: u64| read(address, 8).map(|bytes| u64::from_le_bytes(bytes.try_into().unwrap()));
    let mut seen: HashSet<u64> = roots.iter().map(|f| f.addr).collect();
    let mut queue: VecDeque<u64> = roots.iter().map(|f| f.addr).collect();
    let mut closure = Closure::default();
    loop {
        let Some(address) = queue.pop_front() else {
            if closure.indirect_call_sites == 0 {
                break;
            }
            for &target in indirect_targets {
                if seen.insert(target.addr) && closure.functions.len() < MAX_FUNCTIONS {
                    closure.functions.push(target);
                }
            }
            break;
        };
        let Some(function) = symbols.lookup(address).filter(|f| f.addr == address) else {
            continue;
        };
        let Some(code) = read(function.addr, function.size.min(MAX_BODY)) else {
            continue;
        };
        let found = callees::scan(&code, function.addr);
        closure.indirect_call_sites += found.indirect_call_sites;
        let targets = found
            .direct
            .into_iter()
            .chain(found.through_pointers.into_iter().filter_map(read_pointer));
        for target in targets {
            let Some(callee) = resolve(symbols, target, &read, &read_pointer)
                .filter(|callee| refusals::reason(callee, true).is_none())
            else {
                continue;
            };
            if seen.insert(callee.addr) && closure.functions.len() < MAX_FUNCTIONS {
                closure.functions.push(callee);
                queue.push_back(callee.addr);
            }
        }
    }
    closure
}

/// The function a branch to `target` enters, PLT stubs followed; `None` for code that
/// is never instrumented (the loader, the vDSO, the agent) or unknown addresses.
fn resolve<'a>(
    symbols: &'a ProcessSymbols,
    target: u64,
    read: &impl Fn(u64, u64) -> Option<Vec<u8>>,
    read_pointer: &impl Fn(u64) -> Option<u64>,
) -> Option<&'a Function> {
    let function = symbols.lookup(target).filter(|f| f.addr == target)?;
    let function = if function.source == SymbolSource::Plt {
        let code = read(function.addr, function.size.clamp(1, 32))?;
        let destination = callees::plt_slot(&code, function.addr).and_then(read_pointer)?;
        symbols
            .lookup(destination)
            .filter(|f| f.addr == destination && f.source != SymbolSource::Plt)?
    } else {
        function
    };
    let excluded = function.size == 0
        || function.module.starts_with("ld-")
        || function.module == "[vdso]"
        || crate::agent_bundle::is_agent_module(&function.module);
    (!excluded).then_some(function)
}
