//! Run and tool-call records, their states and side-effect classes.
//!
//! Invariant: states and classes are closed sets stored as TEXT; an unknown
//! stored value is a typed error, never a panic.

use crate::store::schema::str_enum;

str_enum! {
    /// Lifecycle of a run.
    pub enum RunStatus in "runs"."status" {
        Running = "running", Succeeded = "succeeded", Failed = "failed",
        WaitingForHuman = "waiting_for_human",
    }
}

str_enum! {
    /// Lifecycle of one tool call.
    pub enum ToolCallStatus in "tool_calls"."status" {
        Prepared = "prepared", Running = "running",
        Succeeded = "succeeded", Failed = "failed",
    }
}

str_enum! {
    /// What a tool does to the world.
    pub enum SideEffect in "tool_calls"."side_effect" {
        ReadOnly = "read_only",
        /// Changes local state that a replay overwrites (write a file).
        Reversible = "reversible",
        /// Leaves the process (email, payment): goes through the activity ledger.
        Irreversible = "irreversible",
    }
}

/// A tool call the loop is about to make.
#[derive(Debug, Clone, PartialEq)]
pub struct NewToolCall {
    pub id: String,
    pub run_id: String,
    pub tool_name: String,
    /// The name as the model sent it (for exact replay matching).
    pub raw_tool_name: String,
    pub input: serde_json::Value,
    pub idempotency_key: String,
    pub side_effect: SideEffect,
}

/// A ledger row.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub run_id: String,
    pub tool_name: String,
    pub raw_tool_name: String,
    pub input: serde_json::Value,
    pub idempotency_key: String,
    pub side_effect: SideEffect,
    pub status: ToolCallStatus,
    pub result: Option<serde_json::Value>,
    pub error: Option<String>,
    pub replay_attempts: u32,
}

/// Whether a replay may run ([`super::ToolCallStore::begin_replay`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayStart {
    /// Counted: this is replay number `replay_attempts`; run the tool.
    Started { replay_attempts: u32 },
    /// Not to run: the call had its `max_replays` replays (none of which
    /// answered), or its run already waits for a human.
    Parked { replay_attempts: u32 },
}

/// Why a call in flight runs again ([`super::ToolCallStore::begin_replay`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayOf {
    /// A crash caught it in flight: held back while its run waits for a
    /// human.
    Crash,
    /// A human released it (`confirm --not-delivered`): held to its own
    /// count only.
    Approval,
}

/// How a replay settled its call ([`super::ToolCallStore::record_replay`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayOutcome {
    Succeeded,
    /// Settled `failed`, on replay number `replay_attempts`.
    Failed {
        replay_attempts: u32,
    },
}

/// One failed attempt of a call (a hard failure: the tool was not reached
/// or answered with a server error), numbered from 1 across every run of
/// the call — a call resumed after a crash goes on counting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedAttempt {
    pub call_id: String,
    pub attempt: u32,
    pub error: String,
    pub at_ms: u64,
}

/// A call a hook said must wait for a human, as the activity ledger's
/// NEEDS_CONFIRMATION row shows it (see `ToolCallStore::park_for_confirmation`).
#[derive(Debug, Clone, PartialEq)]
pub struct Parked<'a> {
    pub idem_key: &'a str,
    /// The agent (the activity ledger's `task_id`, as for any tool call).
    pub task_id: &'a str,
    pub action: &'a str,
    pub payload: &'a serde_json::Value,
    /// Which hook asked, and why (the row's `error`, what `status` shows).
    pub reason: &'a str,
}
