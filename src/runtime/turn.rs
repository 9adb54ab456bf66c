//! Turns: `turn.start`, provider rounds with `tool.call`/`tool.result` each
//! closed by a `round.complete` checkpoint, then `turn.complete`; resuming
//! an interrupted turn (`turn.resume`); rebuilding both from a log.
//!
//! Invariants: the conversation holds completed turns only — a turn whose
//! `turn.complete` is not durable is not in it, so memory and the rebuilt
//! log always agree. An interrupted turn is kept aside as the agent's
//! [`OpenTurn`], up to its last durable `round.complete` (a partial round is
//! rolled back); running the same turn again (same prompt, same work)
//! continues it from there, so completed rounds' provider calls are not
//! paid again and their tool calls are not re-executed, and the calls it
//! does repeat carry the same idempotency keys — and the same hook
//! verdicts (logged in the round's decision: a resumed round never asks
//! the hooks again, see [`super::hooks`]).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::log::{DecidedCall, Event, LogEntry};

use super::agent::StartedWork;
use super::ids::{AgentId, MessageId};
use super::provider::ToolRequest;
use super::tools::ToolOutput;
use super::turn_task::{Started, TurnKind};
use super::{Runtime, RuntimeError};

/// One item of an agent's conversation, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ConversationItem {
    Prompt {
        text: String,
    },
    ToolCall {
        call_id: String,
        tool: String,
        args: Value,
        irreversible: bool,
    },
    ToolResult {
        call_id: String,
        ok: bool,
        output: String,
    },
    Response {
        text: String,
    },
}

/// What a completed turn produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnOutcome {
    pub response: String,
    /// Each tool call with its call id and result, in order.
    pub tool_calls: Vec<(String, ToolRequest, ToolOutput)>,
}

/// An interrupted turn, up to its last completed round and, when the
/// model's decision for the round after it is durable, the calls of that
/// round that completed: what running the same turn again continues from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenTurn {
    pub prompt: String,
    pub work: Option<String>,
    /// The completed rounds' tool calls and results, then the completed
    /// calls of the decided round, in order (pairs of call and result).
    pub items: Vec<ConversationItem>,
    /// The round in progress: the decided one, or the next to ask the
    /// provider for.
    pub round: u32,
    /// How many of `items` the completed rounds hold (the round in
    /// progress starts there).
    pub round_start: usize,
    /// The model's durable decision for `round` (`round.decided`): a
    /// resumed turn runs its calls that have no result yet, in order, with
    /// their logged ids and keys, and never asks the model for `round`
    /// again. `None`: the model is asked for `round` (no call of it can
    /// have started: every call starts after its round's decision).
    pub decided: Option<Vec<DecidedCall>>,
}

impl OpenTurn {
    /// The decided calls that have no result yet, with their index in the
    /// round, in order.
    pub fn pending_calls(&self) -> Vec<(usize, DecidedCall)> {
        let Some(decided) = &self.decided else {
            return Vec::new();
        };
        let done: BTreeSet<&str> = self
            .items
            .iter()
            .filter_map(|i| match i {
                ConversationItem::ToolResult { call_id, .. } => Some(call_id.as_str()),
                _ => None,
            })
            .collect();
        decided
            .iter()
            .enumerate()
            .filter(|(_, c)| !done.contains(c.call_id.as_str()))
            .map(|(i, c)| (i, c.clone()))
            .collect()
    }

    /// Drop the decision and the calls of it that completed: the round is
    /// asked again (what the `ReaskDecidedRound` canary does).
    pub(super) fn forget_decision(&mut self) {
        self.items.truncate(self.round_start);
        self.decided = None;
    }

    fn identity(&self) -> (&str, Option<&str>) {
        (&self.prompt, self.work.as_deref())
    }
}

/// The (call id, request) of a decided call, as the tool executor gets it.
pub fn decided_request(call: &DecidedCall) -> ToolRequest {
    ToolRequest {
        tool: call.tool.clone(),
        args: call.args.clone(),
        irreversible: call.irreversible,
        invalid_args: call.invalid_args.clone(),
    }
}

/// Put `turn` aside (a newer turn superseded it), replacing an earlier
/// parked turn with the same prompt and work.
pub(super) fn park(parked: &mut Vec<OpenTurn>, turn: OpenTurn) {
    parked.retain(|p| p.identity() != turn.identity());
    parked.push(turn);
}

/// Take the parked turn with this prompt and work, if any.
pub(super) fn unpark(parked: &mut Vec<OpenTurn>, prompt: &str, work: Option<&str>) -> Option<OpenTurn> {
    let i = parked.iter().position(|p| p.identity() == (prompt, work))?;
    Some(parked.remove(i))
}

/// Everything the turns of a log leave behind, rebuilt in one pass (see
/// [`replay_turns`]).
#[derive(Debug, Default)]
pub(crate) struct ReplayedTurns {
    /// Completed turns only.
    pub conversation: Vec<ConversationItem>,
    /// The interrupted turn at the end of the log, cut back (see
    /// [`OpenTurn`]).
    pub open: Option<OpenTurn>,
    /// Interrupted turns a later turn superseded, cut back likewise.
    pub parked: Vec<OpenTurn>,
    /// Each completed work turn's items in `conversation`.
    pub done_work: BTreeMap<String, Range<usize>>,
    /// Work turns started and never completed.
    pub started_work: BTreeMap<String, StartedWork>,
}

/// Cut an interrupted turn back to what a resume continues from: with a
/// durable decision, the round's completed calls stay and a call in
/// flight (its `tool.call` without a result) goes; without one, the round
/// is rolled back to its last `round.complete`.
fn cut(mut turn: OpenTurn) -> OpenTurn {
    if turn.decided.is_some() {
        if matches!(turn.items.last(), Some(ConversationItem::ToolCall { .. })) {
            turn.items.pop();
        }
    } else {
        turn.items.truncate(turn.round_start);
    }
    turn
}

/// Replay the turn events of a log. The only rebuild of turns from disk:
/// what a turn does in memory (`turn_task`) is kept equal to it.
pub(crate) fn replay_turns(entries: &[LogEntry]) -> ReplayedTurns {
    let mut out = ReplayedTurns::default();
    let mut open: Option<OpenTurn> = None;
    for entry in entries {
        match &entry.event {
            Event::TurnStart { prompt, work, reads } => {
                if let Some(turn) = open.take() {
                    park(&mut out.parked, cut(turn));
                }
                if let Some(w) = work {
                    out.started_work.entry(w.clone()).or_insert_with(|| StartedWork {
                        prompt: prompt.clone(),
                        reads: reads.clone(),
                    });
                }
                open = Some(OpenTurn {
                    prompt: prompt.clone(),
                    work: work.clone(),
                    items: Vec::new(),
                    round: 0,
                    round_start: 0,
                    decided: None,
                });
            }
            Event::RoundDecided { round, calls } => {
                if let Some(turn) = open.as_mut() {
                    // A second decision for one round (only a runtime that
                    // asked again wrote one) replaces the first.
                    turn.items.truncate(turn.round_start);
                    turn.round = *round;
                    turn.decided = Some(calls.clone());
                }
            }
            Event::RoundComplete { round, .. } => {
                if let Some(turn) = open.as_mut() {
                    turn.round_start = turn.items.len();
                    turn.round = round.saturating_add(1);
                    turn.decided = None;
                }
            }
            Event::TurnResume { prompt, work, .. } => {
                if let Some(prompt) = prompt {
                    // A parked turn continues: the one open now is parked.
                    if let Some(turn) = open.take() {
                        park(&mut out.parked, cut(turn));
                    }
                    open = unpark(&mut out.parked, prompt, work.as_deref());
                }
                open = open.map(cut);
            }
            Event::ToolCall {
                call_id,
                tool,
                args,
                irreversible,
            } => {
                if let Some(turn) = open.as_mut() {
                    turn.items.push(ConversationItem::ToolCall {
                        call_id: call_id.clone(),
                        tool: tool.clone(),
                        args: args.clone(),
                        irreversible: *irreversible,
                    });
                }
            }
            Event::ToolResult { call_id, ok, output } => {
                if let Some(turn) = open.as_mut() {
                    turn.items.push(ConversationItem::ToolResult {
                        call_id: call_id.clone(),
                        ok: *ok,
                        output: output.clone(),
                    });
                }
            }
            Event::TurnComplete { response, .. } => {
                if let Some(turn) = open.take() {
                    let start = out.conversation.len();
                    out.conversation
                        .push(ConversationItem::Prompt { text: turn.prompt });
                    out.conversation.extend(turn.items);
                    out.conversation.push(ConversationItem::Response {
                        text: response.clone(),
                    });
                    if let Some(w) = turn.work {
                        out.started_work.remove(&w);
                        out.done_work.insert(w, start..out.conversation.len());
                    }
                }
            }
            _ => {}
        }
    }
    out.open = open.map(cut);
    out
}

/// The outcome of the completed turn whose items are `items` (its prompt,
/// its calls and results, its response).
pub(super) fn outcome_of(items: &[ConversationItem]) -> Option<TurnOutcome> {
    let Some(ConversationItem::Response { text }) = items.last() else {
        return None;
    };
    let calls = items.get(1..items.len() - 1).unwrap_or_default();
    Some(TurnOutcome {
        response: text.clone(),
        tool_calls: completed_calls(calls),
    })
}

/// The (call id, request, output) of every call in `items` (pairs of
/// `ToolCall` then `ToolResult`, as a turn logs them).
pub(super) fn completed_calls(items: &[ConversationItem]) -> Vec<(String, ToolRequest, ToolOutput)> {
    items
        .chunks(2)
        .filter_map(|pair| match pair {
            [ConversationItem::ToolCall {
                call_id,
                tool,
                args,
                irreversible,
            }, ConversationItem::ToolResult { ok, output, .. }] => Some((
                call_id.clone(),
                ToolRequest {
                    tool: tool.clone(),
                    args: args.clone(),
                    irreversible: *irreversible,
                    invalid_args: None,
                },
                ToolOutput {
                    ok: *ok,
                    output: output.clone(),
                },
            )),
            _ => None,
        })
        .collect()
}

/// What [`Runtime::run_work_turn`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkTurn {
    /// The turn ran now and completed.
    Ran(TurnOutcome),
    /// A turn for this work had already completed (before a crash, or in
    /// an earlier claim): nothing ran, nothing was sent.
    AlreadyDone,
}

impl Runtime {
    /// Run one turn of `agent` with `prompt` (restoring its session if
    /// suspended), its calls inline. Acknowledged once `turn.complete` is
    /// durable. (A caller that must not hold the runtime across the
    /// provider and tool calls drives [`Runtime::start_turn`] itself.)
    pub fn run_turn(&mut self, agent: &AgentId, prompt: &str) -> Result<TurnOutcome, RuntimeError> {
        match self.start_turn(agent, prompt, TurnKind::Plain)? {
            Started::Running(task, step) => self.drive(task, step),
            Started::AlreadyDone => Err(RuntimeError::TurnNotInFlight(agent.clone())),
        }
    }

    /// Run one turn of `agent` that reads the pending messages `consumed`
    /// (the caller put them in `prompt`; see [`Runtime::pending`]): they
    /// count as delivered only with the turn — logged in its
    /// `turn.complete`, so a turn lost in a crash leaves them pending, to
    /// be read by the next one (at-least-once, never zero times). Ids not
    /// pending for `agent` (any more) are ignored.
    pub fn run_turn_consuming(
        &mut self,
        agent: &AgentId,
        prompt: &str,
        consumed: &[MessageId],
    ) -> Result<TurnOutcome, RuntimeError> {
        match self.start_turn(agent, prompt, TurnKind::Consuming(consumed))? {
            Started::Running(task, step) => self.drive(task, step),
            Started::AlreadyDone => Err(RuntimeError::TurnNotInFlight(agent.clone())),
        }
    }

    /// Run the turn that performs `work` (e.g. `trigger:{dedup_key}`) for
    /// `agent`, exactly once: if a turn for `work` already completed
    /// durably, nothing runs. The turn's idempotency keys derive from
    /// `work` ([`work_idempotency_key`]), not from the turn number, so a
    /// turn re-run after a crash (same work, same calls) presents the same
    /// keys to the activity ledger whatever else the agent did meanwhile.
    ///
    /// [`work_idempotency_key`]: super::tools::work_idempotency_key
    pub fn run_work_turn(
        &mut self,
        agent: &AgentId,
        prompt: &str,
        work: &str,
    ) -> Result<WorkTurn, RuntimeError> {
        match self.start_turn(agent, prompt, TurnKind::Work(work))? {
            Started::Running(task, step) => self.drive(task, step).map(WorkTurn::Ran),
            Started::AlreadyDone => Ok(WorkTurn::AlreadyDone),
        }
    }

    /// `agent`'s interrupted turn, if any: running the same turn again
    /// (same prompt and work) continues it at [`OpenTurn::round`].
    pub fn open_turn(&self, agent: &AgentId) -> Result<Option<&OpenTurn>, RuntimeError> {
        Ok(self.slot(agent)?.open.as_ref())
    }

    /// Whether `agent` has a turn in flight ([`Runtime::start_turn`]).
    pub fn turn_in_flight(&self, agent: &AgentId) -> Result<bool, RuntimeError> {
        Ok(self.slot(agent)?.in_turn.is_some())
    }

    /// The prompt a turn performing `work` first started with on `agent`,
    /// if it started and never completed (interrupted, or superseded by
    /// another turn since). A retry of the work must run this prompt: the
    /// calls' idempotency keys derive from the work and the call (whose
    /// arguments follow from the prompt), so the activity ledger then
    /// recognises an irreversible call the lost attempt already made.
    pub fn started_work_prompt(&self, agent: &AgentId, work: &str) -> Result<Option<&str>, RuntimeError> {
        Ok(self
            .slot(agent)?
            .started_work
            .get(work)
            .map(|s| s.prompt.as_str()))
    }

    /// The messages work `work` of `agent` read when it started, if it
    /// started and never completed (see [`Runtime::started_work_prompt`]).
    pub fn started_work_reads(
        &self,
        agent: &AgentId,
        work: &str,
    ) -> Result<Option<&[MessageId]>, RuntimeError> {
        Ok(self
            .slot(agent)?
            .started_work
            .get(work)
            .map(|s| s.reads.as_slice()))
    }

    /// Every work `agent` started and never completed, with the prompt it
    /// first started with (see [`Runtime::started_work_prompt`]), in work
    /// order.
    pub fn unfinished_work(&self, agent: &AgentId) -> Result<Vec<(&str, &str)>, RuntimeError> {
        let slot = self.slot(agent)?;
        Ok(slot
            .started_work
            .iter()
            .map(|(work, started)| (work.as_str(), started.prompt.as_str()))
            .collect())
    }

    /// Whether a turn performing `work` completed durably for `agent`.
    pub fn work_done(&self, agent: &AgentId, work: &str) -> Result<bool, RuntimeError> {
        Ok(self.slot(agent)?.done_work.contains_key(work))
    }

    /// The stored answer of `agent`'s completed turn performing `work`:
    /// its response and every call it made with its result, as the turn
    /// returned it (calls before any crash it resumed from included).
    /// `None` if no turn for `work` completed.
    pub fn work_outcome(&self, agent: &AgentId, work: &str) -> Result<Option<TurnOutcome>, RuntimeError> {
        let slot = self.slot(agent)?;
        Ok(slot
            .done_work
            .get(work)
            .and_then(|range| slot.conversation.get(range.clone()))
            .and_then(outcome_of))
    }
}
