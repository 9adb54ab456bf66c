//! Per-agent inboxes of enqueued, not yet delivered messages.
//!
//! Invariant: a message is in an inbox only after its `message.enqueued`
//! entry is durable in the recipient's log, and leaves it only through
//! [`Inboxes::collect`]; order is enqueue order.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ids::{AgentId, MessageId};

/// A message between two agents.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Message {
    pub id: MessageId,
    pub from: AgentId,
    pub to: AgentId,
    pub payload: String,
}

/// Inboxes by recipient.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inboxes {
    boxes: BTreeMap<AgentId, Vec<Message>>,
}

impl Inboxes {
    pub fn push(&mut self, message: Message) {
        self.boxes.entry(message.to.clone()).or_default().push(message);
    }

    /// The pending messages of `agent`, in order (without removing them).
    pub fn peek(&self, agent: &AgentId) -> &[Message] {
        self.boxes.get(agent).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Drain `agent`'s inbox.
    pub fn collect(&mut self, agent: &AgentId) -> Vec<Message> {
        self.boxes.remove(agent).unwrap_or_default()
    }

    /// Put collected messages back at the front (a delivery that failed).
    pub fn restore_front(&mut self, agent: &AgentId, mut messages: Vec<Message>) {
        let rest = self.boxes.remove(agent).unwrap_or_default();
        messages.extend(rest);
        if !messages.is_empty() {
            self.boxes.insert(agent.clone(), messages);
        }
    }

    /// Take the messages of `agent` named in `ids` (in inbox order), leaving
    /// the rest in order.
    pub fn take(&mut self, agent: &AgentId, ids: &[MessageId]) -> Vec<Message> {
        let Some(all) = self.boxes.remove(agent) else {
            return Vec::new();
        };
        let (taken, rest): (Vec<Message>, Vec<Message>) = all.into_iter().partition(|m| ids.contains(&m.id));
        if !rest.is_empty() {
            self.boxes.insert(agent.clone(), rest);
        }
        taken
    }

    /// Drop an agent's inbox (termination).
    pub fn drop_agent(&mut self, agent: &AgentId) {
        self.boxes.remove(agent);
    }
}
