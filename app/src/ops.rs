//! The control API's operations are the worker core's
//! ([`durable_agent::worker::ops`]); this crate adds its read-only views
//! ([`crate::inspect::View`]) to the request type.
//!
//! Invariant: no operation is implemented here; one implementation serves
//! `serve`, the simulation and the commands that run on the root directly.

pub use durable_agent::worker::ops::{
    apply, begin, claim_next, describe_fired, end_api_turn, resolve, settle_fire, status, Begun, Claimed,
    ConfirmRequest, CreateAgent, EmitRequest, FireResult, MessageRequest, OpError, PreparedTurn, StartedTurn,
    TurnRequest, MAX_TRIGGER_DELAY_MS,
};

/// One API operation, the read-only views included.
pub type Request = durable_agent::worker::ops::Request<crate::inspect::View>;
