//! Provider slots: LRU eviction (`suspend.result`, record SUSPENDED) and
//! restore on next use (`session.restored`, record ACTIVE).
//!
//! Invariant: at most `max(1, config.slots)` agents are ACTIVE, and `lru`
//! lists exactly the ACTIVE ones, least recently used first.

use crate::log::Event;
use crate::store::session::SessionState;

use super::ids::AgentId;
use super::{Runtime, RuntimeError};

impl Runtime {
    fn slot_limit(&self) -> usize {
        self.config.slots.max(1)
    }

    /// Suspend least recently used agents (never `keep`, never one with a
    /// turn in flight) until one more session fits.
    pub(super) fn make_room(&mut self, keep: Option<&AgentId>) -> Result<(), RuntimeError> {
        while self.lru.len() >= self.slot_limit() {
            let victim = self
                .lru
                .iter()
                .find(|a| Some(*a) != keep && self.agents.get(*a).is_some_and(|s| s.in_turn.is_none()))
                .cloned();
            let Some(victim) = victim else {
                return Err(RuntimeError::SlotsBusy {
                    limit: self.slot_limit(),
                });
            };
            self.suspend(&victim)?;
        }
        Ok(())
    }

    fn suspend(&mut self, agent: &AgentId) -> Result<(), RuntimeError> {
        let blob = serde_json::to_string(&self.slot(agent)?.conversation).map_err(|source| {
            RuntimeError::Serialize {
                what: format!("the conversation of {agent}"),
                source,
            }
        })?;
        self.log_to(
            agent,
            Event::SuspendResult {
                state_size: blob.len() as u64,
            },
        )?;
        let now = self.clock.now();
        let slot = self.slot_mut(agent)?;
        slot.record.state = SessionState::Suspended;
        slot.record.provider_state = Some(blob);
        slot.record.updated_ts = now;
        let record = slot.record.clone();
        self.store.write(&record)?;
        self.lru.retain(|a| a != agent);
        tracing::debug!(%agent, "session suspended (LRU)");
        Ok(())
    }

    /// Make `agent`'s session ACTIVE (restoring it if suspended) and most
    /// recently used.
    pub(super) fn acquire(&mut self, agent: &AgentId) -> Result<(), RuntimeError> {
        if self.slot(agent)?.record.state == SessionState::Active {
            self.lru.retain(|a| a != agent);
            self.lru.push(agent.clone());
            return Ok(());
        }
        self.make_room(Some(agent))?;
        let event = Event::SessionRestored {
            provider: self.config.provider.name().to_string(),
            model: self.config.provider.model().to_string(),
        };
        self.log_to(agent, event)?;
        let now = self.clock.now();
        let slot = self.slot_mut(agent)?;
        slot.record.state = SessionState::Active;
        // The conversation is rebuilt from the log; a kept blob would go stale.
        slot.record.provider_state = None;
        slot.record.updated_ts = now;
        let record = slot.record.clone();
        self.store.write(&record)?;
        self.lru.push(agent.clone());
        tracing::debug!(%agent, "session restored");
        Ok(())
    }

    /// Suspend `agent`'s session now (the LRU would do it when slots run
    /// out). A no-op when it is already suspended.
    pub fn evict(&mut self, agent: &AgentId) -> Result<(), RuntimeError> {
        self.live()?;
        if self.slot(agent)?.record.state != SessionState::Active {
            return Ok(());
        }
        if self.slot(agent)?.in_turn.is_some() {
            return Err(RuntimeError::TurnInFlight(agent.clone()));
        }
        let r = self.suspend(agent);
        self.poison_on(r)
    }

    /// Restore `agent`'s session now (run_turn does it on demand).
    pub fn restore(&mut self, agent: &AgentId) -> Result<(), RuntimeError> {
        self.live()?;
        let r = self.acquire(agent);
        self.poison_on(r)
    }
}
