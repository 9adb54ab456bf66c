//! The in-memory record of one live agent (its session, log writer and
//! derived conversation).
//!
//! Invariant: every field is derivable from the session's `session.json`
//! and `events.jsonl` (recovery rebuilds it from them).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use crate::log::EventLog;
use crate::store::session::SessionRecord;

use super::ids::{AgentId, MessageId};
use super::turn::{ConversationItem, OpenTurn};

/// One live agent.
#[derive(Debug, Clone)]
pub(crate) struct AgentSlot {
    pub name: String,
    pub instructions: String,
    pub parent: Option<AgentId>,
    pub record: SessionRecord,
    pub log: EventLog,
    /// Completed turns only.
    pub conversation: Vec<ConversationItem>,
    pub delivered: BTreeSet<MessageId>,
    /// Work ids (`turn.start`'s `work`) whose turn completed, with the
    /// turn's items in `conversation` (its stored answer).
    pub done_work: BTreeMap<String, Range<usize>>,
    /// Work ids whose turn started and never completed, with the prompt
    /// it first started with and the messages it read: a retry of the work
    /// runs that prompt again, so its calls keep their idempotency keys even
    /// after another turn superseded the interrupted one (see
    /// [`super::Runtime::started_work_prompt`]).
    pub started_work: BTreeMap<String, StartedWork>,
    /// The interrupted turn, up to its last completed round (and its
    /// decided round's completed calls).
    pub open: Option<OpenTurn>,
    /// Interrupted turns a newer turn superseded, each cut back like
    /// `open`: running one of them again (same prompt and work) continues
    /// it, from its durable decisions, never from a new ask.
    pub parked: Vec<OpenTurn>,
    /// The token of the turn in flight (started, not finished or
    /// abandoned): the agent is pinned to its slot and refuses a second
    /// turn, eviction and termination until it ends. Process state.
    pub in_turn: Option<u64>,
}

/// A work turn that started and never completed (see
/// [`AgentSlot::started_work`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartedWork {
    pub prompt: String,
    /// The pending messages it read (in its prompt), delivered only with
    /// its `turn.complete`.
    pub reads: Vec<MessageId>,
}
