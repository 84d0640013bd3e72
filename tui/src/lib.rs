//! tendril's terminal UI (issue 5): the process picker, the root picker and the live
//! profile views, drawn with ratatui over a view-model of its own, so they can be written
//! and tested without a target.
//!
//! The one idea: the controller owns the event loop, the terminal and the target; this
//! crate owns what is on screen. The controller feeds [`App`] data and acts on the
//! [`Action`]s it returns:
//!
//! ```no_run
//! use std::time::Duration;
//! use tendril_tui::crossterm::event;
//! use tendril_tui::{Action, App, ProfileSnapshot, Screen, TerminalGuard};
//!
//! # fn main() -> std::io::Result<()> {
//! let mut guard = TerminalGuard::enter()?; // restores the terminal on drop and on panic
//! let mut app = App::new(Screen::Live(ProfileSnapshot::default()));
//! loop {
//!     guard.terminal().draw(|frame| app.draw(frame))?;
//!     if event::poll(Duration::from_millis(100))? {
//!         match app.handle_event(event::read()?) {
//!             Some(Action::Quit) => break,
//!             Some(_other) => { /* pause, save, detach… then report with app.set_message */ }
//!             None => {}
//!         }
//!     }
//!     // app.update_snapshot(controller.snapshot()) whenever new data is available
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Rendering is cheap per frame: the call tree is flattened only through expanded nodes,
//! once per snapshot, and only the rows on screen are drawn.

#![forbid(unsafe_code)]

mod action;
mod app;
mod code_view;
mod columns;
mod cursor;
mod format;
mod fuzzy;
mod help;
mod hotspots;
mod live;
mod live_draw;
mod model;
pub mod printable;
mod process_picker;
mod root_picker;
mod status_bar;
mod terminal;
mod theme;
mod top;
mod tree_view;

pub use action::Action;
pub use app::{App, Screen, ScreenKind};
pub use code_view::{CodeLine, CodeSnapshot};
pub use format::grouped;
pub use live::{LiveTab, TreeSource};
pub use model::{
    FunctionEntry, ProcessEntry, ProfileSnapshot, SamplingStatus, Status, ThreadSummary, TreeNode,
};
pub use terminal::{CrosstermTerminal, TerminalGuard};
pub use top::{TopAction, TopRow, TopSnapshot, TopSort, TopView};
pub use tree_view::SortKey;

/// The ratatui version the UI is built with (e.g. for `TestBackend` in the controller's tests).
pub use ratatui;
/// The crossterm version the UI is built with, for the controller's event loop.
pub use ratatui::crossterm;
