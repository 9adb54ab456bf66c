//! The observable state the oracle compares: agents, conversations,
//! pending and delivered messages.
//!
//! Invariant: a pure function of the runtime's in-memory state, in
//! deterministic order (BTreeMaps), holding every live agent as a key of
//! every map, so two runtimes with equal histories compare equal.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::store::session::SessionState;

use super::ids::{AgentId, MessageId, SessionId};
use super::inbox::Message;
use super::turn::ConversationItem;
use super::Runtime;

/// One live agent as the oracle sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentView {
    pub name: String,
    pub instructions: String,
    pub parent: Option<AgentId>,
    pub session_id: SessionId,
    pub session_state: SessionState,
}

/// Snapshot of everything acknowledged operations determine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeState {
    pub agents: BTreeMap<AgentId, AgentView>,
    /// Completed turns, per agent.
    pub conversations: BTreeMap<AgentId, Vec<ConversationItem>>,
    /// Enqueued, not yet delivered messages, in enqueue order.
    pub pending: BTreeMap<AgentId, Vec<Message>>,
    /// Ids of messages delivered to each agent.
    pub delivered: BTreeMap<AgentId, BTreeSet<MessageId>>,
}

impl RuntimeState {
    /// The same state with ACTIVE shown as SUSPENDED: recovery suspends
    /// every session, and which ones hold a slot is not durable state.
    pub fn normalized(&self) -> RuntimeState {
        let mut s = self.clone();
        for view in s.agents.values_mut() {
            if view.session_state == SessionState::Active {
                view.session_state = SessionState::Suspended;
            }
        }
        s
    }
}

impl Runtime {
    /// The observable state (see [`RuntimeState`]).
    pub fn state(&self) -> RuntimeState {
        let mut state = RuntimeState {
            agents: BTreeMap::new(),
            conversations: BTreeMap::new(),
            pending: BTreeMap::new(),
            delivered: BTreeMap::new(),
        };
        for (id, slot) in &self.agents {
            state.agents.insert(
                id.clone(),
                AgentView {
                    name: slot.name.clone(),
                    instructions: slot.instructions.clone(),
                    parent: slot.parent.clone(),
                    session_id: slot.record.session_id.clone(),
                    session_state: slot.record.state,
                },
            );
            state.conversations.insert(id.clone(), slot.conversation.clone());
            state.pending.insert(id.clone(), self.inbox.peek(id).to_vec());
            state.delivered.insert(id.clone(), slot.delivered.clone());
        }
        state
    }

    /// In-memory invariant violations (empty when healthy): tree links,
    /// agents and tree agree, the LRU holds exactly the ACTIVE agents.
    pub fn check_invariants(&self) -> Vec<String> {
        let mut out = self.tree.violations();
        for id in self.tree.nodes().keys() {
            if !self.agents.contains_key(id) {
                out.push(format!("agent {id} is in the tree but has no session"));
            }
        }
        for (id, slot) in &self.agents {
            if !self.tree.contains(id) {
                out.push(format!("agent {id} has a session but is not in the tree"));
            }
            let active = slot.record.state == SessionState::Active;
            if active != self.lru.contains(id) {
                out.push(format!("agent {id}: ACTIVE={active} disagrees with the LRU"));
            }
        }
        if self.lru.len() > self.config.slots.max(1) {
            out.push(format!(
                "{} ACTIVE sessions exceed {} slots",
                self.lru.len(),
                self.config.slots
            ));
        }
        out
    }
}
