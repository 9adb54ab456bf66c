//! Operator actions on triggers: list them by status (the dead-letter view),
//! send a DEAD or FAILED trigger back to PENDING, and settle a PENDING
//! trigger whose work was done another way.
//!
//! Invariant: [`TriggerStore::retry`] is one transaction guarded by the
//! status — only a DEAD or FAILED row moves, to PENDING with its attempts
//! reset, and anything else is a typed error with nothing changed. A
//! PENDING or CLAIMED trigger is never touched (a retry must not steal a
//! live lease or reset a backoff in progress).
//! [`TriggerStore::settle_pending`] is one statement guarded by the
//! status: only a PENDING row moves, to DONE; a CLAIMED one (someone's
//! lease) and a settled one are left as they are.

use rusqlite::{params, Connection, OptionalExtension};

use super::{decode, raw_row, Trigger, TriggerStatus, TriggerStore, COLUMNS};
use crate::store::cached::{CachedSql, WriteTx};
use crate::store::schema::{sql, StoreError};

impl TriggerStore {
    /// Every trigger with `status`, oldest first, each with its
    /// `last_error` and `attempts` (DEAD: the dead-letter queue).
    pub fn with_status(
        &self,
        conn: &Connection,
        status: TriggerStatus,
        now_ms: u64,
    ) -> Result<Vec<Trigger>, StoreError> {
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM triggers WHERE status = ?1 ORDER BY rowid"
            ))
            .map_err(sql("trigger select by status"))?;
        let raws = stmt
            .query_map([status.as_str()], raw_row)
            .map_err(sql("trigger select by status"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql("trigger select by status"))?;
        raws.into_iter()
            .map(|r| decode(r, &self.policy, now_ms))
            .collect()
    }

    /// A human retries a DEAD or FAILED trigger: PENDING now (no backoff),
    /// attempts reset to 0 so it gets the policy's full budget again,
    /// `last_error` kept for the record. Returns the row as it now is.
    ///
    /// Attempts double as the lease fence of [`TriggerStore::ack_done`], so
    /// resetting them lets a claim from before the trigger died match a
    /// new claim's attempt number. Such a stale claim exists only if its
    /// holder outlived a reclaimed lease; the [`crate::system::System`]
    /// settles every claim before its owner thread takes the next call, so
    /// none is outstanding when a retry runs there.
    pub fn retry(&self, conn: &Connection, id: &str, now_ms: u64) -> Result<Trigger, StoreError> {
        let tx = WriteTx::begin(conn).map_err(sql("trigger retry begin"))?;
        let moved = tx
            .execute_cached(
                "UPDATE triggers SET status = 'PENDING', attempts = 0, not_before = NULL, \
                 lease_until = NULL, updated_at = ?2 WHERE id = ?1 AND status IN ('DEAD', 'FAILED')",
                params![id, now_ms],
            )
            .map_err(sql("trigger retry update"))?;
        let raw = tx
            .query_row_cached(
                &format!("SELECT {COLUMNS} FROM triggers WHERE id = ?1"),
                [id],
                raw_row,
            )
            .optional()
            .map_err(sql("trigger retry read"))?;
        let Some(raw) = raw else {
            return Err(StoreError::NotFound {
                table: "triggers",
                id: id.to_string(),
            });
        };
        let trigger = decode(raw, &self.policy, now_ms)?;
        if moved == 0 {
            // Dropping `tx` rolls back; nothing was written anyway.
            return Err(StoreError::WrongState {
                table: "triggers",
                id: id.to_string(),
                op: "retry",
                expected: "DEAD or FAILED",
                actual: trigger.status.as_str().to_string(),
            });
        }
        tx.commit().map_err(sql("trigger retry commit"))?;
        tracing::info!(id, "trigger retried by an operator");
        Ok(trigger)
    }

    /// Settle the PENDING trigger with `dedup_key` as DONE without firing
    /// it: its work completed another way (e.g. `run --resume` finished
    /// the run a RESUME trigger stands for). One guarded statement: only
    /// PENDING → DONE. Returns the row as it now is if it moved; `None` if
    /// there is no such key or the row is in another state (unchanged).
    pub fn settle_pending(
        &self,
        conn: &Connection,
        dedup_key: &str,
        now_ms: u64,
    ) -> Result<Option<Trigger>, StoreError> {
        let tx = WriteTx::begin(conn).map_err(sql("trigger settle begin"))?;
        let moved = tx
            .execute_cached(
                "UPDATE triggers SET status = 'DONE', not_before = NULL, lease_until = NULL, \
                 updated_at = ?2 WHERE dedup_key = ?1 AND status = 'PENDING'",
                params![dedup_key, now_ms],
            )
            .map_err(sql("trigger settle update"))?;
        if moved == 0 {
            // Dropping `tx` rolls back; nothing was written anyway.
            return Ok(None);
        }
        let raw = tx
            .query_row_cached(
                &format!("SELECT {COLUMNS} FROM triggers WHERE dedup_key = ?1"),
                [dedup_key],
                raw_row,
            )
            .map_err(sql("trigger settle read"))?;
        let trigger = decode(raw, &self.policy, now_ms)?;
        tx.commit().map_err(sql("trigger settle commit"))?;
        tracing::info!(id = %trigger.id, dedup_key, "pending trigger settled: its work is done");
        Ok(Some(trigger))
    }
}
