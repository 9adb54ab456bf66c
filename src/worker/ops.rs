//! The operations of the control API, on a booted [`System`]: one
//! implementation, called by the worker ([`super::Worker`]) for each API
//! request and by `status`/`emit`/`confirm`/`gc` directly when no daemon
//! holds the root. Also the scheduler's two halves of a firing: claiming a
//! due trigger ([`claim_next`]) and settling its turn's end ([`settle_fire`]).
//!
//! Invariant: every operation is a sequence of acknowledged runtime/store
//! calls on the caller's thread (the root's one writer); an error that
//! leaves the outcome unknown is reported as [`OpError::UnknownOutcome`]
//! and the caller must stop using the system (boot again: recovery decides).
//! The database guard is never held across a runtime call that persists
//! (a [`Request::View`] reads the runtime's memory under it, and only
//! SELECTs: see [`View`]).

use crate::runtime::{
    AgentId, MessageId, OutsideCall, RuntimeError, Started, TreeError, TurnKind, TurnOutcome, TurnStep,
    TurnTask,
};
use crate::store::activities::{ActivityStatus, ActivityStore};
use crate::store::tool_calls::{RunStatus, ToolCallStore};
use crate::store::triggers::{EmitOutcome, Trigger, TriggerSource, TriggerSpec, TriggerStatus};
use crate::store::StoreError;
use crate::system::{Fired, Resolution, System, SystemError};
use serde::Deserialize;
use serde_json::{json, Value};

use super::effects::{needs_confirmation, turn_calls, CallSummary};
use super::gc::GcRequest;
use super::schedule::{Schedule, ScheduleError, Schedules};
use super::{scoped, Lifecycle, TurnScope, INTERRUPTED};

/// Largest delay or future fire time accepted for a trigger (a year).
pub const MAX_TRIGGER_DELAY_MS: u64 = 365 * 24 * 3_600_000;

/// `POST /agents`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateAgent {
    pub name: String,
    #[serde(default)]
    pub instructions: String,
    /// Name or id of the parent; absent for a root agent.
    #[serde(default)]
    pub parent: Option<String>,
}

/// `POST /agents/{name}/turn`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnRequest {
    pub prompt: String,
    /// Makes the turn exactly-once: a retried request with the same work
    /// id finds it done instead of running it again.
    #[serde(default)]
    pub work_id: Option<String>,
}

/// `POST /messages`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageRequest {
    pub from: String,
    pub to: String,
    pub payload: String,
}

/// `POST /triggers`: fire `prompt` on `agent` once, at `fire_at_ms`
/// (host-clock ms since the UNIX epoch) or `delay_ms` from now.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmitRequest {
    pub dedup_key: String,
    #[serde(default)]
    pub fire_at_ms: Option<u64>,
    #[serde(default)]
    pub delay_ms: Option<u64>,
    pub agent: String,
    pub prompt: String,
}

/// `POST /confirm`: a human's answer for an irreversible call whose fate
/// the ledger could not know.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfirmRequest {
    pub idem_key: String,
    /// It happened (DONE: the resumed work reads it from the ledger), or
    /// it did not (the key is released: the resumed work sends it once).
    pub delivered: bool,
    #[serde(default)]
    pub provider_ref: Option<String>,
    /// Never send it, whatever happened (FAILED: the resumed work reads a
    /// failed call). Overrides `delivered`.
    #[serde(default)]
    pub abandon: bool,
}

/// A read-only view the driver's API defines (paged lists, one row, a
/// transcript): answered by the worker between steps, from the runtime's
/// memory and SELECTs only.
pub trait View: std::fmt::Debug {
    fn answer(&self, system: &System, schedules: Vec<Schedule>) -> Result<Value, OpError>;
}

/// No read-only views (the simulation's API).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoView {}

impl View for NoView {
    fn answer(&self, _: &System, _: Vec<Schedule>) -> Result<Value, OpError> {
        match *self {}
    }
}

/// One API operation; `V` is the driver's read-only views.
#[derive(Debug, Clone)]
pub enum Request<V = NoView> {
    CreateAgent(CreateAgent),
    DeleteAgent(String),
    Turn(String, TurnRequest),
    Message(MessageRequest),
    Emit(EmitRequest),
    Status,
    Confirm(ConfirmRequest),
    /// A human retries a DEAD or FAILED trigger (attempts reset).
    RetryTrigger(String),
    /// A human releases a run parked `waiting_for_human` (replays reset).
    ReleaseRun(String),
    AddSchedule(Schedule),
    DeleteSchedule(String),
    /// A read-only view ([`View`]).
    View(V),
    /// One GC pass with these TTLs ([`super::gc`]).
    Gc(GcRequest),
}

#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// The turn failed and nothing of it was acknowledged (provider error,
    /// too many tool rounds); it can be asked again.
    #[error("{0}")]
    TurnFailed(String),
    #[error("stores: {0}")]
    Store(StoreError),
    /// Unknown outcome: stop and boot again.
    #[error("{0}; outcome unknown — restart to recover")]
    UnknownOutcome(String),
    /// The daemon is stopping (SIGINT/SIGTERM): the turn was abandoned at
    /// a provider call, nothing of it acknowledged; the same work id
    /// resumes it after the restart.
    #[error("the daemon is stopping; the turn was not finished and will resume (retry the same work_id after the restart): {0}")]
    Interrupted(String),
    /// A turn that stopped before it completed (blocked on a human, or
    /// failed): `error`, with what the turn did before it stopped
    /// (`details`: its calls and the keys awaiting confirmation), which
    /// the answer's body carries next to `error`.
    #[error("{error}")]
    Stopped { error: Box<OpError>, details: Value },
}

impl OpError {
    /// The HTTP status that carries it.
    pub fn http_status(&self) -> u16 {
        match self {
            OpError::BadRequest(_) => 400,
            OpError::NotFound(_) => 404,
            OpError::Conflict(_) => 409,
            OpError::TurnFailed(_) => 502,
            OpError::Store(_) => 500,
            OpError::UnknownOutcome(_) | OpError::Interrupted(_) => 503,
            OpError::Stopped { error, .. } => error.http_status(),
        }
    }

    /// The system must not be used any more.
    pub fn is_fatal(&self) -> bool {
        match self {
            OpError::UnknownOutcome(_) => true,
            OpError::Stopped { error, .. } => error.is_fatal(),
            _ => false,
        }
    }

    /// The JSON body of the error answer: `{"error": "..."}`, and a
    /// stopped turn's details next to it.
    pub fn body(&self) -> Value {
        let mut body = json!({"error": self.to_string()});
        if let (OpError::Stopped { details, .. }, Some(map)) = (self, body.as_object_mut()) {
            if let Some(details) = details.as_object() {
                for (k, v) in details {
                    map.insert(k.clone(), v.clone());
                }
            }
        }
        body
    }
}

impl From<StoreError> for OpError {
    fn from(e: StoreError) -> Self {
        match e {
            // A failed SQLite call may have committed: unknown.
            StoreError::Sqlite { .. } => OpError::UnknownOutcome(e.to_string()),
            other => OpError::Store(other),
        }
    }
}

impl From<RuntimeError> for OpError {
    fn from(e: RuntimeError) -> Self {
        match e {
            e if e.is_unknown_outcome() || matches!(e, RuntimeError::Poisoned { .. }) => {
                OpError::UnknownOutcome(e.to_string())
            }
            RuntimeError::UnknownAgent(_) => OpError::NotFound(e.to_string()),
            RuntimeError::Tree(TreeError::HasChildren { .. })
            | RuntimeError::TurnInFlight(_)
            | RuntimeError::SlotsBusy { .. }
            | RuntimeError::NeedsConfirmation { .. } => OpError::Conflict(e.to_string()),
            RuntimeError::Provider { ref source, .. } if source.0 == INTERRUPTED => {
                OpError::Interrupted(e.to_string())
            }
            RuntimeError::Provider { .. } | RuntimeError::TooManyToolRounds { .. } => {
                OpError::TurnFailed(e.to_string())
            }
            other => OpError::UnknownOutcome(other.to_string()),
        }
    }
}

impl From<ScheduleError> for OpError {
    fn from(e: ScheduleError) -> Self {
        match e {
            ScheduleError::Invalid(_) => OpError::BadRequest(e.to_string()),
            ScheduleError::Conflict(_) => OpError::Conflict(e.to_string()),
            ScheduleError::NotFound(_) => OpError::NotFound(e.to_string()),
            // A failed replace may have renamed: unknown until reloaded.
            ScheduleError::Io { .. }
            | ScheduleError::Corrupt { .. }
            | ScheduleError::FutureVersion { .. } => OpError::UnknownOutcome(e.to_string()),
        }
    }
}

/// Perform `request`; `schedules` are the root's (loaded under its lock).
/// `lifecycle` exports the telemetry of agents created and turns run.
pub fn apply<V: View>(
    system: &mut System,
    schedules: &mut Schedules,
    lifecycle: &dyn Lifecycle,
    request: Request<V>,
) -> Result<Value, OpError> {
    match request {
        Request::AddSchedule(s) => {
            // The agent must exist now; it is looked up again at each firing.
            resolve(system, &s.agent)?;
            let created = schedules.add(s.clone())?;
            Ok(json!({"schedule": s, "created": created}))
        }
        Request::DeleteSchedule(id) => Ok(json!({"deleted": schedules.remove(&id)?})),
        Request::Status => {
            let mut value = status(system)?;
            if let Some(map) = value.as_object_mut() {
                map.insert("schedules".into(), json!(schedules.list()));
            }
            Ok(value)
        }
        Request::CreateAgent(r) => create_agent(system, lifecycle, r),
        Request::DeleteAgent(name) => delete_agent(system, lifecycle, &name),
        Request::Turn(name, r) => turn(system, lifecycle, &name, r),
        Request::Message(r) => message(system, r),
        Request::Emit(r) => emit(system, r),
        Request::Confirm(r) => confirm(system, r),
        Request::RetryTrigger(id) => retry_trigger(system, &id),
        Request::ReleaseRun(id) => release_run(system, &id),
        Request::Gc(r) => super::gc::collect(system, r).map(|o| o.answer()),
        // Read-only: the runtime's memory and SELECTs, no runtime call.
        Request::View(view) => view.answer(system, schedules.list()),
    }
}

/// The live agent `name_or_id` names: an id, or a name only one live
/// agent has.
pub fn resolve(system: &System, name_or_id: &str) -> Result<AgentId, OpError> {
    let tree = system.runtime().tree();
    if let Ok(id) = AgentId::from_hex(name_or_id) {
        if tree.contains(&id) {
            return Ok(id);
        }
    }
    let matches: Vec<&AgentId> = tree
        .nodes()
        .iter()
        .filter(|(_, node)| node.name == name_or_id)
        .map(|(id, _)| id)
        .collect();
    match matches.as_slice() {
        [id] => Ok((*id).clone()),
        [] => Err(OpError::NotFound(format!("no live agent named {name_or_id:?}"))),
        many => Err(OpError::Conflict(format!(
            "{} live agents are named {name_or_id:?} ({}); use an id",
            many.len(),
            many.iter().map(|id| id.as_str()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

fn create_agent(system: &mut System, lifecycle: &dyn Lifecycle, r: CreateAgent) -> Result<Value, OpError> {
    if r.name.trim().is_empty() || r.name.len() > 128 {
        return Err(OpError::BadRequest("`name` must be 1-128 characters".into()));
    }
    if resolve(system, &r.name).is_ok() || AgentId::from_hex(&r.name).is_ok() {
        return Err(OpError::Conflict(format!(
            "an agent named {:?} exists (or the name looks like an id); names address agents, so they are unique",
            r.name
        )));
    }
    let (id, parent) = match &r.parent {
        None => (system.runtime_mut().create_root(&r.name, &r.instructions)?, None),
        Some(parent) => {
            let parent = resolve(system, parent)?;
            let id = system
                .runtime_mut()
                .spawn_child(&parent, &r.name, &r.instructions)?;
            (id, Some(parent))
        }
    };
    lifecycle.agent_start(system, &id, &r.name, parent.as_ref());
    Ok(json!({"id": id, "name": r.name, "parent": r.parent}))
}

fn delete_agent(system: &mut System, lifecycle: &dyn Lifecycle, name: &str) -> Result<Value, OpError> {
    let id = resolve(system, name)?;
    let session = lifecycle.agent_stopping(system, &id);
    system.runtime_mut().terminate(&id)?;
    lifecycle.agent_stopped(&id, session.as_deref());
    Ok(json!({"terminated": id}))
}

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
fn turn(
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

fn message(system: &mut System, r: MessageRequest) -> Result<Value, OpError> {
    let from = resolve(system, &r.from)?;
    let to = resolve(system, &r.to)?;
    let id = system.runtime_mut().send_message(&from, &to, &r.payload)?;
    Ok(json!({"message_id": id}))
}

fn emit(system: &mut System, r: EmitRequest) -> Result<Value, OpError> {
    if r.dedup_key.trim().is_empty() {
        return Err(OpError::BadRequest("`dedup_key` must not be empty".into()));
    }
    if r.prompt.trim().is_empty() {
        return Err(OpError::BadRequest("`prompt` must not be empty".into()));
    }
    let now = system.now_ms();
    let fire_at_ms = match (r.fire_at_ms, r.delay_ms) {
        (Some(at), None) => at,
        (None, Some(delay)) if delay <= MAX_TRIGGER_DELAY_MS => now.saturating_add(delay),
        (None, None) => now,
        (None, Some(_)) => {
            return Err(OpError::BadRequest(format!(
                "`delay_ms` is above the limit of {MAX_TRIGGER_DELAY_MS}"
            )))
        }
        (Some(_), Some(_)) => {
            return Err(OpError::BadRequest(
                "give `fire_at_ms` or `delay_ms`, not both".into(),
            ))
        }
    };
    if fire_at_ms > now.saturating_add(MAX_TRIGGER_DELAY_MS) {
        return Err(OpError::BadRequest(
            "`fire_at_ms` is more than a year ahead".into(),
        ));
    }
    // The agent must exist now; it is looked up again when the trigger fires.
    resolve(system, &r.agent)?;
    let spec = TriggerSpec {
        source: TriggerSource::Scheduled,
        dedup_key: Some(r.dedup_key.clone()),
        session_id: None,
        fire_at_ms,
        priority: 0,
        description: format!("prompt for {}", r.agent),
        payload: json!({"agent": r.agent, "prompt": r.prompt}),
    };
    let outcome = system.triggers().emit(system.db().conn(), &spec, now)?;
    let (id, duplicate) = match &outcome {
        EmitOutcome::Inserted(id) => (id, false),
        EmitOutcome::Duplicate(id) => (id, true),
    };
    // A duplicate keeps the trigger first emitted: answer its fire time,
    // not the one this request asked for.
    let stored_at = match duplicate {
        true => system
            .triggers()
            .get(system.db().conn(), id, now)?
            .map_or(fire_at_ms, |t| t.fire_at_ms),
        false => fire_at_ms,
    };
    Ok(json!({"id": id, "duplicate": duplicate, "dedup_key": r.dedup_key, "fire_at_ms": stored_at}))
}

fn confirm(system: &mut System, r: ConfirmRequest) -> Result<Value, OpError> {
    let resolution = match (r.abandon, r.delivered) {
        (true, _) => Resolution::Abandon,
        (false, true) => Resolution::Delivered {
            provider_ref: r
                .provider_ref
                .clone()
                .unwrap_or_else(|| "confirmed delivered by a human".to_string()),
        },
        (false, false) => Resolution::NotDelivered,
    };
    let done = system.confirm(&r.idem_key, &resolution).map_err(|e| match e {
        SystemError::Store(StoreError::NotFound { .. }) => {
            OpError::NotFound(format!("no activity with key {:?}", r.idem_key))
        }
        e => admin_error(e),
    })?;
    Ok(json!({
        "idem_key": r.idem_key,
        "status": done.status.map_or("RELEASED", |s| s.as_str()),
        "retried_triggers": done.retried.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
    }))
}

fn retry_trigger(system: &mut System, id: &str) -> Result<Value, OpError> {
    let t = system.retry_trigger(id).map_err(admin_error)?;
    Ok(json!({"id": t.id, "status": t.status.as_str(), "attempts": t.attempts}))
}

fn release_run(system: &mut System, id: &str) -> Result<Value, OpError> {
    let run = system.release_run(id).map_err(admin_error)?;
    Ok(json!({"run_id": run.run_id, "status": run.status.as_str()}))
}

/// A human's answer refused by the system's operator API: a missing row
/// is 404, a row in another state 409 (both unchanged); anything else is
/// what it is.
fn admin_error(e: SystemError) -> OpError {
    match e {
        SystemError::Store(e @ StoreError::NotFound { .. }) => OpError::NotFound(e.to_string()),
        SystemError::Store(e @ StoreError::WrongState { .. }) => OpError::Conflict(e.to_string()),
        SystemError::Store(e) => e.into(),
        e => OpError::UnknownOutcome(e.to_string()),
    }
}

/// Agents, triggers by status, activities needing confirmation, runs.
pub fn status(system: &mut System) -> Result<Value, OpError> {
    let state = system.runtime().state();
    let agents: Vec<Value> = state
        .agents
        .iter()
        .map(|(id, view)| {
            json!({
                "id": id, "name": view.name, "parent": view.parent,
                "session_id": view.session_id, "session_state": format!("{:?}", view.session_state),
                "pending_messages": state.pending.get(id).map_or(0, Vec::len),
                "turns": state.conversations.get(id).map_or(0, |c| c.iter().filter(|i| matches!(i, crate::runtime::ConversationItem::Prompt { .. })).count()),
            })
        })
        .collect();
    let now = system.now_ms();
    let conn = system.db();
    let mut triggers = serde_json::Map::new();
    for t in system.triggers().all(conn.conn(), now)? {
        let entry = triggers
            .entry(t.status.as_str().to_string())
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(list) = entry {
            list.push(json!({
                "id": t.id, "dedup_key": t.dedup_key, "fire_at_ms": t.fire_at_ms,
                "attempts": t.attempts, "last_error": t.last_error, "payload": t.payload,
            }));
        }
    }
    let needs_confirmation: Vec<Value> = ActivityStore::default()
        .with_status(conn.conn(), ActivityStatus::NeedsConfirmation)?
        .into_iter()
        .map(
            |a| json!({"idem_key": a.idem_key, "agent": a.task_id, "action": a.action, "payload": a.payload}),
        )
        .collect();
    let store = ToolCallStore::default();
    let mut runs = Vec::new();
    // Runs parked after their replays kept failing, with the stuck calls:
    // `POST /runs/{id}/release` (`durable-agent release`) once fixed.
    let mut waiting = Vec::new();
    for run_id in store.run_ids(conn.conn())? {
        let Some(run) = store.get_run(conn.conn(), &run_id)? else {
            continue;
        };
        if run.status == RunStatus::WaitingForHuman {
            let stuck: Vec<Value> = store
                .in_flight(conn.conn(), &run_id)?
                .into_iter()
                .map(|c| json!({"call_id": c.id, "tool": c.raw_tool_name, "error": c.error, "replay_attempts": c.replay_attempts}))
                .collect();
            waiting.push(json!({"run_id": run.run_id, "in_flight": stuck}));
        }
        // Job runs only: the tool-call ledger also keeps one run per agent
        // session (`session:{id}`), which is bookkeeping, not a job.
        if run.job_json.is_some() {
            runs.push(json!({"run_id": run.run_id, "status": run.status.as_str(), "parent_run_id": run.parent_run_id}));
        }
    }
    Ok(json!({
        "now_ms": now,
        "agents": agents,
        "triggers": triggers,
        "needs_confirmation": needs_confirmation,
        "waiting_for_human": waiting,
        "runs": runs,
    }))
}

/// What the scheduler did with one claimed trigger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FireResult {
    Fired {
        id: String,
        fired: Fired,
    },
    /// Acked failed (retried later with backoff, or given up).
    Failed {
        id: String,
        error: String,
    },
    /// A stop arrived mid-turn: the claim is left for the next boot to
    /// reclaim (the turn re-runs under the same work id).
    Interrupted {
        id: String,
    },
}

/// A due trigger this process claimed, with the agent and prompt its
/// payload names.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub claim: Trigger,
    pub agent: AgentId,
    pub prompt: String,
}

/// Claim the next due trigger whose payload names a live agent; a trigger
/// whose payload cannot run is acked failed (not retried) and reported in
/// `results`. `None`: nothing is due.
pub fn claim_next(
    system: &mut System,
    lease_ms: u64,
    results: &mut Vec<FireResult>,
) -> Result<Option<Claimed>, OpError> {
    loop {
        let now = system.now_ms();
        let claimed = system.triggers().claim(system.db().conn(), now, lease_ms)?;
        let Some(claim) = claimed else { return Ok(None) };
        let field = |name: &str| {
            claim
                .payload
                .get(name)
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let target = match (field("agent"), field("prompt")) {
            (Some(target), Some(prompt)) => resolve(system, &target).map(|agent| (agent, prompt)),
            _ => Err(OpError::BadRequest(
                "payload has no `agent` and `prompt` strings".into(),
            )),
        };
        let (agent, mut prompt) = match target {
            Ok(target) => target,
            Err(e) => {
                let error = e.to_string();
                let now = system.now_ms();
                system
                    .triggers()
                    .ack_failed(system.db().conn(), &claim, now, &error, false)?;
                results.push(FireResult::Failed { id: claim.id, error });
                continue;
            }
        };
        // A RESUME trigger continues an interrupted turn: its prompt must
        // stay the turn's own (a note would make it another turn).
        if let Some(note) = claim
            .overdue_note()
            .filter(|_| claim.source != TriggerSource::Resume)
        {
            prompt.push_str(&format!("\n\n[{note}]"));
        }
        tracing::info!(id = %claim.id, key = ?claim.dedup_key, agent = %agent, attempt = claim.attempts, "firing trigger");
        return Ok(Some(Claimed { claim, agent, prompt }));
    }
}

/// Settle a claimed trigger's firing: DONE was acked by the fire (`Ok`);
/// a failed turn is acked failed here — retried with backoff if the
/// provider failed, else given up. `Ok(None)`: a stop interrupted the
/// turn, the claim is left for the next boot to reclaim.
pub fn settle_fire(
    system: &mut System,
    claim: &Trigger,
    outcome: Result<Fired, SystemError>,
) -> Result<Option<FireResult>, OpError> {
    let blocked = matches!(
        outcome,
        Err(SystemError::Runtime(RuntimeError::NeedsConfirmation { .. }))
    );
    let (error, retryable) = match outcome {
        Ok(fired) => {
            tracing::info!(id = %claim.id, ?fired, "trigger done");
            settle_run(system, claim, RunStatus::Succeeded)?;
            return Ok(Some(FireResult::Fired {
                id: claim.id.clone(),
                fired,
            }));
        }
        Err(SystemError::Runtime(RuntimeError::Provider { source, .. })) if source.0 == INTERRUPTED => {
            tracing::info!(id = %claim.id, "trigger turn interrupted by stop; boot reclaims it");
            return Ok(None);
        }
        Err(SystemError::Runtime(e @ RuntimeError::Provider { .. })) => (e.to_string(), true),
        Err(SystemError::Runtime(e @ (RuntimeError::TurnInFlight(_) | RuntimeError::SlotsBusy { .. }))) => {
            (e.to_string(), true)
        }
        Err(SystemError::Runtime(e @ RuntimeError::TooManyToolRounds { .. })) => (e.to_string(), false),
        // Blocked on a human: FAILED, not retried by itself (a retry would
        // block again); answering the key re-pends it (`System::confirm`).
        Err(SystemError::Runtime(e @ RuntimeError::NeedsConfirmation { .. })) => (e.to_string(), false),
        Err(SystemError::Runtime(e @ RuntimeError::UnknownAgent(_))) => (e.to_string(), false),
        Err(SystemError::Store(e @ StoreError::LeaseLost { .. })) => {
            tracing::warn!(id = %claim.id, error = %e, "lease lost; the newer claim owns the trigger");
            return Ok(Some(FireResult::Failed {
                id: claim.id.clone(),
                error: e.to_string(),
            }));
        }
        Err(e) => return Err(OpError::UnknownOutcome(format!("trigger {}: {e}", claim.id))),
    };
    let now = system.now_ms();
    let status = system
        .triggers()
        .ack_failed(system.db().conn(), claim, now, &error, retryable)?;
    tracing::warn!(id = %claim.id, error, next = status.as_str(), "trigger failed");
    if blocked {
        settle_run(system, claim, RunStatus::WaitingForHuman)?;
    } else if status != TriggerStatus::Pending {
        settle_run(system, claim, RunStatus::Failed)?;
    }
    Ok(Some(FireResult::Failed {
        id: claim.id.clone(),
        error,
    }))
}

/// A RESUME trigger of a job run (`run:{id}`, see `crate::system`'s
/// boot) settles the run's status as `run --resume` would.
fn settle_run(system: &System, claim: &Trigger, status: RunStatus) -> Result<(), OpError> {
    let work = System::trigger_work(claim);
    let Some(run_id) = work
        .strip_prefix("run:")
        .filter(|_| claim.source == TriggerSource::Resume)
    else {
        return Ok(());
    };
    let store = ToolCallStore::default();
    let db = system.db();
    if store.get_run(db.conn(), run_id)?.is_some() {
        store.set_run_status(db.conn(), run_id, status, system.now_ms())?;
        tracing::info!(
            run_id,
            status = status.as_str(),
            "run resumed by its RESUME trigger"
        );
    }
    Ok(())
}

/// The `turn_end` payload of a firing.
pub fn describe_fired(fired: &Fired) -> Value {
    match fired {
        Fired::Ran { tool_calls } => json!({"tool_calls": tool_calls}),
        Fired::AlreadyDone => json!({"already_done": true}),
    }
}

#[cfg(test)]
mod tests {
    use crate::runtime::{AgentId, ProviderError, RuntimeError};

    use super::{OpError, INTERRUPTED};

    #[test]
    fn a_turn_abandoned_by_a_stop_is_a_503_that_says_it_will_resume_not_a_provider_failure() {
        let agent = AgentId::from_hex("00000000000000a1").expect("a valid id");
        let stopped = OpError::from(RuntimeError::Provider {
            agent: agent.clone(),
            source: ProviderError(INTERRUPTED.to_string()),
        });
        assert_eq!(stopped.http_status(), 503, "{stopped}");
        assert!(stopped.to_string().contains("will resume"), "{stopped}");
        assert!(!stopped.is_fatal());
        let failed = OpError::from(RuntimeError::Provider {
            agent,
            source: ProviderError("HTTP 500".into()),
        });
        assert_eq!(failed.http_status(), 502, "{failed}");
    }
}
