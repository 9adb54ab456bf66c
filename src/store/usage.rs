//! Token usage per LLM call and errors with their retry attempt (seed 000).
//!
//! Invariant: rows are append-only; an error row carries the 0-indexed
//! attempt that failed, so a retried call leaves attempts 0, 1, … in order.

use rusqlite::{params, Connection};

use crate::store::schema::{sql, StoreError};

/// Who and when: the coordinates every usage/error row carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnRef {
    pub session_id: String,
    pub agent_id: String,
    pub turn: u64,
}

/// A stored error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredError {
    pub turn: u64,
    /// Where it happened: "llm_stream", "llm_complete", a tool name…
    pub context: String,
    pub message: String,
    /// 0-indexed retry attempt that failed.
    pub attempt: u32,
    pub created_at_ms: u64,
}

/// Token usage and error rows.
#[derive(Debug, Clone, Copy, Default)]
pub struct UsageStore;

impl UsageStore {
    /// Record one LLM call's token counts.
    pub fn persist_token_usage(
        &self,
        conn: &Connection,
        at: &TurnRef,
        input_tokens: u64,
        output_tokens: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        conn.execute(
            "INSERT INTO token_usage (session_id, agent_id, turn, input_tokens, output_tokens, \
             created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                at.session_id,
                at.agent_id,
                at.turn,
                input_tokens,
                output_tokens,
                now_ms
            ],
        )
        .map_err(sql("token usage insert"))?;
        Ok(())
    }

    /// `(SUM(input_tokens), SUM(output_tokens))` of a session.
    pub fn total_token_usage(&self, conn: &Connection, session_id: &str) -> Result<(u64, u64), StoreError> {
        conn.query_row(
            "SELECT COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0) \
             FROM token_usage WHERE session_id = ?1",
            [session_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(sql("token usage total"))
    }

    /// Record a failure of attempt `attempt` (0-indexed).
    pub fn persist_error(
        &self,
        conn: &Connection,
        at: &TurnRef,
        context: &str,
        message: &str,
        attempt: u32,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        conn.execute(
            "INSERT INTO errors (session_id, agent_id, turn, context, message, attempt, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                at.session_id,
                at.agent_id,
                at.turn,
                context,
                message,
                attempt,
                now_ms
            ],
        )
        .map_err(sql("error insert"))?;
        Ok(())
    }

    /// A session's errors, oldest first.
    pub fn errors(&self, conn: &Connection, session_id: &str) -> Result<Vec<StoredError>, StoreError> {
        let mut stmt = conn
            .prepare(
                "SELECT turn, context, message, attempt, created_at FROM errors \
                 WHERE session_id = ?1 ORDER BY id",
            )
            .map_err(sql("errors load"))?;
        let rows = stmt
            .query_map([session_id], |r| {
                Ok(StoredError {
                    turn: r.get(0)?,
                    context: r.get(1)?,
                    message: r.get(2)?,
                    attempt: r.get(3)?,
                    created_at_ms: r.get(4)?,
                })
            })
            .map_err(sql("errors load"))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(sql("errors load"))
    }
}
