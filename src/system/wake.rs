//! Wake-ups: an agent with a pending message gets a turn that reads it.
//! [`System::emit_wakeups`] emits, for every pending message, one MESSAGE
//! trigger keyed by the message id (`wake:{message_id}`) whose payload
//! names the recipient, a prompt quoting the message and the message it
//! reads; firing it ([`System::start_fire`]) runs the work
//! `trigger:wake:{message_id}` as a turn that reads that message
//! (`TurnKind::WorkReading`), so the message counts as delivered only with
//! the turn's `turn.complete`.
//!
//! Invariants: a wake-up is never lost — the message is durable in the
//! recipient's log before it is pending, and every pass emits a trigger for
//! every pending message the process has not emitted one for (a restarted
//! process, none: its first pass emits for all, the dedup key absorbing the
//! ones a crash left behind) — and never doubled: one trigger per message
//! id (the dedup key), whose turn is one work (a completed one is never
//! run again, an interrupted one resumes). A wake-up whose message another
//! turn read meanwhile runs no turn (acked as already done).

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::runtime::{AgentId, MessageId, Started, TurnKind};
use crate::store::triggers::{EmitOutcome, Trigger, TriggerSource, TriggerSpec};
use crate::store::StoreError;

use super::{System, SystemError};

/// The dedup key of the wake-up trigger of message `message`. Message ids
/// are unique in a root, so the key needs no agent.
pub fn wake_key(message: &MessageId) -> String {
    format!("wake:{message}")
}

/// The messages this process already emitted a wake-up for (a pass writes
/// nothing for them again); only pending ones are remembered.
#[derive(Debug, Default, Clone)]
pub struct WakeUps {
    emitted: BTreeSet<MessageId>,
}

/// The messages a wake-up trigger reads (its payload's `reads`), if it is
/// one.
pub(super) fn wake_reads(trigger: &Trigger) -> Option<Vec<MessageId>> {
    if trigger.source != TriggerSource::Message {
        return None;
    }
    let reads = trigger.payload.get("reads")?.as_array()?;
    reads
        .iter()
        .map(|v| v.as_str().and_then(|s| MessageId::from_hex(s).ok()))
        .collect()
}

impl System {
    /// Emit a wake-up trigger for every pending message `wakeups` has not
    /// seen (see the module docs). Returns the keys of the triggers
    /// inserted now.
    pub fn emit_wakeups(&self, wakeups: &mut WakeUps) -> Result<Vec<String>, StoreError> {
        let runtime = self.runtime();
        let mut pending = BTreeSet::new();
        let mut todo = Vec::new();
        for agent in runtime.tree().nodes().keys() {
            for message in runtime.pending(agent) {
                pending.insert(message.id.clone());
                if !wakeups.emitted.contains(&message.id) {
                    todo.push(message.clone());
                }
            }
        }
        wakeups.emitted.retain(|m| pending.contains(m));
        let mut inserted = Vec::new();
        for message in todo {
            let key = wake_key(&message.id);
            let from = runtime
                .tree()
                .get(&message.from)
                .map_or_else(|| format!("agent {}", message.from), |n| n.name.clone());
            let prompt = format!(
                "Message {} from {from} ({}):\n{}",
                message.id, message.from, message.payload
            );
            let now = self.now_ms();
            let spec = TriggerSpec {
                source: TriggerSource::Message,
                dedup_key: Some(key.clone()),
                session_id: runtime.session_id(&message.to).map(ToString::to_string),
                fire_at_ms: now,
                priority: 0,
                description: format!("wake {} for message {} from {from}", message.to, message.id),
                payload: json!({
                    "agent": message.to.as_str(),
                    "prompt": prompt,
                    "reads": [Value::String(message.id.to_string())],
                }),
            };
            let outcome = self.triggers().emit(self.db().conn(), &spec, now)?;
            if let EmitOutcome::Inserted(_) = outcome {
                tracing::info!(agent = %message.to, message = %message.id, "wake-up trigger emitted");
                inserted.push(key);
            }
            wakeups.emitted.insert(message.id);
        }
        Ok(inserted)
    }

    /// Start a wake-up's turn: the work reading `reads` — or nothing, if
    /// no turn of it started and another turn read them meanwhile.
    pub(super) fn start_wake(
        &mut self,
        agent: &AgentId,
        prompt: &str,
        work: &str,
        reads: &[MessageId],
    ) -> Result<Started, SystemError> {
        let runtime = self.runtime();
        let started = runtime.started_work_prompt(agent, work)?.is_some();
        let done = runtime.work_done(agent, work)?;
        let pending = runtime.pending(agent).iter().any(|m| reads.contains(&m.id));
        if !done && !started && !pending {
            tracing::info!(%agent, work, "wake-up: its message was read by another turn; no turn");
            return Ok(Started::AlreadyDone);
        }
        let kind = TurnKind::WorkReading(work, reads);
        Ok(self.runtime_mut().start_turn(agent, prompt, kind)?)
    }
}
