//! [`Runtime`]: opening (with recovery), agent creation, spawn, termination.
//! Turns, messaging and slots live in sibling modules as further `impl`s.
//!
//! Invariant: the in-memory tree, agents and inboxes equal what recovery
//! would rebuild from disk after the last acknowledged operation; after an
//! unknown-outcome error the runtime is poisoned and refuses every call.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::fs::Fs;
use crate::log::{Event, EventLog, LogEntry};
use crate::recovery::{self, RecoveryReport};
use crate::store::session::{SessionRecord, SessionState, SessionStore, SESSION_SCHEMA_VERSION};

use super::ids::{AgentId, Clock, IdGen, SessionId};
use super::inbox::Inboxes;
use super::tree::AgentTree;
use super::{AgentSlot, RuntimeConfig, RuntimeError};

/// An agent to create, with its ids: fresh ones, or the ones a spawn
/// reserved in its call's logged result (see [`super::orchestration`]).
#[derive(Debug, Clone)]
pub(super) struct NewAgent<'a> {
    pub id: AgentId,
    pub session_id: SessionId,
    pub name: &'a str,
    pub instructions: &'a str,
    pub parent: Option<AgentId>,
}

/// Where a new agent's session starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Placement {
    /// ACTIVE, in a provider slot (evicting the least recently used).
    Active,
    /// SUSPENDED: no slot until its first turn restores it (a deferred
    /// spawn at a turn's end must not fail because every slot is busy).
    Suspended,
}

/// The durable agent runtime. See the [module docs](crate::runtime) for
/// each operation's acknowledgement point.
#[derive(Debug)]
pub struct Runtime {
    pub(super) fs: Arc<dyn Fs>,
    pub(super) root: PathBuf,
    pub(super) config: RuntimeConfig,
    pub(super) store: SessionStore,
    pub(super) ids: IdGen,
    pub(super) clock: Clock,
    pub(super) tree: AgentTree,
    pub(super) agents: BTreeMap<AgentId, AgentSlot>,
    pub(super) inbox: Inboxes,
    /// ACTIVE agents, least recently used first.
    pub(super) lru: Vec<AgentId>,
    pub(super) poisoned: Option<String>,
}

impl Runtime {
    /// Open the runtime rooted at `root`, running recovery first. Works on
    /// an empty or missing root (a fresh runtime).
    pub fn open(
        fs: Arc<dyn Fs>,
        root: &Path,
        config: RuntimeConfig,
    ) -> Result<(Runtime, RecoveryReport), RuntimeError> {
        let (recovered, mut report) = recovery::recover(&fs, root, &config)?;
        let mut ids = IdGen::new(config.seed);
        ids.observe(recovered.max_id_counter);
        let mut clock = Clock::default();
        clock.observe(recovered.max_ts);
        let mut runtime = Runtime {
            fs,
            root: root.to_path_buf(),
            config,
            store: recovered.store,
            ids,
            clock,
            tree: recovered.tree,
            agents: recovered.agents,
            inbox: recovered.inbox,
            lru: Vec::new(),
            poisoned: None,
        };
        // Ids the orchestration tools reserved in logged results are never
        // handed out again, and the effects those results promise are all
        // there before anything else runs (see `orchestration`).
        runtime.observe_reserved_ids();
        runtime.complete_orchestration(&mut report)?;
        Ok((runtime, report))
    }

    /// The runtime's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    /// The live agent tree.
    pub fn tree(&self) -> &AgentTree {
        &self.tree
    }

    /// Whether an earlier unknown-outcome error poisoned the runtime.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.is_some()
    }

    /// The session id of a live agent.
    pub fn session_id(&self, agent: &AgentId) -> Option<&super::SessionId> {
        self.agents.get(agent).map(|a| &a.record.session_id)
    }

    /// The session directory of a live agent.
    pub fn session_dir(&self, agent: &AgentId) -> Option<PathBuf> {
        self.agents
            .get(agent)
            .map(|a| self.store.dir(&a.record.session_id))
    }

    /// Create a root agent: session first, then `tree.add`, then
    /// `agent.created` (the acknowledgement point).
    pub fn create_root(&mut self, name: &str, instructions: &str) -> Result<AgentId, RuntimeError> {
        self.live()?;
        let r = self.create_agent(name, instructions, None);
        self.poison_on(r)
    }

    /// Spawn a child of `parent`: a provider slot (refused with
    /// [`RuntimeError::SlotsBusy`], leaving nothing behind, when every slot
    /// has a turn in flight), `tree.add`, then the deferred spawn (session
    /// + `agent.created`) before returning.
    pub fn spawn_child(
        &mut self,
        parent: &AgentId,
        name: &str,
        instructions: &str,
    ) -> Result<AgentId, RuntimeError> {
        self.live()?;
        if !self.agents.contains_key(parent) {
            return Err(RuntimeError::UnknownAgent(parent.clone()));
        }
        let r = self.create_agent(name, instructions, Some(parent.clone()));
        self.poison_on(r)
    }

    fn create_agent(
        &mut self,
        name: &str,
        instructions: &str,
        parent: Option<AgentId>,
    ) -> Result<AgentId, RuntimeError> {
        let id = self.ids.agent();
        let session_id = self.ids.session();
        let agent = NewAgent {
            id,
            session_id,
            name,
            instructions,
            parent,
        };
        self.create_with(agent, Placement::Active)
    }

    /// Create an agent under ids chosen before (see [`NewAgent`]), its
    /// session ACTIVE (taking a provider slot now, evicting the least
    /// recently used) or SUSPENDED (taking none until its first turn).
    ///
    /// A refusal that is not an unknown outcome (a parent that is not live,
    /// every slot held by a turn in flight: [`RuntimeError::SlotsBusy`])
    /// happens before anything changes — the tree included — so the
    /// runtime stays usable and its memory equals the disk (a child left
    /// in the tree without a session would pin its parent: it could never
    /// be terminated). Once the tree holds the node, every error is an I/O
    /// one and poisons the runtime.
    pub(super) fn create_with(
        &mut self,
        agent: NewAgent<'_>,
        placement: Placement,
    ) -> Result<AgentId, RuntimeError> {
        let NewAgent {
            id,
            session_id,
            name,
            instructions,
            parent,
        } = agent;
        // The refusals first: an unknown parent, then a busy slot (what it
        // suspends to make room is a complete, durable operation of its own).
        let parent_session_id = match &parent {
            Some(p) => Some(self.slot(p)?.record.session_id.clone()),
            None => None,
        };
        let state = match placement {
            Placement::Active => {
                self.make_room(None)?;
                SessionState::Active
            }
            Placement::Suspended => SessionState::Suspended,
        };
        if parent.is_some() {
            // Child: in the tree synchronously; durable only after the
            // deferred spawn below logs agent.created.
            self.tree.add(id.clone(), name.to_string(), parent.clone())?;
        }
        let record = SessionRecord {
            schema_version: SESSION_SCHEMA_VERSION,
            session_id: session_id.clone(),
            agent_id: id.clone(),
            provider: self.config.provider.name().to_string(),
            model: self.config.provider.model().to_string(),
            state,
            provider_state: None,
            updated_ts: self.clock.now(),
        };
        let dir = self.store.create(&record)?;
        let log = EventLog::create(self.fs.clone(), &dir, session_id, self.config.canaries.clone())?;
        if parent.is_none() {
            self.tree.add(id.clone(), name.to_string(), None)?;
        }
        self.agents.insert(
            id.clone(),
            AgentSlot {
                name: name.to_string(),
                instructions: instructions.to_string(),
                parent,
                record,
                log,
                conversation: Vec::new(),
                delivered: Default::default(),
                done_work: Default::default(),
                started_work: Default::default(),
                open: None,
                parked: Vec::new(),
                in_turn: None,
            },
        );
        if placement == Placement::Active {
            self.lru.push(id.clone());
        }
        let event = Event::AgentCreated {
            agent_id: id.clone(),
            name: name.to_string(),
            parent_session_id,
            instructions: instructions.to_string(),
        };
        self.log_to(&id, event)?;
        tracing::debug!(agent = %id, name, "agent created");
        Ok(id)
    }

    /// Terminate a leaf agent: `agent.terminated` (acknowledgement point),
    /// then the record goes TERMINATED, then the node leaves the tree. An
    /// agent with live children is refused ([`super::TreeError::HasChildren`]):
    /// terminate its children first.
    pub fn terminate(&mut self, agent: &AgentId) -> Result<(), RuntimeError> {
        self.live()?;
        let node = self
            .tree
            .get(agent)
            .ok_or_else(|| RuntimeError::UnknownAgent(agent.clone()))?;
        if self.agents.get(agent).is_some_and(|s| s.in_turn.is_some()) {
            return Err(RuntimeError::TurnInFlight(agent.clone()));
        }
        if !node.children.is_empty() {
            return Err(super::TreeError::HasChildren {
                agent: agent.clone(),
                count: node.children.len(),
            }
            .into());
        }
        let r = self.terminate_inner(agent);
        self.poison_on(r)
    }

    fn terminate_inner(&mut self, agent: &AgentId) -> Result<(), RuntimeError> {
        self.log_to(
            agent,
            Event::AgentTerminated {
                agent_id: agent.clone(),
            },
        )?;
        let now = self.clock.now();
        let slot = self.slot_mut(agent)?;
        slot.record.state = SessionState::Terminated;
        slot.record.updated_ts = now;
        let record = slot.record.clone();
        self.store.write(&record)?;
        self.tree.remove(agent)?;
        self.inbox.drop_agent(agent);
        self.agents.remove(agent);
        self.lru.retain(|a| a != agent);
        tracing::debug!(%agent, "agent terminated");
        Ok(())
    }

    pub(super) fn live(&self) -> Result<(), RuntimeError> {
        match &self.poisoned {
            Some(cause) => Err(RuntimeError::Poisoned { cause: cause.clone() }),
            None => Ok(()),
        }
    }

    pub(super) fn poison_on<T>(&mut self, r: Result<T, RuntimeError>) -> Result<T, RuntimeError> {
        if let Err(e) = &r {
            if e.is_unknown_outcome() {
                tracing::warn!(error = %e, "runtime poisoned: reopen to recover");
                self.poisoned = Some(e.to_string());
            }
        }
        r
    }

    pub(super) fn slot(&self, agent: &AgentId) -> Result<&AgentSlot, RuntimeError> {
        self.agents
            .get(agent)
            .ok_or_else(|| RuntimeError::UnknownAgent(agent.clone()))
    }

    pub(super) fn slot_mut(&mut self, agent: &AgentId) -> Result<&mut AgentSlot, RuntimeError> {
        self.agents
            .get_mut(agent)
            .ok_or_else(|| RuntimeError::UnknownAgent(agent.clone()))
    }

    /// Append `event` to `agent`'s log at the next logical tick.
    pub(super) fn log_to(&mut self, agent: &AgentId, event: Event) -> Result<LogEntry, RuntimeError> {
        let ts = self.clock.tick();
        let slot = self.slot_mut(agent)?;
        Ok(slot.log.append(ts, event)?)
    }
}
