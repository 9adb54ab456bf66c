//! Token usage per LLM call (with the model it was made with) and errors
//! with their retry attempt (seed 000).
//!
//! Invariant: rows are append-only until GC; an error row carries the
//! 0-indexed attempt that failed, so a retried call leaves attempts 0, 1, …
//! in order. The agent loop's provider failures are numbered by the store
//! itself ([`UsageStore::persist_failed_attempt`]): the attempt is the
//! count of the rows already recorded for the same call — session, turn
//! number and context (`llm_complete round N`) — so the numbering goes on
//! across a restart, as the tool ledger's numbered attempts do. [`UsageStore::gc_keeping`] deletes rows recorded more than a
//! TTL ago, except those of the sessions the caller keeps, in one
//! transaction over both tables (all or nothing). Nothing recovery or a
//! resume does reads these rows — they are what the operator's views show
//! — so the caller keeps only the sessions whose work is not settled
//! (their errors say why a run is stuck).

use rusqlite::{params, params_from_iter, Connection};
use serde::Serialize;

use crate::store::cached::{CachedSql, WriteTx};
use crate::store::schema::{sql, StoreError};
use crate::store::triggers::{cutoff_and_kept, cutoff_ms};

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

/// A stored token-usage row (one completed LLM call).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredUsage {
    /// The turn's number in the agent's conversation (completed turns
    /// before it).
    pub turn: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The model the call was made with (`None` on rows older than
    /// schema version 4).
    pub model: Option<String>,
    pub created_at_ms: u64,
}

/// Token usage and error rows.
#[derive(Debug, Clone, Copy, Default)]
pub struct UsageStore;

impl UsageStore {
    /// Record one LLM call's token counts and the model it was made with
    /// (the provider's configured model, so usage shows per model).
    pub fn persist_token_usage(
        &self,
        conn: &Connection,
        at: &TurnRef,
        model: &str,
        input_tokens: u64,
        output_tokens: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        conn.execute_cached(
            "INSERT INTO token_usage (session_id, agent_id, turn, input_tokens, output_tokens, \
             created_at, model) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                at.session_id,
                at.agent_id,
                at.turn,
                input_tokens,
                output_tokens,
                now_ms,
                model
            ],
        )
        .map_err(sql("token usage insert"))?;
        Ok(())
    }

    /// `(SUM(input_tokens), SUM(output_tokens))` of a session.
    pub fn total_token_usage(&self, conn: &Connection, session_id: &str) -> Result<(u64, u64), StoreError> {
        conn.query_row_cached(
            "SELECT COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0) \
             FROM token_usage WHERE session_id = ?1",
            [session_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(sql("token usage total"))
    }

    /// Record a failure of the call at (`at`, `context`), numbered by the
    /// rows already recorded for that call: the first failure is attempt
    /// 0, the next 1, … — whatever process recorded the earlier ones (the
    /// number is read and written in one statement, so it survives a
    /// restart and never repeats). Returns the attempt recorded.
    ///
    /// Not `INSERT … RETURNING` read with `query_row`: that takes the row
    /// from the statement's first step and resets it, and an autocommit
    /// statement commits only when it completes, so a failed commit (EIO
    /// writing the WAL) would be dropped with the reset and the caller told
    /// the row was recorded (the crash fuzzer's E1 found it). The insert
    /// runs to completion here, and the number is read back after.
    pub fn persist_failed_attempt(
        &self,
        conn: &Connection,
        at: &TurnRef,
        context: &str,
        message: &str,
        now_ms: u64,
    ) -> Result<u32, StoreError> {
        conn.execute_cached(
            "INSERT INTO errors (session_id, agent_id, turn, context, message, attempt, created_at) \
             SELECT ?1, ?2, ?3, ?4, ?5, COUNT(*), ?6 FROM errors \
             WHERE session_id = ?1 AND turn = ?3 AND context = ?4",
            params![at.session_id, at.agent_id, at.turn, context, message, now_ms],
        )
        .map_err(sql("error insert"))?;
        conn.query_row_cached(
            "SELECT attempt FROM errors WHERE rowid = ?1",
            [conn.last_insert_rowid()],
            |r| r.get(0),
        )
        .map_err(sql("error insert read back"))
    }

    /// A session's usage rows, oldest first.
    pub fn token_usage(&self, conn: &Connection, session_id: &str) -> Result<Vec<StoredUsage>, StoreError> {
        conn.query_all_cached(
            "SELECT turn, input_tokens, output_tokens, model, created_at FROM token_usage \
             WHERE session_id = ?1 ORDER BY id",
            [session_id],
            |r| {
                Ok(StoredUsage {
                    turn: r.get(0)?,
                    input_tokens: r.get(1)?,
                    output_tokens: r.get(2)?,
                    model: r.get(3)?,
                    created_at_ms: r.get(4)?,
                })
            },
        )
        .map_err(sql("token usage load"))
    }

    /// A session's errors, oldest first.
    pub fn errors(&self, conn: &Connection, session_id: &str) -> Result<Vec<StoredError>, StoreError> {
        conn.query_all_cached(
            "SELECT turn, context, message, attempt, created_at FROM errors \
             WHERE session_id = ?1 ORDER BY id",
            [session_id],
            |r| {
                Ok(StoredError {
                    turn: r.get(0)?,
                    context: r.get(1)?,
                    message: r.get(2)?,
                    attempt: r.get(3)?,
                    created_at_ms: r.get(4)?,
                })
            },
        )
        .map_err(sql("errors load"))
    }
}

/// What one usage GC deleted: how many rows of each table (the rows are
/// anonymous, append-only records; their ids mean nothing to an operator).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct UsageGcReport {
    /// Rows recorded before this instant were eligible.
    pub cutoff_ms: u64,
    pub token_usage: u64,
    pub errors: u64,
}

impl UsageStore {
    /// Delete the `token_usage` and `errors` rows recorded more than
    /// `ttl_ms` before `now_ms`, except those of sessions
    /// `keep_session_ids`; one transaction (see the module docs).
    pub fn gc_keeping(
        &self,
        conn: &Connection,
        now_ms: u64,
        ttl_ms: u64,
        keep_session_ids: &[String],
    ) -> Result<UsageGcReport, StoreError> {
        let cutoff_ms = cutoff_ms(now_ms, ttl_ms);
        let (kept, binds) = cutoff_and_kept(cutoff_ms, keep_session_ids);
        let eligible = format!("created_at < ?1 AND session_id NOT IN ({kept})");
        let tx = WriteTx::begin(conn).map_err(sql("usage gc begin"))?;
        let mut deleted = [0u64; 2];
        for (n, table) in deleted.iter_mut().zip(["token_usage", "errors"]) {
            *n = tx
                .execute_cached(
                    &format!("DELETE FROM {table} WHERE {eligible}"),
                    params_from_iter(binds.iter()),
                )
                .map_err(sql("usage gc delete"))? as u64;
        }
        tx.commit().map_err(sql("usage gc commit"))?;
        let [token_usage, errors] = deleted;
        if token_usage + errors > 0 {
            tracing::info!(token_usage, errors, cutoff_ms, "collected usage and error rows");
        }
        Ok(UsageGcReport {
            cutoff_ms,
            token_usage,
            errors,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::schema::migrate;

    /// An in-memory store at the current schema.
    fn store() -> Connection {
        let conn = Connection::open_in_memory().expect("in-memory db");
        migrate(&conn, "test").expect("migrate");
        conn
    }

    /// Turn `turn` of session `s` (its agent `agent-{s}`).
    fn at(s: &str, turn: u64) -> TurnRef {
        TurnRef {
            session_id: s.into(),
            agent_id: format!("agent-{s}"),
            turn,
        }
    }

    #[test]
    fn a_sessions_usage_rows_read_back_in_order_with_their_turn_and_model() {
        let conn = store();
        let usage = UsageStore;
        usage
            .persist_token_usage(&conn, &at("s", 0), "m1", 5, 2, 10)
            .expect("usage");
        usage
            .persist_token_usage(&conn, &at("other", 0), "m1", 9, 9, 11)
            .expect("usage");
        usage
            .persist_token_usage(&conn, &at("s", 3), "m2", 7, 1, 12)
            .expect("usage");
        let rows = usage.token_usage(&conn, "s").expect("read");
        let row = |turn, input_tokens, output_tokens, model: &str, created_at_ms| StoredUsage {
            turn,
            input_tokens,
            output_tokens,
            model: Some(model.into()),
            created_at_ms,
        };
        assert_eq!(rows, vec![row(0, 5, 2, "m1", 10), row(3, 7, 1, "m2", 12)]);
        assert_eq!(usage.total_token_usage(&conn, "s").expect("sum"), (12, 3));
    }

    #[test]
    fn a_failed_call_is_numbered_by_the_rows_of_the_same_call_so_numbering_survives_a_restart() {
        let conn = store();
        let usage = UsageStore;
        let fail = |s: &str, turn, context: &str| {
            usage
                .persist_failed_attempt(&conn, &at(s, turn), context, "HTTP 503", 7)
                .expect("error row")
        };
        // The same call (session, turn, context) counts on; any other call
        // starts at 0. Nothing in memory carries the count: a process that
        // restarted between two failures numbers the second 1, not 0.
        assert_eq!(fail("s", 2, "llm_complete round 0"), 0);
        assert_eq!(fail("s", 2, "llm_complete round 0"), 1);
        assert_eq!(fail("s", 2, "llm_complete round 1"), 0);
        assert_eq!(fail("s", 3, "llm_complete round 0"), 0);
        assert_eq!(fail("other", 2, "llm_complete round 0"), 0);
        assert_eq!(fail("s", 2, "llm_complete round 0"), 2);
        let rows: Vec<(u64, String, u32)> = usage
            .errors(&conn, "s")
            .expect("read")
            .into_iter()
            .map(|e| (e.turn, e.context, e.attempt))
            .collect();
        let row = |turn, round, attempt| (turn, format!("llm_complete round {round}"), attempt);
        assert_eq!(
            rows,
            vec![
                row(2, 0, 0),
                row(2, 0, 1),
                row(2, 1, 0),
                row(3, 0, 0),
                row(2, 0, 2)
            ]
        );
    }

    #[test]
    fn usage_gc_deletes_old_rows_of_sessions_not_kept_in_one_pass() {
        let conn = store();
        let usage = UsageStore;
        for (session, time) in [("old", 1), ("kept", 1), ("young", 60)] {
            usage
                .persist_token_usage(&conn, &at(session, 0), "m", 1, 1, time)
                .expect("usage");
            usage
                .persist_failed_attempt(&conn, &at(session, 0), "llm", "boom", time)
                .expect("error");
        }
        let report = usage
            .gc_keeping(&conn, 100, 50, &["kept".to_string()])
            .expect("gc");
        assert_eq!((report.cutoff_ms, report.token_usage, report.errors), (50, 1, 1));
        assert!(usage.errors(&conn, "old").expect("errors").is_empty());
        assert_eq!(usage.errors(&conn, "kept").expect("errors").len(), 1);
        assert_eq!(usage.total_token_usage(&conn, "young").expect("sum"), (1, 1));
        let again = usage
            .gc_keeping(&conn, 100, 50, &["kept".to_string()])
            .expect("gc again");
        assert_eq!((again.token_usage, again.errors), (0, 0));
    }
}
