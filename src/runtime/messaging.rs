//! Messages between agents: `send_message` and `deliver`.
//!
//! Invariant: `message.enqueued` is durable in the RECIPIENT's log before the
//! message enters its inbox (so an acknowledged enqueue is never lost), and
//! `message.delivered` is logged only after the inbox was drained, in one
//! entry per delivery (so a crash mid-delivery re-delivers everything
//! collected, never loses part of it).

use crate::canary::Canary;
use crate::log::Event;

use super::ids::{AgentId, MessageId};
use super::inbox::Message;
use super::{Runtime, RuntimeError};

impl Runtime {
    /// Send `payload` from `from` to `to`; acknowledged once the enqueue is
    /// durable in `to`'s log.
    pub fn send_message(
        &mut self,
        from: &AgentId,
        to: &AgentId,
        payload: &str,
    ) -> Result<MessageId, RuntimeError> {
        self.live()?;
        self.slot(from)?;
        self.slot(to)?;
        let r = self.send_inner(from, to, payload);
        self.poison_on(r)
    }

    fn send_inner(&mut self, from: &AgentId, to: &AgentId, payload: &str) -> Result<MessageId, RuntimeError> {
        let id = self.ids.message();
        self.enqueue(id, from, to, payload)
    }

    /// Enqueue message `id` (fresh, or reserved by an orchestration call's
    /// logged result): `message.enqueued` in `to`'s log, then the inbox.
    pub(super) fn enqueue(
        &mut self,
        id: MessageId,
        from: &AgentId,
        to: &AgentId,
        payload: &str,
    ) -> Result<MessageId, RuntimeError> {
        let event = Event::MessageEnqueued {
            message_id: id.clone(),
            sender: from.clone(),
            recipient: to.clone(),
            payload: payload.to_string(),
        };
        self.log_to(to, event)?;
        if self.config.canaries.has(Canary::DeliveredBeforeDelivery) {
            // CANARY: the delivery is recorded before the message ever
            // reaches the inbox, so recovery will not re-inject it.
            self.log_to(
                to,
                Event::MessageDelivered {
                    message_ids: vec![id.clone()],
                },
            )?;
        }
        self.inbox.push(Message {
            id: id.clone(),
            from: from.clone(),
            to: to.clone(),
            payload: payload.to_string(),
        });
        Ok(id)
    }

    /// The messages waiting for `agent` (not yet delivered), in order.
    pub fn pending(&self, agent: &AgentId) -> &[Message] {
        self.inbox.peek(agent)
    }

    /// Drain `agent`'s inbox and log the delivery; returns the messages.
    pub fn deliver(&mut self, agent: &AgentId) -> Result<Vec<Message>, RuntimeError> {
        self.live()?;
        self.slot(agent)?;
        let messages = self.inbox.collect(agent);
        if messages.is_empty() {
            return Ok(messages);
        }
        let ids: Vec<MessageId> = messages.iter().map(|m| m.id.clone()).collect();
        let r = self.log_to(
            agent,
            Event::MessageDelivered {
                message_ids: ids.clone(),
            },
        );
        if r.is_err() {
            self.inbox.restore_front(agent, messages);
            return self.poison_on(r.map(|_| Vec::new()));
        }
        self.slot_mut(agent)?.delivered.extend(ids);
        Ok(messages)
    }
}
