//! Pointing a function's entry at a whole copy of it with edge counters (`tendril
//! edges`, issue 18).
//!
//! The copy is built by `code::function_copy` behind a count hook (which counts the
//! calls and gives a thread its state before the first counter needs it), in one
//! trampoline of its own, and its entry jump goes in with the same protocol and
//! bookkeeping as every other patch: a restore (`Unpatch`, a detach) puts the entry's
//! bytes back, and a thread still inside the copy finishes there, as copies are never
//! freed. The copy's unwind information (`code::copy_unwind`) is registered with the
//! process's unwinder before the entry goes in, so exceptions, thread cancellation and
//! backtraces pass through the copy's frames as through the original's; a function with
//! exception tables gets tables of its own for the copy (`code::lsda`). The same copy
//! can go behind a recording's hook instead (`install_behind_hook`, the live view's
//! annotated code). Preparing and building the copy is `prepared`.

mod prepared;

use super::patch_protocol::{self, Site};
use super::readiness::prepare;
use super::site_plan::{Nearby, own_code, replaced_bytes};
use super::sites::{CopyBehind, Engine, PatchRequest, PointerChecked};
use super::state::{engine, runtime};
use crate::code::entry_plan::{EntryPlan, PatchStyle};
use crate::code::function_copy;
use crate::patching::patch_protocol::Trampoline;
use crate::sys::code_memory;
use crate::sys::error::AgentError;
use crate::sys::loaded_modules;
use prepared::{CopyOptions, Counted, counter_ids};
use tendril_wire::Hook;
use tendril_wire::edges::EdgeLayout;

/// The counter index (see `prepared::counter_ids`) of the calls counter of a copy behind a
/// recording hook: past every other index a copy can have.
const CALLS_INDEX: usize = 0xffff;

/// Copies the function at `address` (`size` bytes) with counters, and the path
/// register if `count_paths`, for session `owner`, and points its entry at the copy.
/// `code_ranges` as for `patcher::patch`.
pub fn install(
    owner: u64,
    address: u64,
    size: u64,
    code_ranges: &[(u64, u64)],
    cold_parts: &[(u64, u64)],
    count_paths: bool,
) -> Result<EdgeLayout, AgentError> {
    // The loader held, then the engine, as for every patch (`patcher::patch`).
    loaded_modules::with_modules_held(|modules| {
        let mut guard = engine();
        let engine = guard.get_or_insert_with(Engine::default);
        engine.forget_unloaded(modules);
        install_copy(
            engine,
            owner,
            address,
            size,
            code_ranges,
            cold_parts,
            count_paths,
        )
    })
}

/// [`install`], with the loader and the engine held.
fn install_copy(
    engine: &mut Engine,
    owner: u64,
    address: u64,
    size: u64,
    code_ranges: &[(u64, u64)],
    cold_parts: &[(u64, u64)],
    count_paths: bool,
) -> Result<EdgeLayout, AgentError> {
    prepare()?;
    if let Some(reason) = own_code(owner, address, size) {
        return Err(AgentError::Refused(reason.into()));
    }
    if engine.sites.contains_key(&address) {
        return Err(AgentError::Refused(
            "it is instrumented already (by another tendril command); stop that one first".into(),
        ));
    }
    let options = CopyOptions {
        counters: true,
        count_paths,
        calls_counter: None,
        pointer_checks: false,
    };
    let plan_code = Counted::read(engine, address, size, cold_parts, options)?;
    let request = PatchRequest {
        address,
        size,
        kind: Hook::Count,
    };
    let nearby = Nearby::new(code_ranges);
    let pads_taken: Vec<u64> = engine
        .sites
        .values()
        .filter_map(|site| site.pad.as_ref().map(|pad| pad.address))
        .collect();
    // No call thunk: the copy runs the whole function, from its first instruction.
    let (plan, pad_address) =
        engine.choose_plan(&request, &plan_code.code, &nearby, &pads_taken, false)?;
    debug_assert_ne!(plan.style, PatchStyle::CallThunk);
    let calls_id = engine.id_for(address)?;
    let built = plan_code.build(
        engine,
        address,
        calls_id,
        Hook::Count,
        &plan,
        pad_address.is_some(),
    )?;
    let patch_at = address + plan.patch_offset as u64;
    let (original, pad) = replaced_bytes(&plan_code.code, &plan, pad_address)?;
    let site = Site {
        patch_at,
        original,
        pad,
        trampoline: built.trampoline(&plan_code.code, plan),
        owner,
        id: calls_id,
        kind: Hook::Count,
        internal: false,
        recorded: [None, None],
    };
    let layout = plan_code.layout(calls_id);
    let runtime = runtime()?;
    for id in layout.counters() {
        (runtime.before_patching)(id);
    }
    let mut batch = [site];
    patch_protocol::install(&mut batch)?;
    let [site] = batch;
    engine.register_installed(vec![site]);
    Ok(layout)
}

/// Puts a copy of the function at `address`, with counters for the calls made inside
/// the recording's call graph (and the path register if `count_paths`), behind the
/// recording hook session `owner` has on it: the hook runs as before, then the copy
/// instead of the original. The live view's annotated code (issue 18) reads these
/// counters while the recording goes on; a restore of the function takes out hook and
/// copy together. Answers the layout and the function's original bytes.
pub fn install_behind_hook(
    owner: u64,
    address: u64,
    size: u64,
    cold_parts: &[(u64, u64)],
    count_paths: bool,
) -> Result<(EdgeLayout, Vec<u8>), AgentError> {
    loaded_modules::with_modules_held(|modules| {
        let mut guard = engine();
        let engine = guard.get_or_insert_with(Engine::default);
        engine.forget_unloaded(modules);
        copy_behind_hook(engine, owner, address, size, cold_parts, count_paths)
    })
}

/// [`install_behind_hook`], with the loader and the engine held.
fn copy_behind_hook(
    engine: &mut Engine,
    owner: u64,
    address: u64,
    size: u64,
    cold_parts: &[(u64, u64)],
    count_paths: bool,
) -> Result<(EdgeLayout, Vec<u8>), AgentError> {
    prepare()?;
    let Some(site) = engine.sites.get(&address) else {
        return Err(AgentError::Refused(
            "it is not instrumented by this recording (any more)".into(),
        ));
    };
    if site.owner != owner || !site.kind.records() {
        return Err(AgentError::Refused(
            "it is not instrumented by this recording; only a recorded function's code \
             can be shown"
                .into(),
        ));
    }
    if site.kind == Hook::RecordRootOutermost {
        return Err(AgentError::Refused(
            "its calls inside the graph are counted, not timed (adaptive timing): record \
             with --time-all to see its code with counts"
                .into(),
        ));
    }
    if site.trampoline.plan.style == PatchStyle::CallThunk {
        return Err(AgentError::Refused(
            "its entry is a call, which its hook replaced in place; a copy needs a jump there"
                .into(),
        ));
    }
    let runtime = runtime()?;
    // Asked again (the view opened again): the same copy, its counts from zero.
    if let Some(copy) = engine.copies_behind.get(&address)
        && copy.hook == site.trampoline.hook
    {
        for id in copy.layout.counters() {
            (runtime.before_patching)(id);
        }
        return Ok((copy.layout.clone(), copy.code.clone()));
    }
    let (kind, id, plan, has_pad) = (
        site.kind,
        site.id,
        site.trampoline.plan.clone(),
        site.pad.is_some(),
    );
    // The calls counter's key is past every counter index a copy can have.
    let calls_counter = counter_ids(engine, address, CALLS_INDEX..CALLS_INDEX + 1)?[0];
    let options = CopyOptions {
        counters: true,
        count_paths,
        calls_counter: Some(calls_counter),
        pointer_checks: matches!(engine.pointer_checked.get(&address), Some(Some(_))),
    };
    let plan_code = Counted::read(engine, address, size, cold_parts, options)?;
    let built = plan_code.build(engine, address, id, kind, &plan, has_pad)?;
    let trampoline = built.trampoline(&plan_code.code, plan);
    let layout = plan_code.layout(calls_counter);
    for id in layout.counters() {
        (runtime.before_patching)(id);
    }
    let site = engine
        .sites
        .get_mut(&address)
        .expect("the site was found above, under the same lock");
    patch_protocol::retarget(site, trampoline.hook)?;
    let hook = trampoline.hook;
    site.trampoline = trampoline;
    engine.copies_behind.insert(
        address,
        CopyBehind {
            hook,
            layout: layout.clone(),
            code: plan_code.code.clone(),
        },
    );
    Ok((layout, plan_code.code))
}

/// The trampoline of a `kind` recording hook on function `id` at `address` (`size`
/// bytes), for an entry patched as `plan` (with a pad if `has_pad`), whose body is a
/// copy of the function that checks its calls through pointers
/// (`hooks::pointer_checks`); `None` when the function makes no such call or its copy
/// cannot be made (it then runs as it is, and its calls through pointers are not
/// followed). Either answer is remembered (`Engine::pointer_checked`).
pub(super) fn pointer_checked_trampoline(
    engine: &mut Engine,
    address: u64,
    size: u64,
    id: u32,
    kind: Hook,
    plan: &EntryPlan,
    has_pad: bool,
) -> Option<Trampoline> {
    let built = build_pointer_checked(engine, address, size, id, kind, plan, has_pad);
    let remembered = built.as_ref().map(|trampoline| PointerChecked {
        size,
        body: trampoline.body,
    });
    engine.pointer_checked.insert(address, remembered);
    built
}

/// [`pointer_checked_trampoline`]'s copy.
fn build_pointer_checked(
    engine: &mut Engine,
    address: u64,
    size: u64,
    id: u32,
    kind: Hook,
    plan: &EntryPlan,
    has_pad: bool,
) -> Option<Trampoline> {
    if plan.style == PatchStyle::CallThunk {
        return None;
    }
    // Most functions make no call through a pointer: a linear decode says so before
    // the graph, the unwind rows and the exception tables are read.
    let mut code = vec![0u8; size.min(1 << 20) as usize];
    code_memory::read_code(address, &mut code).ok()?;
    engine.put_back_originals(address, &mut code);
    if !function_copy::may_branch_through_pointers(&code, address) {
        return None;
    }
    let options = CopyOptions {
        counters: false,
        count_paths: false,
        calls_counter: None,
        pointer_checks: true,
    };
    let copied = Counted::read(engine, address, size, &[], options).ok()?;
    if !copied.has_pointer_sites() {
        return None;
    }
    let built = copied
        .build(engine, address, id, kind, plan, has_pad)
        .ok()?;
    Some(built.trampoline(&copied.code, plan.clone()))
}
