//! The UI state machine: which screen is shown, what keys do there, and how it is drawn.
//!
//! The one idea: the controller owns the loop and the target; [`App`] owns only what is on
//! screen. The controller feeds it data ([`App::update_snapshot`], [`App::set_processes`],
//! [`App::show_root_picker`], [`App::update_sampled`], [`App::set_message`]) and carries
//! out the [`Action`]s that [`App::handle_event`] returns; everything else (browsing,
//! filtering, help) stays here.
//!
//! Two trees can be on hand: the sampled one (the Sampled view, built from the outside
//! after a process is picked) and the instrumented one (the live view). Each has its own
//! browsing state, so switching between them with `S` keeps each where it was.

use ratatui::crossterm::event::{Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

mod code_screen;
mod layout;
mod message_line;

use crate::action::Action;
use crate::code_view::CodeView;
use crate::help::{self, Context, KeyHelp, Needs};
use crate::live::LiveView;
use crate::model::{FunctionEntry, ProcessEntry, ProfileSnapshot};
use crate::printable::{already_printed, printable};
use crate::process_picker::ProcessPicker;
use crate::root_picker::{RootPicker, RootPickerOutcome};
use message_line::MessageLine;
use std::time::Instant;

/// The screen an [`App`] starts on, with the data it needs.
#[derive(Debug, Clone)]
pub enum Screen {
    /// Choose a running process to attach to.
    ProcessPicker(Vec<ProcessEntry>),
    /// Attached: choose the root functions among these.
    RootPicker(Vec<FunctionEntry>),
    /// Profiling a live target (roots already chosen, e.g. on the command line).
    Live(ProfileSnapshot),
    /// Sampling a target from the outside, before any root is instrumented (a sampled
    /// snapshot: its status has `sampling`).
    Sampled(ProfileSnapshot),
    /// Browsing a saved profile (`tendril view FILE`): no key acts on a target.
    ReadOnly(ProfileSnapshot),
}

/// Which screen is showing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScreenKind {
    ProcessPicker,
    RootPicker,
    Live,
    /// The sampled tree: Enter instruments the selected function.
    Sampled,
    /// One function's annotated code, counted live (`e` in the live view).
    Code,
}

/// The terminal UI's state. See the crate documentation for the controller's loop.
#[derive(Debug)]
pub struct App {
    screen: ScreenKind,
    read_only: bool,
    /// Roots were chosen (or data arrived): the live view exists and Esc can return to it.
    session_started: bool,
    process_picker: ProcessPicker,
    root_picker: RootPicker,
    live: LiveView,
    snapshot: ProfileSnapshot,
    /// The sampled tree and its browsing state (empty until sampling began).
    sampled: ProfileSnapshot,
    sampled_view: LiveView,
    /// The sampled tree's hottest path was opened, or a key pressed there first.
    sampled_opened: bool,
    /// Where Esc in the root picker goes back to.
    picker_from: Option<ScreenKind>,
    message: MessageLine,
    help_visible: bool,
    /// The live view shows on-CPU times (`C`) instead of wall-clock times.
    shows_cpu_time: bool,
    code: CodeView,
}

impl App {
    pub fn new(screen: Screen) -> Self {
        let mut app = App {
            screen: ScreenKind::ProcessPicker,
            read_only: false,
            session_started: false,
            process_picker: ProcessPicker::default(),
            root_picker: RootPicker::default(),
            live: LiveView::default(),
            snapshot: ProfileSnapshot::default(),
            sampled: ProfileSnapshot::default(),
            sampled_view: LiveView::default(),
            sampled_opened: false,
            picker_from: None,
            message: MessageLine::default(),
            help_visible: false,
            shows_cpu_time: false,
            code: CodeView::default(),
        };
        match screen {
            Screen::ProcessPicker(processes) => app.process_picker.set_processes(processes),
            Screen::RootPicker(functions) => app.show_root_picker(functions),
            Screen::Live(snapshot) => app.show_live(snapshot),
            Screen::Sampled(snapshot) => {
                app.update_sampled(snapshot);
                app.show_sampled();
            }
            Screen::ReadOnly(snapshot) => {
                app.read_only = true;
                app.show_live(snapshot);
            }
        }
        app
    }

    fn show_live(&mut self, snapshot: ProfileSnapshot) {
        self.update_snapshot(snapshot);
        self.screen = ScreenKind::Live;
    }

    pub fn screen(&self) -> ScreenKind {
        self.screen
    }

    /// Browsing a saved profile: actions that need a target are unavailable.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    pub fn is_help_visible(&self) -> bool {
        self.help_visible
    }

    /// The latest snapshot (empty until the first one arrives).
    pub fn snapshot(&self) -> &ProfileSnapshot {
        &self.snapshot
    }

    /// The message shown in the footer, if any, as shown (escaped).
    pub fn message(&self) -> Option<&str> {
        self.message.shown()
    }

    /// A number that changes whenever the footer message changes: the controller reads
    /// it before carrying out an action, to tell whether the action answered in the
    /// footer ([`App::hold_answer_since`]).
    pub fn message_serial(&self) -> u64 {
        self.message.serial()
    }

    /// If the footer message changed since `serial`, it answers the user's key: notes
    /// that arrive in the next few seconds wait behind it instead of replacing it.
    pub fn hold_answer_since(&mut self, serial: u64) {
        if self.message.serial() != serial {
            self.message.hold(Instant::now());
        }
    }

    /// Replaces the profile data shown; expansion, selection and scroll position are kept.
    /// A new `status.message` (different from the previous snapshot's) becomes the footer
    /// message.
    pub fn update_snapshot(&mut self, snapshot: ProfileSnapshot) {
        if let Some(message) = &snapshot.status.message
            && snapshot.status.message != self.snapshot.status.message
        {
            (self.message).note(printable(message).into_owned(), Instant::now());
        }
        self.snapshot = snapshot;
        if self.shows_cpu_time && self.snapshot.has_other_clock() {
            self.snapshot.swap_clocks();
        }
        self.snapshot.status.shows_cpu_time = self.shows_cpu_time;
        self.session_started = true;
        self.live.data_changed();
    }

    /// `E`: the selected call-tree node's total with its estimated error, in the message
    /// line.
    fn show_error_estimate(&mut self) {
        let message = match self.live.selected_tree_row(&self.snapshot) {
            None => "E: select a node of the call tree (1) to see its estimated error".to_owned(),
            Some(row) => match row.error_ns {
                Some(error) => format!(
                    "{}: {} ms ± {} ms estimated error (the calibration's spread times the \
                     calls whose hooks' cost was taken out)",
                    row.name,
                    crate::format::millis(row.total_ns),
                    crate::format::millis(error),
                ),
                None => format!(
                    "{}: no error estimate (a sampled tree, or a profile from an older tendril)",
                    row.name
                ),
            },
        };
        self.set_message(message);
    }

    /// Whether the live view shows on-CPU times.
    pub fn shows_cpu_time(&self) -> bool {
        self.shows_cpu_time
    }

    /// `C`: switches the live view between wall-clock and on-CPU times, when the
    /// recording measured CPU time; otherwise says why not.
    fn toggle_clock(&mut self) {
        if !self.snapshot.has_other_clock() {
            let why = (self.snapshot.status.cpu_unmeasured.clone())
                .unwrap_or_else(|| "no on-CPU times in this profile".to_owned());
            self.set_message(why);
            return;
        }
        self.shows_cpu_time = !self.shows_cpu_time;
        self.snapshot.swap_clocks();
        self.snapshot.status.shows_cpu_time = self.shows_cpu_time;
        self.live.data_changed();
        self.set_message(if self.shows_cpu_time {
            "times are on-CPU now: waiting in system calls, on locks and for a CPU left out"
        } else {
            "times are wall-clock now: waiting included"
        });
    }

    /// Replaces the sampled tree shown in the Sampled view; its expansion, selection and
    /// scroll position are kept. The first tree with samples opens its hottest path, as
    /// if `h` had been pressed, unless a key was pressed there first.
    pub fn update_sampled(&mut self, snapshot: ProfileSnapshot) {
        self.sampled = snapshot;
        self.sampled_view.data_changed();
        if !self.sampled_opened && !self.sampled.merged.is_empty() {
            self.sampled_opened = true;
            self.sampled_view.refresh(&self.sampled);
            self.sampled_view
                .tree
                .expand_hottest_path(&self.sampled.merged);
        }
    }

    /// The sampled tree (empty if nothing was sampled).
    pub fn sampled(&self) -> &ProfileSnapshot {
        &self.sampled
    }

    /// Whether there is a sampled tree to show.
    pub fn has_sampled(&self) -> bool {
        self.sampled.status.sampling.is_some()
    }

    /// Shows the Sampled view (e.g. when sampling begins, or back from an Enter whose
    /// function cannot be instrumented).
    pub fn show_sampled(&mut self) {
        self.screen = ScreenKind::Sampled;
        self.help_visible = false;
    }

    /// Replaces the process picker's list (after [`Action::RefreshProcesses`]).
    pub fn set_processes(&mut self, processes: Vec<ProcessEntry>) {
        self.process_picker.set_processes(processes);
    }

    /// Shows the root picker over `functions` (after a successful [`Action::Attach`]).
    pub fn show_root_picker(&mut self, functions: Vec<FunctionEntry>) {
        self.root_picker
            .set_functions(functions, &self.snapshot.status.roots);
        self.root_picker.open(&self.snapshot.status.roots);
        self.open_root_picker_from(None);
    }

    fn open_root_picker_from(&mut self, from: Option<ScreenKind>) {
        self.picker_from = from;
        self.screen = ScreenKind::RootPicker;
        self.help_visible = false;
    }

    /// Starts over at the process picker with `processes` (the chosen process is gone
    /// before any root was profiled): its filter, its functions and any data shown are
    /// forgotten.
    pub fn show_process_picker(&mut self, processes: Vec<ProcessEntry>) {
        self.process_picker = ProcessPicker::default();
        self.process_picker.set_processes(processes);
        self.root_picker = RootPicker::default();
        self.live = LiveView::default();
        self.snapshot = ProfileSnapshot::default();
        self.sampled = ProfileSnapshot::default();
        self.sampled_view = LiveView::default();
        self.sampled_opened = false;
        self.picker_from = None;
        self.session_started = false;
        self.screen = ScreenKind::ProcessPicker;
        self.help_visible = false;
    }

    /// Supplies the function list the root picker asked for with [`Action::LoadFunctions`].
    pub fn set_functions(&mut self, functions: Vec<FunctionEntry>) {
        self.root_picker
            .set_functions(functions, &self.snapshot.status.roots);
    }

    /// Shows `message` in the footer (e.g. the result of an action, or an error). It may
    /// name the target's functions and files: it is kept escaped ([`printable`]).
    pub fn set_message(&mut self, message: impl Into<String>) {
        self.message.show(printable(&message.into()).into_owned());
    }

    /// Shows a line tendril wrote on stderr while the UI runs (captured) in the footer:
    /// escaped when written, it is escaped again only where still unsafe. It waits while
    /// an answer to a key holds the footer.
    pub fn show_stderr_line(&mut self, line: &str) {
        (self.message).note(already_printed(line).into_owned(), Instant::now());
    }

    fn detached(&self) -> bool {
        self.snapshot.status.detached
    }

    fn context(&self) -> Context {
        Context {
            read_only: self.read_only,
            detached: self.detached(),
            sampled: self.has_sampled(),
        }
    }

    /// Handles one terminal event; returns what the controller must do, if anything.
    pub fn handle_event(&mut self, event: Event) -> Option<Action> {
        match event {
            Event::Key(key) if key.kind != KeyEventKind::Release => {
                let serial = self.message.serial();
                let action = self.handle_key(key);
                self.hold_answer_since(serial);
                action
            }
            // Resizes need nothing: the next draw lays everything out for the new size.
            _ => None,
        }
    }

    /// Handles one key press.
    pub fn handle_key(&mut self, key: KeyEvent) -> Option<Action> {
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Some(Action::Quit);
        }
        if self.help_visible {
            // Any key closes the help; a view key (1 2 3, Tab) also switches the view,
            // so one press does what the user wanted; any other key does nothing else.
            self.help_visible = false;
            let view_key = matches!(
                key.code,
                KeyCode::Char('1' | '2' | '3') | KeyCode::Tab | KeyCode::BackTab
            );
            let browsing = matches!(self.screen, ScreenKind::Live | ScreenKind::Sampled);
            if !(view_key && browsing) {
                return None;
            }
        }
        if key.code == KeyCode::F(1) {
            self.help_visible = true;
            return None;
        }
        match self.screen {
            ScreenKind::ProcessPicker => {
                if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('r') {
                    return Some(Action::RefreshProcesses);
                }
                self.process_picker.handle_key(key)
            }
            ScreenKind::RootPicker => self.root_picker_key(key),
            ScreenKind::Live => self.live_key(key),
            ScreenKind::Sampled => self.sampled_key(key),
            ScreenKind::Code => self.code_key(key),
        }
    }

    fn root_picker_key(&mut self, key: KeyEvent) -> Option<Action> {
        match self.root_picker.handle_key(key) {
            RootPickerOutcome::Stay => None,
            RootPickerOutcome::Leave if self.picker_from == Some(ScreenKind::Sampled) => {
                self.screen = ScreenKind::Sampled;
                None
            }
            RootPickerOutcome::Leave if self.session_started => {
                self.screen = ScreenKind::Live;
                None
            }
            RootPickerOutcome::Leave => {
                self.set_message(
                    "choose a root function with Enter (Tab selects several), or quit with Ctrl-C",
                );
                None
            }
            RootPickerOutcome::Choose(roots) => {
                self.screen = ScreenKind::Live;
                self.session_started = true;
                Some(Action::SetRoots(roots))
            }
        }
    }

    /// Checks that a key needing `needs` is available; explains why not otherwise.
    fn allowed(&mut self, needs: Needs) -> bool {
        if help::available(needs, self.context()) {
            return true;
        }
        let why = if self.read_only {
            "read-only: this is a saved profile, there is no target to act on"
        } else if needs == Needs::Samples {
            "no sampled tree in this session: sampling runs when a process is picked without a root"
        } else {
            "the target is detached: the data can be browsed and saved, nothing more"
        };
        self.set_message(why);
        false
    }

    fn live_key(&mut self, key: KeyEvent) -> Option<Action> {
        if key
            .modifiers
            .intersects(KeyModifiers::CONTROL | KeyModifiers::ALT)
        {
            return None;
        }
        match key.code {
            KeyCode::Char('q') => return Some(Action::Quit),
            KeyCode::Char('?') => self.help_visible = true,
            KeyCode::Char('p') if self.allowed(Needs::Target) => {
                return Some(if self.snapshot.status.paused {
                    Action::Resume
                } else {
                    Action::Pause
                });
            }
            KeyCode::Char('X') if self.allowed(Needs::Target) => return Some(Action::Reset),
            KeyCode::Char('w') if self.allowed(Needs::Session) => return Some(Action::Save),
            KeyCode::Char('t') if self.allowed(Needs::Target) => return Some(Action::Trace),
            KeyCode::Char('d') if self.allowed(Needs::Target) => return Some(Action::Detach),
            KeyCode::Char('r') if self.allowed(Needs::Target) => {
                return self.open_root_picker(ScreenKind::Live);
            }
            KeyCode::Char('S') if self.allowed(Needs::Samples) => self.show_sampled(),
            KeyCode::Char('C') => self.toggle_clock(),
            KeyCode::Char('E') => self.show_error_estimate(),
            KeyCode::Char('e') if self.allowed(Needs::Target) => return self.open_code(),
            KeyCode::Char('p' | 'X' | 'w' | 't' | 'd' | 'r' | 'S' | 'e') => {}
            KeyCode::Esc => self.message.clear(),
            _ => {
                self.live.handle_key(key, &self.snapshot);
            }
        }
        None
    }

    /// `r`: the root picker, asking for the functions first if it has none; Esc comes
    /// back to `from`.
    fn open_root_picker(&mut self, from: ScreenKind) -> Option<Action> {
        self.open_root_picker_from(Some(from));
        if !self.root_picker.has_functions() {
            return Some(Action::LoadFunctions);
        }
        self.root_picker.open(&self.snapshot.status.roots);
        None
    }

    fn sampled_key(&mut self, key: KeyEvent) -> Option<Action> {
        if key
            .modifiers
            .intersects(KeyModifiers::CONTROL | KeyModifiers::ALT)
        {
            return None;
        }
        self.sampled_opened = true;
        match key.code {
            KeyCode::Char('q') => return Some(Action::Quit),
            KeyCode::Char('?') => self.help_visible = true,
            KeyCode::Char('r') if self.allowed(Needs::Target) => {
                return self.open_root_picker(ScreenKind::Sampled);
            }
            KeyCode::Char('S') if self.snapshot.status.roots.is_empty() => self.set_message(
                "nothing is instrumented yet: Enter instruments the selected function",
            ),
            KeyCode::Char('S') => self.screen = ScreenKind::Live,
            KeyCode::Enter if self.sampled_view.tab != crate::live::LiveTab::Threads => {
                if self.allowed(Needs::Target) {
                    return self.instrument_selected();
                }
            }
            KeyCode::Char('w') => return Some(Action::SaveSampled),
            KeyCode::Char('r') => {}
            KeyCode::Esc => self.message.clear(),
            _ => {
                self.sampled_view.handle_key(key, &self.sampled);
            }
        }
        None
    }

    /// Enter in the Sampled view: the selected function becomes the root.
    fn instrument_selected(&mut self) -> Option<Action> {
        let (name, module, address) = self.sampled_view.selected_function(&self.sampled)?;
        if name.starts_with('[') {
            self.set_message(format!(
                "{name} is not a function: choose one of its callers or callees"
            ));
            return None;
        }
        self.screen = ScreenKind::Live;
        self.session_started = true;
        Some(Action::RootFromSamples {
            name,
            module,
            address,
        })
    }

    fn keys(&self) -> &'static [KeyHelp] {
        match self.screen {
            ScreenKind::ProcessPicker => help::PROCESS_PICKER_KEYS,
            ScreenKind::RootPicker => help::ROOT_PICKER_KEYS,
            ScreenKind::Live => help::LIVE_KEYS,
            ScreenKind::Sampled => help::SAMPLED_KEYS,
            ScreenKind::Code => help::CODE_KEYS,
        }
    }
}
