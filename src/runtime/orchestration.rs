//! Orchestration tools the model calls — `spawn_agent {name, instructions}`,
//! `send_message {to, payload}`, `list_agents {}` — performed by the
//! runtime itself inside the caller's turn, on its own operations (the
//! deferred child spawn, the enqueue to the recipient's log), so every
//! guarantee of those operations holds unchanged. No outside call: a
//! call's `tool.call`, its result and its effect are one persistence step.
//!
//! **Write-ahead result.** A call's result (`tool.result`, in the caller's
//! log) is its write-ahead record: it names the ids its effect will use,
//! reserved from the id generator when the call runs — the child's agent
//! and session ids for a spawn, the message id for a send — and the
//! effect is applied after it, under those ids:
//! - `send_message` to a live agent: the result, then `message.enqueued`
//!   in the recipient's log, in the same step, before the model is asked
//!   again (so before the call "returns" to the model);
//! - `spawn_agent` (seed 002's deferred spawn): the child is created when
//!   the caller's turn ends — after its `turn.complete` — as a SUSPENDED
//!   session (it takes a provider slot at its first turn); a
//!   `send_message` to a child spawned earlier in the same turn is
//!   enqueued right after that child is created.
//!
//! **Invariant** (exactly once, under any crash): an effect exists iff the
//! result naming it is durable — and, for a spawn or a send to a child
//! spawned in the turn, the turn completed. Never twice: an effect is
//! applied only if its reserved id is not there yet (the child in the tree,
//! or a session record under its reserved session id — it lived and was
//! terminated; the message pending or delivered at its recipient). Never
//! lost: every effect whose result is durable is applied by the step that
//! logged the result or, after a crash in between, by
//! [`Runtime::open`] before anything else runs (`complete_orchestration`):
//! the only results whose effects can be missing are the open turn's (a
//! crash between a send's result and its enqueue) and the last completed
//! turn's (a crash between `turn.complete` and the last deferred effect),
//! since every later step of an agent starts after those effects were
//! applied. A call with no durable result has no effect and reserved
//! nothing durable: run again after a crash, it reserves new ids.
//! Reserved ids are observed by the id generator at open — those in the
//! logs of terminated agents too — so none is ever handed out twice. An
//! interrupted turn that never completes never creates its children (seed
//! 002: the unacknowledged spawn vanishes).
//!
//! Limits (checked when the call runs, against the live tree plus the
//! spawns of every turn of a live agent not completed — in flight,
//! interrupted, or parked by a newer turn, since running it again creates
//! its children — never when the effect is applied: a result already
//! promised the child): `max_depth` (a root is depth 0), `max_children`
//! per parent and `max_agents` in the tree, and a child's name unique
//! among its parent's children. Which agent may call which tool is the
//! [`Orchestration`] grant, by agent name; a call it does not grant is
//! answered as a failed call.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::log::{DecidedCall, Event, LogEntry};

use super::ids::{AgentId, MessageId, SessionId};
use super::orchestrator::{NewAgent, Placement};
use super::provider::ToolRequest;
use super::tools::ToolOutput;
use super::turn::ConversationItem;
use super::{Runtime, RuntimeError};

/// The tool names the runtime performs (when enabled).
pub const SPAWN_AGENT: &str = "spawn_agent";
pub const SEND_MESSAGE: &str = "send_message";
pub const LIST_AGENTS: &str = "list_agents";

/// Longest agent name a spawn accepts.
pub const MAX_NAME_LEN: usize = 64;

/// One orchestration tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OrchestrationTool {
    SpawnAgent,
    SendMessage,
    ListAgents,
}

impl OrchestrationTool {
    pub const ALL: [OrchestrationTool; 3] = [
        OrchestrationTool::SpawnAgent,
        OrchestrationTool::SendMessage,
        OrchestrationTool::ListAgents,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OrchestrationTool::SpawnAgent => SPAWN_AGENT,
            OrchestrationTool::SendMessage => SEND_MESSAGE,
            OrchestrationTool::ListAgents => LIST_AGENTS,
        }
    }

    pub fn from_name(name: &str) -> Option<OrchestrationTool> {
        OrchestrationTool::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// Which orchestration tools the runtime performs, who may call them, and
/// the spawning limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orchestration {
    /// Calls to these names are performed by the runtime; any other name
    /// goes to the tool executor as usual.
    pub enabled: BTreeSet<OrchestrationTool>,
    /// The tools an agent not named in `grants` may call.
    pub default_grant: BTreeSet<OrchestrationTool>,
    /// The tools each named agent may call (replacing the default).
    pub grants: BTreeMap<String, BTreeSet<OrchestrationTool>>,
    /// Deepest child a spawn may create (a root is depth 0).
    pub max_depth: u32,
    /// Children one agent may have (live, and spawned in turns not
    /// completed: in flight, interrupted or parked).
    pub max_children: u32,
    /// Agents the tree may hold (live, and spawned in turns not completed:
    /// in flight, interrupted or parked).
    pub max_agents: u32,
}

impl Orchestration {
    /// Every tool enabled and granted to every agent; depth 2, 8 children
    /// per agent, 64 agents.
    pub fn all() -> Orchestration {
        let all: BTreeSet<_> = OrchestrationTool::ALL.into_iter().collect();
        Orchestration {
            enabled: all.clone(),
            default_grant: all,
            grants: BTreeMap::new(),
            max_depth: 2,
            max_children: 8,
            max_agents: 64,
        }
    }

    /// Whether an agent named `name` may call `tool`.
    pub fn granted(&self, name: &str, tool: OrchestrationTool) -> bool {
        self.grants
            .get(name)
            .unwrap_or(&self.default_grant)
            .contains(&tool)
    }
}

/// A spawn's write-ahead record: the ids its child will have.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spawned {
    pub agent_id: AgentId,
    pub session_id: SessionId,
    pub name: String,
}

/// A send's write-ahead record: the id its message will have.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sent {
    pub message_id: MessageId,
    pub to: AgentId,
    pub to_name: String,
    /// The recipient is a child spawned earlier in the same turn: the
    /// message is enqueued when that child is created, at the turn's end.
    #[serde(default)]
    pub after_spawn: bool,
}

/// What a logged result promises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Effect {
    Spawn { spawned: Spawned, instructions: String },
    Send { sent: Sent, payload: String },
}

/// What [`Runtime::apply_effect`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Applied {
    Now,
    AlreadyThere,
    /// The other end is gone (a terminated recipient, or a parent).
    Moot,
}

fn string_arg<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

/// The text a send enqueues: a string payload as is, anything else as JSON
/// (a pure function of the logged arguments, so a recovered send enqueues
/// the same text).
fn payload_text(args: &Value) -> String {
    match args.get("payload") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

/// The effect a completed call's result promises, if it is an
/// orchestration call that succeeded.
fn effect_of(call: &ToolRequest, output: &ToolOutput) -> Option<Effect> {
    if !output.ok {
        return None;
    }
    let tool = OrchestrationTool::from_name(&call.tool)?;
    let record: Value = serde_json::from_str(&output.output).ok()?;
    match tool {
        OrchestrationTool::SpawnAgent => {
            let spawned: Spawned = serde_json::from_value(record.get("spawned")?.clone()).ok()?;
            let instructions = string_arg(&call.args, "instructions").unwrap_or("").to_string();
            Some(Effect::Spawn {
                spawned,
                instructions,
            })
        }
        OrchestrationTool::SendMessage => {
            let sent: Sent = serde_json::from_value(record.get("sent")?.clone()).ok()?;
            Some(Effect::Send {
                sent,
                payload: payload_text(&call.args),
            })
        }
        OrchestrationTool::ListAgents => None,
    }
}

/// The effects of the completed calls in `items` (any run of
/// conversation items: each call is matched to its result by call id),
/// in call order.
fn effects_in(items: &[ConversationItem]) -> Vec<Effect> {
    let mut calls: BTreeMap<&str, ToolRequest> = BTreeMap::new();
    let mut out = Vec::new();
    for item in items {
        match item {
            ConversationItem::ToolCall {
                call_id, tool, args, ..
            } if OrchestrationTool::from_name(tool).is_some() => {
                calls.insert(call_id, call_request(tool, args));
            }
            ConversationItem::ToolResult { call_id, ok, output } => {
                if let Some(call) = calls.remove(call_id.as_str()) {
                    let output = ToolOutput {
                        ok: *ok,
                        output: output.clone(),
                    };
                    out.extend(effect_of(&call, &output));
                }
            }
            _ => {}
        }
    }
    out
}

/// The highest id counter the durable results in `items` reserved (0:
/// none).
fn max_reserved(items: &[ConversationItem]) -> u64 {
    effects_in(items)
        .iter()
        .map(|effect| match effect {
            Effect::Spawn { spawned, .. } => spawned.agent_id.counter().max(spawned.session_id.counter()),
            Effect::Send { sent, .. } => sent.message_id.counter(),
        })
        .max()
        .unwrap_or(0)
}

/// The highest id counter the durable results in a log reserved,
/// whatever turn they belong to (0: none): recovery's reading of a
/// terminated agent's log (see `Runtime::observe_reserved_ids`).
pub(crate) fn max_reserved_in_log(entries: &[LogEntry]) -> u64 {
    max_reserved(&logged_calls(entries))
}

/// Every tool call and result of a log, as conversation items, whatever
/// turn they belong to (completed, interrupted, parked or rolled back: a
/// durable result reserved its ids all the same).
fn logged_calls(entries: &[LogEntry]) -> Vec<ConversationItem> {
    entries
        .iter()
        .filter_map(|e| match &e.event {
            Event::ToolCall {
                call_id,
                tool,
                args,
                irreversible,
            } => Some(ConversationItem::ToolCall {
                call_id: call_id.clone(),
                tool: tool.clone(),
                args: args.clone(),
                irreversible: *irreversible,
            }),
            Event::ToolResult { call_id, ok, output } => Some(ConversationItem::ToolResult {
                call_id: call_id.clone(),
                ok: *ok,
                output: output.clone(),
            }),
            _ => None,
        })
        .collect()
}

/// The spawns among the effects of `items`, in call order.
fn spawns_in(items: &[ConversationItem]) -> Vec<Spawned> {
    effects_in(items)
        .into_iter()
        .filter_map(|e| match e {
            Effect::Spawn { spawned, .. } => Some(spawned),
            Effect::Send { .. } => None,
        })
        .collect()
}

fn call_request(tool: &str, args: &Value) -> ToolRequest {
    ToolRequest {
        tool: tool.to_string(),
        args: args.clone(),
        irreversible: false,
        invalid_args: None,
    }
}

/// The last completed turn of a conversation (its prompt to its response).
fn last_turn(conversation: &[ConversationItem]) -> &[ConversationItem] {
    let start = conversation
        .iter()
        .rposition(|i| matches!(i, ConversationItem::Prompt { .. }))
        .unwrap_or(conversation.len());
    conversation.get(start..).unwrap_or_default()
}

fn failed(tool: OrchestrationTool, why: impl std::fmt::Display) -> ToolOutput {
    ToolOutput {
        ok: false,
        output: format!("{}: {why}; nothing was done", tool.name()),
    }
}

fn valid_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(format!("name must be 1-{MAX_NAME_LEN} characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
    {
        return Err(format!("name {name:?}: use a-z A-Z 0-9 _ - ."));
    }
    if name == "parent" || AgentId::from_hex(name).is_ok() {
        return Err(format!(
            "name {name:?} is reserved (it addresses an agent otherwise)"
        ));
    }
    Ok(())
}

impl Runtime {
    /// The orchestration tool `name` is, if this runtime performs it.
    pub(super) fn orchestration_tool(&self, name: &str) -> Option<OrchestrationTool> {
        let tool = OrchestrationTool::from_name(name)?;
        self.config
            .orchestration
            .as_ref()
            .filter(|o| o.enabled.contains(&tool))
            .map(|_| tool)
    }

    /// Run orchestration call `call` of `agent`'s turn in flight (its
    /// `tool.call` is durable). Returns its result — the write-ahead
    /// record — and the effect to apply once that result is durable
    /// (`None`: nothing now; a spawn's effect waits for the turn's end).
    pub(super) fn orchestrate(
        &mut self,
        agent: &AgentId,
        tool: OrchestrationTool,
        call: &DecidedCall,
    ) -> Result<(ToolOutput, Option<Effect>), RuntimeError> {
        let Some(policy) = self.config.orchestration.clone() else {
            return Ok((failed(tool, "orchestration is not enabled"), None));
        };
        let name = self.slot(agent)?.name.clone();
        if let Some(detail) = &call.invalid_args {
            return Ok((
                failed(tool, format!("the arguments are not usable ({detail})")),
                None,
            ));
        }
        if call.hook.as_ref().is_some_and(|h| h.needs_confirmation.is_some()) {
            // The runtime's own operations have nowhere to park.
            return Ok((
                failed(
                    tool,
                    "a hook asks for a confirmation, which orchestration tools cannot wait for",
                ),
                None,
            ));
        }
        if !policy.granted(&name, tool) {
            return Ok((
                failed(
                    tool,
                    format!("not granted to agent {name:?} by the configuration"),
                ),
                None,
            ));
        }
        let done = match tool {
            OrchestrationTool::SpawnAgent => self.spawn_call(agent, &policy, &call.args),
            OrchestrationTool::SendMessage => self.send_call(agent, &call.args),
            OrchestrationTool::ListAgents => Ok((self.list_call(agent), None)),
        };
        Ok(match done {
            Ok((record, effect)) => (
                ToolOutput {
                    ok: true,
                    output: record.to_string(),
                },
                effect,
            ),
            Err(why) => (failed(tool, why), None),
        })
    }

    /// The spawns of every turn in flight or interrupted, by spawning
    /// agent: each live agent's open turn and the turns a newer one
    /// superseded (parked). Their children are created only when the turn
    /// completes — a parked one too, when it is run again — so each is
    /// promised a place in the tree: what the limits count.
    fn pending_spawns(&self) -> BTreeMap<AgentId, Vec<Spawned>> {
        let mut out: BTreeMap<AgentId, Vec<Spawned>> = BTreeMap::new();
        for (id, slot) in &self.agents {
            let turns = slot.open.iter().chain(&slot.parked);
            let spawned: Vec<Spawned> = turns.flat_map(|t| spawns_in(&t.items)).collect();
            if !spawned.is_empty() {
                out.insert(id.clone(), spawned);
            }
        }
        out
    }

    /// The spawns of `agent`'s open turn (the one in flight): the children
    /// a send of this turn may name, enqueued when the turn ends.
    fn spawning_now(&self, agent: &AgentId) -> Vec<Spawned> {
        self.agents
            .get(agent)
            .and_then(|s| s.open.as_ref())
            .map(|open| spawns_in(&open.items))
            .unwrap_or_default()
    }

    fn depth(&self, agent: &AgentId) -> u32 {
        let mut depth = 0u32;
        let mut at = self.tree.get(agent).and_then(|n| n.parent.clone());
        // Bounded by the tree's size: the tree has no cycles (its invariant).
        while let Some(p) = at {
            depth = depth.saturating_add(1);
            if depth as usize > self.tree.nodes().len() {
                break;
            }
            at = self.tree.get(&p).and_then(|n| n.parent.clone());
        }
        depth
    }

    fn spawn_call(
        &mut self,
        agent: &AgentId,
        policy: &Orchestration,
        args: &Value,
    ) -> Result<(Value, Option<Effect>), String> {
        let name = string_arg(args, "name").ok_or("argument `name` (a string) is required")?;
        valid_name(name)?;
        // The child's instructions are read back from the logged call
        // when it is created; only their type is checked here.
        if !matches!(
            args.get("instructions"),
            None | Some(Value::Null | Value::String(_))
        ) {
            return Err("argument `instructions` must be a string".into());
        }
        let depth = self.depth(agent).saturating_add(1);
        if depth > policy.max_depth {
            return Err(format!(
                "a child of this agent would be at depth {depth}, above the limit of {} (orchestration.max_depth)",
                policy.max_depth
            ));
        }
        let pending = self.pending_spawns();
        let mine = pending.get(agent).map(Vec::as_slice).unwrap_or_default();
        let children: Vec<&str> = self
            .tree
            .get(agent)
            .map(|n| {
                n.children
                    .iter()
                    .filter_map(|c| self.tree.get(c).map(|c| c.name.as_str()))
                    .collect()
            })
            .unwrap_or_default();
        if children.contains(&name) {
            return Err(format!("this agent already has a child named {name:?}"));
        }
        if mine.iter().any(|s| s.name == name) {
            return Err(format!(
                "this agent is already spawning a child named {name:?} (in this turn, or in an interrupted one that creates it when it completes)"
            ));
        }
        let count = children.len() + mine.len();
        if count >= policy.max_children as usize {
            return Err(format!(
                "this agent has {count} children (live or being spawned), the limit is {} (orchestration.max_children)",
                policy.max_children
            ));
        }
        let total = self.tree.nodes().len() + pending.values().map(Vec::len).sum::<usize>();
        if total >= policy.max_agents as usize {
            return Err(format!(
                "the tree holds {total} agents (live or being spawned), the limit is {} (orchestration.max_agents)",
                policy.max_agents
            ));
        }
        let spawned = Spawned {
            agent_id: self.ids.agent(),
            session_id: self.ids.session(),
            name: name.to_string(),
        };
        let record = json!({
            "spawned": spawned,
            "note": format!("agent {name:?} is created when this turn ends; a send_message to it now is delivered then"),
        });
        tracing::info!(%agent, child = %spawned.agent_id, name, "spawn decided; the child is created at the turn's end");
        Ok((record, None))
    }

    /// Whom `to` names, seen from `agent`: an agent id, `parent`, or a
    /// name — first among the children it is spawning in this turn, then
    /// its children, its parent, its siblings, then every agent. Returns
    /// the id, its name, and whether it is still being spawned.
    fn resolve_recipient(&self, agent: &AgentId, to: &str) -> Result<(AgentId, String, bool), String> {
        let mine = self.spawning_now(agent);
        let name_of = |id: &AgentId| self.tree.get(id).map(|n| n.name.clone()).unwrap_or_default();
        let me = self
            .tree
            .get(agent)
            .ok_or_else(|| format!("agent {agent} is gone"))?;
        if let Ok(id) = AgentId::from_hex(to) {
            if self.tree.contains(&id) {
                return Ok((id.clone(), name_of(&id), false));
            }
            if let Some(s) = mine.iter().find(|s| s.agent_id == id) {
                return Ok((id, s.name.clone(), true));
            }
            return Err(format!("no live agent has id {to}"));
        }
        if to == "parent" {
            return match &me.parent {
                Some(p) => Ok((p.clone(), name_of(p), false)),
                None => Err("this is a root agent: it has no parent".into()),
            };
        }
        if let Some(s) = mine.iter().find(|s| s.name == to) {
            return Ok((s.agent_id.clone(), s.name.clone(), true));
        }
        let named =
            |ids: Vec<AgentId>| -> Vec<AgentId> { ids.into_iter().filter(|i| name_of(i) == to).collect() };
        let children: Vec<AgentId> = me.children.iter().cloned().collect();
        let parent: Vec<AgentId> = me.parent.iter().cloned().collect();
        let siblings: Vec<AgentId> = me
            .parent
            .as_ref()
            .and_then(|p| self.tree.get(p))
            .map(|p| p.children.iter().filter(|c| *c != agent).cloned().collect())
            .unwrap_or_default();
        let everyone: Vec<AgentId> = self.tree.nodes().keys().cloned().collect();
        for tier in [children, parent, siblings, everyone] {
            match named(tier).as_slice() {
                [] => continue,
                [one] => return Ok((one.clone(), to.to_string(), false)),
                many => {
                    let ids: Vec<String> = many.iter().map(ToString::to_string).collect();
                    return Err(format!(
                        "{to:?} names {} agents ({}): use an id",
                        many.len(),
                        ids.join(", ")
                    ));
                }
            }
        }
        Err(format!("no agent named {to:?} (list_agents shows the tree)"))
    }

    fn send_call(&mut self, agent: &AgentId, args: &Value) -> Result<(Value, Option<Effect>), String> {
        let to = string_arg(args, "to")
            .ok_or("argument `to` (a string: a name, an id or \"parent\") is required")?;
        if args.get("payload").is_none() {
            return Err("argument `payload` is required".into());
        }
        let (to_id, to_name, after_spawn) = self.resolve_recipient(agent, to)?;
        let sent = Sent {
            message_id: self.ids.message(),
            to: to_id,
            to_name,
            after_spawn,
        };
        let note = match after_spawn {
            true => "enqueued when the recipient is created, at this turn's end",
            false => "enqueued to the recipient",
        };
        let effect = match after_spawn {
            true => None,
            false => Some(Effect::Send {
                sent: sent.clone(),
                payload: payload_text(args),
            }),
        };
        Ok((json!({"sent": sent, "note": note}), effect))
    }

    fn list_call(&self, agent: &AgentId) -> Value {
        let agents: Vec<Value> = self
            .tree
            .nodes()
            .iter()
            .map(|(id, node)| {
                json!({
                    "id": id,
                    "name": node.name,
                    "parent": node.parent,
                    "depth": self.depth(id),
                    "pending_messages": self.inbox.peek(id).len(),
                })
            })
            .collect();
        let spawning = self.spawning_now(agent);
        json!({"you": agent, "agents": agents, "spawning": spawning})
    }

    /// Whether message `id` reached `to` (pending or delivered).
    fn has_message(&self, to: &AgentId, id: &MessageId) -> bool {
        self.inbox.peek(to).iter().any(|m| &m.id == id)
            || self.agents.get(to).is_some_and(|s| s.delivered.contains(id))
    }

    /// Apply `effect` of a call of `caller` unless it is there already
    /// (see the module invariant).
    fn apply_effect(&mut self, caller: &AgentId, effect: &Effect) -> Result<Applied, RuntimeError> {
        match effect {
            Effect::Spawn {
                spawned,
                instructions,
            } => {
                if self.tree.contains(&spawned.agent_id) {
                    return Ok(Applied::AlreadyThere);
                }
                // Created once and since terminated: its record stays.
                if self.store.load(&spawned.session_id)?.is_some() {
                    return Ok(Applied::AlreadyThere);
                }
                if !self.tree.contains(caller) {
                    return Ok(Applied::Moot);
                }
                let new = NewAgent {
                    id: spawned.agent_id.clone(),
                    session_id: spawned.session_id.clone(),
                    name: &spawned.name,
                    instructions,
                    parent: Some(caller.clone()),
                };
                self.create_with(new, Placement::Suspended)?;
                tracing::info!(parent = %caller, child = %spawned.agent_id, name = %spawned.name, "deferred spawn: child created");
                Ok(Applied::Now)
            }
            Effect::Send { sent, payload } => {
                if !self.tree.contains(&sent.to) {
                    return Ok(Applied::Moot);
                }
                if self.has_message(&sent.to, &sent.message_id) {
                    return Ok(Applied::AlreadyThere);
                }
                self.enqueue(sent.message_id.clone(), caller, &sent.to, payload)?;
                Ok(Applied::Now)
            }
        }
    }

    /// Apply a just-logged result's immediate effect (a send to a live
    /// agent).
    pub(super) fn apply_now(&mut self, caller: &AgentId, effect: &Effect) -> Result<(), RuntimeError> {
        self.apply_effect(caller, effect).map(|_| ())
    }

    /// The end of `agent`'s turn (its `turn.complete` is durable): the
    /// deferred effects of its calls, in call order — each spawn's child,
    /// then the sends to it (and any send not there yet).
    pub(super) fn apply_turn_effects(
        &mut self,
        agent: &AgentId,
        calls: &[(String, ToolRequest, ToolOutput)],
    ) -> Result<(), RuntimeError> {
        let effects: Vec<Effect> = calls
            .iter()
            .filter(|(_, call, _)| OrchestrationTool::from_name(&call.tool).is_some())
            .filter_map(|(_, call, output)| effect_of(call, output))
            .collect();
        for effect in &effects {
            self.apply_effect(agent, effect)?;
        }
        Ok(())
    }

    /// Make every id a live agent's durable orchestration results reserved
    /// unavailable to the id generator (open, after recovery, before any
    /// id is handed out). Recovery observes the ids of every session and
    /// every enqueued message, but a result's ids may be in neither (the
    /// child of a turn that never completed, a send to a recipient gone
    /// since), so every durable result is read: a live agent's in its
    /// turns (completed, open, parked) here; a terminated agent's in its
    /// log, by recovery as it reads that log ([`max_reserved_in_log`]):
    /// recovery rebuilds no turn of it, yet what it reserved stays
    /// reserved (ids are never reused).
    pub(super) fn observe_reserved_ids(&mut self) {
        let mut max = 0u64;
        for slot in self.agents.values() {
            let turns = std::iter::once(slot.conversation.as_slice())
                .chain(slot.open.iter().map(|o| o.items.as_slice()))
                .chain(slot.parked.iter().map(|p| p.items.as_slice()));
            for items in turns {
                max = max.max(max_reserved(items));
            }
        }
        if max > 0 {
            self.ids.observe(max);
        }
    }

    /// Apply every effect a durable result promises that a crash left
    /// missing (see the module invariant): the last completed turn's (all
    /// of them) and the open turn's (its sends to live agents). Returns
    /// how many were applied now.
    pub(super) fn complete_orchestration(
        &mut self,
        report: &mut crate::recovery::RecoveryReport,
    ) -> Result<(), RuntimeError> {
        let mut todo: Vec<(AgentId, Effect)> = Vec::new();
        for (id, slot) in &self.agents {
            for effect in effects_in(last_turn(&slot.conversation)) {
                todo.push((id.clone(), effect));
            }
            if let Some(open) = &slot.open {
                for effect in effects_in(&open.items) {
                    if matches!(&effect, Effect::Send { sent, .. } if !sent.after_spawn) {
                        todo.push((id.clone(), effect));
                    }
                }
            }
        }
        let mut applied = 0;
        // What it appended to existing logs, for the recovery report (a
        // spawn writes only its child's new log).
        for (caller, effect) in &todo {
            let r = self.apply_effect(caller, effect);
            if self.poison_on(r)? == Applied::Now {
                applied += 1;
                match effect {
                    Effect::Send { sent, .. } => {
                        let session = self.slot(&sent.to)?.record.session_id.clone();
                        report
                            .orchestration_enqueued
                            .entry(session)
                            .or_default()
                            .push(sent.message_id.clone());
                    }
                    Effect::Spawn { spawned, .. } => {
                        report.orchestration_spawned.push(spawned.session_id.clone())
                    }
                }
            }
        }
        if applied > 0 {
            tracing::info!(
                applied,
                "recovery: orchestration effects a crash left missing applied"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
