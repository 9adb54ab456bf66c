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

use crate::runtime::{AgentId, Runtime};
use crate::store::activities::{ActivityStatus, ActivityStore};
use crate::store::tool_calls::{RunStatus, ToolCallStore};
use crate::store::triggers::{EmitOutcome, TriggerSource, TriggerSpec};
use crate::store::StoreError;
use crate::system::{Resolution, System, SystemError};
use serde::Deserialize;
use serde_json::{json, Value};

use super::gc::GcRequest;
use super::schedule::{Schedule, Schedules};
use super::Lifecycle;

mod error;
mod fire;
mod turn;

pub use error::OpError;
pub use fire::{claim_next, describe_fired, settle_fire, Claimed, FireResult};
pub use turn::{begin, end_api_turn, Begun, PreparedTurn, StartedTurn};

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
            let created = schedules.add(s.clone(), system.now_ms())?;
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
        Request::Turn(name, r) => turn::turn(system, lifecycle, &name, r),
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
    resolve_in(system.runtime(), name_or_id)
}

/// [`resolve`] on a runtime alone (the read-only views, which open no
/// system): the one lookup of an agent by name or id.
pub fn resolve_in(runtime: &Runtime, name_or_id: &str) -> Result<AgentId, OpError> {
    let tree = runtime.tree();
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
        [] => Err(OpError::NotFound(format!(
            "no live agent named {name_or_id:?} (list them: GET /agents, `durable-agent inspect agents`)"
        ))),
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
    // Any live agent of that name, one or several (spawned children may
    // share a name across the tree), makes the name taken.
    let taken = !matches!(resolve(system, &r.name), Err(OpError::NotFound(_)));
    if taken || AgentId::from_hex(&r.name).is_ok() {
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

fn message(system: &mut System, r: MessageRequest) -> Result<Value, OpError> {
    let from = resolve(system, &r.from)?;
    let to = resolve(system, &r.to)?;
    let id = system.runtime_mut().send_message(&from, &to, &r.payload)?;
    Ok(json!({"message_id": id}))
}

/// Dedup key prefixes of the triggers the system emits itself (wake-ups,
/// resumes, schedule buckets), which `POST /triggers` refuses.
pub const RESERVED_KEY_PREFIXES: [&str; 3] = ["wake:", "resume:", "scheduled:"];

fn emit(system: &mut System, r: EmitRequest) -> Result<Value, OpError> {
    if r.dedup_key.trim().is_empty() {
        return Err(OpError::BadRequest("`dedup_key` must not be empty".into()));
    }
    // The system's own triggers share the key space: a client's trigger
    // under one of their keys would make the system's emit a duplicate,
    // and the wake-up, resume or schedule bucket would never fire.
    if let Some(prefix) = RESERVED_KEY_PREFIXES.iter().find(|p| r.dedup_key.starts_with(*p)) {
        return Err(OpError::BadRequest(format!(
            "`dedup_key` may not start with {prefix:?}: the daemon's own triggers use it"
        )));
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
        e @ SystemError::AwaitsConfirmation { .. } => OpError::Conflict(e.to_string()),
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
    // Runs parked for a human, with the calls to look at (in flight, or
    // replayed to the limit): `POST /runs/{id}/release` (`durable-agent
    // release`) once fixed; a job run waits on a confirmation instead.
    let mut waiting = Vec::new();
    for run_id in store.run_ids(conn.conn())? {
        let Some(run) = store.get_run(conn.conn(), &run_id)? else {
            continue;
        };
        if run.status == RunStatus::WaitingForHuman {
            let stuck: Vec<Value> = store
                .stuck(conn.conn(), &run_id)?
                .into_iter()
                .map(|c| json!({"call_id": c.id, "tool": c.raw_tool_name, "error": c.error, "replay_attempts": c.replay_attempts}))
                .collect();
            waiting.push(json!({"run_id": run.run_id, "stuck_calls": stuck}));
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

#[cfg(test)]
mod tests {
    use crate::runtime::{AgentId, ProviderError, RuntimeError};

    use super::OpError;
    use crate::worker::INTERRUPTED;

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
