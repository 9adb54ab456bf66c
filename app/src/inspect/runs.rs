//! Runs and work turns: `GET /runs`, `/runs/{id}`, `/work/{work_id}`.
//!
//! A job run is the work turn `run:{run_id}` of its own agent; its calls
//! are the rows of that agent's tool-call ledger run (`session:{id}`)
//! whose idempotency key belongs to the work ([`key_of_work`]), and its
//! effects the activity-ledger rows of its irreversible calls. A
//! bookkeeping run (`session:{id}`) is shown with every call of the
//! session and no outcome (it is an agent's ledger, not a job).
//!
//! Invariant: read-only (see [`super`]); every call listed is a ledger row
//! (nothing is inferred), listed once, oldest first.

use std::collections::BTreeSet;

use durable_agent::runtime::{ConversationItem, Runtime, RuntimeError, TurnOutcome};
use durable_agent::store::activities::ActivityStore;
use durable_agent::store::inspect::{self as q, Page, RunRow, BOOKKEEPING_RUN_PREFIX};
use durable_agent::store::tool_calls::{SideEffect, ToolCall, ToolCallStore};
use durable_agent::system::session_run;
use serde_json::{json, Value};

use super::{agent_of_session, agent_ref, paged, read_error, Source};
use crate::effects::key_of_work;
use crate::ops::OpError;

/// Errors a run's answer carries inline (the rest: `GET /errors?run=`).
const RUN_ERRORS_SHOWN: u32 = 20;

fn run_summary(runtime: &Runtime, row: &RunRow) -> Value {
    let agent = agent_of_session(runtime, &row.session_id);
    json!({
        "run_id": row.run_id,
        "status": row.status.as_str(),
        "parent_run_id": row.parent_run_id,
        "agent": agent.map(|a| agent_ref(runtime, a.as_str())),
        "session_id": row.session_id,
        "created_at_ms": row.created_at_ms,
        "updated_at_ms": row.updated_at_ms,
    })
}

/// `GET /runs`.
pub fn list(source: &Source<'_>, page: Page) -> Result<Value, OpError> {
    let (rows, total) = q::user_runs(source.db.conn(), page).map_err(read_error)?;
    let items = rows.iter().map(|r| run_summary(source.runtime, r)).collect();
    Ok(paged(items, total, page))
}

/// The round a call key names (`…-r{round}-c{index}…@session`).
fn round_of_key(key: &str) -> Option<u32> {
    let body = key.rsplit_once('@').map_or(key, |(body, _)| body);
    // The last `-r{digits}-c{digits}` in the key: a work id may itself
    // hold `-r`, the call part comes last.
    body.rmatch_indices("-r").find_map(|(i, _)| {
        let rest = &body[i + 2..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let after = rest[digits..].strip_prefix("-c")?;
        (digits > 0 && after.bytes().next().is_some_and(|b| b.is_ascii_digit()))
            .then(|| rest[..digits].parse().ok())
            .flatten()
    })
}

/// The ledger rows of run `row`: a job run's work calls, or every call of
/// a bookkeeping run.
fn calls_of(source: &Source<'_>, row: &RunRow) -> Result<Vec<ToolCall>, OpError> {
    let store = ToolCallStore::default();
    let conn = source.db.conn();
    if row.run_id.starts_with(BOOKKEEPING_RUN_PREFIX) {
        return store.calls_of(conn, &row.run_id).map_err(read_error);
    }
    let work = format!("run:{}", row.run_id);
    let rows = store
        .calls_of(conn, &session_run(&row.session_id))
        .map_err(read_error)?;
    Ok(rows
        .into_iter()
        .filter(|c| key_of_work(&c.idempotency_key, &work, &row.session_id))
        .collect())
}

/// `GET /runs/{id}`.
pub fn one(source: &Source<'_>, id: &str) -> Result<Value, OpError> {
    let conn = source.db.conn();
    let row = q::run(conn, id).map_err(read_error)?.ok_or_else(|| {
        OpError::NotFound(format!(
            "no run {id:?} in this root (list them: GET /runs, `durable-agent inspect runs`)"
        ))
    })?;
    let calls = calls_of(source, &row)?;
    let activities = ActivityStore::default();
    let mut effects = Vec::new();
    for c in calls.iter().filter(|c| c.side_effect == SideEffect::Irreversible) {
        if let Some(a) = activities.get(conn, &c.idempotency_key).map_err(read_error)? {
            effects.push(json!({
                "idem_key": a.idem_key, "action": a.action, "status": a.status.as_str(),
                "provider_ref": a.provider_ref, "error": a.error,
            }));
        }
    }
    let rounds: BTreeSet<u32> = calls
        .iter()
        .filter_map(|c| round_of_key(&c.idempotency_key))
        .collect();
    let outcome = match row.run_id.starts_with(BOOKKEEPING_RUN_PREFIX) {
        true => Value::Null,
        false => run_outcome(source.runtime, &row),
    };
    let usage = q::token_sum(conn, Some(&row.session_id)).map_err(read_error)?;
    let (errors, errors_total) =
        q::errors(conn, Some(&row.session_id), Page::new(RUN_ERRORS_SHOWN, 0)).map_err(read_error)?;
    let mut answer = run_summary(source.runtime, &row);
    answer["job"] = row.job_json.as_deref().map_or(Value::Null, |j| {
        serde_json::from_str(j).unwrap_or_else(|_| json!(j))
    });
    answer["work"] =
        json!((!row.run_id.starts_with(BOOKKEEPING_RUN_PREFIX)).then(|| format!("run:{}", row.run_id)));
    answer["rounds"] = json!(rounds.len());
    answer["calls"] = calls
        .iter()
        .map(|c| {
            json!({
                "call_id": c.id, "tool": c.raw_tool_name, "idem_key": c.idempotency_key,
                "side_effect": c.side_effect.as_str(), "status": c.status.as_str(),
                "replays": c.replay_attempts, "round": round_of_key(&c.idempotency_key), "error": c.error,
            })
        })
        .collect();
    answer["effects"] = json!(effects);
    answer["outcome"] = outcome;
    answer["usage"] = json!({
        "calls": usage.calls, "input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
    });
    answer["errors"] = json!({
        "items": errors.iter().map(super::store_views::error_json).collect::<Vec<_>>(),
        "total": errors_total,
    });
    Ok(answer)
}

/// A job run's work turn: done (its response), unfinished, or gone.
fn run_outcome(runtime: &Runtime, row: &RunRow) -> Value {
    let work = format!("run:{}", row.run_id);
    let Some(agent) = agent_of_session(runtime, &row.session_id) else {
        return json!({"state": "agent_gone"});
    };
    match runtime.work_outcome(&agent, &work) {
        Ok(Some(o)) => json!({"state": "done", "response": o.response, "tool_calls": o.tool_calls.len()}),
        _ if runtime
            .started_work_prompt(&agent, &work)
            .ok()
            .flatten()
            .is_some() =>
        {
            json!({"state": "unfinished"})
        }
        _ => json!({"state": "not_started"}),
    }
}

fn outcome_json(work: &str, agent: Value, o: &TurnOutcome) -> Value {
    json!({
        "work": work,
        "agent": agent,
        "response": o.response,
        "tool_calls": o.tool_calls.iter().map(|(call_id, call, output)| json!({
            "call_id": call_id, "tool": call.tool, "args": call.args, "irreversible": call.irreversible,
            "ok": output.ok, "output": output.output,
        })).collect::<Vec<_>>(),
    })
}

/// `GET /work/{id}`: the stored answer of the completed work turn `id`
/// (as given — `api:w1`, `run:job-1`, `trigger:key` — or, without a
/// prefix, the API turn `api:{id}`), on whichever live agent ran it.
pub fn work(source: &Source<'_>, id: &str) -> Result<Value, OpError> {
    let runtime = source.runtime;
    let mut candidates = vec![id.to_string()];
    if !id.contains(':') {
        candidates.push(format!("api:{id}"));
    }
    let mut unfinished = None;
    for agent in runtime.tree().nodes().keys() {
        for work in &candidates {
            let found = runtime.work_outcome(agent, work).map_err(gone)?;
            if let Some(o) = found {
                return Ok(outcome_json(work, agent_ref(runtime, agent.as_str()), &o));
            }
            if runtime.started_work_prompt(agent, work).map_err(gone)?.is_some() {
                unfinished = Some((work.clone(), agent.clone()));
            }
        }
    }
    Err(OpError::NotFound(match unfinished {
        Some((work, agent)) => format!(
            "work {work:?} started on agent {agent} but has not completed (interrupted or blocked): \
             it has no stored answer yet; retrying the same work id resumes it"
        ),
        None => format!(
            "no completed work turn {id:?} on a live agent (a work id is an API turn's `work_id`, \
             `run:{{run_id}}` or `trigger:{{dedup_key}}`)"
        ),
    }))
}

fn gone(e: RuntimeError) -> OpError {
    OpError::NotFound(e.to_string())
}

/// The number of prompts (turns) in a conversation.
pub fn turns(conversation: &[ConversationItem]) -> usize {
    conversation
        .iter()
        .filter(|i| matches!(i, ConversationItem::Prompt { .. }))
        .count()
}

#[cfg(test)]
mod tests {
    use super::round_of_key;

    #[test]
    fn the_round_is_read_from_the_call_part_of_a_key() {
        assert_eq!(
            round_of_key("run:job-1-r0-c0-dbd52cc47c28319f@ee23863900000002"),
            Some(0)
        );
        assert_eq!(round_of_key("api:w-r9-r12-c3@ee23863900000002"), Some(12));
        assert_eq!(round_of_key("no-round-here@ee"), None);
    }
}
