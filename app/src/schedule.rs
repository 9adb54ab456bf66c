//! Recurring schedules: the worker core's ([`durable_agent::worker::schedule`]).
//!
//! Invariant: defined once, in the core; re-exported for the CLI.

pub use durable_agent::worker::schedule::*;
