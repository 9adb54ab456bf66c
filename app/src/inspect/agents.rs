//! Agents: `GET /agents` (the live tree, a page of root agents, newest
//! first, each with its descendants nested) and `GET /agents/{name|id}`
//! (one agent, its conversation as JSON, its interrupted turn if any).
//!
//! Invariant: read-only (see [`super`]); the tree shown is the runtime's
//! (every live agent exactly once, under its parent), children oldest
//! first, as they were spawned.

use durable_agent::runtime::{AgentId, OpenTurn, Runtime, RuntimeState};
use durable_agent::store::inspect::{self as q, Page};
use serde_json::{json, Value};

use super::runs::turns;
use super::{paged, read_error, resolve, window, Source};
use crate::ops::OpError;

/// Deepest nesting shown (the runtime bounds nothing here; a bound keeps
/// the answer finite whatever the tree).
const MAX_DEPTH: usize = 64;

fn node(runtime: &Runtime, state: &RuntimeState, id: &AgentId, depth: usize) -> Value {
    let Some(n) = runtime.tree().get(id) else {
        return Value::Null;
    };
    let children: Vec<Value> = match depth < MAX_DEPTH {
        true => n
            .children
            .iter()
            .map(|c| node(runtime, state, c, depth + 1))
            .collect(),
        false => Vec::new(),
    };
    json!({
        "id": id,
        "name": n.name,
        "parent": n.parent,
        "session_id": runtime.session_id(id),
        "turns": state.conversations.get(id).map_or(0, |c| turns(c)),
        "pending_messages": state.pending.get(id).map_or(0, Vec::len),
        "open_turn": runtime.open_turn(id).ok().flatten().is_some(),
        "children": children,
    })
}

/// `GET /agents`.
pub fn tree(source: &Source<'_>, page: Page) -> Result<Value, OpError> {
    let runtime = source.runtime;
    // Newest first: ids count up as agents are created.
    let mut roots: Vec<&AgentId> = runtime
        .tree()
        .nodes()
        .iter()
        .filter(|(_, n)| n.parent.is_none())
        .map(|(id, _)| id)
        .collect();
    roots.sort_by_key(|id| std::cmp::Reverse(id.counter()));
    let total = roots.len() as u64;
    let state = runtime.state();
    let items = window(roots, page)
        .into_iter()
        .map(|id| node(runtime, &state, id, 0))
        .collect();
    let mut answer = paged(items, total, page);
    answer["agents_live"] = json!(runtime.tree().nodes().len());
    Ok(answer)
}

fn open_json(open: &OpenTurn) -> Value {
    json!({
        "prompt": open.prompt,
        "work": open.work,
        "round": open.round,
        "items": open.items,
        "pending_calls": open.pending_calls().iter().map(|(_, c)| json!({
            "call_id": c.call_id, "tool": c.tool, "args": c.args,
        })).collect::<Vec<_>>(),
    })
}

/// `GET /agents/{name|id}`.
pub fn one(source: &Source<'_>, name: &str) -> Result<Value, OpError> {
    let runtime = source.runtime;
    let id = resolve(runtime, name)?;
    let Some(n) = runtime.tree().get(&id) else {
        return Err(OpError::NotFound(format!("agent {id} left the tree")));
    };
    let state = runtime.state();
    let view = state.agents.get(&id);
    let session = runtime.session_id(&id).map(|s| s.to_string());
    let usage = match &session {
        Some(s) => Some(q::token_sum(source.db.conn(), Some(s)).map_err(read_error)?),
        None => None,
    };
    let conversation = state.conversations.get(&id).cloned().unwrap_or_default();
    let open = runtime
        .open_turn(&id)
        .map_err(|e| OpError::NotFound(e.to_string()))?
        .map(open_json);
    let unfinished: Vec<Value> = runtime
        .unfinished_work(&id)
        .map_err(|e| OpError::NotFound(e.to_string()))?
        .into_iter()
        .map(|(work, prompt)| json!({"work": work, "prompt": prompt}))
        .collect();
    Ok(json!({
        "id": id,
        "name": n.name,
        "parent": n.parent,
        "children": n.children,
        "instructions": view.map(|v| v.instructions.clone()),
        "session_id": session,
        "session_state": view.map(|v| v.session_state),
        "pending_messages": state.pending.get(&id).cloned().unwrap_or_default().iter().map(|m| json!({
            "id": m.id, "from": m.from, "payload": m.payload,
        })).collect::<Vec<_>>(),
        "turns": turns(&conversation),
        "conversation": conversation,
        "open_turn": open,
        "unfinished_work": unfinished,
        "usage": usage.map(|u| json!({
            "calls": u.calls, "input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
        })),
    }))
}
