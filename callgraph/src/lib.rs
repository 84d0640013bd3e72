//! What a function's machine code says about its calls and its paths, read the same way
//! by the tendril controller and by its agent.
//!
//! Two analyses both sides run on the same bytes and must agree on: [`callees`], the
//! functions a body calls or tail-jumps to (Scheme A reads them in the controller,
//! Scheme B's discovery in the agent); and [`paths`], the Ball–Larus numbering of a
//! function's acyclic paths (the agent instruments a copy with it, the controller
//! decodes the counted numbers with it). Nothing here crosses the socket or the rings:
//! that is `tendril-wire`.

pub mod callees;
pub mod paths;
