//! The UI state machine: which screen is shown, what keys do there, and how it is drawn.
//!
//! The one idea: the controller owns the loop and the target; [`App`] owns only what is on
//! screen. The controller feeds it data ([`App::update_snapshot`], [`App::set_processes`],
//! [`App::show_root_picker`], [`App::set_message`]) and carries out the [`Action`]s that
//! [`App::handle_event`] returns; everything else (browsing, filtering, help) stays here.

use ratatui::Frame;
use ratatui::crossterm::event::{Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use crate::action::Action;
use crate::help::{self, KeyHelp, Needs};
use crate::live::LiveView;
use crate::live_draw;
use crate::model::{FunctionEntry, ProcessEntry, ProfileSnapshot};
use crate::process_picker::ProcessPicker;
use crate::root_picker::{RootPicker, RootPickerOutcome};
use crate::status_bar::status_lines;
use crate::theme;

/// The screen an [`App`] starts on, with the data it needs.
#[derive(Debug, Clone)]
pub enum Screen {
    /// Choose a running process to attach to.
    ProcessPicker(Vec<ProcessEntry>),
    /// Attached: choose the root functions among these.
    RootPicker(Vec<FunctionEntry>),
    /// Profiling a live target (roots already chosen, e.g. on the command line).
    Live(ProfileSnapshot),
    /// Browsing a saved profile (`tendril view FILE`): no key acts on a target.
    ReadOnly(ProfileSnapshot),
}

/// Which screen is showing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScreenKind {
    ProcessPicker,
    RootPicker,
    Live,
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
    message: Option<String>,
    help_visible: bool,
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
            message: None,
            help_visible: false,
        };
        match screen {
            Screen::ProcessPicker(processes) => app.process_picker.set_processes(processes),
            Screen::RootPicker(functions) => app.show_root_picker(functions),
            Screen::Live(snapshot) => app.show_live(snapshot),
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

    /// The message shown in the footer, if any.
    pub fn message(&self) -> Option<&str> {
        self.message.as_deref()
    }

    /// Replaces the profile data shown; expansion, selection and scroll position are kept.
    /// A new `status.message` (different from the previous snapshot's) becomes the footer
    /// message.
    pub fn update_snapshot(&mut self, snapshot: ProfileSnapshot) {
        if snapshot.status.message.is_some()
            && snapshot.status.message != self.snapshot.status.message
        {
            self.message = snapshot.status.message.clone();
        }
        self.snapshot = snapshot;
        self.session_started = true;
        self.live.data_changed();
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
        self.session_started = false;
        self.screen = ScreenKind::ProcessPicker;
        self.help_visible = false;
    }

    /// Supplies the function list the root picker asked for with [`Action::LoadFunctions`].
    pub fn set_functions(&mut self, functions: Vec<FunctionEntry>) {
        self.root_picker
            .set_functions(functions, &self.snapshot.status.roots);
    }

    /// Shows `message` in the footer (e.g. the result of an action, or an error).
    pub fn set_message(&mut self, message: impl Into<String>) {
        self.message = Some(message.into());
    }

    fn detached(&self) -> bool {
        self.snapshot.status.detached
    }

    /// Handles one terminal event; returns what the controller must do, if anything.
    pub fn handle_event(&mut self, event: Event) -> Option<Action> {
        match event {
            Event::Key(key) if key.kind != KeyEventKind::Release => self.handle_key(key),
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
            if !(view_key && self.screen == ScreenKind::Live) {
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
        }
    }

    fn root_picker_key(&mut self, key: KeyEvent) -> Option<Action> {
        match self.root_picker.handle_key(key) {
            RootPickerOutcome::Stay => None,
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
        if help::available(needs, self.read_only, self.detached()) {
            return true;
        }
        let why = if self.read_only {
            "read-only: this is a saved profile, there is no target to act on"
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
                self.screen = ScreenKind::RootPicker;
                if !self.root_picker.has_functions() {
                    return Some(Action::LoadFunctions);
                }
                self.root_picker.open(&self.snapshot.status.roots);
            }
            KeyCode::Char('p' | 'X' | 'w' | 't' | 'd' | 'r') => {}
            KeyCode::Esc => self.message = None,
            _ => {
                self.live.handle_key(key, &self.snapshot);
            }
        }
        None
    }

    fn keys(&self) -> &'static [KeyHelp] {
        match self.screen {
            ScreenKind::ProcessPicker => help::PROCESS_PICKER_KEYS,
            ScreenKind::RootPicker => help::ROOT_PICKER_KEYS,
            ScreenKind::Live => help::LIVE_KEYS,
        }
    }

    /// Draws the whole UI into `frame` (any size, down to nothing at all).
    pub fn draw(&mut self, frame: &mut Frame) {
        let area = frame.area();
        if area.is_empty() {
            return;
        }
        let footer_height = u16::from(area.height >= 2);
        let shows_status = self.screen == ScreenKind::Live
            || (self.screen == ScreenKind::RootPicker && self.session_started);
        let status_height = match area.height {
            _ if !shows_status => 0,
            0..=4 => 0,
            5..=9 => 1,
            _ => 2,
        };
        let (rest, footer) = split_bottom(area, footer_height);
        let (body, status) = split_bottom(rest, status_height);
        match self.screen {
            ScreenKind::ProcessPicker => self.process_picker.draw(frame, body),
            ScreenKind::RootPicker => self.root_picker.draw(frame, body),
            ScreenKind::Live => {
                let tabs_height = u16::from(body.height >= 3);
                let (tabs, tree) = split_top(body, tabs_height);
                live_draw::draw_tabs(&self.live, &self.snapshot, frame, tabs);
                live_draw::draw_body(&mut self.live, &self.snapshot, self.read_only, frame, tree);
            }
        }
        if status_height > 0 {
            let lines = status_lines(&self.snapshot.status, self.read_only);
            let shown: Vec<Line> = lines.into_iter().take(status_height as usize).collect();
            frame.render_widget(Paragraph::new(shown).style(theme::status_bar()), status);
        }
        if footer_height > 0 {
            let width = footer.width as usize;
            let line = match &self.message {
                // The message first; the most important hints that fit follow it.
                Some(message) => {
                    let used = message.chars().count() + 3;
                    let hints = help::hints(
                        self.keys(),
                        self.read_only,
                        self.detached(),
                        width.saturating_sub(used),
                    );
                    let mut spans = vec![Span::styled(format!(" {message} "), theme::strong())];
                    spans.push(theme::dim("│"));
                    spans.extend(hints.spans);
                    Line::from(spans)
                }
                None => help::hints(self.keys(), self.read_only, self.detached(), width),
            };
            frame.render_widget(Paragraph::new(line), footer);
        }
        if self.help_visible {
            help::draw_overlay(self.keys(), self.read_only, self.detached(), frame, area);
        }
    }
}

/// `area` split into everything above the bottom `height` rows, and those rows.
fn split_bottom(area: Rect, height: u16) -> (Rect, Rect) {
    let height = height.min(area.height);
    let top = Rect {
        height: area.height - height,
        ..area
    };
    let bottom = Rect {
        y: area.y + area.height - height,
        height,
        ..area
    };
    (top, bottom)
}

/// `area` split into its top `height` rows and everything below them.
fn split_top(area: Rect, height: u16) -> (Rect, Rect) {
    let height = height.min(area.height);
    let top = Rect { height, ..area };
    let bottom = Rect {
        y: area.y + height,
        height: area.height - height,
        ..area
    };
    (top, bottom)
}
