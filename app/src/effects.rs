//! Every call of a turn, from the ledgers: the worker core's
//! ([`durable_agent::worker::effects`]).
//!
//! Invariant: defined once, in the core; re-exported for the CLI.

pub use durable_agent::worker::effects::*;
