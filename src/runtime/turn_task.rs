//! A turn as a sequence of persistence steps between the calls that leave
//! the process: [`Runtime::start_turn`] logs `turn.start` (or
//! `turn.resume`) and hands back the first [`OutsideCall`] — a provider
//! completion — and [`Runtime::continue_turn`] takes each call's result,
//! persists it (`tool.call` before a tool runs, `tool.result`,
//! `round.complete`, finally `turn.complete`) and hands back the next call
//! or the finished turn. The caller performs each call with [`Outside`]
//! wherever it likes: inline ([`Runtime::run_turn`] and its siblings do),
//! or with the runtime's lock released, so a completion that takes seconds
//! stalls no other agent, timer or API request, while every persistence
//! step still happens one at a time under the caller's lock.
//!
//! A completion's request carries the conversation cut to the context
//! budget ([`super::context`]): the instructions and the whole turn in
//! flight always, older turns as they fit.
//!
//! A completion that asks for tools is shown to the `PreToolUse` hooks
//! where it is performed ([`Outside::perform`], outside any lock), and
//! their verdicts enter the round's decision (`round.decided`) with the
//! calls: a denied call is answered with its reason, never handed out; a
//! call that needs a human goes out marked so ([`ToolJob::confirm`]).
//!
//! Invariants: this is the only turn loop — the inline turns drive it too.
//! While a turn is in flight its agent is pinned ([`AgentSlot::in_turn`]):
//! it is never evicted to make room, and a second turn, an eviction or a
//! termination of it is refused with [`RuntimeError::TurnInFlight`]. A
//! turn ends (the pin is released) when it completes or fails; a failed
//! step leaves the interrupted turn as the agent's [`OpenTurn`], exactly as
//! a crash at that point would. A result handed to a task whose turn is no
//! longer in flight (it failed, or the runtime was reopened) is refused
//! with [`RuntimeError::TurnNotInFlight`], never applied.
//!
//! [`AgentSlot::in_turn`]: super::AgentSlot
//! [`OpenTurn`]: super::OpenTurn

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::canary::Canary;
use crate::log::{DecidedCall, Event};

use super::agent::StartedWork;
use super::context;
use super::hooks::{review, HookEvent, Hooks, Resumed, Reviewed};
use super::ids::{AgentId, MessageId, SessionId};
use super::provider::{Provider, ProviderError, ProviderReply, ProviderRequest, ToolRequest};
use super::tools::{
    idempotency_key, turn_identity, work_idempotency_key, ToolContext, ToolError, ToolExecutor, ToolOutput,
};
use super::turn::{completed_calls, decided_request, park, ConversationItem, OpenTurn, TurnOutcome};
use super::{CallSite, Runtime, RuntimeError};

/// Turn tokens, unique in the process: a task from before a reopen can
/// never match a turn of the new runtime. (Never in a trace or on disk.)
static NEXT_TURN: AtomicU64 = AtomicU64::new(1);

/// Which turn to start.
#[derive(Debug, Clone, Copy)]
pub enum TurnKind<'a> {
    /// A plain turn (its keys derive from the prompt's identity).
    Plain,
    /// A turn that reads these pending messages: they count as delivered
    /// only with the turn (see [`Runtime::run_turn_consuming`]).
    Consuming(&'a [MessageId]),
    /// The turn performing this work, at most once (see
    /// [`Runtime::run_work_turn`]).
    Work(&'a str),
    /// The turn performing this work that reads these pending messages
    /// (they are in its prompt): logged in its `turn.start`, delivered
    /// only with its `turn.complete`. A retry of work that started before
    /// reads what the first attempt read, whatever is passed here.
    WorkReading(&'a str, &'a [MessageId]),
}

/// What [`Runtime::start_turn`] did.
#[derive(Debug)]
pub enum Started {
    /// The turn is in flight: perform the call, then
    /// [`Runtime::continue_turn`].
    Running(Box<TurnTask>, TurnStep),
    /// A turn for this work had already completed: nothing ran.
    AlreadyDone,
}

/// What the turn needs next.
#[derive(Debug)]
pub enum TurnStep {
    /// Perform this outside the runtime, then hand the result to
    /// [`Runtime::continue_turn`].
    Call(OutsideCall),
    /// The turn completed (acknowledged: `turn.complete` is durable).
    Done(TurnOutcome),
}

/// A call that leaves the process: no runtime state is borrowed.
#[derive(Debug, Clone)]
pub enum OutsideCall {
    Provider(ProviderCall),
    /// Boxed: a job is several times a completion's size.
    Tool(Box<ToolJob>),
}

/// The result of an [`OutsideCall`].
#[derive(Debug)]
pub enum CallResult {
    Provider(Result<ProviderReply, ProviderError>),
    /// A completion whose tool calls the `PreToolUse` hooks already
    /// reviewed, one verdict per call in order ([`Outside::perform`] does
    /// it there, so a slow hook program holds no lock). A plain
    /// [`CallResult::Provider`] reply is reviewed when it is decided.
    Reviewed(ProviderReply, Vec<Reviewed>),
    Tool(Result<ToolOutput, ToolError>),
}

/// One completion to ask for (an owned [`ProviderRequest`]).
#[derive(Debug, Clone)]
pub struct ProviderCall {
    pub agent: AgentId,
    pub agent_name: String,
    pub instructions: String,
    /// The conversation as the context budget cuts it
    /// ([`context::fit`]): under a budget, a marker item in place of the
    /// oldest turns; without one, every completed turn. The open turn is
    /// always whole.
    pub history: Vec<ConversationItem>,
    pub round: u32,
}

impl ProviderCall {
    pub fn request(&self) -> ProviderRequest<'_> {
        ProviderRequest {
            agent: &self.agent,
            agent_name: &self.agent_name,
            instructions: &self.instructions,
            history: &self.history,
            round: self.round,
        }
    }
}

/// One tool call to run (an owned [`ToolContext`] and its request); its
/// `tool.call` entry is already durable.
#[derive(Debug, Clone)]
pub struct ToolJob {
    pub agent: AgentId,
    pub session: SessionId,
    pub call_id: String,
    pub idempotency_key: String,
    pub now: u64,
    pub call: ToolRequest,
    /// A hook's reason to wait for a human before the call runs (its
    /// logged decision): the executor parks it until `confirm` answers.
    pub confirm: Option<String>,
}

impl ToolJob {
    pub fn context(&self) -> ToolContext<'_> {
        ToolContext {
            agent: &self.agent,
            session: &self.session,
            call_id: &self.call_id,
            idempotency_key: &self.idempotency_key,
            now: self.now,
        }
    }
}

/// The provider and tools a runtime was configured with, to perform
/// [`OutsideCall`]s without holding the runtime.
#[derive(Debug, Clone)]
pub struct Outside {
    pub provider: Arc<dyn Provider>,
    pub tools: Arc<dyn ToolExecutor>,
    pub hooks: Arc<dyn Hooks>,
}

impl Outside {
    /// Perform `call`. A completion that asks for tools comes back with
    /// the `PreToolUse` hooks' verdicts on them ([`CallResult::Reviewed`]).
    pub fn perform(&self, call: &OutsideCall) -> CallResult {
        match call {
            OutsideCall::Provider(call) => match self.provider.complete(&call.request()) {
                Ok(reply) if !reply.tool_calls.is_empty() => {
                    let reviewed = reply
                        .tool_calls
                        .iter()
                        .enumerate()
                        .map(|(index, c)| review(self.hooks.as_ref(), &call.agent, call.round, index, c))
                        .collect();
                    CallResult::Reviewed(reply, reviewed)
                }
                other => CallResult::Provider(other),
            },
            OutsideCall::Tool(job) => CallResult::Tool(match &job.confirm {
                Some(reason) => self
                    .tools
                    .execute_after_confirmation(&job.context(), &job.call, reason),
                None => self.tools.execute(&job.context(), &job.call),
            }),
        }
    }
}

/// A turn in flight. Only the runtime that started it can advance it.
#[derive(Debug)]
pub struct TurnTask {
    agent: AgentId,
    token: u64,
    work: Option<String>,
    consumed: Vec<MessageId>,
    /// [`turn_identity`]: the plain turn's key material.
    identity: String,
    turn_no: usize,
    /// The conversation so far, this turn's prompt and items included.
    working: Vec<ConversationItem>,
    /// Where this turn's prompt is in `working`: what the context budget
    /// never cuts starts here.
    turn_start: usize,
    round: u32,
    /// Every call of the turn that has its result, in order.
    tool_calls: Vec<(String, ToolRequest, ToolOutput)>,
    /// The current round's decided calls not yet started, with their
    /// index in the round.
    batch: VecDeque<DecidedCall>,
    /// The call out now: a provider completion (`None`) or this tool call.
    out: Option<DecidedCall>,
    /// An orchestration call's effect, applied once its result is durable
    /// (see [`super::orchestration`]).
    effect: Option<super::orchestration::Effect>,
}

impl TurnTask {
    /// The agent whose turn this is.
    pub fn agent(&self) -> &AgentId {
        &self.agent
    }
}

impl Runtime {
    /// The provider and tools, to perform a turn's calls outside the
    /// runtime (see the [module docs](self)).
    pub fn outside(&self) -> Outside {
        Outside {
            provider: self.config.provider.clone(),
            tools: self.config.tools.clone(),
            hooks: self.config.hooks.clone(),
        }
    }

    /// Start a turn of `agent` with `prompt` (restoring its session if
    /// suspended): `turn.start` is durable, or `turn.resume` when the same
    /// turn (same prompt and work) was interrupted — it continues after its
    /// last completed round. The first step is a provider call.
    ///
    /// A work that started and never completed runs the prompt and reads
    /// the messages it first started with, whatever this call passes
    /// ([`Runtime::started_work_prompt`]): its calls' idempotency keys
    /// follow from the work and the calls the prompt leads to, so a retry
    /// with another prompt (or with other messages waiting) would make
    /// other calls with other keys, and an irreversible call the lost
    /// attempt made could happen twice.
    pub fn start_turn(
        &mut self,
        agent: &AgentId,
        prompt: &str,
        kind: TurnKind<'_>,
    ) -> Result<Started, RuntimeError> {
        self.live()?;
        let pending_of = |rt: &Runtime, ids: &[MessageId]| -> Vec<MessageId> {
            rt.inbox
                .peek(agent)
                .iter()
                .filter(|m| ids.contains(&m.id))
                .map(|m| m.id.clone())
                .collect()
        };
        let (work, consumed, first_prompt) = match kind {
            TurnKind::Plain => (None, Vec::new(), None),
            TurnKind::Consuming(ids) => {
                self.slot(agent)?;
                (None, pending_of(self, ids), None)
            }
            TurnKind::Work(work) | TurnKind::WorkReading(work, _) => {
                // Canary: forget which work completed, so a lost ack re-runs it.
                let rerun = self.config.canaries.has(Canary::TriggerTurnRerun);
                if self.work_done(agent, work)? && !rerun {
                    return Ok(Started::AlreadyDone);
                }
                // A started work: what it first started with.
                let first = self.started_work_prompt(agent, work)?.map(str::to_string);
                let reads = match (kind, self.started_work_reads(agent, work)?) {
                    (_, Some(reads)) => reads.to_vec(),
                    (TurnKind::WorkReading(_, ids), None) => ids.to_vec(),
                    _ => Vec::new(),
                };
                (Some(work.to_string()), pending_of(self, &reads), first)
            }
        };
        let prompt = first_prompt.as_deref().unwrap_or(prompt);
        if self.slot(agent)?.in_turn.is_some() {
            return Err(RuntimeError::TurnInFlight(agent.clone()));
        }
        let consumed = if self.config.canaries.has(Canary::DeliveredAtCollect) && !consumed.is_empty() {
            // Canary (seed 002's known gap): the delivery is logged when
            // the messages are collected, before the turn that reads them.
            let logged = self.log_to(
                agent,
                Event::MessageDelivered {
                    message_ids: consumed.clone(),
                },
            );
            self.poison_on(logged)?;
            let taken = self.inbox.take(agent, &consumed);
            let ids = taken.into_iter().map(|m| m.id);
            self.slot_mut(agent)?.delivered.extend(ids);
            Vec::new()
        } else {
            consumed
        };
        let token = NEXT_TURN.fetch_add(1, Ordering::Relaxed);
        let r = self.begin(agent, prompt, work, consumed, token);
        let r = self.end_on_error(agent, token, r);
        self.poison_on(r)
            .map(|(task, step)| Started::Running(Box::new(task), step))
    }

    /// Hand the result of `task`'s outstanding call to the turn: persist
    /// it and get the next step. An error ends the turn (see the module
    /// docs); the I/O ones poison the runtime.
    pub fn continue_turn(
        &mut self,
        task: &mut TurnTask,
        result: CallResult,
    ) -> Result<TurnStep, RuntimeError> {
        self.live()?;
        let agent = task.agent.clone();
        match self.agents.get(&agent) {
            Some(slot) if slot.in_turn == Some(task.token) => {}
            _ => return Err(RuntimeError::TurnNotInFlight(agent)),
        }
        let r = match result {
            CallResult::Provider(reply) if task.out.is_none() => self.provider_replied(task, reply, None),
            CallResult::Reviewed(reply, reviewed) if task.out.is_none() => {
                self.provider_replied(task, Ok(reply), Some(reviewed))
            }
            CallResult::Tool(output) if task.out.is_some() => self.tool_ran(task, output),
            _ => Err(RuntimeError::TurnNotInFlight(agent.clone())),
        };
        let r = self.end_on_error(&agent, task.token, r);
        self.poison_on(r)
    }

    /// Perform `task`'s calls inline until it completes.
    pub fn drive(
        &mut self,
        mut task: Box<TurnTask>,
        mut step: TurnStep,
    ) -> Result<TurnOutcome, RuntimeError> {
        let outside = self.outside();
        loop {
            match step {
                TurnStep::Done(outcome) => return Ok(outcome),
                TurnStep::Call(call) => {
                    let result = outside.perform(&call);
                    step = self.continue_turn(&mut task, result)?;
                }
            }
        }
    }

    fn end_on_error<T>(
        &mut self,
        agent: &AgentId,
        token: u64,
        r: Result<T, RuntimeError>,
    ) -> Result<T, RuntimeError> {
        if r.is_err() {
            if let Some(slot) = self.agents.get_mut(agent) {
                if slot.in_turn == Some(token) {
                    slot.in_turn = None;
                }
            }
        }
        r
    }

    fn begin(
        &mut self,
        agent: &AgentId,
        prompt: &str,
        work: Option<String>,
        consumed: Vec<MessageId>,
        token: u64,
    ) -> Result<(TurnTask, TurnStep), RuntimeError> {
        self.acquire(agent)?;
        let slot = self.slot(agent)?;
        let is_this = |o: &OpenTurn| o.prompt == prompt && o.work == work;
        // The turn to continue: the open one, or a parked one a newer turn
        // superseded (whose resume must name it in the log).
        let open_matches = slot.open.as_ref().is_some_and(is_this);
        let parked_at = match open_matches {
            true => None,
            false => slot.parked.iter().position(is_this),
        };
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
        let turn_start = working.len();
        working.push(ConversationItem::Prompt {
            text: prompt.to_string(),
        });
        let resumed = match (open_matches, parked_at) {
            (true, _) => {
                self.log_to(
                    agent,
                    Event::TurnResume {
                        round: slot.open.as_ref().map_or(0, |o| o.round),
                        prompt: None,
                        work: None,
                    },
                )?;
                self.slot_mut(agent)?.open.take()
            }
            (false, Some(i)) => {
                let round = slot.parked[i].round;
                self.log_to(
                    agent,
                    Event::TurnResume {
                        round,
                        prompt: Some(prompt.to_string()),
                        work: work.clone(),
                    },
                )?;
                let slot = self.slot_mut(agent)?;
                let turn = slot.parked.remove(i);
                if let Some(superseded) = slot.open.take() {
                    park(&mut slot.parked, superseded);
                }
                Some(turn)
            }
            (false, None) => {
                // A work turn's reads are part of what it started with.
                let reads = if work.is_some() {
                    consumed.clone()
                } else {
                    Vec::new()
                };
                self.log_to(
                    agent,
                    Event::TurnStart {
                        prompt: prompt.to_string(),
                        work: work.clone(),
                        reads: reads.clone(),
                    },
                )?;
                let slot = self.slot_mut(agent)?;
                if let Some(superseded) = slot.open.take() {
                    park(&mut slot.parked, superseded);
                }
                if let Some(w) = &work {
                    slot.started_work.entry(w.clone()).or_insert_with(|| StartedWork {
                        prompt: prompt.to_string(),
                        reads,
                    });
                }
                None
            }
        };
        let was_open = resumed.is_some();
        let open = match resumed {
            Some(mut open) => {
                // Canary: ask the model again for a round it already
                // decided (its completed calls rolled back with it).
                if self.config.canaries.has(Canary::ReaskDecidedRound) {
                    open.forget_decision();
                }
                tracing::info!(%agent, round = open.round, decided = open.decided.is_some(), "resuming an interrupted turn");
                open
            }
            None => OpenTurn {
                prompt: prompt.to_string(),
                work: work.clone(),
                items: Vec::new(),
                round: 0,
                round_start: 0,
                decided: None,
            },
        };
        let resumed_at = was_open.then(|| Resumed {
            round: open.round,
            decided: open.decided.is_some(),
        });
        self.config.hooks.observe(&HookEvent::AgentStart {
            agent: agent.clone(),
            task: prompt.to_string(),
            resumed: resumed_at,
        });
        // Completed rounds' calls, and the decided round's completed ones,
        // come from the log: neither the provider nor the tools again.
        let done_calls = completed_calls(&open.items);
        working.extend(open.items.iter().cloned());
        let pending: VecDeque<DecidedCall> = open.pending_calls().into_iter().map(|(_, c)| c).collect();
        let decided = open.decided.is_some();
        let round = open.round;
        let slot = self.slot_mut(agent)?;
        slot.open = Some(open);
        slot.in_turn = Some(token);
        let mut task = TurnTask {
            agent: agent.clone(),
            token,
            work,
            consumed,
            identity,
            turn_no,
            working,
            turn_start,
            round,
            tool_calls: done_calls,
            batch: pending,
            out: None,
            effect: None,
        };
        let step = match (decided, task.batch.is_empty()) {
            // The decision stands: run what has no result yet.
            (true, false) => self.next_call(&mut task)?,
            // Every decided call has its result: only the checkpoint is missing.
            (true, true) => self.complete_round(&mut task)?,
            (false, _) => self.ask(&mut task)?,
        };
        Ok((task, step))
    }

    /// The next provider completion of `task`.
    fn ask(&self, task: &mut TurnTask) -> Result<TurnStep, RuntimeError> {
        task.out = None;
        self.config.hooks.observe(&HookEvent::TurnStart {
            agent: task.agent.clone(),
            turn: task.round,
        });
        let slot = self.slot(&task.agent)?;
        let (instructions, agent_name) = (slot.instructions.clone(), slot.name.clone());
        let history = self.request_history(task, &instructions);
        Ok(TurnStep::Call(OutsideCall::Provider(ProviderCall {
            agent: task.agent.clone(),
            agent_name,
            instructions,
            history,
            round: task.round,
        })))
    }

    /// The history `task`'s next completion is sent: the whole
    /// conversation, or its cut to the configured budget — a pure
    /// function of the conversation (rebuilt from the log after a crash)
    /// and the budget, so a resumed turn asks what the interrupted one
    /// asked. The cut is reported here, never logged: it is no part of the
    /// round's decision (see [`context`]).
    fn request_history(&self, task: &TurnTask, instructions: &str) -> Vec<ConversationItem> {
        let budget = &self.config.context_budget;
        if budget.is_unlimited() {
            return task.working.clone();
        }
        let cut = context::fit(budget, instructions, &task.working, task.turn_start);
        if cut.omitted_turns > 0 {
            tracing::info!(
                agent = %task.agent,
                turn = task.turn_no,
                round = task.round,
                omitted_turns = cut.omitted_turns,
                omitted_messages = cut.omitted_messages,
                kept_turns = cut.kept_turns,
                messages = cut.size.messages,
                estimated_tokens = cut.size.tokens,
                "context budget: older turns left out of the request"
            );
        }
        if cut.over_budget {
            // Never a failure: the model gets the turn it must answer.
            tracing::warn!(
                agent = %task.agent,
                turn = task.turn_no,
                round = task.round,
                messages = cut.size.messages,
                estimated_tokens = cut.size.tokens,
                max_messages = budget.max_messages,
                max_context_tokens = budget.max_context_tokens,
                "context budget: the current turn alone is over the budget; sent anyway"
            );
        }
        cut.history
    }

    fn provider_replied(
        &mut self,
        task: &mut TurnTask,
        completed: Result<ProviderReply, ProviderError>,
        reviewed: Option<Vec<Reviewed>>,
    ) -> Result<TurnStep, RuntimeError> {
        let agent = task.agent.clone();
        let session = self.slot(&agent)?.record.session_id.clone();
        let site = CallSite {
            agent: &agent,
            session: &session,
            turn: task.turn_no as u64,
            round: task.round,
        };
        let calls = self.config.calls.clone();
        let logged = match &completed {
            Ok(reply) => calls.completed(&site, reply.usage),
            Err(e) => calls.failed(&site, &e.0).map(|attempt| {
                tracing::warn!(%agent, turn = site.turn, round = site.round, attempt, error = %e.0, "provider call failed; the turn stays open for a retry");
            }),
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
            return self.finish(task, reply.text).map(TurnStep::Done);
        }
        if task.round >= self.config.max_tool_rounds {
            return Err(RuntimeError::TooManyToolRounds {
                agent,
                limit: self.config.max_tool_rounds,
            });
        }
        self.decide(task, reply.tool_calls, reviewed)?;
        self.next_call(task)
    }

    /// Make the model's answer for this round durable before any of its
    /// calls starts (`round.decided`): each call gets its id and its
    /// idempotency key now, once, and every attempt of it — after any
    /// crash, whatever the model would answer if asked again — uses them.
    /// The `PreToolUse` hooks' verdicts (`reviewed`, or asked now when the
    /// reply came unreviewed) are part of the decision: the key derives
    /// from the arguments the hooks left, and a denial or a wait for a
    /// human is logged with the call.
    fn decide(
        &mut self,
        task: &mut TurnTask,
        calls: Vec<ToolRequest>,
        reviewed: Option<Vec<Reviewed>>,
    ) -> Result<(), RuntimeError> {
        let agent = task.agent.clone();
        let slot = self.slot(&agent)?;
        let session = slot.record.session_id.clone();
        let seq = slot.log.next_seq();
        let round = task.round;
        let reviewed = match reviewed {
            Some(r) if r.len() == calls.len() => r,
            _ => calls
                .iter()
                .enumerate()
                .map(|(index, c)| review(self.config.hooks.as_ref(), &agent, round, index, c))
                .collect(),
        };
        let decided: Vec<DecidedCall> = calls
            .into_iter()
            .zip(reviewed)
            .enumerate()
            .map(|(index, (mut call, reviewed))| {
                call.args = reviewed.args;
                let key = match &task.work {
                    Some(work) => work_idempotency_key(&session, work, round, index, &call),
                    None => idempotency_key(&session, &task.identity, round, index, &call),
                };
                DecidedCall {
                    call_id: format!("{session}-{seq}.{index}"),
                    tool: call.tool,
                    args: call.args,
                    irreversible: call.irreversible,
                    idempotency_key: key,
                    invalid_args: call.invalid_args,
                    hook: reviewed.outcome,
                }
            })
            .collect();
        self.log_to(
            &agent,
            Event::RoundDecided {
                round,
                calls: decided.clone(),
            },
        )?;
        task.batch = decided.iter().cloned().collect();
        if let Some(open) = self.slot_mut(&agent)?.open.as_mut() {
            open.decided = Some(decided);
        }
        Ok(())
    }

    /// Log the next decided call of the round (`tool.call` durable before
    /// it runs) and hand it out, with the id and key its decision gave it.
    fn next_call(&mut self, task: &mut TurnTask) -> Result<TurnStep, RuntimeError> {
        let Some(call) = task.batch.pop_front() else {
            return Err(RuntimeError::TurnNotInFlight(task.agent.clone()));
        };
        let agent = task.agent.clone();
        let session = self.slot(&agent)?.record.session_id.clone();
        let call_entry = self.log_to(
            &agent,
            Event::ToolCall {
                call_id: call.call_id.clone(),
                tool: call.tool.clone(),
                args: call.args.clone(),
                irreversible: call.irreversible,
            },
        )?;
        task.effect = None;
        let hook = call.hook.clone().unwrap_or_default();
        if hook.denied.is_none() {
            if let Some(tool) = self.orchestration_tool(&call.tool) {
                // The runtime's own operation, in this step: no outside
                // call; its result is the write-ahead record of its effect.
                let (output, effect) = self.orchestrate(&agent, tool, &call)?;
                task.out = Some(call);
                task.effect = effect;
                return self.tool_ran(task, Ok(output));
            }
        }
        if let Some(reason) = hook.denied {
            // Denied by its logged decision: never handed out; the model
            // reads the reason as the call's failed result.
            let output = ToolOutput {
                ok: false,
                output: format!("{}: denied by policy: {reason}; the call was not run", call.tool),
            };
            task.out = Some(call);
            return self.tool_ran(task, Ok(output));
        }
        // Canary: each attempt keys the call by the agent's turn count,
        // not by the key its decision gave it.
        let key = match self.config.canaries.has(Canary::TriggerTurnKeyedByTurn) {
            true => {
                let index = call
                    .call_id
                    .rsplit('.')
                    .next()
                    .and_then(|i| i.parse().ok())
                    .unwrap_or(0);
                let request = decided_request(&call);
                idempotency_key(&session, &task.turn_no.to_string(), task.round, index, &request)
            }
            false => call.idempotency_key.clone(),
        };
        let job = ToolJob {
            agent,
            session,
            call_id: call.call_id.clone(),
            idempotency_key: key,
            now: call_entry.ts,
            call: decided_request(&call),
            confirm: hook.needs_confirmation,
        };
        task.out = Some(call);
        Ok(TurnStep::Call(OutsideCall::Tool(Box::new(job))))
    }

    fn tool_ran(
        &mut self,
        task: &mut TurnTask,
        executed: Result<ToolOutput, ToolError>,
    ) -> Result<TurnStep, RuntimeError> {
        let agent = task.agent.clone();
        let output = match executed {
            Ok(output) => output,
            // A hard failure the executor did not (or no longer) retry:
            // the model reads it; nothing about our state is unknown.
            Err(ToolError::Transient(reason)) => ToolOutput {
                ok: false,
                output: reason,
            },
            // Blocked, not broken: the turn ends at this call, open.
            Err(ToolError::NeedsConfirmation { tool, idem_key }) => {
                return Err(RuntimeError::NeedsConfirmation {
                    agent: agent.clone(),
                    tool,
                    idem_key,
                })
            }
            Err(source) => {
                return Err(RuntimeError::Tool {
                    agent: agent.clone(),
                    source,
                })
            }
        };
        let Some(decided) = task.out.take() else {
            return Err(RuntimeError::TurnNotInFlight(agent));
        };
        let call_id = decided.call_id.clone();
        self.log_to(
            &agent,
            Event::ToolResult {
                call_id: call_id.clone(),
                ok: output.ok,
                output: output.output.clone(),
            },
        )?;
        // The result names the effect's ids: apply it now that it is durable.
        if let Some(effect) = task.effect.take() {
            self.apply_now(&agent, &effect)?;
        }
        let pair = [
            ConversationItem::ToolCall {
                call_id: call_id.clone(),
                tool: decided.tool.clone(),
                args: decided.args.clone(),
                irreversible: decided.irreversible,
            },
            ConversationItem::ToolResult {
                call_id: call_id.clone(),
                ok: output.ok,
                output: output.output.clone(),
            },
        ];
        task.working.extend(pair.iter().cloned());
        // The open turn keeps the round's completed calls, as the log does.
        if let Some(open) = self.slot_mut(&agent)?.open.as_mut() {
            open.items.extend(pair);
        }
        let event = match output.ok {
            true => HookEvent::PostToolUse {
                agent: agent.clone(),
                tool_name: decided.tool.clone(),
                tool_input: decided.args.clone(),
                tool_use_id: call_id.clone(),
                result: output.output.clone(),
            },
            false => HookEvent::PostToolUseFailure {
                agent: agent.clone(),
                tool_name: decided.tool.clone(),
                tool_input: decided.args.clone(),
                tool_use_id: call_id.clone(),
                error: output.output.clone(),
            },
        };
        self.config.hooks.observe(&event);
        task.tool_calls.push((call_id, decided_request(&decided), output));
        if !task.batch.is_empty() {
            return self.next_call(task);
        }
        self.complete_round(task)
    }

    /// The round's checkpoint (`round.complete`): a crash from here on
    /// resumes after it, with the next round's ask.
    fn complete_round(&mut self, task: &mut TurnTask) -> Result<TurnStep, RuntimeError> {
        let agent = task.agent.clone();
        let calls = u32::try_from(task.tool_calls.len()).unwrap_or(u32::MAX);
        self.log_to(
            &agent,
            Event::RoundComplete {
                round: task.round,
                tool_calls: calls,
            },
        )?;
        self.config.hooks.observe(&HookEvent::TurnEnd {
            agent: agent.clone(),
            turn: task.round,
        });
        task.round += 1;
        if let Some(open) = self.slot_mut(&agent)?.open.as_mut() {
            open.round = task.round;
            open.round_start = open.items.len();
            open.decided = None;
        }
        self.ask(task)
    }

    fn finish(&mut self, task: &mut TurnTask, response: String) -> Result<TurnOutcome, RuntimeError> {
        let agent = task.agent.clone();
        self.log_to(
            &agent,
            Event::TurnComplete {
                response: response.clone(),
                delivered: task.consumed.clone(),
            },
        )?;
        // Acknowledged: the consumed messages leave the inbox with the turn.
        let taken = self.inbox.take(&agent, &task.consumed);
        let ids: Vec<MessageId> = taken.into_iter().map(|m| m.id).collect();
        let mut working = std::mem::take(&mut task.working);
        working.push(ConversationItem::Response {
            text: response.clone(),
        });
        let slot = self.slot_mut(&agent)?;
        slot.delivered.extend(ids);
        // The turn's items start where the conversation before it ended.
        let start = slot.conversation.len();
        slot.conversation = working;
        slot.open = None;
        slot.in_turn = None;
        if let Some(work) = &task.work {
            slot.done_work
                .insert(work.clone(), start..slot.conversation.len());
            slot.started_work.remove(work);
        }
        // Seed 002's deferred spawn: the turn is acknowledged; now its
        // children (and the messages to them). A crash from here on is
        // completed by the next open.
        self.apply_turn_effects(&agent, &task.tool_calls)?;
        self.config.hooks.observe(&HookEvent::AgentStop {
            agent: agent.clone(),
            result: response.clone(),
        });
        Ok(TurnOutcome {
            response,
            tool_calls: std::mem::take(&mut task.tool_calls),
        })
    }
}
