//! [`OpError`]: what an operation's failure means to its caller — the HTTP
//! status that carries it and whether the system may still be used.
//!
//! Invariant: every error whose outcome may have committed (a failed
//! SQLite call, an unknown runtime outcome, a failed schedules replace) is
//! [`OpError::UnknownOutcome`], which is fatal: the caller stops and boots
//! again.

use crate::runtime::{RuntimeError, TreeError};
use crate::store::StoreError;
use serde_json::{json, Value};

use super::super::schedule::ScheduleError;
use super::super::INTERRUPTED;

#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// The turn failed and nothing of it was acknowledged (provider error,
    /// too many tool rounds); it can be asked again.
    #[error("{0}")]
    TurnFailed(String),
    #[error("stores: {0}")]
    Store(StoreError),
    /// Unknown outcome: stop and boot again.
    #[error("{0}; outcome unknown — restart to recover")]
    UnknownOutcome(String),
    /// The daemon is stopping (SIGINT/SIGTERM): the turn was abandoned at
    /// a provider call, nothing of it acknowledged; the same work id
    /// resumes it after the restart.
    #[error("the daemon is stopping; the turn was not finished and will resume (retry the same work_id after the restart): {0}")]
    Interrupted(String),
    /// A turn that stopped before it completed (blocked on a human, or
    /// failed): `error`, with what the turn did before it stopped
    /// (`details`: its calls and the keys awaiting confirmation), which
    /// the answer's body carries next to `error`.
    #[error("{error}")]
    Stopped { error: Box<OpError>, details: Value },
}

impl OpError {
    /// The HTTP status that carries it.
    pub fn http_status(&self) -> u16 {
        match self {
            OpError::BadRequest(_) => 400,
            OpError::NotFound(_) => 404,
            OpError::Conflict(_) => 409,
            OpError::TurnFailed(_) => 502,
            OpError::Store(_) => 500,
            OpError::UnknownOutcome(_) | OpError::Interrupted(_) => 503,
            OpError::Stopped { error, .. } => error.http_status(),
        }
    }

    /// The system must not be used any more.
    pub fn is_fatal(&self) -> bool {
        match self {
            OpError::UnknownOutcome(_) => true,
            OpError::Stopped { error, .. } => error.is_fatal(),
            _ => false,
        }
    }

    /// The JSON body of the error answer: `{"error": "..."}`, and a
    /// stopped turn's details next to it.
    pub fn body(&self) -> Value {
        let mut body = json!({"error": self.to_string()});
        if let (OpError::Stopped { details, .. }, Some(map)) = (self, body.as_object_mut()) {
            if let Some(details) = details.as_object() {
                for (k, v) in details {
                    map.insert(k.clone(), v.clone());
                }
            }
        }
        body
    }
}

impl From<StoreError> for OpError {
    fn from(e: StoreError) -> Self {
        match e {
            // A failed SQLite call may have committed: unknown.
            StoreError::Sqlite { .. } | StoreError::Migrate { .. } => OpError::UnknownOutcome(e.to_string()),
            other => OpError::Store(other),
        }
    }
}

impl From<RuntimeError> for OpError {
    fn from(e: RuntimeError) -> Self {
        match e {
            e if e.is_unknown_outcome() || matches!(e, RuntimeError::Poisoned { .. }) => {
                OpError::UnknownOutcome(e.to_string())
            }
            RuntimeError::UnknownAgent(_) => OpError::NotFound(e.to_string()),
            RuntimeError::Tree(TreeError::HasChildren { .. })
            | RuntimeError::TurnInFlight(_)
            | RuntimeError::SlotsBusy { .. }
            | RuntimeError::NeedsConfirmation { .. } => OpError::Conflict(e.to_string()),
            RuntimeError::Provider { ref source, .. } if source.0 == INTERRUPTED => {
                OpError::Interrupted(e.to_string())
            }
            RuntimeError::Provider { .. } | RuntimeError::TooManyToolRounds { .. } => {
                OpError::TurnFailed(e.to_string())
            }
            other => OpError::UnknownOutcome(other.to_string()),
        }
    }
}

impl From<ScheduleError> for OpError {
    fn from(e: ScheduleError) -> Self {
        match e {
            ScheduleError::Invalid(_) => OpError::BadRequest(e.to_string()),
            ScheduleError::Conflict(_) => OpError::Conflict(e.to_string()),
            ScheduleError::NotFound(_) => OpError::NotFound(e.to_string()),
            // A failed replace may have renamed: unknown until reloaded.
            ScheduleError::Io { .. }
            | ScheduleError::Corrupt { .. }
            | ScheduleError::FutureVersion { .. }
            | ScheduleError::InvalidFile { .. } => OpError::UnknownOutcome(e.to_string()),
        }
    }
}
