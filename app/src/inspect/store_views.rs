//! The stores' views: `GET /usage`, `/errors`, `/triggers`,
//! `/triggers/{id}`, `/confirmations`.
//!
//! Usage per model: every `token_usage` row records the model its call
//! was made with (schema 4); rows written before that have none and are
//! summed under `"model": null` — not recorded, never guessed.
//!
//! Invariant: read-only (see [`super`]); every number is a SUM or COUNT
//! over the stored rows, nothing estimated.

use durable_agent::runtime::AgentId;
use durable_agent::store::activities::{ActivityStatus, ActivityStore};
use durable_agent::store::inspect::{self as q, ErrorRow, Page, TokenSum};
use durable_agent::store::tool_calls::ToolCallStore;
use durable_agent::store::triggers::{Trigger, TriggerStatus};
use durable_agent::system::System;
use serde_json::{json, Value};

use super::{agent_ref, paged, read_error, window, Source};
use crate::ops::OpError;

fn tokens(sum: &TokenSum) -> Value {
    json!({"calls": sum.calls, "input_tokens": sum.input_tokens, "output_tokens": sum.output_tokens})
}

/// `GET /usage`: totals, per model, and a page each of agents (sessions,
/// most recently active first) and user runs (newest first).
pub fn usage(source: &Source<'_>, page: Page) -> Result<Value, OpError> {
    let conn = source.db.conn();
    let total = q::token_sum(conn, None).map_err(read_error)?;
    let (sessions, sessions_total) = q::usage_by_session(conn, page).map_err(read_error)?;
    let by_agent: Vec<Value> = sessions
        .iter()
        .map(|s| {
            let mut row = tokens(&s.sum);
            row["agent"] = agent_ref(source.runtime, &s.agent_id);
            row["session_id"] = json!(s.session_id);
            row["last_at_ms"] = json!(s.last_at_ms);
            row
        })
        .collect();
    let (runs, runs_total) = q::user_runs(conn, page).map_err(read_error)?;
    let mut by_run = Vec::new();
    for r in &runs {
        // A job run is the one work turn of its own agent: its session's usage.
        let mut row = tokens(&q::token_sum(conn, Some(&r.session_id)).map_err(read_error)?);
        row["run_id"] = json!(r.run_id);
        row["status"] = json!(r.status.as_str());
        by_run.push(row);
    }
    let by_model: Vec<Value> = q::usage_by_model(conn)
        .map_err(read_error)?
        .iter()
        .map(|m| {
            let mut row = tokens(&m.sum);
            row["model"] = json!(m.model);
            row
        })
        .collect();
    Ok(json!({
        "total": tokens(&total),
        "by_model": by_model,
        "by_agent": paged(by_agent, sessions_total, page),
        "by_run": paged(by_run, runs_total, page),
    }))
}

/// One stored error as JSON.
pub fn error_json(e: &ErrorRow) -> Value {
    json!({
        "session_id": e.session_id, "agent_id": e.agent_id, "turn": e.turn,
        "context": e.context, "message": e.message, "attempt": e.attempt,
        "created_at_ms": e.created_at_ms,
    })
}

/// `GET /errors[?run=]`: every stored error, or one run's (its agent
/// session's), newest first.
pub fn errors(source: &Source<'_>, run: Option<&str>, page: Page) -> Result<Value, OpError> {
    let conn = source.db.conn();
    let session = match run {
        Some(id) => Some(
            q::run(conn, id)
                .map_err(read_error)?
                .ok_or_else(|| {
                    OpError::NotFound(format!("no run {id:?} in this root (GET /runs lists them)"))
                })?
                .session_id,
        ),
        None => None,
    };
    let (rows, total) = q::errors(conn, session.as_deref(), page).map_err(read_error)?;
    let items = rows
        .iter()
        .map(|e| {
            let mut row = error_json(e);
            row["agent"] = agent_ref(source.runtime, &e.agent_id);
            row
        })
        .collect();
    let mut answer = paged(items, total, page);
    answer["run_id"] = json!(run);
    Ok(answer)
}

fn trigger_json(t: &Trigger) -> Value {
    let field = |name: &str| t.payload.get(name).and_then(Value::as_str).map(str::to_string);
    json!({
        "id": t.id,
        "status": t.status.as_str(),
        "source": t.source.as_str(),
        "dedup_key": t.dedup_key,
        "agent": field("agent"),
        "prompt": field("prompt"),
        "work": System::trigger_work(t),
        "fire_at_ms": t.fire_at_ms,
        "attempts": t.attempts,
        "last_error": t.last_error,
        "lease_until_ms": t.lease_until_ms,
        "overdue_by_ms": t.overdue_by_ms,
        "created_at_ms": t.created_at_ms,
        "updated_at_ms": t.updated_at_ms,
        "session_id": t.session_id,
    })
}

/// `GET /triggers[?status=]`, newest first.
pub fn triggers(source: &Source<'_>, status: Option<TriggerStatus>, page: Page) -> Result<Value, OpError> {
    let conn = source.db.conn();
    let (ids, total) = q::trigger_ids(conn, status, page).map_err(read_error)?;
    let store = durable_agent::store::triggers::TriggerStore::default();
    let mut items = Vec::new();
    for id in ids {
        // A row GC removed between the two reads is simply not shown.
        if let Some(t) = store.get(conn, &id, source.now_ms).map_err(read_error)? {
            items.push(trigger_json(&t));
        }
    }
    Ok(paged(items, total, page))
}

/// `GET /triggers/{id}`: the trigger, its attempts so far and the work
/// turn it starts (done, with its response, or not).
pub fn trigger(source: &Source<'_>, id: &str) -> Result<Value, OpError> {
    let conn = source.db.conn();
    let store = durable_agent::store::triggers::TriggerStore::default();
    let t = store
        .get(conn, id, source.now_ms)
        .map_err(read_error)?
        .ok_or_else(|| {
            OpError::NotFound(format!(
                "no trigger {id:?} (ids are `trg-N`; list them: GET /triggers, `durable-agent inspect triggers`)"
            ))
        })?;
    let mut answer = trigger_json(&t);
    answer["description"] = json!(t.description);
    answer["payload"] = t.payload.clone();
    let work = System::trigger_work(&t);
    let agent = t
        .payload
        .get("agent")
        .and_then(Value::as_str)
        .and_then(|a| super::resolve(source.runtime, a).ok());
    answer["work_outcome"] = match agent {
        None => json!({"state": "agent_not_live"}),
        Some(agent) => match source.runtime.work_outcome(&agent, &work) {
            Ok(Some(o)) => json!({"state": "done", "response": o.response, "tool_calls": o.tool_calls.len()}),
            _ if source
                .runtime
                .started_work_prompt(&agent, &work)
                .ok()
                .flatten()
                .is_some() =>
            {
                json!({"state": "unfinished"})
            }
            _ => json!({"state": "not_started"}),
        },
    };
    Ok(answer)
}

/// `GET /confirmations`: NEEDS_CONFIRMATION activities, newest first, each
/// with its tool call and the command that answers it.
pub fn confirmations(source: &Source<'_>, page: Page) -> Result<Value, OpError> {
    let conn = source.db.conn();
    let mut all = ActivityStore::default()
        .with_status(conn, ActivityStatus::NeedsConfirmation)
        .map_err(read_error)?;
    all.sort_by(|a, b| (b.created_at_ms, &b.idem_key).cmp(&(a.created_at_ms, &a.idem_key)));
    let total = all.len() as u64;
    let calls = ToolCallStore::default();
    let mut items = Vec::new();
    for a in window(all, page) {
        let call = calls.by_key(conn, &a.idem_key).map_err(read_error)?;
        let agent = AgentId::from_hex(&a.task_id).ok();
        items.push(json!({
            "idem_key": a.idem_key,
            "action": a.action,
            "agent": agent.map(|id| agent_ref(source.runtime, id.as_str())),
            "payload": a.payload,
            "created_at_ms": a.created_at_ms,
            "call": call.map(|c| json!({
                "call_id": c.id, "run_id": c.run_id, "tool": c.raw_tool_name, "status": c.status.as_str(),
            })),
            "answer_with": format!(
                "durable-agent confirm --config FILE {} --delivered|--not-delivered|--abandon", a.idem_key
            ),
        }));
    }
    Ok(paged(items, total, page))
}
