//! Layer 4, the patch protocol: putting hooks into live code and taking them out.
//!
//! Stopping the world and moving threads' PCs (`stop_world`, and `signal_frames` for
//! resume points saved in signal frames), writing entry jumps safely while other
//! threads run (`patch_protocol`), checking what a controller
//! asks to patch (`patch_targets`), and the engine's bookkeeping of what is patched by
//! whom (`patcher`, which prepares each function's patch with `site_plan`, its data in
//! `sites`), hooks in front of entries the patcher could not patch, for the checks of
//! calls through pointers (`entry_stubs`), and switching a recorded function's hook
//! between timed and untimed (`timing`). The layer's statics are `state`. The runtime above installs its callbacks here (`patcher::install`);
//! nothing here imports it.

pub mod entry_stubs;
pub mod function_copies;
pub mod patch_protocol;
pub mod patch_targets;
pub mod patcher;
mod readiness;
pub mod signal_frames;
mod site_plan;
mod sites;
mod state;
pub mod stop_world;
pub mod timing;
