//! [`StoreCallLog`]: the agent loop's provider calls into the usage store
//! (seed 000): one `token_usage` row per completed call that reported its
//! usage, with the model it was made with, and one `errors` row per failed
//! call with its attempt number — numbered by the store from the rows of
//! the same call (session, turn, round), so a call retried after a restart
//! goes on counting (never a second attempt 0).
//!
//! Invariant: a row is committed before the loop goes on with the call's
//! result, and a failed commit is returned (the runtime poisons itself: a
//! persistence failure is never swallowed). Rows are append-only: a round
//! re-asked after a crash leaves a second usage row — that call was paid
//! twice.

use std::sync::{Arc, Mutex};

use crate::runtime::{CallLog, CallSite, Usage};
use crate::sqlite::Db;
use crate::store::usage::{TurnRef, UsageStore};

use super::LogicalClock;

/// The [`CallLog`] [`super::System::boot`] gives the runtime.
#[derive(Debug, Clone)]
pub struct StoreCallLog {
    pub db: Arc<Mutex<Db>>,
    pub clock: Arc<dyn LogicalClock>,
    /// The provider's model (`Provider::model`), recorded on every usage
    /// row: one provider per system, so every call is made with it.
    pub model: String,
}

impl StoreCallLog {
    fn with<T>(&self, f: impl FnOnce(&Db) -> T) -> T {
        f(&super::lock_db(&self.db))
    }
}

fn turn_ref(at: &CallSite<'_>) -> TurnRef {
    TurnRef {
        session_id: at.session.to_string(),
        agent_id: at.agent.to_string(),
        turn: at.turn,
    }
}

impl CallLog for StoreCallLog {
    fn completed(&self, at: &CallSite<'_>, usage: Option<Usage>) -> Result<(), String> {
        let Some(u) = usage else { return Ok(()) };
        let now = self.clock.now_ms();
        self.with(|db| {
            UsageStore
                .persist_token_usage(
                    db.conn(),
                    &turn_ref(at),
                    &self.model,
                    u.input_tokens,
                    u.output_tokens,
                    now,
                )
                .map_err(|e| e.to_string())
        })
    }

    fn failed(&self, at: &CallSite<'_>, error: &str) -> Result<u32, String> {
        let now = self.clock.now_ms();
        let context = format!("llm_complete round {}", at.round);
        self.with(|db| {
            UsageStore
                .persist_failed_attempt(db.conn(), &turn_ref(at), &context, error, now)
                .map_err(|e| e.to_string())
        })
    }
}
