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

use crate::canary::Canary;
use crate::log::{Event, LogEntry};

use super::ids::{AgentId, MessageId};
use super::provider::{ProviderRequest, ToolRequest};
use super::tools::{idempotency_key, turn_identity, work_idempotency_key, ToolContext, ToolOutput};
use super::{CallSite, Runtime, RuntimeError};

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
            Event::TurnStart { prompt, work } => {
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
/// the prompt each first started with (see `AgentSlot::started_work`).
pub fn started_work_from_log(entries: &[LogEntry]) -> BTreeMap<String, String> {
    let mut started = BTreeMap::new();
    let mut open: Option<Option<&String>> = None;
    for entry in entries {
        match &entry.event {
            Event::TurnStart { prompt, work } => {
                if let Some(w) = work {
                    started.entry(w.clone()).or_insert_with(|| prompt.clone());
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
fn completed_calls(items: &[ConversationItem]) -> Vec<(String, ToolRequest, ToolOutput)> {
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
    /// suspended). Acknowledged once `turn.complete` is durable.
    pub fn run_turn(&mut self, agent: &AgentId, prompt: &str) -> Result<TurnOutcome, RuntimeError> {
        self.live()?;
        self.slot(agent)?;
        let r = self.run_turn_inner(agent, prompt, None, &[]);
        self.poison_on(r)
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
        self.live()?;
        self.slot(agent)?;
        let pending: Vec<MessageId> = self
            .inbox
            .peek(agent)
            .iter()
            .filter(|m| consumed.contains(&m.id))
            .map(|m| m.id.clone())
            .collect();
        if self.config.canaries.has(Canary::DeliveredAtCollect) && !pending.is_empty() {
            // Canary (seed 002's known gap): the delivery is logged when
            // the messages are collected, before the turn that reads them.
            let logged = self.log_to(
                agent,
                Event::MessageDelivered {
                    message_ids: pending.clone(),
                },
            );
            self.poison_on(logged)?;
            let taken = self.inbox.take(agent, &pending);
            let ids = taken.into_iter().map(|m| m.id);
            self.slot_mut(agent)?.delivered.extend(ids);
            let r = self.run_turn_inner(agent, prompt, None, &[]);
            return self.poison_on(r);
        }
        let r = self.run_turn_inner(agent, prompt, None, &pending);
        self.poison_on(r)
    }

    /// Run the turn that performs `work` (e.g. `trigger:{dedup_key}`) for
    /// `agent`, exactly once: if a turn for `work` already completed
    /// durably, nothing runs. The turn's idempotency keys derive from
    /// `work` ([`work_idempotency_key`]), not from the turn number, so a
    /// turn re-run after a crash (same work, same calls) presents the same
    /// keys to the activity ledger whatever else the agent did meanwhile.
    pub fn run_work_turn(
        &mut self,
        agent: &AgentId,
        prompt: &str,
        work: &str,
    ) -> Result<WorkTurn, RuntimeError> {
        self.live()?;
        // Canary: forget which work completed, so a lost ack re-runs it.
        let rerun = self.config.canaries.has(Canary::TriggerTurnRerun);
        if self.work_done(agent, work)? && !rerun {
            return Ok(WorkTurn::AlreadyDone);
        }
        let r = self.run_turn_inner(agent, prompt, Some(work), &[]);
        self.poison_on(r).map(WorkTurn::Ran)
    }

    /// `agent`'s interrupted turn, if any: running the same turn again
    /// (same prompt and work) continues it at [`OpenTurn::round`].
    pub fn open_turn(&self, agent: &AgentId) -> Result<Option<&OpenTurn>, RuntimeError> {
        Ok(self.slot(agent)?.open.as_ref())
    }

    /// The prompt a turn performing `work` first started with on `agent`,
    /// if it started and never completed (interrupted, or superseded by
    /// another turn since). A retry of the work must run this prompt: the
    /// calls' idempotency keys derive from the work and the call (whose
    /// arguments follow from the prompt), so the activity ledger then
    /// recognises an irreversible call the lost attempt already made.
    pub fn started_work_prompt(&self, agent: &AgentId, work: &str) -> Result<Option<&str>, RuntimeError> {
        Ok(self.slot(agent)?.started_work.get(work).map(String::as_str))
    }

    /// Whether a turn performing `work` completed durably for `agent`.
    pub fn work_done(&self, agent: &AgentId, work: &str) -> Result<bool, RuntimeError> {
        Ok(self.slot(agent)?.done_work.contains(work))
    }

    fn run_turn_inner(
        &mut self,
        agent: &AgentId,
        prompt: &str,
        work: Option<&str>,
        consumed: &[MessageId],
    ) -> Result<TurnOutcome, RuntimeError> {
        self.acquire(agent)?;
        let slot = self.slot(agent)?;
        let resumed = slot
            .open
            .clone()
            .filter(|o| o.prompt == prompt && o.work.as_deref() == work);
        let mut working = slot.conversation.clone();
        let turn_no = working
            .iter()
            .filter(|i| matches!(i, ConversationItem::Prompt { .. }))
            .count();
        let same_prompt = working
            .iter()
            .filter(|i| matches!(i, ConversationItem::Prompt { text } if text == prompt))
            .count();
        let identity = turn_identity(prompt, same_prompt);
        working.push(ConversationItem::Prompt {
            text: prompt.to_string(),
        });
        let mut round = 0;
        let mut done_calls = Vec::new();
        match resumed {
            Some(open) => {
                // Continue after the last completed round; its calls and
                // results come from the log, not from the provider again.
                self.log_to(agent, Event::TurnResume { round: open.round })?;
                round = open.round;
                done_calls = completed_calls(&open.items);
                working.extend(open.items);
                tracing::info!(%agent, round, "resuming an interrupted turn");
            }
            None => {
                self.log_to(
                    agent,
                    Event::TurnStart {
                        prompt: prompt.to_string(),
                        work: work.map(str::to_string),
                    },
                )?;
                if let Some(w) = work {
                    let started = &mut self.slot_mut(agent)?.started_work;
                    started.entry(w.to_string()).or_insert_with(|| prompt.to_string());
                }
            }
        }
        self.slot_mut(agent)?.open = Some(OpenTurn {
            prompt: prompt.to_string(),
            work: work.map(str::to_string),
            items: working[working.len() - done_calls.len() * 2..].to_vec(),
            round,
        });
        let mut tool_calls = done_calls;
        let provider = self.config.provider.clone();
        let tools = self.config.tools.clone();
        let response = loop {
            let slot = self.slot(agent)?;
            let request = ProviderRequest {
                agent,
                instructions: &slot.instructions,
                history: &working,
                round,
            };
            let session = slot.record.session_id.clone();
            let completed = provider.complete(&request);
            let site = CallSite {
                agent,
                session: &session,
                turn: turn_no as u64,
                round,
            };
            let calls = self.config.calls.clone();
            let logged = match &completed {
                Ok(reply) => {
                    self.slot_mut(agent)?.provider_failures = 0;
                    calls.completed(&site, reply.usage)
                }
                Err(e) => {
                    let slot = self.slot_mut(agent)?;
                    let attempt = slot.provider_failures;
                    slot.provider_failures = attempt.saturating_add(1);
                    calls.failed(&site, &e.0, attempt)
                }
            };
            logged.map_err(|cause| RuntimeError::CallLog {
                agent: agent.clone(),
                cause,
            })?;
            let reply = completed.map_err(|source| RuntimeError::Provider {
                agent: agent.clone(),
                source,
            })?;
            if reply.tool_calls.is_empty() {
                break reply.text;
            }
            if round >= self.config.max_tool_rounds {
                return Err(RuntimeError::TooManyToolRounds {
                    agent: agent.clone(),
                    limit: self.config.max_tool_rounds,
                });
            }
            for (index, call) in reply.tool_calls.into_iter().enumerate() {
                let slot = self.slot(agent)?;
                let session = slot.record.session_id.clone();
                let call_id = format!("{session}-{}", slot.log.next_seq());
                let call_entry = self.log_to(
                    agent,
                    Event::ToolCall {
                        call_id: call_id.clone(),
                        tool: call.tool.clone(),
                        args: call.args.clone(),
                        irreversible: call.irreversible,
                    },
                )?;
                // Canary: key the calls by the agent's turn count instead.
                let by_turn = self.config.canaries.has(Canary::TriggerTurnKeyedByTurn);
                let key = match work {
                    _ if by_turn => idempotency_key(&session, &turn_no.to_string(), round, index, &call),
                    Some(work) => work_idempotency_key(work, round, index, &call),
                    None => idempotency_key(&session, &identity, round, index, &call),
                };
                let ctx = ToolContext {
                    agent,
                    session: &session,
                    call_id: &call_id,
                    idempotency_key: &key,
                    now: call_entry.ts,
                };
                let output = tools.execute(&ctx, &call).map_err(|source| RuntimeError::Tool {
                    agent: agent.clone(),
                    source,
                })?;
                self.log_to(
                    agent,
                    Event::ToolResult {
                        call_id: call_id.clone(),
                        ok: output.ok,
                        output: output.output.clone(),
                    },
                )?;
                working.push(ConversationItem::ToolCall {
                    call_id: call_id.clone(),
                    tool: call.tool.clone(),
                    args: call.args.clone(),
                    irreversible: call.irreversible,
                });
                working.push(ConversationItem::ToolResult {
                    call_id: call_id.clone(),
                    ok: output.ok,
                    output: output.output.clone(),
                });
                tool_calls.push((call_id, call, output));
            }
            // The round's checkpoint: a crash from here on resumes after it.
            let calls = u32::try_from(tool_calls.len()).unwrap_or(u32::MAX);
            self.log_to(
                agent,
                Event::RoundComplete {
                    round,
                    tool_calls: calls,
                },
            )?;
            round += 1;
            let open_items = working[working.len() - tool_calls.len() * 2..].to_vec();
            if let Some(open) = self.slot_mut(agent)?.open.as_mut() {
                open.items = open_items;
                open.round = round;
            }
        };
        self.log_to(
            agent,
            Event::TurnComplete {
                response: response.clone(),
                delivered: consumed.to_vec(),
            },
        )?;
        // Acknowledged: the consumed messages leave the inbox with the turn.
        let taken = self.inbox.take(agent, consumed);
        let ids: Vec<MessageId> = taken.into_iter().map(|m| m.id).collect();
        self.slot_mut(agent)?.delivered.extend(ids);
        working.push(ConversationItem::Response {
            text: response.clone(),
        });
        let slot = self.slot_mut(agent)?;
        slot.conversation = working;
        slot.open = None;
        if let Some(work) = work {
            slot.done_work.insert(work.to_string());
            slot.started_work.remove(work);
        }
        Ok(TurnOutcome { response, tool_calls })
    }
}
