//! The orchestrator: agents, the agent tree, inboxes, turns, the `Provider`
//! trait and tools. Synchronous API; every persisted byte goes through the
//! [`crate::fs::Fs`] seam.
//!
//! Invariant (the contract of [`Runtime`]): an operation that returns `Ok`
//! is durable (acknowledged means durable); one that returns an I/O error
//! has an unknown outcome, poisons the runtime (every later call returns
//! [`RuntimeError::Poisoned`]) and must be followed by [`Runtime::open`],
//! which runs [`crate::recovery`]. Acknowledgement points:
//! - `create_root`: after `agent.created` is fsynced in the new session's log.
//! - `spawn_child`: once it has a provider slot (refused with
//!   [`RuntimeError::SlotsBusy`] before anything changes, the tree
//!   included), the child is added to the in-memory tree; its session and
//!   `agent.created` are the deferred part of the spawn, run before
//!   `spawn_child` returns (in this synchronous API the call is the
//!   parent's turn boundary). A crash before `agent.created` is durable
//!   makes the child vanish: it was never acknowledged.
//! - `run_turn`: after `turn.complete` is fsynced; an unfinished turn is
//!   dropped from the conversation on recovery.
//! - `send_message`: after `message.enqueued` is fsynced in the RECIPIENT's
//!   log, before the inbox sees it.
//! - `deliver`: after one `message.delivered` entry naming every collected
//!   message is fsynced; until then recovery re-injects them (re-delivery).
//! - an orchestration tool call (`spawn_agent`, `send_message`): its
//!   result names the ids its effect uses and is durable before the
//!   effect; a send is enqueued in the same step, a spawn's child created
//!   after the turn's `turn.complete`, and open completes what a crash
//!   left missing — each effect exactly once ([`orchestration`]).
//! - `terminate`: refused while the agent has live children; otherwise
//!   after `agent.terminated` is fsynced, then the record goes TERMINATED
//!   and the node leaves the tree.

mod agent;
pub mod context;
#[cfg(feature = "fakes")]
mod fake;
pub mod hooks;
pub mod ids;
pub mod inbox;
mod messaging;
pub mod orchestration;
mod orchestrator;
pub mod provider;
mod slots;
pub mod state;
pub mod tools;
pub mod tree;
pub mod turn;
pub mod turn_task;

use std::sync::Arc;

pub(crate) use agent::AgentSlot;
#[cfg(feature = "fakes")]
pub use fake::FakeProvider;
pub use hooks::{HookDecision, HookEvent, HookEventKind, Hooks, NoHooks, PreToolUse, Resumed};
pub use ids::{AgentId, MessageId, SessionId};
pub use inbox::Message;
pub use orchestration::{Orchestration, OrchestrationTool};
pub use orchestrator::Runtime;
pub use provider::{NoProvider, Provider, ProviderError, ProviderReply, ProviderRequest, ToolRequest, Usage};
pub use state::{AgentView, RuntimeState};
pub use tools::{
    idempotency_key, turn_identity, work_idempotency_key, NoRetries, PureTools, ToolContext, ToolError,
    ToolExecutor, ToolOutput, ToolRetries,
};
pub use tree::{AgentTree, TreeError};
pub use turn::{ConversationItem, OpenTurn, TurnOutcome, WorkTurn};
pub use turn_task::{
    CallResult, Outside, OutsideCall, ProviderCall, Started, ToolJob, TurnKind, TurnStep, TurnTask,
};

use crate::canary::Canaries;
use crate::log::LogError;
use crate::store::session::SessionError;

/// Configuration of a [`Runtime`]. All behaviour is a function of these
/// fields and the disk: no wall clock, no OS randomness.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Seed of the id prefix (and of the default fake provider).
    pub seed: u64,
    /// Provider slots: at most this many sessions are ACTIVE; the least
    /// recently used one is suspended to make room (LRU eviction).
    pub slots: usize,
    /// Bound on provider rounds (tool call batches) within one turn.
    pub max_tool_rounds: u32,
    /// Known bugs to re-introduce (empty in production).
    pub canaries: Canaries,
    /// The LLM.
    pub provider: Arc<dyn Provider>,
    /// Where tool calls are executed (the activity ledger plugs in here).
    pub tools: Arc<dyn ToolExecutor>,
    /// Where every provider call's usage, and every failure with its
    /// attempt number, is persisted (the stores plug in here).
    pub calls: Arc<dyn CallLog>,
    /// Asked before each round's calls are decided, told about the rest
    /// of a turn (see [`hooks`]).
    pub hooks: Arc<dyn Hooks>,
    /// What one provider request may carry ([`context`]); the default,
    /// no budget, sends the whole conversation.
    pub context_budget: context::ContextBudget,
    /// The orchestration tools the runtime performs itself
    /// ([`orchestration`]); `None` (the default): none, every call goes
    /// to `tools`.
    pub orchestration: Option<Orchestration>,
}

/// Where a provider call happened.
#[derive(Debug, Clone, Copy)]
pub struct CallSite<'a> {
    pub agent: &'a AgentId,
    pub session: &'a SessionId,
    /// The turn's number in the agent's conversation (completed turns
    /// before it).
    pub turn: u64,
    pub round: u32,
}

/// Persists what provider calls cost and how they failed (seed 000). A
/// failure to persist is an unknown outcome: the runtime poisons itself
/// (persistence failures are never swallowed).
pub trait CallLog: Send + Sync + std::fmt::Debug {
    /// A completion returned, with its usage if the provider reported it.
    fn completed(&self, at: &CallSite<'_>, usage: Option<Usage>) -> Result<(), String>;
    /// A completion failed: record it with its attempt number — how many
    /// failures of the same call (agent session, turn, round) are already
    /// recorded, 0 for the first — and return that number. The turn is
    /// its number (completed turns before it), so two turns started at
    /// one number (one failed and set aside, then another) share a count:
    /// the failures at that point of the conversation. Kept where the
    /// failures are (the store), never in memory: a restart between two
    /// failures of one call must not number both 0.
    fn failed(&self, at: &CallSite<'_>, error: &str) -> Result<u32, String>;
}

/// Records nothing (a runtime without stores).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoCallLog;

impl CallLog for NoCallLog {
    fn completed(&self, _at: &CallSite<'_>, _usage: Option<Usage>) -> Result<(), String> {
        Ok(())
    }
    fn failed(&self, _at: &CallSite<'_>, _error: &str) -> Result<u32, String> {
        Ok(0)
    }
}

#[cfg(feature = "fakes")]
fn default_provider(seed: u64) -> Arc<dyn Provider> {
    Arc::new(FakeProvider::new(seed))
}

#[cfg(not(feature = "fakes"))]
fn default_provider(_seed: u64) -> Arc<dyn Provider> {
    Arc::new(NoProvider)
}

impl RuntimeConfig {
    /// Defaults: 3 slots, 4 tool rounds, [`PureTools`], no canaries, no
    /// call log, and a provider that refuses — or, with the `fakes` feature
    /// (tests), `FakeProvider` from `seed`.
    pub fn new(seed: u64) -> Self {
        RuntimeConfig {
            seed,
            slots: 3,
            max_tool_rounds: 4,
            canaries: Canaries::none(),
            provider: default_provider(seed),
            tools: Arc::new(PureTools),
            calls: Arc::new(NoCallLog),
            hooks: Arc::new(NoHooks),
            context_budget: context::ContextBudget::default(),
            orchestration: None,
        }
    }

    /// Same config with `canaries` enabled.
    pub fn with_canaries(mut self, canaries: Canaries) -> Self {
        self.canaries = canaries;
        self
    }

    /// Same config with `slots` provider slots.
    pub fn with_slots(mut self, slots: usize) -> Self {
        self.slots = slots;
        self
    }
}

/// A runtime operation failed. I/O variants mean "outcome unknown: reopen".
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    Tree(#[from] TreeError),
    #[error("agent {0} does not exist (never created, vanished in a crash, or terminated)")]
    UnknownAgent(AgentId),
    #[error("provider failed in the turn of agent {agent}: {source}")]
    Provider {
        agent: AgentId,
        #[source]
        source: ProviderError,
    },
    #[error(
        "tool executor failed in the turn of agent {agent}: {source} (outcome unknown: reopen to recover)"
    )]
    Tool {
        agent: AgentId,
        #[source]
        source: ToolError,
    },
    /// The turn reached an irreversible call that needs a human's
    /// confirmation ([`ToolError::NeedsConfirmation`]) and stopped there:
    /// its `tool.call` is logged with no result and the turn stays open,
    /// exactly as a crash at that point would leave it, so the same turn
    /// (same prompt, or same work) resumes once the key is answered
    /// (`System::confirm`). Not an I/O error: the runtime stays usable.
    #[error("the turn of agent {agent} is blocked: {tool} {idem_key} needs confirmation by a human (answer it, then run the turn again)")]
    NeedsConfirmation {
        agent: AgentId,
        tool: String,
        idem_key: String,
    },
    #[error(
        "agent {agent}: the provider still asked for tools after {limit} rounds; the turn was abandoned"
    )]
    TooManyToolRounds { agent: AgentId, limit: u32 },
    #[error("persisting the provider call of agent {agent}: {cause} (outcome unknown: reopen to recover)")]
    CallLog { agent: AgentId, cause: String },
    /// The agent has a turn in flight ([`Runtime::start_turn`]): a second
    /// turn, an eviction or a termination waits until it ends.
    #[error("agent {0} has a turn in flight; try again when it ends")]
    TurnInFlight(AgentId),
    /// Every provider slot is held by an agent with a turn in flight.
    #[error("all {limit} provider slots have a turn in flight; try again when one ends")]
    SlotsBusy { limit: usize },
    /// A turn step was handed to a turn that is not in flight (it ended
    /// with an error, or the runtime was reopened): a caller's bug.
    #[error("agent {0}: no such turn in flight (it ended, or the runtime was reopened)")]
    TurnNotInFlight(AgentId),
    #[error("runtime is poisoned by an earlier failure ({cause}); its outcome is unknown: reopen with Runtime::open to recover")]
    Poisoned { cause: String },
    #[error("recovery: {0}")]
    Recovery(String),
    /// In-memory data could not be serialized (a bug: it is plain data).
    #[error("cannot serialize {what}: {source}")]
    Serialize {
        what: String,
        #[source]
        source: serde_json::Error,
    },
}

impl RuntimeError {
    /// Whether this error leaves the disk in an unknown state (the runtime
    /// poisons itself).
    pub fn is_unknown_outcome(&self) -> bool {
        matches!(
            self,
            RuntimeError::Log(_)
                | RuntimeError::Session(_)
                | RuntimeError::Tool { .. }
                | RuntimeError::CallLog { .. }
        )
    }
}
