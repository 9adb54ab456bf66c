//! The requests a client sends, one method each: what it asks and what it
//! remembers of the answer (turns and emits to ask again, agents and
//! schedules of its own to delete, triggers it retried).
//!
//! Invariant: every request goes through [`Client::call`], which records
//! it; a method changes the client's memory only by the answer it got.

use durable_agent::store::activities::Resolution;
use durable_agent::worker::gc::GcRequest;
use durable_agent::worker::ops::{
    ConfirmRequest, CreateAgent, EmitRequest, MessageRequest, Request, TurnRequest,
};
use durable_agent::worker::schedule::Schedule;
use rand::Rng;
use serde_json::Value;

use super::super::provider::POISON;
use super::super::Op;
use super::{Answer, Client, Emit};

/// Which of its requests a client asks again first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Prefer {
    /// One whose answer was lost (a retry).
    Unsure,
    /// One acknowledged (a duplicate).
    Acked,
}

/// A one-time trigger's prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TriggerKind {
    Plain,
    /// The provider always fails on it (keyed `c{client}p{n}`, so aimed
    /// crashes leave it alone): it dies DEAD, for a human to retry.
    Poisoned,
}

/// How a human answers a call that needs confirmation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Human {
    /// As the world says (now and then giving up instead).
    Honest,
    /// Gives up on it (abandon).
    GivesUp,
}

impl Client {
    async fn turn(&mut self, agent: String, work_id: String) {
        let op = Op::Turn {
            agent: agent.clone(),
            work_id: work_id.clone(),
        };
        let request = Request::Turn(
            agent.clone(),
            TurnRequest {
                prompt: format!("task {work_id}"),
                work_id: Some(work_id.clone()),
            },
        );
        match self.call(op, request).await {
            Answer::Ok(_) => self.acked.push((agent, work_id)),
            Answer::Refused | Answer::Lost => self.unsure.push((agent, work_id)),
        }
    }

    /// The status, for the requests that act on what it lists.
    async fn status(&self) -> Option<Value> {
        match self.call(Op::Status, Request::Status).await {
            Answer::Ok(v) => Some(v),
            _ => None,
        }
    }

    /// Answer the first key `status` lists as needing confirmation, as an
    /// honest human would: look it up in the world (their outbox) and say
    /// what happened; now and then (always, for [`Human::GivesUp`]) give
    /// up on it instead.
    async fn confirm_from(&mut self, status: &Value, human: Human) {
        let Some(key) = status["needs_confirmation"][0]["idem_key"].as_str() else {
            return;
        };
        let key = key.to_string();
        let (delivered, provider_ref) = match self.ctx.world.honest_answer(&key) {
            Resolution::Delivered { provider_ref } => (true, Some(provider_ref)),
            _ => (false, None),
        };
        let abandon = human == Human::GivesUp || self.rng.random_bool(0.2);
        let op = Op::Confirm {
            key: key.clone(),
            delivered,
            abandon,
        };
        let request = Request::Confirm(ConfirmRequest {
            idem_key: key,
            delivered,
            provider_ref,
            abandon,
        });
        self.call(op, request).await;
    }

    /// Read the status and answer what waits for a human there.
    pub(super) async fn confirm(&mut self, human: Human) {
        if let Some(status) = self.status().await {
            self.confirm_from(&status, human).await;
        }
    }

    /// Retry the first trigger the status lists with one of `statuses`
    /// (DEAD, FAILED) that this client has not retried before, as an
    /// operator would (one whose retry died again is left for a closer
    /// look). `false`: none was listed.
    pub(super) async fn retry_stuck(&mut self, statuses: &[&str]) -> bool {
        let Some(status) = self.status().await else {
            return true;
        };
        let stuck = statuses.iter().find_map(|s| {
            let listed = status["triggers"][*s].as_array()?;
            let id = listed
                .iter()
                .filter_map(|t| t["id"].as_str())
                .find(|id| !self.retried.contains(*id))?;
            Some((id.to_string(), s.to_string()))
        });
        let Some((id, status)) = stuck else { return false };
        self.retried.insert(id.clone());
        let op = Op::RetryTrigger {
            id: id.clone(),
            status,
        };
        self.call(op, Request::RetryTrigger(id)).await;
        true
    }

    pub(super) async fn new_turn(&mut self) {
        let (agent, work) = (self.worker(), self.name("t"));
        self.turn(agent, work).await;
    }

    /// Ask a turn again: one whose outcome is unknown (a client retry,
    /// the same work id whatever happened) or an acknowledged one (must
    /// answer `already_done`), `prefer`red first. `false`: there is none.
    pub(super) async fn turn_again(&mut self, prefer: Prefer) -> bool {
        let unsure_first = prefer == Prefer::Unsure;
        let list = match (unsure_first && !self.unsure.is_empty(), self.acked.is_empty()) {
            (true, _) => &mut self.unsure,
            (false, false) => &mut self.acked,
            (false, true) if !self.unsure.is_empty() => &mut self.unsure,
            (false, true) => return false,
        };
        let i = self.rng.random_range(0..list.len());
        let (agent, work) = list.swap_remove(i);
        self.turn(agent, work).await;
        true
    }

    pub(super) async fn message(&mut self) {
        let (from, to) = (self.worker(), self.worker());
        // Bracketed: found in a prompt that quotes it by a substring search.
        let payload = format!("[{}]", self.name("m"));
        let op = Op::Message {
            from: from.clone(),
            to: to.clone(),
            payload: payload.clone(),
        };
        let request = Request::Message(MessageRequest { from, to, payload });
        self.call(op, request).await;
    }

    async fn emit(&mut self, emit: Emit) {
        let op = Op::Emit {
            key: emit.key.clone(),
            agent: emit.agent.clone(),
            delay_ms: emit.delay_ms,
        };
        let request = Request::Emit(EmitRequest {
            dedup_key: emit.key.clone(),
            fire_at_ms: None,
            delay_ms: Some(emit.delay_ms),
            agent: emit.agent.clone(),
            prompt: emit.prompt.clone(),
        });
        match self.call(op, request).await {
            Answer::Ok(_) if !self.emits.iter().any(|e| e.key == emit.key) => self.emits.push(emit),
            Answer::Ok(_) => {}
            // A careful producer emits again with the same key.
            Answer::Lost => self.unsure_emits.push(emit),
            Answer::Refused => {}
        }
    }

    /// A new one-time trigger.
    pub(super) async fn emit_new(&mut self, kind: TriggerKind) {
        let poison = kind == TriggerKind::Poisoned;
        let key = self.name(if poison { "p" } else { "e" });
        let agent = self.worker();
        let delay_ms = self.rng.random_range(0..=120_000u64);
        let mut prompt = format!("trigger {key}");
        if poison {
            prompt.push_str(&format!(" {POISON}"));
            self.poisoned_at = Some(self.ctx.clock.now_ms());
        }
        self.emit(Emit {
            key,
            agent,
            delay_ms,
            prompt,
        })
        .await;
    }

    /// Emit a key again: one whose answer was lost (a retry) if
    /// `prefer`red and there is one, else an acknowledged one (an
    /// at-least-once producer's duplicate: must be answered `duplicate`).
    /// `false`: there is none.
    pub(super) async fn emit_again(&mut self, prefer: Prefer) -> bool {
        let emit = if prefer == Prefer::Unsure && !self.unsure_emits.is_empty() {
            let i = self.rng.random_range(0..self.unsure_emits.len());
            self.unsure_emits.swap_remove(i)
        } else if !self.emits.is_empty() {
            let i = self.rng.random_range(0..self.emits.len());
            self.emits[i].clone()
        } else {
            return false;
        };
        self.emit(emit).await;
        true
    }

    pub(super) async fn create_agent(&mut self) {
        let name = self.name("a");
        let op = Op::CreateAgent {
            name: name.clone(),
            parent: Some("lead".into()),
        };
        let request = Request::CreateAgent(CreateAgent {
            name: name.clone(),
            instructions: String::new(),
            parent: Some("lead".into()),
        });
        if let Answer::Ok(_) = self.call(op, request).await {
            self.agents.push(name);
        }
    }

    /// Delete an agent this client created; `false`: it has none.
    pub(super) async fn delete_agent(&mut self) -> bool {
        if self.agents.is_empty() {
            return false;
        }
        let name = self.agents.swap_remove(0);
        let op = Op::DeleteAgent { name: name.clone() };
        self.call(op, Request::DeleteAgent(name)).await;
        true
    }

    pub(super) async fn add_schedule(&mut self) {
        let id = self.name("s");
        let period_ms = self.rng.random_range(60_000..=240_000u64);
        self.add_schedule_as(id, period_ms).await;
    }

    async fn add_schedule_as(&mut self, id: String, period_ms: u64) {
        let agent = self.worker();
        let op = Op::AddSchedule {
            id: id.clone(),
            agent: agent.clone(),
            period_ms,
        };
        let request = Request::AddSchedule(Schedule {
            id: id.clone(),
            agent,
            prompt: format!("schedule {id}"),
            period_ms,
        });
        if let Answer::Ok(_) = self.call(op, request).await {
            self.schedules.push(id);
        }
    }

    /// An operator changes the period of a schedule this client added:
    /// a different definition under an existing id is refused, so it is
    /// deleted, then added again with the new period (a new schedule,
    /// which fires in its current bucket). `false`: it has none.
    pub(super) async fn reschedule(&mut self) -> bool {
        if self.schedules.is_empty() {
            return false;
        }
        let id = self.schedules.swap_remove(0);
        let period_ms = self.rng.random_range(60_000..=240_000u64);
        let op = Op::DeleteSchedule { id: id.clone() };
        if let Answer::Ok(_) = self.call(op, Request::DeleteSchedule(id.clone())).await {
            self.add_schedule_as(id, period_ms).await;
        }
        true
    }

    /// Delete a schedule this client added; `false`: it has none.
    pub(super) async fn delete_schedule(&mut self) -> bool {
        if self.schedules.is_empty() {
            return false;
        }
        let id = self.schedules.swap_remove(0);
        let op = Op::DeleteSchedule { id: id.clone() };
        self.call(op, Request::DeleteSchedule(id)).await;
        true
    }

    pub(super) async fn gc(&self) {
        // Settled rows older than a day: none in a simulated run, so the
        // oracle's rows stay; the pass itself is exercised.
        let day = 86_400_000;
        let request = Request::Gc(GcRequest {
            ttl_ms: day,
            payload_ttl_ms: day,
        });
        self.call(Op::Gc, request).await;
    }
}
