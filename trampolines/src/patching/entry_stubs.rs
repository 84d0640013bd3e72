//! A recording hook in front of a function whose entry stays untouched: where the
//! checks before calls through pointers send the calls to a target the patcher could
//! not patch (issue 33).
//!
//! Some entries cannot take a jump: a 4-byte getter with no padding near it, an entry
//! whose first two bytes straddle a cache line (the guard would not be one store).
//! Calls to such a function through a pointer from inside the call graph pass a check
//! (`hooks::pointer_checks`), which can send them anywhere. So the function gets a
//! trampoline of its own whose hook is the recording hook of any patched function and
//! whose body is a jump to the function's untouched entry: the checks' table sends the
//! target's calls to the hook, and they are recorded, timed and discovered (Scheme B)
//! like any other callee's. Nothing of the function is written, so nothing is restored;
//! calls that do not pass a check (direct calls, callers outside the graph) are not
//! seen, as before. Adaptive timing switches such a function as it does a patched one
//! ([`switch_timing`]): an untimed hook is built in front of it too, and the table's
//! destinations move from one hook to the other. Like every trampoline, a stub is never
//! freed: a thread inside it when the recording ends finishes there.

use super::readiness::prepare;
use super::site_plan::own_code;
use super::sites::{Engine, InFront};
use super::state::{engine, runtime};
use crate::hooks::pointer_checks;
use crate::hooks::stubs::{self, TrampolineCode};
use crate::sys::code_memory;
use crate::sys::error::AgentError;
use crate::sys::loaded_modules::{self, LoadedModules};
use iced_x86::{BlockEncoder, BlockEncoderOptions, Code, Instruction, InstructionBlock};
use tendril_wire::Hook;
use tendril_wire::events::HookShape;

/// The first bytes of a function kept to tell it from another loaded at its address.
const ENTRY_KEPT: u64 = 16;

/// Builds a recording hook for session `owner` in front of the untouched entry of the
/// function at `address` (`size` bytes), and answers where to call it.
pub fn hook_in_front(owner: u64, address: u64, size: u64) -> Result<u64, AgentError> {
    // The loader held, then the engine, as for every patch (`patcher::patch`).
    loaded_modules::with_modules_held(|modules| {
        let mut guard = engine();
        let engine = guard.get_or_insert_with(Engine::default);
        engine.forget_unloaded(modules);
        build(engine, owner, address, size)
    })
}

/// The hook the checks should send the calls to the function at `address` to, if one
/// was built in front of it (and the function is still the one it was built for).
/// Call with the loader held (`modules`, its counts then).
pub fn hook_now(address: u64, modules: &LoadedModules) -> Option<u64> {
    let mut guard = engine();
    let engine = guard.as_mut()?;
    engine.forget_unloaded(modules);
    let id = *engine.ids.get(&address)?;
    (engine.in_front.get(&address))
        .filter(|front| front.id == id)
        .map(InFront::hook)
}

/// [`hook_in_front`], with the loader and the engine held: the hook built for this
/// function before (the same id: not a function since unloaded) or a new timed one.
fn build(engine: &mut Engine, owner: u64, address: u64, size: u64) -> Result<u64, AgentError> {
    prepare()?;
    if let Some(reason) = own_code(owner, address, size.max(1)) {
        return Err(AgentError::Refused(reason.into()));
    }
    if engine.sites.contains_key(&address) {
        return Err(AgentError::Refused(
            "its entry is patched already (by another tendril command)".into(),
        ));
    }
    let id = engine.id_for(address)?;
    if let Some(front) = engine.in_front.get(&address).filter(|f| f.id == id) {
        return Ok(front.hook());
    }
    let mut entry = vec![0u8; size.clamp(1, ENTRY_KEPT) as usize];
    code_memory::read_code(address, &mut entry)
        .map_err(|e| AgentError::io("cannot read its code", e))?;
    let timed = build_hook(engine, address, id, Hook::Record)?;
    (runtime()?.before_patching)(id);
    let front = InFront {
        id,
        kind: Hook::Record,
        timed,
        untimed: None,
        entry,
    };
    engine.in_front.insert(address, front);
    Ok(timed)
}

/// Sends the calls the checks make to the function at `address` to its timed or
/// untimed hook in front (`timing::set_timing` for a function with no patched entry).
pub(super) fn switch_timing(
    engine: &mut Engine,
    address: u64,
    timed: bool,
) -> Result<(), AgentError> {
    let Some(front) = engine.in_front.get(&address).cloned() else {
        return Err(AgentError::Refused(
            "it is not instrumented (any more)".into(),
        ));
    };
    let kind = if timed { Hook::Record } else { Hook::Untimed };
    if front.kind == kind {
        return Ok(());
    }
    let untimed = match front.untimed {
        Some(hook) => hook,
        None => build_hook(engine, address, front.id, Hook::Untimed)?,
    };
    let to = if timed { front.timed } else { untimed };
    pointer_checks::redirect(front.hook(), to);
    engine.in_front.insert(
        address,
        InFront {
            kind,
            untimed: Some(untimed),
            ..front
        },
    );
    Ok(())
}

/// A `kind` hook for function `id` at `address`, whose body jumps to the entry.
fn build_hook(engine: &mut Engine, address: u64, id: u32, kind: Hook) -> Result<u64, AgentError> {
    let memory = engine
        .arena
        .allocate_near(address, stubs::TRAMPOLINE_BYTES)?;
    // Only a `Backtrace` hook has a body sink to fill: a recording hook has none.
    let TrampolineCode { bytes, hook, .. } =
        stubs::build(memory, id, kind, None, HookShape::Jump, |body| {
            jump(body, address)
        })?;
    code_memory::write_code(memory, &bytes)
        .map_err(|e| AgentError::io("cannot write a trampoline", e))?;
    Ok(hook)
}

/// Forgets the hooks in front of functions whose library went away since they were
/// built (their first bytes changed or unmapped: see `Engine::forget_unloaded`); their
/// ids are retired, so a function loaded at the same address later gets its own.
pub(super) fn forget_unloaded(engine: &mut Engine) {
    let gone: Vec<u64> = (engine.in_front.iter())
        .filter(|&(&address, front)| {
            let mut now = vec![0u8; front.entry.len()];
            code_memory::read_code(address, &mut now).is_err() || now != front.entry
        })
        .map(|(&address, _)| address)
        .collect();
    for address in gone {
        engine.in_front.remove(&address);
        if let Some(id) = engine.ids.remove(&address) {
            engine.retired_ids.push((address, id));
        }
    }
}

/// A jump at `from` to `to`, encoded by iced's `BlockEncoder`: `jmp rel32` when in
/// reach, else a jump through a pointer it places after it.
fn jump(from: u64, to: u64) -> Result<Vec<u8>, AgentError> {
    let cannot =
        |e: iced_x86::IcedError| AgentError::Refused(format!("cannot encode its hook: {e}"));
    let jump = Instruction::with_branch(Code::Jmp_rel32_64, to).map_err(cannot)?;
    let block = InstructionBlock::new(std::slice::from_ref(&jump), from);
    let encoded = BlockEncoder::encode(64, block, BlockEncoderOptions::NONE).map_err(cannot)?;
    Ok(encoded.code_buffer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};

    /// Where the jump `bytes` at `at` leads (through its pointer, for an indirect one).
    fn target_of(at: u64, bytes: &[u8]) -> u64 {
        let instruction = Decoder::with_ip(64, bytes, at, DecoderOptions::NONE).decode();
        match instruction.memory_base() {
            iced_x86::Register::RIP => {
                let slot = (instruction.ip_rel_memory_address() - at) as usize;
                u64::from_le_bytes(bytes[slot..slot + 8].try_into().unwrap())
            }
            _ => instruction.near_branch_target(),
        }
    }

    #[test]
    fn the_body_jumps_to_the_entry_near_or_far() {
        let near = jump(0x7f00_0000_1000, 0x7f00_1000_0000).unwrap();
        assert_eq!(near.len(), 5);
        assert_eq!(target_of(0x7f00_0000_1000, &near), 0x7f00_1000_0000);
        let below = jump(0x7f00_1000_0000, 0x7f00_0000_1000).unwrap();
        assert_eq!(target_of(0x7f00_1000_0000, &below), 0x7f00_0000_1000);
        let far = jump(0x1000, 0x7f00_0000_1000).unwrap();
        assert_eq!(target_of(0x1000, &far), 0x7f00_0000_1000);
    }
}
