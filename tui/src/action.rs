//! What the UI asks the controller to do.
//!
//! The one idea: the UI never touches the target. Keys that need the profiler return an
//! [`Action`] from [`crate::App::handle_event`]; the controller carries it out and reports
//! back through the next snapshot (or [`crate::App::set_message`]).

use crate::model::FunctionEntry;

/// A request from the UI to the controller.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Attach to this pid (process picker, Enter). On success the controller calls
    /// [`crate::App::show_root_picker`]; on failure [`crate::App::set_message`].
    Attach(u32),
    /// Re-read the process list and pass it to [`crate::App::set_processes`] (Ctrl-R).
    RefreshProcesses,
    /// The root picker opened without a function list: pass one to
    /// [`crate::App::set_functions`].
    LoadFunctions,
    /// Profile exactly these functions as roots, replacing the current ones. The UI has
    /// switched to the live view and waits for snapshots.
    SetRoots(Vec<FunctionEntry>),
    /// Instrument the function a sampled node or hot spot names (Enter in the Sampled
    /// view) as the only root, by its sampled name and module (`module+0xOFFSET` for
    /// stripped code). The UI has switched to the live view; if the function cannot be
    /// instrumented, the controller says why and may call
    /// [`crate::App::show_sampled`] to go back. `address`, when the samples have it,
    /// picks one of two functions that share a name and module.
    RootFromSamples {
        name: String,
        module: String,
        address: Option<u64>,
    },
    /// Stop collecting events: the target's code is restored (it runs its own code
    /// again) and the roots are kept for [`Action::Resume`]; the data stays browsable.
    Pause,
    /// Collect again after [`Action::Pause`].
    Resume,
    /// Discard the collected data and start counting from zero.
    Reset,
    /// Write the current profile to a file and report where in the status message.
    Save,
    /// Write the sampled profile (the Sampled view's tree) to a file, likewise.
    SaveSampled,
    /// Keep the raw enter and exit events of the next second as a timeline (saved with
    /// the profile, for the chrome and speedscope exports).
    Trace,
    /// Show this function's annotated code with exact block, branch and path counts,
    /// counted live (`e` on a node): the controller sends [`crate::App::update_code`]
    /// a few times a second, or [`crate::App::close_code`] with the reason it cannot.
    /// The function is named by its entry address where known (two `static` functions
    /// may share a name and module), else by name and module.
    ShowCode {
        name: String,
        module: String,
        address: Option<u64>,
    },
    /// The annotated code was left (Esc): stop reading its counts.
    CloseCode,
    /// Restore the target's code and stop collecting; the UI stays to browse the data.
    Detach,
    /// Leave the UI (the controller detaches first if still attached).
    Quit,
}
