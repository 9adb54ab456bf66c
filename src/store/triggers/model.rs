//! The trigger record, its spec, policy and outcomes, and row decoding.
//!
//! Invariant: every stored value decodes to a typed value or a typed
//! [`StoreError`] naming the row; nothing here panics on bad data.

use rusqlite::Row;

use crate::store::schema::{str_enum, StoreError};

str_enum! {
    /// Who produced a trigger (replaces stringly `payload["type"]`).
    pub enum TriggerSource in "triggers"."source" {
        Message = "MESSAGE", Scheduled = "SCHEDULED", Immediate = "IMMEDIATE",
        Memory = "MEMORY", Proactive = "PROACTIVE", Resume = "RESUME",
        LivingUi = "LIVING_UI", SkillWorkflow = "SKILL_WORKFLOW",
        Onboarding = "ONBOARDING", System = "SYSTEM",
    }
}

str_enum! {
    /// Lifecycle state of a trigger.
    pub enum TriggerStatus in "triggers"."status" {
        Pending = "PENDING", Claimed = "CLAIMED", Done = "DONE",
        /// Permanently failed (the consumer said retrying is pointless).
        Failed = "FAILED",
        /// Dead-lettered after `max_attempts`.
        Dead = "DEAD",
    }
}

/// What a producer asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct TriggerSpec {
    pub source: TriggerSource,
    /// Idempotency key (`scheduled:{id}:{bucket}`, `resume:{task}`…); `None`
    /// only for one-off user messages.
    pub dedup_key: Option<String>,
    pub session_id: Option<String>,
    pub fire_at_ms: u64,
    /// Tiebreak among triggers due at the same time; lower runs first.
    pub priority: i64,
    pub description: String,
    pub payload: serde_json::Value,
}

/// A stored trigger.
#[derive(Debug, Clone, PartialEq)]
pub struct Trigger {
    pub id: String,
    pub source: TriggerSource,
    pub dedup_key: Option<String>,
    pub session_id: Option<String>,
    pub fire_at_ms: u64,
    pub not_before_ms: Option<u64>,
    pub priority: i64,
    pub description: String,
    pub payload: serde_json::Value,
    pub status: TriggerStatus,
    pub attempts: u32,
    pub lease_until_ms: Option<u64>,
    pub last_error: Option<String>,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// Set when the trigger is handed out later than `fire_at + overdue_grace`:
    /// the catch-up note (seed 001 §6.2) for the agent to judge, for any source.
    pub overdue_by_ms: Option<u64>,
}

impl Trigger {
    /// The agent-facing catch-up note, if the trigger is overdue.
    pub fn overdue_note(&self) -> Option<String> {
        self.overdue_by_ms.map(|late| {
            format!(
                "this {} trigger was due at {} ms and fires {late} ms late (after a restart or \
                 backlog); use judgment whether it still applies",
                self.source.as_str(),
                self.fire_at_ms
            )
        })
    }
}

/// Result of [`TriggerStore::emit`](super::TriggerStore::emit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmitOutcome {
    /// A new trigger row with this id was committed.
    Inserted(String),
    /// A trigger with the same dedup key already exists (any status).
    Duplicate(String),
}

impl EmitOutcome {
    /// The id of the trigger that carries the spec's key.
    pub fn id(&self) -> &str {
        match self {
            EmitOutcome::Inserted(id) | EmitOutcome::Duplicate(id) => id,
        }
    }
}

/// Retry, lease and catch-up limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TriggerPolicy {
    /// Claims allowed before a failing trigger is dead-lettered.
    pub max_attempts: u32,
    /// Backoff after failed attempt `a` (1-based) is `base * 2^(a-1)`, capped.
    pub backoff_base_ms: u64,
    pub backoff_cap_ms: u64,
    /// Lateness tolerated before a trigger carries an overdue note.
    pub overdue_grace_ms: u64,
}

impl Default for TriggerPolicy {
    fn default() -> Self {
        TriggerPolicy {
            max_attempts: 5,
            backoff_base_ms: 1_000,
            backoff_cap_ms: 3_600_000,
            overdue_grace_ms: 60_000,
        }
    }
}

impl TriggerPolicy {
    /// Delay before the next attempt after `attempts` failed ones.
    pub fn backoff_ms(&self, attempts: u32) -> u64 {
        let exp = attempts.saturating_sub(1).min(32);
        self.backoff_base_ms
            .saturating_mul(1u64 << exp)
            .min(self.backoff_cap_ms)
    }
}

pub(super) const COLUMNS: &str = "id, source, dedup_key, session_id, fire_at, not_before, priority, \
    description, payload_json, status, attempts, lease_until, last_error, created_at, updated_at";

/// Decode a stored row; the overdue note is relative to `now_ms`.
pub(super) fn decode(raw: RawTrigger, policy: &TriggerPolicy, now_ms: u64) -> Result<Trigger, StoreError> {
    let payload = serde_json::from_str(&raw.payload_json).map_err(|source| StoreError::Json {
        what: format!("triggers.payload_json of {}", raw.id),
        source,
    })?;
    let due = raw.fire_at.saturating_add(policy.overdue_grace_ms);
    Ok(Trigger {
        source: TriggerSource::parse(&raw.source)?,
        status: TriggerStatus::parse(&raw.status)?,
        overdue_by_ms: (now_ms > due).then(|| now_ms - raw.fire_at),
        id: raw.id,
        dedup_key: raw.dedup_key,
        session_id: raw.session_id,
        fire_at_ms: raw.fire_at,
        not_before_ms: raw.not_before,
        priority: raw.priority,
        description: raw.description.unwrap_or_default(),
        payload,
        attempts: raw.attempts,
        lease_until_ms: raw.lease_until,
        last_error: raw.last_error,
        created_at_ms: raw.created_at,
        updated_at_ms: raw.updated_at,
    })
}

/// A row as stored, before enum/JSON decoding (which can fail with a typed
/// error, unlike a rusqlite row mapper).
pub(super) struct RawTrigger {
    pub(super) id: String,
    source: String,
    dedup_key: Option<String>,
    session_id: Option<String>,
    fire_at: u64,
    not_before: Option<u64>,
    priority: i64,
    description: Option<String>,
    payload_json: String,
    status: String,
    attempts: u32,
    lease_until: Option<u64>,
    last_error: Option<String>,
    created_at: u64,
    updated_at: u64,
}

pub(super) fn raw_row(r: &Row<'_>) -> rusqlite::Result<RawTrigger> {
    Ok(RawTrigger {
        id: r.get(0)?,
        source: r.get(1)?,
        dedup_key: r.get(2)?,
        session_id: r.get(3)?,
        fire_at: r.get(4)?,
        not_before: r.get(5)?,
        priority: r.get(6)?,
        description: r.get(7)?,
        payload_json: r.get(8)?,
        status: r.get(9)?,
        attempts: r.get(10)?,
        lease_until: r.get(11)?,
        last_error: r.get(12)?,
        created_at: r.get(13)?,
        updated_at: r.get(14)?,
    })
}
