//! The analysis of one function's counted copy, shared by `tendril edges` and the live
//! UI's annotated code: what the counters say of each edge, block and loop
//! (`derived`), the annotated disassembly (`listing`), the Ball–Larus path numbers
//! decoded into their blocks (`path_counts`), and what the copy needs read from the
//! target first (its `.cold` parts, whether it calls a function that returns twice).

pub mod derived;
pub mod listing;
mod path_counts;

use crate::symbols::{Function, ProcessSymbols};
use crate::targets;
use tendril_wire::ThreadCounters;

/// Functions that return twice: a call of one can come back after the code after it
/// already ran, with the path register of that later time.
const RETURNS_TWICE: [&str; 8] = [
    "setjmp",
    "_setjmp",
    "__setjmp",
    "sigsetjmp",
    "__sigsetjmp",
    "vfork",
    "__vfork",
    "getcontext",
];

/// The bytes of `function`'s `.cold` parts that can be read: (start, bytes).
pub fn cold_bytes(pid: i32, symbols: &ProcessSymbols, function: &Function) -> Vec<(u64, Vec<u8>)> {
    targets::cold_parts(symbols, function)
        .into_iter()
        .filter_map(|(start, size)| {
            let bytes = crate::symbols::maps::read_memory(pid, start, start + size).ok()?;
            Some((start, bytes))
        })
        .collect()
}

/// The first function that returns twice (`setjmp`, `vfork`) that the code `code` at
/// `start` calls, directly, through its PLT stub or through a GOT slot. Every byte is
/// decoded, padding included: a false match only costs the paths.
pub fn returns_twice_callee(
    pid: i32,
    symbols: &ProcessSymbols,
    start: u64,
    code: &[u8],
) -> Option<String> {
    use iced_x86::{Decoder, DecoderOptions, FlowControl, OpKind};
    Decoder::with_ip(64, code, start, DecoderOptions::NONE)
        .into_iter()
        .filter(|instruction| {
            instruction.flow_control() == FlowControl::Call
                || instruction.flow_control() == FlowControl::IndirectCall
        })
        .find_map(|instruction| {
            let target = match instruction.op0_kind() {
                OpKind::NearBranch64 => instruction.near_branch64(),
                OpKind::Memory if instruction.is_ip_rel_memory_operand() => {
                    let slot = instruction.ip_rel_memory_address();
                    let bytes = crate::symbols::maps::read_memory(pid, slot, slot + 8).ok()?;
                    u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)
                }
                _ => return None,
            };
            let callee = symbols.lookup(target)?;
            let name = callee.plt_target().unwrap_or(&callee.name);
            let name = name.split('@').next().unwrap_or(name);
            RETURNS_TWICE.contains(&name).then(|| name.to_string())
        })
}

/// `name` or `name+0xN` for an address outside the function.
pub fn name_of(symbols: &ProcessSymbols, address: u64) -> Option<String> {
    let function = symbols.lookup(address)?;
    Some(match address - function.addr {
        0 => function.name.to_string(),
        offset => format!("{}+{offset:#x}", function.name),
    })
}

/// Counter `index`'s count (its `calls`), summed over the threads.
pub fn summed(threads: &[ThreadCounters], index: usize) -> u64 {
    threads
        .iter()
        .map(|thread| thread.calls.get(index).copied().unwrap_or(0))
        .sum()
}
