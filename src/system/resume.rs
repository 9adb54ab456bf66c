//! Boot's last step (seed 001 §6.3/§8): every work an agent started and
//! never completed — a job run (`run:{id}`), an API turn with a work id
//! (`api:{id}`), interrupted or since superseded by another turn — becomes
//! a RESUME trigger, emitted with the dedup key `resume:{work}@{agent}` and the
//! prompt the work began with, whose firing runs that same work again
//! ([`super::System::trigger_work`]): the turn continues after its last
//! completed round with the same idempotency keys, or only acks if the
//! work completed meanwhile (e.g. `run --resume` by hand).
//!
//! Invariants: a work is resumed by at most one trigger — a second boot
//! (or a boot after the trigger ran) finds the key and emits nothing, so a
//! double boot cannot double-resume; a trigger's own turn (`trigger:…`) is
//! never given one, its trigger is reclaimed instead; plain turns (no work)
//! are not resumed behind the caller's back — the caller that retries the
//! same prompt resumes them, and a second, automatic resume could run the
//! prompt twice.
//!
//! A work finished by hand (`run --resume`) settles its own RESUME trigger
//! ([`super::System::settle_resume`]: PENDING → DONE only), so no trigger
//! is left PENDING for a work that is done; had it stayed, its firing would
//! only have found the work done and acked.

use std::sync::Mutex;

use serde_json::json;

use crate::runtime::{AgentId, Runtime};
use crate::sqlite::Db;
use crate::store::triggers::{EmitOutcome, Trigger, TriggerSource, TriggerSpec, TriggerStore};
use crate::store::StoreError;

use super::{lock_db, System};

/// The dedup key of the RESUME trigger of `agent`'s `work`. Work ids are
/// scoped to their agent (the API's `work_id` is the caller's), so the
/// key names both: with the work alone, a second agent's interrupted work
/// of the same id was deduped away at every boot and never resumed.
pub fn resume_key(agent: &AgentId, work: &str) -> String {
    format!("resume:{work}@{agent}")
}

/// The work and the agent (its id as written) a RESUME key names — the
/// inverse of [`resume_key`] — or `None` for any other key.
pub fn resume_key_parts(key: &str) -> Option<(&str, &str)> {
    key.strip_prefix("resume:")?.rsplit_once('@')
}

/// The work a RESUME trigger resumes (its payload's `work`), if it is one.
pub(super) fn resumed_work(trigger: &Trigger) -> Option<&str> {
    if trigger.source != TriggerSource::Resume {
        return None;
    }
    trigger.payload.get("work").and_then(serde_json::Value::as_str)
}

/// Emit the RESUME triggers of `runtime`'s interrupted work turns; returns
/// the dedup keys of the new ones (in agent order).
pub(super) fn emit_resumes(
    runtime: &Runtime,
    triggers: &TriggerStore,
    db: &Mutex<Db>,
    now_ms: u64,
) -> Result<Vec<String>, StoreError> {
    let mut emitted = Vec::new();
    for agent in runtime.tree().nodes().keys() {
        let Ok(unfinished) = runtime.unfinished_work(agent) else {
            continue;
        };
        for (work, prompt) in unfinished {
            // A trigger's own turn is resumed by re-claiming its trigger.
            if work.starts_with("trigger:") {
                continue;
            }
            let key = resume_key(agent, work);
            let spec = TriggerSpec {
                source: TriggerSource::Resume,
                dedup_key: Some(key.clone()),
                session_id: runtime.session_id(agent).map(|s| s.to_string()),
                fire_at_ms: now_ms,
                priority: 0,
                description: format!("resume the interrupted {work}"),
                payload: json!({"agent": agent.as_str(), "prompt": prompt, "work": work}),
            };
            let db = lock_db(db);
            if let EmitOutcome::Inserted(_) = triggers.emit(db.conn(), &spec, now_ms)? {
                tracing::info!(%agent, work, "interrupted work: RESUME trigger emitted");
                emitted.push(key);
            }
        }
    }
    Ok(emitted)
}

impl System {
    /// The work `work` of `agent` completed outside its RESUME trigger
    /// (`run --resume` finished it): settle that trigger DONE if it is
    /// still PENDING (one guarded transaction; a CLAIMED or settled one is
    /// left alone). Returns the settled trigger, `None` if there was none.
    pub fn settle_resume(&self, agent: &AgentId, work: &str) -> Result<Option<Trigger>, StoreError> {
        let key = resume_key(agent, work);
        let now = self.now_ms();
        let db = self.db();
        self.triggers().settle_pending(db.conn(), &key, now)
    }
}
