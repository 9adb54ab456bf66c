//! Garbage collection of settled ledger rows with a TTL (seed 001 §7 and
//! §10: the ledger may hold message content; do not keep it forever).
//!
//! Invariant: [`ActivityStore::gc_keeping`] deletes only DONE and FAILED rows whose
//! `updated_at` is more than `ttl_ms` before `now_ms`, in one transaction
//! (after a crash: all of them gone or none). Never an INTENT row — its
//! outcome is unknown and boot recovery must still decide it — and never a
//! NEEDS_CONFIRMATION row, which waits for a human however old it is.
//! (Seed 001 §7 lists INTENT among the GC'd rows; that would let a crash
//! older than the TTL re-send blindly, so it is not done here.)
//!
//! Consequence, stated plainly: once a row is collected the ledger has
//! forgotten its key, so a later `execute_irreversible` with the same key
//! is a first send again — not deduplicated by the ledger (a deduplicating
//! provider still answers with the original reference, within its own
//! window). The TTL must therefore exceed any horizon on which the same
//! key can run again: trigger retries with backoff, and a turn resumed
//! after a crash (its partial round re-executes its tool calls with the
//! same keys). [`ActivityStore::gc_keeping`] lets the caller protect the
//! rows of tasks that still have such a resume pending.
//!
//! Payload stripping (seed 001 §10's privacy note: "consider stripping
//! bodies on DONE"): [`ActivityStore::strip_payloads`] replaces the
//! `payload_json` of DONE/FAILED rows settled more than a (shorter) TTL
//! ago with [`STRIPPED_JSON`], in one transaction, keeping key, task,
//! action, status, provider reference, error and times. Nothing reads a
//! settled row's payload back: a repeated key is answered from its status
//! and provider reference (or error), and only an INTENT's payload is ever
//! re-sent — so the same rows GC may delete may be stripped, and the
//! caller protects the same tasks. Idempotent: a stripped row is not
//! selected again, and `updated_at` is not touched (the GC TTL still
//! counts from the settlement).

use rusqlite::{params_from_iter, Connection};
use serde::Serialize;

use super::ActivityStore;
use crate::store::cached::{CachedSql, WriteTx};
use crate::store::schema::{sql, StoreError};
pub use crate::store::triggers::GcReport;
use crate::store::triggers::{cutoff_and_kept, cutoff_ms};

impl ActivityStore {
    /// Delete DONE/FAILED rows last updated more than `ttl_ms` before
    /// `now_ms`, in one transaction (see the module docs), except that
    /// rows whose `task_id` is in `keep_task_ids` are kept whatever their
    /// age (the system passes the agents with an interrupted turn:
    /// resuming it re-runs keys of its partial round, which must still be
    /// answered from the ledger). Nothing kept: an empty slice.
    pub fn gc_keeping(
        &self,
        conn: &Connection,
        now_ms: u64,
        ttl_ms: u64,
        keep_task_ids: &[String],
    ) -> Result<GcReport, StoreError> {
        let cutoff_ms = cutoff_ms(now_ms, ttl_ms);
        // The kept tasks are few: agents mid-turn.
        let (kept, binds) = cutoff_and_kept(cutoff_ms, keep_task_ids);
        let eligible =
            format!("status IN ('DONE', 'FAILED') AND updated_at < ?1 AND task_id NOT IN ({kept})");

        let tx = WriteTx::begin(conn).map_err(sql("activity gc begin"))?;
        let deleted = {
            let mut stmt = tx
                .prepare_cached(&format!(
                    "SELECT idem_key FROM activity_log WHERE {eligible} ORDER BY rowid"
                ))
                .map_err(sql("activity gc select"))?;
            let rows = stmt
                .query_map(params_from_iter(binds.iter()), |r| r.get::<_, String>(0))
                .map_err(sql("activity gc select"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(sql("activity gc select"))?
        };
        if !deleted.is_empty() {
            let n = tx
                .execute_cached(
                    &format!("DELETE FROM activity_log WHERE {eligible}"),
                    params_from_iter(binds.iter()),
                )
                .map_err(sql("activity gc delete"))?;
            // The write lock is held since the select.
            assert_eq!(n, deleted.len(), "activity gc: delete disagrees with its select");
        }
        tx.commit().map_err(sql("activity gc commit"))?;
        if !deleted.is_empty() {
            tracing::info!(count = deleted.len(), cutoff_ms, "collected settled activities");
        }
        Ok(GcReport { cutoff_ms, deleted })
    }
}

/// What replaces a stripped JSON body: valid JSON, so every reader still
/// decodes the row, and plainly not the original.
pub const STRIPPED_JSON: &str = r#"{"stripped":true}"#;

/// What one payload strip rewrote (also the tool-call ledger's report).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StripReport {
    /// Rows settled before this instant were eligible.
    pub cutoff_ms: u64,
    /// The keys of the rows stripped (idempotency keys / call ids), in
    /// insertion order.
    pub stripped: Vec<String>,
}

impl ActivityStore {
    /// Replace the payload of DONE/FAILED rows last updated more than
    /// `ttl_ms` before `now_ms` with [`STRIPPED_JSON`], except the rows of
    /// `keep_task_ids` (as in [`Self::gc_keeping`]); one transaction (see
    /// the module docs).
    pub fn strip_payloads(
        &self,
        conn: &Connection,
        now_ms: u64,
        ttl_ms: u64,
        keep_task_ids: &[String],
    ) -> Result<StripReport, StoreError> {
        let cutoff_ms = cutoff_ms(now_ms, ttl_ms);
        let (kept, mut binds) = cutoff_and_kept(cutoff_ms, keep_task_ids);
        let sentinel = binds.len() + 1;
        binds.push(rusqlite::types::Value::Text(STRIPPED_JSON.to_string()));
        let eligible = format!(
            "status IN ('DONE', 'FAILED') AND updated_at < ?1 AND task_id NOT IN ({kept}) \
             AND payload_json <> ?{sentinel}"
        );
        let tx = WriteTx::begin(conn).map_err(sql("activity strip begin"))?;
        let stripped = {
            let mut stmt = tx
                .prepare_cached(&format!(
                    "SELECT idem_key FROM activity_log WHERE {eligible} ORDER BY rowid"
                ))
                .map_err(sql("activity strip select"))?;
            let rows = stmt
                .query_map(params_from_iter(binds.iter()), |r| r.get::<_, String>(0))
                .map_err(sql("activity strip select"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(sql("activity strip select"))?
        };
        if !stripped.is_empty() {
            let n = tx
                .execute_cached(
                    &format!("UPDATE activity_log SET payload_json = ?{sentinel} WHERE {eligible}"),
                    params_from_iter(binds.iter()),
                )
                .map_err(sql("activity strip update"))?;
            // The write lock is held since the select.
            assert_eq!(
                n,
                stripped.len(),
                "activity strip: update disagrees with its select"
            );
        }
        tx.commit().map_err(sql("activity strip commit"))?;
        if !stripped.is_empty() {
            tracing::info!(
                count = stripped.len(),
                cutoff_ms,
                "stripped settled activity payloads"
            );
        }
        Ok(StripReport { cutoff_ms, stripped })
    }
}
