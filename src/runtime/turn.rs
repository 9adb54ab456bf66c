//! Turns: `turn.start`, provider rounds with `tool.call`/`tool.result`, then
//! `turn.complete`; and rebuilding the conversation from a log.
//!
//! Invariant: the conversation holds completed turns only. A turn whose
//! `turn.complete` is not durable is dropped on rebuild (the in-flight turn
//! is lost, as documented), so memory and the rebuilt log always agree.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::canary::Canary;
use crate::log::{Event, LogEntry};

use super::ids::AgentId;
use super::provider::{ProviderRequest, ToolRequest};
use super::tools::{idempotency_key, work_idempotency_key, ToolContext, ToolOutput};
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

/// Rebuild the conversation (completed turns only) from log entries.
pub fn conversation_from_log(entries: &[LogEntry]) -> Vec<ConversationItem> {
    let mut done = Vec::new();
    let mut open: Option<Vec<ConversationItem>> = None;
    for entry in entries {
        match &entry.event {
            Event::TurnStart { prompt, .. } => {
                open = Some(vec![ConversationItem::Prompt { text: prompt.clone() }]);
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
            Event::TurnComplete { response } => {
                if let Some(mut turn) = open.take() {
                    turn.push(ConversationItem::Response {
                        text: response.clone(),
                    });
                    done.extend(turn);
                }
            }
            _ => {}
        }
    }
    done
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
        let r = self.run_turn_inner(agent, prompt, None);
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
        let r = self.run_turn_inner(agent, prompt, Some(work));
        self.poison_on(r).map(WorkTurn::Ran)
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
    ) -> Result<TurnOutcome, RuntimeError> {
        self.acquire(agent)?;
        self.log_to(
            agent,
            Event::TurnStart {
                prompt: prompt.to_string(),
                work: work.map(str::to_string),
            },
        )?;
        let mut working = self.slot(agent)?.conversation.clone();
        let turn_no = working
            .iter()
            .filter(|i| matches!(i, ConversationItem::Prompt { .. }))
            .count();
        working.push(ConversationItem::Prompt {
            text: prompt.to_string(),
        });
        let mut tool_calls = Vec::new();
        let provider = self.config.provider.clone();
        let tools = self.config.tools.clone();
        let mut round = 0;
        let response = loop {
            let slot = self.slot(agent)?;
            let request = ProviderRequest {
                agent,
                instructions: &slot.instructions,
                history: &working,
                round,
            };
            let reply = provider
                .complete(&request)
                .map_err(|source| RuntimeError::Provider {
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
                // Canary: key the work's calls by the turn count instead.
                let by_turn = self.config.canaries.has(Canary::TriggerTurnKeyedByTurn);
                let key = match work {
                    Some(work) if !by_turn => work_idempotency_key(work, round, index, &call),
                    _ => idempotency_key(&session, turn_no, round, index, &call),
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
            round += 1;
        };
        self.log_to(
            agent,
            Event::TurnComplete {
                response: response.clone(),
            },
        )?;
        working.push(ConversationItem::Response {
            text: response.clone(),
        });
        let slot = self.slot_mut(agent)?;
        slot.conversation = working;
        if let Some(work) = work {
            slot.done_work.insert(work.to_string());
        }
        Ok(TurnOutcome { response, tool_calls })
    }
}
