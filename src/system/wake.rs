//! Wake-ups: an agent with a pending message gets a turn that reads it.
//! [`System::emit_wakeups`] emits, for a recipient's pending messages in
//! enqueue order, one MESSAGE trigger per message keyed by its id
//! (`wake:{message_id}`) whose payload names the recipient, a prompt
//! quoting the message and the message it reads; firing it
//! ([`System::start_fire`]) runs the work `trigger:wake:{message_id}` as a
//! turn that reads that message (`TurnKind::WorkReading`), so the message
//! counts as delivered only with the turn's `turn.complete`.
//!
//! A recipient's messages are woken one at a time, in enqueue order: the
//! wake-up of message M is emitted only once every message enqueued to its
//! recipient before M is delivered or has a wake-up that was given up
//! (its trigger no longer PENDING or CLAIMED: DEAD after its attempts,
//! FAILED — blocked on a human, or a permanent error). So while an earlier
//! message's wake-up fails and backs off, no later wake-up exists to run
//! ahead of it and supersede its turn (found by a review: the second
//! message was delivered while the first's turn waited out its backoff).
//! A wake-up given up holds nothing back — a message the model cannot
//! answer must not starve the ones after it; its message stays pending,
//! never lost, for the next turn that reads pending messages (an API
//! turn) or its own wake-up once an operator re-pends it. Those are the
//! only ways past an undelivered earlier message: an API turn reads every
//! pending message at once, in enqueue order.
//!
//! Invariants: a wake-up is never lost — the message is durable in the
//! recipient's log before it is pending, and every pass walks every
//! recipient's pending messages and emits the wake-up of each that the
//! process has not emitted one for, up to and including the first whose
//! wake-up is still live (a restarted process has emitted none: its first
//! pass emits again, the dedup key absorbing the ones a crash left
//! behind) — and never doubled: one trigger per message id (the dedup
//! key), whose turn is one work (a completed one is never run again, an
//! interrupted one resumes). A wake-up whose message another turn read
//! meanwhile runs no turn (acked as already done). Order holds across a
//! crash because the pass decides from durable state only — the inbox
//! (rebuilt from the logs) and the trigger rows — and emitting is
//! idempotent: a crash before the emit leaves nothing, one after it a
//! trigger the next pass finds by its key; a delivery is never undone and
//! a trigger never goes back to live by itself, so a wake-up once allowed
//! stays allowed, and one not yet allowed is emitted by whichever pass
//! (of this process or the next) first finds its predecessors done.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use crate::runtime::{AgentId, Message, MessageId, Started, TurnKind};
use crate::store::triggers::{EmitOutcome, Trigger, TriggerSource, TriggerSpec, TriggerStatus};
use crate::store::StoreError;

use super::{System, SystemError};

/// The dedup key of the wake-up trigger of message `message`. Message ids
/// are unique in a root, so the key needs no agent.
pub fn wake_key(message: &MessageId) -> String {
    format!("wake:{message}")
}

/// The wake-ups this process already emitted (or found emitted): the
/// trigger id of each pending message's, so a pass writes nothing for it
/// again; only pending messages are remembered.
#[derive(Debug, Default, Clone)]
pub struct WakeUps {
    emitted: BTreeMap<MessageId, String>,
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
    /// Emit the wake-ups due (see the module docs): for each recipient,
    /// walking its pending messages in enqueue order, the wake-up of every
    /// message `wakeups` has not seen, up to and including the first whose
    /// wake-up is still live. Returns the keys of the triggers inserted now.
    pub fn emit_wakeups(&self, wakeups: &mut WakeUps) -> Result<Vec<String>, StoreError> {
        let runtime = self.runtime();
        let mut pending = BTreeSet::new();
        let mut inserted = Vec::new();
        for agent in runtime.tree().nodes().keys() {
            let mut held = false;
            for message in runtime.pending(agent) {
                pending.insert(message.id.clone());
                if held {
                    continue;
                }
                let live = match wakeups.emitted.get(&message.id) {
                    Some(id) => self.wake_live(id)?,
                    None => {
                        let (id, new) = self.emit_wakeup(message)?;
                        if new {
                            inserted.push(wake_key(&message.id));
                        }
                        // A row inserted now is PENDING; one found may be
                        // settled already.
                        let live = new || self.wake_live(&id)?;
                        wakeups.emitted.insert(message.id.clone(), id);
                        live
                    }
                };
                // A live wake-up holds every later message of its
                // recipient back: theirs run after it, never ahead.
                held = live;
            }
        }
        wakeups.emitted.retain(|m, _| pending.contains(m));
        Ok(inserted)
    }

    /// Emit `message`'s wake-up trigger: its id, and whether it was
    /// inserted now (else the dedup key found it).
    fn emit_wakeup(&self, message: &Message) -> Result<(String, bool), StoreError> {
        let runtime = self.runtime();
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
            dedup_key: Some(key),
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
        Ok(match self.triggers().emit(self.db().conn(), &spec, now)? {
            EmitOutcome::Inserted(id) => {
                tracing::info!(agent = %message.to, message = %message.id, "wake-up trigger emitted");
                (id, true)
            }
            EmitOutcome::Duplicate(id) => (id, false),
        })
    }

    /// Whether the wake-up trigger `id` may still run (PENDING, backing
    /// off included, or CLAIMED). A settled one — given up, or a row GC
    /// collected — holds no later message back.
    fn wake_live(&self, id: &str) -> Result<bool, StoreError> {
        let row = self.triggers().get(self.db().conn(), id, self.now_ms())?;
        Ok(row.is_some_and(|t| matches!(t.status, TriggerStatus::Pending | TriggerStatus::Claimed)))
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
