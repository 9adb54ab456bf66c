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
//! does repeat carry the same idempotency keys.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::log::{Event, LogEntry};

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

/// An interrupted turn, up to its last completed round: what running the
/// same turn again continues from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenTurn {
    pub prompt: String,
    pub work: Option<String>,
    /// The completed rounds' tool calls and results, in order.
    pub items: Vec<ConversationItem>,
    /// The next round to ask the provider for.
    pub round: u32,
}

/// Rebuild the conversation (completed turns only) from log entries.
pub fn conversation_from_log(entries: &[LogEntry]) -> Vec<ConversationItem> {
    replay_turns(entries).0
}

/// The interrupted turn at the end of `entries`, if any (see [`OpenTurn`]).
pub fn open_turn_from_log(entries: &[LogEntry]) -> Option<OpenTurn> {
    replay_turns(entries).1
}

/// Completed turns, and the open turn cut back to its last checkpoint.
fn replay_turns(entries: &[LogEntry]) -> (Vec<ConversationItem>, Option<OpenTurn>) {
    let mut done = Vec::new();
    let mut open: Option<Vec<ConversationItem>> = None;
    // The open turn's header and its last round boundary (items, round).
    let mut head: Option<(String, Option<String>)> = None;
    let mut boundary = (1usize, 0u32);
    for entry in entries {
        match &entry.event {
            Event::TurnStart { prompt, work, .. } => {
                open = Some(vec![ConversationItem::Prompt { text: prompt.clone() }]);
                head = Some((prompt.clone(), work.clone()));
                boundary = (1, 0);
            }
            Event::RoundComplete { round, .. } => {
                if let Some(turn) = open.as_ref() {
                    boundary = (turn.len(), round.saturating_add(1));
                }
            }
            Event::TurnResume { .. } => {
                // The partial round before the crash is rolled back.
                if let Some(turn) = open.as_mut() {
                    turn.truncate(boundary.0);
                }
            }
            Event::ToolCall {
                call_id,
                tool,
                args,
                irreversible,
            } => {
                if let Some(turn) = open.as_mut() {
                    turn.push(ConversationItem::ToolCall {
                        call_id: call_id.clone(),
                        tool: tool.clone(),
                        args: args.clone(),
                        irreversible: *irreversible,
                    });
                }
            }
            Event::ToolResult { call_id, ok, output } => {
                if let Some(turn) = open.as_mut() {
                    turn.push(ConversationItem::ToolResult {
                        call_id: call_id.clone(),
                        ok: *ok,
                        output: output.clone(),
                    });
                }
            }
            Event::TurnComplete { response, .. } => {
                if let Some(mut turn) = open.take() {
                    turn.push(ConversationItem::Response {
                        text: response.clone(),
                    });
                    done.extend(turn);
                }
                head = None;
            }
            _ => {}
        }
    }
    let open_turn = match (open, head) {
        (Some(mut items), Some((prompt, work))) => {
            items.truncate(boundary.0);
            items.remove(0); // the prompt
            Some(OpenTurn {
                prompt,
                work,
                items,
                round: boundary.1,
            })
        }
        _ => None,
    };
    (done, open_turn)
}

/// The work ids whose turn completed in `entries` (a `turn.start` with
/// `work`, then its `turn.complete`).
pub fn done_work_from_log(entries: &[LogEntry]) -> BTreeSet<String> {
    let mut done = BTreeSet::new();
    let mut open: Option<Option<&String>> = None;
    for entry in entries {
        match &entry.event {
            Event::TurnStart { work, .. } => open = Some(work.as_ref()),
            Event::TurnComplete { .. } => {
                if let Some(Some(work)) = open.take() {
                    done.insert(work.clone());
                }
            }
            _ => {}
        }
    }
    done
}

/// The work ids whose turn started in `entries` and never completed, with
/// the prompt each first started with and the messages it read (see
/// `AgentSlot::started_work`).
pub fn started_work_from_log(entries: &[LogEntry]) -> BTreeMap<String, StartedWork> {
    let mut started = BTreeMap::new();
    let mut open: Option<Option<&String>> = None;
    for entry in entries {
        match &entry.event {
            Event::TurnStart { prompt, work, reads } => {
                if let Some(w) = work {
                    started.entry(w.clone()).or_insert_with(|| StartedWork {
                        prompt: prompt.clone(),
                        reads: reads.clone(),
                    });
                }
                open = Some(work.as_ref());
            }
            Event::TurnComplete { .. } => {
                if let Some(Some(work)) = open.take() {
                    started.remove(work);
                }
            }
            _ => {}
        }
    }
    started
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
        Ok(self.slot(agent)?.done_work.contains(work))
    }
}
