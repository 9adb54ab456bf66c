//! Durable triggers (seed 001 §6.2): the one front door [`TriggerStore::emit`]
//! and the lease lifecycle
//! `PENDING -claim-> CLAIMED -ack_done-> DONE`,
//! `CLAIMED -ack_failed-> PENDING (backoff in not_before) | DEAD (max attempts) | FAILED (permanent)`,
//! `CLAIMED -lease expired, reclaim_expired-> PENDING`,
//! `DEAD | FAILED -retry (an operator)-> PENDING` (`admin.rs`),
//! `DONE | FAILED | DEAD -gc after the TTL-> deleted` (`gc.rs`).
//!
//! Invariants: once `emit` returned `Ok`, the trigger is committed (never
//! lost); at most one row exists per `dedup_key` (`INSERT … ON CONFLICT
//! (dedup_key) DO NOTHING`), so a key reaches DONE at most once; every
//! transition is one SQLite transaction guarded by the expected status, so a
//! crash leaves the row either before or after it. Time is the caller's
//! logical `now` in milliseconds.

use rusqlite::{params, Connection, OptionalExtension};

use crate::canary::{Canaries, Canary};
use crate::store::cached::{CachedSql, WriteTx};
use crate::store::schema::{sql, StoreError};

mod admin;
mod gc;
mod model;
pub mod scheduled;

pub use gc::GcReport;
pub(crate) use gc::{cutoff_and_kept, cutoff_ms};
use model::{decode, raw_row, COLUMNS};
pub use model::{EmitOutcome, Trigger, TriggerPolicy, TriggerSource, TriggerSpec, TriggerStatus};

/// The trigger store. Stateless apart from its policy and canaries.
#[derive(Debug, Clone, Default)]
pub struct TriggerStore {
    pub policy: TriggerPolicy,
    pub canaries: Canaries,
}

impl TriggerStore {
    pub fn new(policy: TriggerPolicy, canaries: Canaries) -> Self {
        TriggerStore { policy, canaries }
    }

    /// The single producer entry point: commit the trigger, or report the
    /// existing one with the same dedup key. Returns only after COMMIT.
    pub fn emit(
        &self,
        conn: &Connection,
        spec: &TriggerSpec,
        now_ms: u64,
    ) -> Result<EmitOutcome, StoreError> {
        // Canary: forget the key, so UNIQUE(dedup_key) cannot stop a re-emit.
        let dedup_key = if self.canaries.has(Canary::TriggerWithoutDedup) {
            None
        } else {
            spec.dedup_key.as_deref()
        };
        let payload = serde_json::to_string(&spec.payload).map_err(|source| StoreError::Json {
            what: format!("trigger payload for {:?}", spec.dedup_key),
            source,
        })?;
        let tx = WriteTx::begin(conn).map_err(sql("trigger emit begin"))?;
        // The id derives from the rowid inside the same transaction: unique,
        // deterministic, and never reused for a committed row.
        let inserted = tx
            .execute_cached(
                "INSERT INTO triggers (id, source, dedup_key, session_id, fire_at, not_before, \
                 priority, description, payload_json, status, attempts, created_at, updated_at) \
                 VALUES ('trg-' || (SELECT COALESCE(MAX(rowid), 0) + 1 FROM triggers), \
                 ?1, ?2, ?3, ?4, NULL, ?5, ?6, ?7, 'PENDING', 0, ?8, ?8) \
                 ON CONFLICT(dedup_key) DO NOTHING",
                params![
                    spec.source.as_str(),
                    dedup_key,
                    spec.session_id,
                    spec.fire_at_ms,
                    spec.priority,
                    spec.description,
                    payload,
                    now_ms
                ],
            )
            .map_err(sql("trigger emit insert"))?;
        let outcome = if inserted == 1 {
            let id: String = tx
                .query_row_cached(
                    "SELECT id FROM triggers WHERE rowid = last_insert_rowid()",
                    [],
                    |r| r.get(0),
                )
                .map_err(sql("trigger emit read id"))?;
            EmitOutcome::Inserted(id)
        } else {
            let id: String = tx
                .query_row_cached("SELECT id FROM triggers WHERE dedup_key = ?1", [dedup_key], |r| {
                    r.get(0)
                })
                .map_err(sql("trigger emit read duplicate"))?;
            EmitOutcome::Duplicate(id)
        };
        tx.commit().map_err(sql("trigger emit commit"))?;
        tracing::debug!(?outcome, key = ?spec.dedup_key, "trigger emitted");
        Ok(outcome)
    }

    /// Claim the next due trigger — PENDING, `fire_at <= now`, `not_before
    /// <= now` — ordered by (fire_at, priority): mark it CLAIMED with a lease
    /// and count the attempt, in one transaction.
    pub fn claim(
        &self,
        conn: &Connection,
        now_ms: u64,
        lease_ms: u64,
    ) -> Result<Option<Trigger>, StoreError> {
        let tx = WriteTx::begin(conn).map_err(sql("trigger claim begin"))?;
        let next = tx
            .query_row_cached(
                &format!(
                    "SELECT {COLUMNS} FROM triggers WHERE status = 'PENDING' AND fire_at <= ?1 \
                     AND (not_before IS NULL OR not_before <= ?1) \
                     ORDER BY fire_at, priority, rowid LIMIT 1"
                ),
                [now_ms],
                raw_row,
            )
            .optional()
            .map_err(sql("trigger claim select"))?;
        let Some(raw) = next else {
            return Ok(None);
        };
        let lease_until = now_ms.saturating_add(lease_ms);
        tx.execute_cached(
            "UPDATE triggers SET status = 'CLAIMED', lease_until = ?2, attempts = attempts + 1, \
             updated_at = ?3 WHERE id = ?1 AND status = 'PENDING'",
            params![raw.id, lease_until, now_ms],
        )
        .map_err(sql("trigger claim update"))?;
        tx.commit().map_err(sql("trigger claim commit"))?;
        let mut trigger = decode(raw, &self.policy, now_ms)?;
        trigger.status = TriggerStatus::Claimed;
        trigger.lease_until_ms = Some(lease_until);
        trigger.attempts += 1;
        trigger.updated_at_ms = now_ms;
        Ok(Some(trigger))
    }

    /// The claimed trigger ran: CLAIMED → DONE. `claim` is what
    /// [`TriggerStore::claim`] returned: the ack proves it still holds the
    /// lease (same attempt), else [`StoreError::LeaseLost`] and nothing
    /// changes.
    pub fn ack_done(&self, conn: &Connection, claim: &Trigger, now_ms: u64) -> Result<(), StoreError> {
        self.transition(
            conn,
            claim,
            "ack_done",
            |attempts| (TriggerStatus::Done, None, attempts),
            None,
            now_ms,
        )?;
        Ok(())
    }

    /// The claimed trigger failed. Retryable: PENDING with `not_before =
    /// now + backoff`, or DEAD once `max_attempts` were used. Not retryable:
    /// FAILED.
    pub fn ack_failed(
        &self,
        conn: &Connection,
        claim: &Trigger,
        now_ms: u64,
        error: &str,
        retryable: bool,
    ) -> Result<TriggerStatus, StoreError> {
        let policy = self.policy;
        self.transition(
            conn,
            claim,
            "ack_failed",
            |attempts| {
                if !retryable {
                    (TriggerStatus::Failed, None, attempts)
                } else if attempts >= policy.max_attempts {
                    (TriggerStatus::Dead, None, attempts)
                } else {
                    let delay = policy.backoff_ms(attempts);
                    (
                        TriggerStatus::Pending,
                        Some(now_ms.saturating_add(delay)),
                        attempts,
                    )
                }
            },
            Some(error),
            now_ms,
        )
    }

    /// Give a claim back unused: PENDING, due at once, its attempt not
    /// counted. For a claim a graceful stop interrupted (its turn cut by
    /// the stop, or never started because its agent was busy): the stop is
    /// no failure of the trigger, and without this every stop during its
    /// turn used up an attempt — five restarts of the daemon during one
    /// long job turn dead-lettered it, "its lease was lost 5 times (the
    /// process running it died each time)", though no process died. A
    /// claim never given back (the process died) is reclaimed at boot
    /// and counts, so a trigger that kills the process still dies. Same
    /// claim check as the acks ([`StoreError::LeaseLost`] otherwise,
    /// nothing changed).
    pub fn release(&self, conn: &Connection, claim: &Trigger, now_ms: u64) -> Result<(), StoreError> {
        self.transition(
            conn,
            claim,
            "release",
            |attempts| (TriggerStatus::Pending, None, attempts.saturating_sub(1)),
            None,
            now_ms,
        )?;
        Ok(())
    }

    fn transition(
        &self,
        conn: &Connection,
        claim: &Trigger,
        op: &'static str,
        // The status, `not_before` (None: unchanged) and attempts after.
        next: impl FnOnce(u32) -> (TriggerStatus, Option<u64>, u32),
        error: Option<&str>,
        now_ms: u64,
    ) -> Result<TriggerStatus, StoreError> {
        let id = claim.id.as_str();
        let tx = WriteTx::begin(conn).map_err(sql("trigger ack begin"))?;
        let row: Option<(String, u32, Option<u64>)> = tx
            .query_row_cached(
                "SELECT status, attempts, lease_until FROM triggers WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(sql("trigger ack select"))?;
        let Some((status, attempts, lease_until)) = row else {
            return Err(StoreError::NotFound {
                table: "triggers",
                id: id.to_string(),
            });
        };
        // A claim is its attempt number and its lease's end: a human retry
        // restarts the attempt count, but a new claim's lease ends at a
        // later (logical) time than any claim before the retry.
        // Canary: accept any claim of a CLAIMED row, stale or not.
        let lease_checked = !self.canaries.has(Canary::AckIgnoresLease);
        let same_claim = attempts == claim.attempts && lease_until == claim.lease_until_ms;
        if status != TriggerStatus::Claimed.as_str() || (lease_checked && !same_claim) {
            // The lease was reclaimed (and maybe claimed again: a newer
            // claim owns the row now). Acking would settle someone
            // else's claim.
            return Err(StoreError::LeaseLost {
                id: id.to_string(),
                op,
                attempt: claim.attempts,
                status,
                attempts,
            });
        }
        let (status, not_before, attempts) = next(attempts);
        tx.execute_cached(
            "UPDATE triggers SET status = ?2, not_before = COALESCE(?3, not_before), \
             lease_until = NULL, last_error = COALESCE(?4, last_error), updated_at = ?5, \
             attempts = ?6 WHERE id = ?1",
            params![id, status.as_str(), not_before, error, now_ms, attempts],
        )
        .map_err(sql("trigger ack update"))?;
        tx.commit().map_err(sql("trigger ack commit"))?;
        tracing::debug!(id, status = status.as_str(), "trigger acked");
        Ok(status)
    }

    /// Reclaim: CLAIMED triggers whose lease expired go back to PENDING
    /// (or DEAD if they already used `max_attempts`: a trigger that kills
    /// the process every time must not loop forever). Returns their ids.
    pub fn reclaim_expired(&self, conn: &Connection, now_ms: u64) -> Result<Vec<String>, StoreError> {
        self.reclaim(conn, now_ms, now_ms)
    }

    /// Boot reclaim by the root's one writer (it holds the root lock): every
    /// CLAIMED lease belongs to a process that died, expired or not, so all
    /// are reclaimed at once instead of waiting out their leases.
    pub fn reclaim_orphaned(&self, conn: &Connection, now_ms: u64) -> Result<Vec<String>, StoreError> {
        // The largest time SQLite can hold (u64 binds are range-checked).
        self.reclaim(conn, now_ms, i64::MAX.unsigned_abs())
    }

    fn reclaim(&self, conn: &Connection, now_ms: u64, expired_by: u64) -> Result<Vec<String>, StoreError> {
        let tx = WriteTx::begin(conn).map_err(sql("trigger reclaim begin"))?;
        let ids = {
            let mut stmt = tx
                .prepare_cached(
                    "SELECT id FROM triggers WHERE status = 'CLAIMED' AND lease_until <= ?1 \
                     ORDER BY rowid",
                )
                .map_err(sql("trigger reclaim select"))?;
            let rows = stmt
                .query_map([expired_by], |r| r.get::<_, String>(0))
                .map_err(sql("trigger reclaim select"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(sql("trigger reclaim select"))?
        };
        // Nothing expired (the common boot): the write lock held since the
        // select guarantees the update would match nothing; skip it.
        if !ids.is_empty() {
            tx.execute_cached(
                // A trigger dead-lettered here never got an ack: say why
                // (a DEAD row always carries its reason).
                "UPDATE triggers SET status = CASE WHEN attempts >= ?2 THEN 'DEAD' ELSE 'PENDING' END, \
                 last_error = CASE WHEN attempts >= ?2 THEN \
                 'attempt ' || attempts || ' of ' || ?2 || ' lost its lease (the process running it died)' || \
                 CASE WHEN last_error IS NULL THEN '' ELSE '; the last error before it: ' || last_error END \
                 ELSE last_error END, \
                 lease_until = NULL, updated_at = ?1 WHERE status = 'CLAIMED' AND lease_until <= ?3",
                params![now_ms, self.policy.max_attempts, expired_by],
            )
            .map_err(sql("trigger reclaim update"))?;
        }
        tx.commit().map_err(sql("trigger reclaim commit"))?;
        if !ids.is_empty() {
            tracing::info!(count = ids.len(), "reclaimed expired trigger leases");
        }
        Ok(ids)
    }

    /// Rehydration on boot: every PENDING trigger in run order, each with
    /// its overdue note relative to `now`.
    pub fn pending(&self, conn: &Connection, now_ms: u64) -> Result<Vec<Trigger>, StoreError> {
        self.select(
            conn,
            "WHERE status = 'PENDING' ORDER BY fire_at, priority, rowid",
            now_ms,
        )
    }

    /// Every trigger, in insertion order (diagnostics and checkers).
    pub fn all(&self, conn: &Connection, now_ms: u64) -> Result<Vec<Trigger>, StoreError> {
        self.select(conn, "ORDER BY rowid", now_ms)
    }

    /// One trigger by id.
    pub fn get(&self, conn: &Connection, id: &str, now_ms: u64) -> Result<Option<Trigger>, StoreError> {
        let raw = conn
            .query_row_cached(
                &format!("SELECT {COLUMNS} FROM triggers WHERE id = ?1"),
                [id],
                raw_row,
            )
            .optional()
            .map_err(sql("trigger get"))?;
        raw.map(|r| decode(r, &self.policy, now_ms)).transpose()
    }

    fn select(&self, conn: &Connection, tail: &str, now_ms: u64) -> Result<Vec<Trigger>, StoreError> {
        let mut stmt = conn
            .prepare_cached(&format!("SELECT {COLUMNS} FROM triggers {tail}"))
            .map_err(sql("trigger select"))?;
        let raws = stmt
            .query_map([], raw_row)
            .map_err(sql("trigger select"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql("trigger select"))?;
        raws.into_iter()
            .map(|r| decode(r, &self.policy, now_ms))
            .collect()
    }
}
