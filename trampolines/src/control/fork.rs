//! What the agent does around a `fork()` of the target: the forking thread records
//! nothing while fork runs, and the child starts clean.

use crate::patching::patch_protocol;
use crate::runtime::{discoverer, recording, thread_state};
use crate::sys::frame_registrar;

/// A forked child inherits the mapped agent and the patched code, but not the agent's
/// threads and not the controller's session: it gets its original code back at once
/// (it has a single thread, so no stop is needed), lets go of the recording's shared
/// rings (they are its parent's), and a later attach may start a fresh control thread
/// in it. The forking thread's hooks stepped aside from the prepare handler on (see
/// [`before_fork`]), so nothing the child ran before this handler reached the rings;
/// they work again once the rings are gone (frames opened before the fork return
/// through their exits and record nothing).
extern "C" fn after_fork_in_child() {
    patch_protocol::restore_all_in_forked_child();
    recording::forget_in_forked_child();
    discoverer::forget_in_forked_child();
    frame_registrar::forget_in_forked_child();
    super::forget_control_in_forked_child();
    thread_state::release_after_fork();
}

/// Prepare handler: the forking thread records nothing until the parent or child
/// handler runs. Registered last, it runs before every other prepare handler.
extern "C" fn before_fork() {
    thread_state::hold_for_fork();
}

/// Parent handler: the forking thread's hooks work as before.
extern "C" fn after_fork_in_parent() {
    thread_state::release_after_fork();
}

/// Registers the fork handlers once, from the constructor path.
pub fn register_fork_handler() {
    // SAFETY: pthread_atfork only records the function pointers. The handlers only
    // touch the calling thread's own state and the agent's atomics, with no lock and
    // no allocation, as handlers around fork must.
    unsafe {
        libc::pthread_atfork(
            Some(before_fork),
            Some(after_fork_in_parent),
            Some(after_fork_in_child),
        );
    }
}
