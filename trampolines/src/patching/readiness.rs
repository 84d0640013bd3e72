//! What the stubs and the patch protocol rely on, set up once before the first patch
//! (the runtime's shared state, the agent's code ranges, the slow call, writable code,
//! the stop signal and the thread tracer).

use crate::hooks::slow_call;
use crate::patching::state::runtime;
use crate::patching::stop_world;
use crate::sys::code_memory;
use crate::sys::error::AgentError;

/// Everything the stubs and the protocol rely on, set up before the first patch.
pub(super) fn prepare() -> Result<(), AgentError> {
    (runtime()?.prepare)()?;
    // Computed now, so signal handlers can ask without allocating.
    crate::sys::own_code::is_agent_code(0);
    slow_call::prepare();
    code_memory::prepare()?;
    stop_world::install()?;
    crate::sys::thread_tracer::prepare()?;
    Ok(())
}
