//! Garbage collection of the settled tool-call ledger with a TTL (seed 001
//! §7's stale-row GC, applied to seed 004's ledger): settled calls, their
//! numbered failed attempts, and settled job runs.
//!
//! Invariant: [`ToolCallStore::gc_keeping`] deletes, in ONE transaction
//! (after a crash: all of it or none):
//! - `succeeded`/`failed` calls last updated more than the TTL ago, outside
//!   the runs the caller keeps, and every `tool_call_attempts` row of those
//!   calls (never an attempt of a call that stays: its numbers go on
//!   counting across resumes);
//! - `succeeded`/`failed` runs last updated more than the TTL ago, outside
//!   the sessions the caller keeps, that no call row names any more.
//!
//! Never a `prepared`/`running` call (in flight: a resume replays it, or
//! it waits for a human's confirmation), never a `running` or
//! `waiting_for_human` run. The caller (`System::gc`) keeps the runs and
//! sessions of every agent that may still resume — a settled call asked
//! again by a resumed round is answered from its row, not run twice — and
//! the runs parked for a human.
//!
//! Consequence, stated plainly: a collected call's idempotency key is free
//! again (a later call with that key is a first run), and a collected
//! run's id is free again (`durable-agent run` of a job naming it starts a
//! new run instead of refusing). The TTL must outlive every resume and
//! re-run horizon, as for the other stores.

use rusqlite::{params_from_iter, Connection};
use serde::Serialize;

use super::ToolCallStore;
use crate::store::cached::{CachedSql, WriteTx};
use crate::store::schema::{sql, StoreError};
use crate::store::triggers::{cutoff_and_kept, cutoff_ms};

/// What one tool-call ledger GC deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ToolCallGcReport {
    /// Rows last updated before this instant were eligible.
    pub cutoff_ms: u64,
    /// The ids of the calls deleted, in insertion order.
    pub calls: Vec<String>,
    /// How many failed-attempt rows of those calls went with them.
    pub attempts: u64,
    /// The ids of the runs deleted, in insertion order.
    pub runs: Vec<String>,
}

impl ToolCallStore {
    /// Delete the settled calls (with their attempts) and settled runs
    /// last updated more than `ttl_ms` before `now_ms`, except the calls of
    /// runs `keep_run_ids` and the runs of sessions `keep_session_ids`; one
    /// transaction (see the module docs).
    pub fn gc_keeping(
        &self,
        conn: &Connection,
        now_ms: u64,
        ttl_ms: u64,
        keep_run_ids: &[String],
        keep_session_ids: &[String],
    ) -> Result<ToolCallGcReport, StoreError> {
        let cutoff_ms = cutoff_ms(now_ms, ttl_ms);
        let (kept_runs, call_binds) = cutoff_and_kept(cutoff_ms, keep_run_ids);
        let calls_eligible =
            format!("status IN ('succeeded', 'failed') AND updated_at < ?1 AND run_id NOT IN ({kept_runs})");
        let (kept_sessions, run_binds) = cutoff_and_kept(cutoff_ms, keep_session_ids);
        // A run is collected only once no call names it (the calls'
        // `run_id` references it), so the calls go first, in the same
        // transaction.
        let runs_eligible = format!(
            "status IN ('succeeded', 'failed') AND updated_at < ?1 \
             AND session_id NOT IN ({kept_sessions}) \
             AND NOT EXISTS (SELECT 1 FROM tool_calls c WHERE c.run_id = runs.run_id)"
        );
        let tx = WriteTx::begin(conn).map_err(sql("tool call gc begin"))?;
        let calls = select_ids(&tx, "tool_calls", "id", &calls_eligible, &call_binds)?;
        let mut attempts = 0;
        if !calls.is_empty() {
            let n = tx
                .execute_cached(
                    &format!(
                        "DELETE FROM tool_call_attempts WHERE call_id IN \
                         (SELECT id FROM tool_calls WHERE {calls_eligible})"
                    ),
                    params_from_iter(call_binds.iter()),
                )
                .map_err(sql("tool call attempts gc delete"))?;
            attempts = n as u64;
            let n = tx
                .execute_cached(
                    &format!("DELETE FROM tool_calls WHERE {calls_eligible}"),
                    params_from_iter(call_binds.iter()),
                )
                .map_err(sql("tool call gc delete"))?;
            // The write lock is held since the select.
            assert_eq!(n, calls.len(), "tool call gc: delete disagrees with its select");
        }
        let runs = select_ids(&tx, "runs", "run_id", &runs_eligible, &run_binds)?;
        if !runs.is_empty() {
            let n = tx
                .execute_cached(
                    &format!("DELETE FROM runs WHERE {runs_eligible}"),
                    params_from_iter(run_binds.iter()),
                )
                .map_err(sql("run gc delete"))?;
            assert_eq!(n, runs.len(), "run gc: delete disagrees with its select");
        }
        tx.commit().map_err(sql("tool call gc commit"))?;
        if !calls.is_empty() || !runs.is_empty() {
            tracing::info!(
                calls = calls.len(),
                attempts,
                runs = runs.len(),
                cutoff_ms,
                "collected settled tool calls and runs"
            );
        }
        Ok(ToolCallGcReport {
            cutoff_ms,
            calls,
            attempts,
            runs,
        })
    }
}

/// The `key` column of the rows of `table` that `eligible` selects, in
/// insertion order.
fn select_ids(
    conn: &Connection,
    table: &str,
    key: &str,
    eligible: &str,
    binds: &[rusqlite::types::Value],
) -> Result<Vec<String>, StoreError> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {key} FROM {table} WHERE {eligible} ORDER BY rowid"
        ))
        .map_err(sql("tool call gc select"))?;
    let rows = stmt
        .query_map(params_from_iter(binds.iter()), |r| r.get::<_, String>(0))
        .map_err(sql("tool call gc select"))?;
    rows.collect::<Result<Vec<_>, _>>()
        .map_err(sql("tool call gc select"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::schema::migrate;
    use crate::store::tool_calls::{NewToolCall, RunRecord, RunStatus, SideEffect};

    fn db() -> Connection {
        let conn = Connection::open_in_memory().expect("in-memory db");
        migrate(&conn, "test").expect("migrate");
        conn
    }

    fn call(store: &ToolCallStore, conn: &Connection, id: &str, run: &str, at: u64) {
        let new = NewToolCall {
            id: id.into(),
            run_id: run.into(),
            tool_name: "t".into(),
            raw_tool_name: "t".into(),
            input: serde_json::json!({"a": 1}),
            idempotency_key: format!("key-{id}"),
            side_effect: SideEffect::Reversible,
        };
        store.prepare(conn, &new, at).expect("prepare");
    }

    fn job(store: &ToolCallStore, conn: &Connection, id: &str, session: &str, status: RunStatus, at: u64) {
        let run = RunRecord {
            run_id: id.into(),
            session_id: session.into(),
            status,
            parent_run_id: None,
            job_json: Some("{}".into()),
        };
        store.create_job_run(conn, &run, at).expect("run");
    }

    #[test]
    fn gc_deletes_settled_calls_with_their_attempts_and_settled_runs_and_nothing_unsettled_or_kept() {
        let conn = db();
        let store = ToolCallStore::default();
        for run in ["session:a", "session:b"] {
            store.create_run(&conn, run, run, 1).expect("run");
        }
        // Settled and old: goes, with its two attempts.
        call(&store, &conn, "done", "session:a", 1);
        store.record_attempt(&conn, "done", "503", 1).expect("attempt");
        store.record_attempt(&conn, "done", "503", 1).expect("attempt");
        store
            .mark_succeeded(&conn, "done", &serde_json::json!("ok"), 2)
            .expect("ok");
        // In flight however old: stays, with its attempt.
        call(&store, &conn, "flying", "session:a", 1);
        store.mark_running(&conn, "flying", 1).expect("running");
        store.record_attempt(&conn, "flying", "503", 1).expect("attempt");
        // Settled but in a kept run: stays.
        call(&store, &conn, "kept", "session:b", 1);
        store.mark_failed(&conn, "kept", "no", 2).expect("failed");
        // Settled, too young: stays.
        call(&store, &conn, "young", "session:a", 1);
        store
            .mark_succeeded(&conn, "young", &serde_json::json!("ok"), 100)
            .expect("ok");
        job(&store, &conn, "old-done", "s1", RunStatus::Succeeded, 2);
        job(&store, &conn, "old-failed", "s2", RunStatus::Failed, 2);
        job(&store, &conn, "kept-session", "s3", RunStatus::Succeeded, 2);
        job(&store, &conn, "running", "s4", RunStatus::Running, 2);
        job(&store, &conn, "waiting", "s5", RunStatus::WaitingForHuman, 2);

        let keep_runs = ["session:b".to_string()];
        let keep_sessions = ["s3".to_string()];
        let report = store
            .gc_keeping(&conn, 100, 50, &keep_runs, &keep_sessions)
            .expect("gc");
        assert_eq!(report.cutoff_ms, 50);
        assert_eq!(report.calls, ["done"]);
        assert_eq!(report.attempts, 2);
        assert_eq!(report.runs, ["old-done", "old-failed"]);
        assert!(store.get(&conn, "done").expect("get").is_none());
        for id in ["flying", "kept", "young"] {
            assert!(store.get(&conn, id).expect("get").is_some(), "{id}");
        }
        assert_eq!(store.attempts(&conn, "flying").expect("attempts").len(), 1);
        assert!(store.attempts(&conn, "done").expect("attempts").is_empty());
        let left = store.run_ids(&conn).expect("runs");
        for id in ["session:a", "session:b", "kept-session", "running", "waiting"] {
            assert!(left.iter().any(|r| r == id), "{id} kept: {left:?}");
        }
        // Idempotent.
        let again = store
            .gc_keeping(&conn, 100, 50, &keep_runs, &keep_sessions)
            .expect("gc again");
        assert!(again.calls.is_empty() && again.runs.is_empty() && again.attempts == 0);
    }

    #[test]
    fn a_settled_run_some_call_still_names_is_kept() {
        let conn = db();
        let store = ToolCallStore::default();
        job(&store, &conn, "j", "s", RunStatus::Succeeded, 1);
        call(&store, &conn, "c", "j", 1);
        store.mark_running(&conn, "c", 1).expect("running");
        let report = store.gc_keeping(&conn, 100, 10, &[], &[]).expect("gc");
        assert!(report.runs.is_empty(), "{report:?}");
    }
}
