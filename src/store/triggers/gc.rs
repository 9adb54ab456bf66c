//! Garbage collection of settled triggers with a TTL (seed 001 §7: the
//! "stale-GC TTL", 24 h by default at the system level).
//!
//! Invariant: [`TriggerStore::gc`] deletes only DONE, FAILED and DEAD rows
//! whose `updated_at` is more than `ttl_ms` before `now_ms` (and not among
//! the ids the caller keeps), never a PENDING or CLAIMED one (a PENDING trigger is work not yet done; a CLAIMED one is
//! someone's lease), and never the newest row (see below). It is one
//! transaction: after a crash either every row it chose is gone or none is.
//!
//! Consequence, stated plainly: once a DONE trigger is collected its
//! `dedup_key` is free again, so a producer re-emitting that key gets a
//! *new* trigger ([`super::EmitOutcome::Inserted`]), not a duplicate. The
//! TTL must therefore exceed the longest time a producer may re-emit a key
//! (its retry or restart horizon). (At the system level the turn a fired
//! trigger runs is keyed by `trigger:{dedup_key}` in the agent's own log,
//! which no GC touches, so `System::fire` on the same agent still finds
//! that turn done and runs nothing; the store alone does not promise that.)
//!
//! Why the newest row is kept: `emit` derives a trigger's id from
//! `MAX(rowid) + 1` (and SQLite gives a table without AUTOINCREMENT the
//! same rowid). Deleting the newest row would hand its id to the next
//! emit — and a trigger without a dedup key is identified everywhere by its
//! id (`System::trigger_work` is `trigger:{id}`), so the new trigger would
//! inherit the old one's completed turn and never run. Keeping the newest
//! row keeps `MAX(rowid)` monotonic, so ids are never reused.

use rusqlite::types::Value;
use rusqlite::{params_from_iter, Connection};
use serde::Serialize;

use super::TriggerStore;
use crate::store::cached::{CachedSql, WriteTx};
use crate::store::schema::{sql, StoreError};

/// What one GC deleted (also the activity ledger's report,
/// `store::activities::GcReport`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GcReport {
    /// Rows last updated before this instant were eligible.
    pub cutoff_ms: u64,
    /// The keys of the rows deleted (trigger ids / idempotency keys), in
    /// insertion order.
    pub deleted: Vec<String>,
}

/// The instant before which a settled row is old enough: a row exactly
/// `ttl_ms` old is kept. Saturates at 0 (nothing collected) while `now_ms`
/// is younger than the TTL.
pub(crate) fn cutoff_ms(now_ms: u64, ttl_ms: u64) -> u64 {
    now_ms.saturating_sub(ttl_ms)
}

/// The binds of a GC statement that keeps some rows: `?1` is the cutoff,
/// `?2..` the kept values (few). Returns the placeholder list for
/// `NOT IN (…)` (empty when nothing is kept) and the binds in order.
pub(crate) fn cutoff_and_kept(cutoff_ms: u64, kept: &[String]) -> (String, Vec<Value>) {
    let placeholders = (0..kept.len())
        .map(|i| format!("?{}", i + 2))
        .collect::<Vec<_>>()
        .join(", ");
    let mut binds: Vec<Value> = Vec::with_capacity(kept.len() + 1);
    binds.push(Value::Integer(i64::try_from(cutoff_ms).unwrap_or(i64::MAX)));
    binds.extend(kept.iter().map(|k| Value::Text(k.clone())));
    (placeholders, binds)
}

/// The statuses GC may delete.
const SETTLED: &str = "status IN ('DONE', 'FAILED', 'DEAD')";

impl TriggerStore {
    /// Delete DONE/FAILED/DEAD triggers last updated more than `ttl_ms`
    /// before `now_ms`, in one transaction (see the module docs for what is
    /// kept and the consequence for dedup keys).
    pub fn gc(&self, conn: &Connection, now_ms: u64, ttl_ms: u64) -> Result<GcReport, StoreError> {
        self.gc_keeping(conn, now_ms, ttl_ms, &[])
    }

    /// [`Self::gc`], keeping also the triggers `keep_ids` (the system's:
    /// FAILED triggers blocked on a key that still waits for a human,
    /// which its answer re-pends).
    pub fn gc_keeping(
        &self,
        conn: &Connection,
        now_ms: u64,
        ttl_ms: u64,
        keep_ids: &[String],
    ) -> Result<GcReport, StoreError> {
        let cutoff_ms = cutoff_ms(now_ms, ttl_ms);
        // The kept ids are few: blocked triggers.
        let (kept, binds) = cutoff_and_kept(cutoff_ms, keep_ids);
        let eligible = format!(
            "{SETTLED} AND updated_at < ?1 AND rowid < (SELECT MAX(rowid) FROM triggers) AND id NOT IN ({kept})"
        );
        let tx = WriteTx::begin(conn).map_err(sql("trigger gc begin"))?;
        let deleted = {
            let mut stmt = tx
                .prepare_cached(&format!(
                    "SELECT id FROM triggers WHERE {eligible} ORDER BY rowid"
                ))
                .map_err(sql("trigger gc select"))?;
            let rows = stmt
                .query_map(params_from_iter(binds.iter()), |r| r.get::<_, String>(0))
                .map_err(sql("trigger gc select"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(sql("trigger gc select"))?
        };
        // Nothing old enough (the common case): skip the write.
        if !deleted.is_empty() {
            let n = tx
                .execute_cached(
                    &format!("DELETE FROM triggers WHERE {eligible}"),
                    params_from_iter(binds.iter()),
                )
                .map_err(sql("trigger gc delete"))?;
            // The write lock is held since the select: the same predicate
            // must match the same rows.
            assert_eq!(n, deleted.len(), "trigger gc: delete disagrees with its select");
        }
        tx.commit().map_err(sql("trigger gc commit"))?;
        if !deleted.is_empty() {
            tracing::info!(count = deleted.len(), cutoff_ms, "collected settled triggers");
        }
        Ok(GcReport { cutoff_ms, deleted })
    }
}
