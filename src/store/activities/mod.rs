//! The activity ledger for irreversible tools (seed 001 §6.4, table
//! `activity_log`): `INTENT` is committed *before* the side effect, the
//! stable idempotency key travels to the provider, `DONE`/`FAILED` with the
//! provider's reference is committed after.
//!
//! Invariant: no irreversible side effect is sent twice for one key by this
//! module. A key with a committed `INTENT` and no result is only ever re-sent
//! to a provider that deduplicates by key; without dedup it becomes
//! `NEEDS_CONFIRMATION` and waits for a human ([`ActivityStore::resolve`]),
//! never blindly re-run. An unknown provider answer leaves `INTENT` in place.
//!
//! A human answers NEEDS_CONFIRMATION with [`ActivityStore::confirm`]
//! (`confirm.rs`: delivered, not delivered, abandon); settled rows are
//! collected after a TTL by [`ActivityStore::gc_keeping`] (`gc.rs`: never INTENT or
//! NEEDS_CONFIRMATION), their payloads stripped after a shorter one by
//! [`ActivityStore::strip_payloads`] (same rows, same rules).

use rusqlite::{params, Connection, OptionalExtension};

use crate::canary::{Canaries, Canary};
use crate::store::cached::CachedSql;
use crate::store::schema::{sql, str_enum, StoreError};
use crate::world::{DeliveryError, Outbox};

mod confirm;
mod gate;
mod gc;

pub use confirm::{Resolution, ABANDONED};
pub use gate::ActivityGate;
pub use gc::{GcReport, StripReport, STRIPPED_JSON};

str_enum! {
    /// Ledger state of one irreversible action.
    pub enum ActivityStatus in "activity_log"."status" {
        /// Recorded before the side effect; its outcome is not yet known.
        Intent = "INTENT",
        Done = "DONE",
        /// The provider refused: nothing happened.
        Failed = "FAILED",
        /// An INTENT whose provider cannot dedup: a human must say whether
        /// it happened.
        NeedsConfirmation = "NEEDS_CONFIRMATION",
    }
}

/// One irreversible action the runtime wants performed.
#[derive(Debug, Clone, PartialEq)]
pub struct IrreversibleCall {
    /// Stable across restarts: the same action must carry the same key.
    pub idem_key: String,
    pub task_id: String,
    pub action: String,
    pub payload: serde_json::Value,
}

impl IrreversibleCall {
    /// With a key the caller already holds stably (the runtime's
    /// `ToolContext::idempotency_key`, derived from its event log).
    pub fn with_key(idem_key: &str, task_id: &str, action: &str, payload: serde_json::Value) -> Self {
        IrreversibleCall {
            idem_key: idem_key.to_string(),
            task_id: task_id.to_string(),
            action: action.to_string(),
            payload,
        }
    }
}

/// A ledger row.
#[derive(Debug, Clone, PartialEq)]
pub struct ActivityRecord {
    pub idem_key: String,
    pub task_id: String,
    pub action: String,
    pub payload: serde_json::Value,
    pub status: ActivityStatus,
    pub provider_ref: Option<String>,
    pub error: Option<String>,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
}

/// What happened to an irreversible call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActivityOutcome {
    /// The effect happened once; `from_ledger` when it was already DONE and
    /// nothing was sent now.
    Done {
        idem_key: String,
        provider_ref: String,
        from_ledger: bool,
    },
    /// The provider refused; nothing happened.
    Failed { idem_key: String, error: String },
    /// It may have happened and the provider cannot dedup: ask a human.
    NeedsConfirmation { idem_key: String },
}

/// Errors of the ledger: store failures, or a provider whose answer was lost.
#[derive(Debug, thiserror::Error)]
pub enum ActivityError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The provider did not answer: INTENT stays; run recovery before retrying.
    #[error("provider outcome unknown for {idem_key}; INTENT kept, recovery decides")]
    DeliveryUnknown { idem_key: String },
}

/// The activity ledger. Stateless apart from its canaries.
#[derive(Debug, Clone, Default)]
pub struct ActivityStore {
    pub canaries: Canaries,
}

impl ActivityStore {
    pub fn new(canaries: Canaries) -> Self {
        ActivityStore { canaries }
    }

    /// Perform `call` at most once: the entry point for the runtime's tool
    /// executor. Idempotent in the key: calling it again after a crash
    /// returns the recorded result, re-sends only to a deduplicating
    /// provider, and otherwise surfaces `NeedsConfirmation`.
    pub fn execute_irreversible(
        &self,
        conn: &Connection,
        outbox: &dyn Outbox,
        call: &IrreversibleCall,
        now_ms: u64,
    ) -> Result<ActivityOutcome, ActivityError> {
        let idem_key = call.idem_key.clone();
        if let Some(rec) = self.get(conn, &idem_key)? {
            return self.resume_record(conn, outbox, rec, now_ms);
        }
        if self.canaries.has(Canary::SideEffectBeforeIntent) {
            // Canary: the side effect runs first; a crash before the INTENT
            // commits leaves no trace of it, so a restart sends it again.
            let sent = outbox.send(&idem_key, &call.action, &call.payload);
            self.record_intent(conn, call, &idem_key, now_ms)?;
            return self.finish(conn, &idem_key, sent, now_ms);
        }
        self.record_intent(conn, call, &idem_key, now_ms)?;
        let sent = outbox.send(&idem_key, &call.action, &call.payload);
        self.finish(conn, &idem_key, sent, now_ms)
    }

    /// Boot recovery: settle every INTENT left by a crash. With a
    /// deduplicating provider it is re-sent with the same key; without one it
    /// becomes NEEDS_CONFIRMATION. Returns one outcome per INTENT found;
    /// a provider that still does not answer leaves the INTENT for next time.
    pub fn recover(
        &self,
        conn: &Connection,
        outbox: &dyn Outbox,
        now_ms: u64,
    ) -> Result<Vec<ActivityOutcome>, ActivityError> {
        let mut outcomes = Vec::new();
        for rec in self.with_status(conn, ActivityStatus::Intent)? {
            match self.resume_record(conn, outbox, rec, now_ms) {
                Ok(o) => outcomes.push(o),
                Err(ActivityError::DeliveryUnknown { idem_key }) => {
                    tracing::warn!(idem_key, "provider still silent; INTENT kept");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(outcomes)
    }

    fn resume_record(
        &self,
        conn: &Connection,
        outbox: &dyn Outbox,
        rec: ActivityRecord,
        now_ms: u64,
    ) -> Result<ActivityOutcome, ActivityError> {
        let idem_key = rec.idem_key;
        match rec.status {
            ActivityStatus::Done => Ok(ActivityOutcome::Done {
                idem_key,
                provider_ref: rec.provider_ref.unwrap_or_default(),
                from_ledger: true,
            }),
            ActivityStatus::Failed => Ok(ActivityOutcome::Failed {
                idem_key,
                error: rec.error.unwrap_or_default(),
            }),
            ActivityStatus::NeedsConfirmation => Ok(ActivityOutcome::NeedsConfirmation { idem_key }),
            ActivityStatus::Intent if outbox.supports_dedup(&rec.action) => {
                tracing::info!(idem_key, "re-sending INTENT with its key to a dedup provider");
                let sent = outbox.send(&idem_key, &rec.action, &rec.payload);
                self.finish(conn, &idem_key, sent, now_ms)
            }
            ActivityStatus::Intent => {
                self.set_status(
                    conn,
                    &idem_key,
                    ActivityStatus::NeedsConfirmation,
                    None,
                    None,
                    now_ms,
                )?;
                tracing::warn!(idem_key, "INTENT without provider dedup: needs confirmation");
                Ok(ActivityOutcome::NeedsConfirmation { idem_key })
            }
        }
    }

    fn record_intent(
        &self,
        conn: &Connection,
        call: &IrreversibleCall,
        idem_key: &str,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let payload = serde_json::to_string(&call.payload).map_err(|source| StoreError::Json {
            what: format!("activity payload for {idem_key}"),
            source,
        })?;
        // Autocommit: returns only after the INTENT is committed.
        conn.execute_cached(
            "INSERT INTO activity_log (idem_key, task_id, action, payload_json, status, \
             created_at, updated_at) VALUES (?1, ?2, ?3, ?4, 'INTENT', ?5, ?5)",
            params![idem_key, call.task_id, call.action, payload, now_ms],
        )
        .map_err(sql("activity record intent"))?;
        Ok(())
    }

    fn finish(
        &self,
        conn: &Connection,
        idem_key: &str,
        sent: Result<String, DeliveryError>,
        now_ms: u64,
    ) -> Result<ActivityOutcome, ActivityError> {
        match sent {
            Ok(provider_ref) => {
                self.set_status(
                    conn,
                    idem_key,
                    ActivityStatus::Done,
                    Some(&provider_ref),
                    None,
                    now_ms,
                )?;
                Ok(ActivityOutcome::Done {
                    idem_key: idem_key.to_string(),
                    provider_ref,
                    from_ledger: false,
                })
            }
            Err(DeliveryError::Rejected { reason, .. }) => {
                self.set_status(
                    conn,
                    idem_key,
                    ActivityStatus::Failed,
                    None,
                    Some(&reason),
                    now_ms,
                )?;
                Ok(ActivityOutcome::Failed {
                    idem_key: idem_key.to_string(),
                    error: reason,
                })
            }
            Err(DeliveryError::Unknown { .. }) => Err(ActivityError::DeliveryUnknown {
                idem_key: idem_key.to_string(),
            }),
        }
    }

    fn set_status(
        &self,
        conn: &Connection,
        idem_key: &str,
        status: ActivityStatus,
        provider_ref: Option<&str>,
        error: Option<&str>,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        conn.execute_cached(
            "UPDATE activity_log SET status = ?2, provider_ref = COALESCE(?3, provider_ref), \
             error = COALESCE(?4, error), updated_at = ?5 WHERE idem_key = ?1",
            params![idem_key, status.as_str(), provider_ref, error, now_ms],
        )
        .map_err(sql("activity set status"))?;
        Ok(())
    }

    /// One ledger row by key.
    pub fn get(&self, conn: &Connection, idem_key: &str) -> Result<Option<ActivityRecord>, StoreError> {
        let raw = conn
            .query_row_cached(
                &format!("SELECT {COLUMNS} FROM activity_log WHERE idem_key = ?1"),
                [idem_key],
                raw_row,
            )
            .optional()
            .map_err(sql("activity get"))?;
        raw.map(decode).transpose()
    }

    /// Every row with `status`, oldest first.
    pub fn with_status(
        &self,
        conn: &Connection,
        status: ActivityStatus,
    ) -> Result<Vec<ActivityRecord>, StoreError> {
        let raws = conn
            .query_all_cached(
                &format!("SELECT {COLUMNS} FROM activity_log WHERE status = ?1 ORDER BY created_at, rowid"),
                [status.as_str()],
                raw_row,
            )
            .map_err(sql("activity select"))?;
        raws.into_iter().map(decode).collect()
    }
}

const COLUMNS: &str =
    "idem_key, task_id, action, payload_json, status, provider_ref, error, created_at, updated_at";

type RawActivity = (
    String,
    String,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    u64,
    u64,
);

fn raw_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawActivity> {
    RawActivity::try_from(r)
}

fn decode(raw: RawActivity) -> Result<ActivityRecord, StoreError> {
    let (idem_key, task_id, action, payload_json, status, provider_ref, error, created, updated) = raw;
    let payload = serde_json::from_str(&payload_json).map_err(|source| StoreError::Json {
        what: format!("activity_log.payload_json of {idem_key}"),
        source,
    })?;
    Ok(ActivityRecord {
        status: ActivityStatus::parse(&status)?,
        idem_key,
        task_id,
        action,
        payload,
        provider_ref,
        error,
        created_at_ms: created,
        updated_at_ms: updated,
    })
}
