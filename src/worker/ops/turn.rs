//! API turns: a turn request prepared (the messages waiting for the agent
//! first in its prompt), started with its first call handed out, and its
//! answer when it ends — with every call it made.
//!
//! Invariant: the messages a turn reads count as delivered only with its
//! `turn.complete`; a retried work id resumes (or finds done) the turn it
//! first started, with its prompt and its keys.

use crate::runtime::{
    AgentId, MessageId, OutsideCall, RuntimeError, Started, TurnKind, TurnOutcome, TurnStep, TurnTask,
};
use crate::system::System;
use serde_json::{json, Value};

use super::super::effects::{needs_confirmation, turn_calls, CallSummary};
use super::super::{scoped, Lifecycle, TurnScope};
use super::{apply, resolve, OpError, Request, Schedules, TurnRequest, View};

/// A turn request, prepared: the agent, the full prompt (the messages
/// waiting for it first) and the work id.
#[derive(Debug, Clone)]
pub struct PreparedTurn {
    pub agent: AgentId,
    pub prompt: String,
    pub work: Option<String>,
    /// The pending messages in its prompt: delivered only with the turn.
    pub reads: Vec<MessageId>,
    pub messages: usize,
}

impl PreparedTurn {
    /// The work label of its telemetry.
    fn label(&self) -> &str {
        self.work.as_deref().unwrap_or("api")
    }

    /// The answer to the request: the turn's response and every call it
    /// made (`calls`, see [`crate::effects::turn_calls`]); for a work that
    /// had completed before (`already_done`), its stored response and
    /// calls (`outcome`, from `Runtime::work_outcome`; absent if the
    /// runtime kept none).
    pub fn answer(&self, outcome: Option<&TurnOutcome>, already_done: bool, calls: &[CallSummary]) -> Value {
        let mut answer = json!({"agent": self.agent, "tool_calls": calls});
        if let Some(o) = outcome {
            answer["response"] = json!(o.response);
        }
        if already_done {
            answer["already_done"] = json!(true);
        } else {
            answer["messages_delivered"] = json!(self.messages);
        }
        answer
    }

    /// The `turn_end` payload of its telemetry.
    pub fn describe(outcome: Option<&TurnOutcome>) -> Value {
        match outcome {
            Some(o) => json!({"tool_calls": o.tool_calls.len()}),
            None => json!({"already_done": true}),
        }
    }
}

fn prepare_turn(system: &mut System, name: &str, r: TurnRequest) -> Result<PreparedTurn, OpError> {
    if r.prompt.trim().is_empty() {
        return Err(OpError::BadRequest("`prompt` must not be empty".into()));
    }
    let id = resolve(system, name)?;
    if system.runtime().turn_in_flight(&id)? {
        // Refused before the messages are handed out.
        return Err(RuntimeError::TurnInFlight(id).into());
    }
    let work = r.work_id.as_ref().map(|w| format!("api:{w}"));
    // Messages waiting for the agent are in this turn's prompt; they count
    // as delivered only with the turn (seed 002: a turn lost in a crash
    // leaves them pending, never lost). A retried request whose turn was
    // cut short (a crash, a stop) runs the prompt and reads the messages
    // that turn began with instead, even if another turn ran in between:
    // `Runtime::start_turn` decides, so its calls keep their idempotency
    // keys and the email does not go out twice (found by the kill -9 soak:
    // `soak --kill --seed 2`, then `--seed 7`).
    let messages = system.runtime().pending(&id).to_vec();
    let mut prompt = String::new();
    if !messages.is_empty() {
        prompt.push_str("Messages for you:\n");
        for m in &messages {
            prompt.push_str(&format!("- from {}: {}\n", m.from, m.payload));
        }
        prompt.push('\n');
    }
    prompt.push_str(&r.prompt);
    let reads: Vec<MessageId> = messages.into_iter().map(|m| m.id).collect();
    let messages = match &work {
        Some(w) => system
            .runtime()
            .started_work_reads(&id, w)?
            .map_or(reads.len(), <[MessageId]>::len),
        None => reads.len(),
    };
    Ok(PreparedTurn {
        agent: id,
        prompt,
        work,
        reads,
        messages,
    })
}

/// A turn request answered on the caller's thread: [`begin_turn`]'s
/// steps with the calls performed inline.
pub(super) fn turn(
    system: &mut System,
    lifecycle: &dyn Lifecycle,
    name: &str,
    r: TurnRequest,
) -> Result<Value, OpError> {
    match begin_turn(system, lifecycle, name, r) {
        Begun::Answered(answer) => answer,
        Begun::Turn(begun) => {
            let (StartedTurn { task, call, scope }, p) = *begun;
            let ended = scoped(lifecycle, &scope, || {
                system.runtime_mut().drive(task, TurnStep::Call(call))
            });
            end_api_turn(system, lifecycle, &scope, &p, ended.map(Some))
        }
    }
}

/// A turn started by the worker, its first call to perform outside it
/// (see [`super::turns`]).
#[derive(Debug)]
pub struct StartedTurn {
    pub task: Box<TurnTask>,
    pub call: OutsideCall,
    pub scope: TurnScope,
}

/// What a request became on the worker.
#[derive(Debug)]
pub enum Begun {
    /// Answered already.
    Answered(Result<Value, OpError>),
    /// A turn is in flight: answer with [`PreparedTurn::answer`] when it ends.
    Turn(Box<(StartedTurn, PreparedTurn)>),
}

/// [`apply`], except that a turn request only starts its turn.
pub fn begin<V: View>(
    system: &mut System,
    schedules: &mut Schedules,
    lifecycle: &dyn Lifecycle,
    request: Request<V>,
) -> Begun {
    match request {
        Request::Turn(name, r) => begin_turn(system, lifecycle, &name, r),
        request => Begun::Answered(apply(system, schedules, lifecycle, request)),
    }
}

/// Start the turn `r` asks of `name`: `turn_start`, then the first call
/// to perform — or the answer, if it ended at once.
fn begin_turn(system: &mut System, lifecycle: &dyn Lifecycle, name: &str, r: TurnRequest) -> Begun {
    let p = match prepare_turn(system, name, r) {
        Ok(p) => p,
        Err(e) => return Begun::Answered(Err(e)),
    };
    let scope = lifecycle.turn_started(system, &p.agent, p.label());
    let kind = match &p.work {
        None => TurnKind::Consuming(&p.reads),
        Some(work) => TurnKind::WorkReading(work, &p.reads),
    };
    let started = system.runtime_mut().start_turn(&p.agent, &p.prompt, kind);
    let ended = match started {
        Ok(Started::Running(task, TurnStep::Call(call))) => {
            return Begun::Turn(Box::new((StartedTurn { task, call, scope }, p)));
        }
        Ok(Started::Running(_, TurnStep::Done(outcome))) => Ok(Some(outcome)),
        Ok(Started::AlreadyDone) => Ok(None),
        Err(e) => Err(e),
    };
    Begun::Answered(end_api_turn(system, lifecycle, &scope, &p, ended))
}

/// The end of a turn [`begin`] started: `turn_end`, and the answer —
/// with every call of the turn, those the ledgers hold of a turn that
/// stopped included (a 409 or 502 carries them too, see
/// [`OpError::Stopped`]).
pub fn end_api_turn(
    system: &System,
    lifecycle: &dyn Lifecycle,
    scope: &TurnScope,
    p: &PreparedTurn,
    ended: Result<Option<TurnOutcome>, RuntimeError>,
) -> Result<Value, OpError> {
    let work = p.work.as_deref();
    match ended {
        Ok(outcome) => {
            lifecycle.turn_ended(scope, Ok(PreparedTurn::describe(outcome.as_ref())));
            let already_done = outcome.is_none();
            let outcome = match (outcome, work) {
                (None, Some(work)) => system.runtime().work_outcome(&p.agent, work)?,
                (outcome, _) => outcome,
            };
            let calls = turn_calls(system, &p.agent, work, outcome.as_ref())?;
            Ok(p.answer(outcome.as_ref(), already_done, &calls))
        }
        Err(e) => {
            lifecycle.turn_ended(scope, Err(e.to_string()));
            let stopped = matches!(
                e,
                RuntimeError::NeedsConfirmation { .. }
                    | RuntimeError::Provider { .. }
                    | RuntimeError::TooManyToolRounds { .. }
            );
            let error = OpError::from(e);
            if !stopped || error.is_fatal() {
                return Err(error);
            }
            // What the stopped turn did before it stopped.
            let calls = turn_calls(system, &p.agent, work, None)?;
            let needs_confirmation = needs_confirmation(system, &p.agent)?;
            Err(OpError::Stopped {
                error: Box::new(error),
                details: json!({"tool_calls": calls, "needs_confirmation": needs_confirmation}),
            })
        }
    }
}
