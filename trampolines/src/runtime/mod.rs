//! Layer 5, the runtime: what runs on the target's threads and keeps the data.
//!
//! Per-thread state and its registration (`thread_state`), shadow stacks of return
//! addresses (`shadow`), event rings (`recording`), Scheme B discovery (`discovery`, made by a raised thread of the agent's when it can: `discoverer`; calls through pointers met by the copies' checks: `pointer_targets`),
//! calibration of the hooks' cost (`calibration`, at the start, and `in_situ`, on the
//! target's threads while the recording runs), counters (`counting`), taking return
//! hooks out of live frames (`retire`, `lingering`) and the agent's own threads
//! (`threads`), and room made ahead for a recording's threads (`room_ahead`); the layer's statics are `state`. It uses the patch protocol below it and is driven by `control` above.

pub mod calibration;
pub mod counting;
pub mod discoverer;
pub mod discovery;
mod discovery_turn;
pub mod in_situ;
pub mod lingering;
pub mod pointer_targets;
pub mod recording;
pub mod retire;
pub mod ring_memory;
pub mod ring_segments;
pub mod room_ahead;
pub mod shadow;
mod state;
mod table_lookup;
pub mod thread_state;
pub mod threads;
pub mod untimed_table;

use crate::hooks::stubs::{
    self, BacktraceStandIn, Handlers, RECORD_HOOK_PUSHES, RETURN_HOOK_PUSHES,
};
use crate::patching::{patcher, stop_world};

/// Hands the layers below the runtime's answers: the stubs' slow-path handlers, the
/// patch engine's callbacks and the stop signal's pause observer. Call once, before
/// the first patch (the control thread does, as it starts).
pub fn install() {
    stubs::install_handlers(Handlers {
        register_thread: thread_state::register_current_thread,
        returns_before_push: shadow::before_push::<RETURN_HOOK_PUSHES>,
        returns_before_push_after_call: shadow::before_push::<{ RETURN_HOOK_PUSHES + 1 }>,
        returns_mismatched_return: shadow::mismatched_return::<RETURN_HOOK_PUSHES>,
        record_before_push: shadow::before_push::<RECORD_HOOK_PUSHES>,
        record_before_push_after_call: shadow::before_push::<{ RECORD_HOOK_PUSHES + 1 }>,
        record_mismatched_return: shadow::mismatched_return::<RECORD_HOOK_PUSHES>,
        ring_space: in_situ::ring_space,
        untimed_miss: untimed_table::untimed_miss,
        discover: discovery::discover,
        pointer_target: pointer_targets::target_met,
        invoked_table: recording::invoked_table,
        generation_word: recording::generation_word,
        unwinder_starts: shadow::unwinder_starts,
        exception_caught: shadow::exception_caught,
        backtrace: BacktraceStandIn {
            replacement: shadow::backtrace_replacement as *const () as u64,
            body: &state::STATE.backtrace_body,
        },
    });
    patcher::install_runtime(patcher::RuntimeHooks {
        prepare: thread_state::prepare,
        before_patching,
        function_registered: recording::register_function,
        internal_trampoline_built: retire::note_internal_trampoline,
        retire_exits: |attempts| retire::retire_all_exits(attempts).map_err(Into::into),
    });
    stop_world::set_park_observer(recording::adjust_after_park);
}

/// Just before function `id`'s hooks go in: its counters start from zero, and a root
/// discovered ahead is marked invoked.
fn before_patching(id: u32) {
    counting::reset_before_patching(id);
    discovery_turn::forget_nothing_to_discover(id);
    discovery::mark_if_discovered_ahead(id);
}
