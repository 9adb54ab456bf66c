//! Garbage collection of settled ledger rows with a TTL (seed 001 §7 and
//! §10: the ledger may hold message content; do not keep it forever).
//!
//! Invariant: [`ActivityStore::gc`] deletes only DONE and FAILED rows whose
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

use rusqlite::{params_from_iter, Connection, TransactionBehavior};

use super::ActivityStore;
use crate::store::schema::{sql, StoreError};
pub use crate::store::triggers::GcReport;
use crate::store::triggers::{cutoff_and_kept, cutoff_ms};

impl ActivityStore {
    /// Delete DONE/FAILED rows last updated more than `ttl_ms` before
    /// `now_ms`, in one transaction (see the module docs).
    pub fn gc(&self, conn: &Connection, now_ms: u64, ttl_ms: u64) -> Result<GcReport, StoreError> {
        self.gc_keeping(conn, now_ms, ttl_ms, &[])
    }

    /// [`ActivityStore::gc`], except that rows whose `task_id` is in
    /// `keep_task_ids` are kept whatever their age (the system passes the
    /// agents with an interrupted turn: resuming it re-runs keys of its
    /// partial round, which must still be answered from the ledger).
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

        let tx = rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Immediate)
            .map_err(sql("activity gc begin"))?;
        let deleted = {
            let mut stmt = tx
                .prepare(&format!(
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
                .execute(
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
