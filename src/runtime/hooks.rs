//! Hooks and policy on every tool call (seed 000's hook bus): the
//! [`Hooks`] trait the turn loop asks before a round's calls are decided
//! (`PreToolUse`) and tells about the rest of a turn (observe-only events).
//!
//! Invariant: a hook's verdict is part of the round's decision. The
//! `PreToolUse` hooks are asked once per round, before `round.decided` is
//! written, and what they said is logged inside the decided call
//! ([`HookOutcome`]: the rewritten arguments — from which the idempotency
//! key is derived — a denial, a wait for a human). A resumed round applies
//! the logged verdict and never asks the hooks again, so a hook that would
//! answer differently now (another config, a script with state) cannot
//! change what an interrupted round does. Resolution is seed 000's,
//! extended by one step: Deny > RequireConfirmation > ModifyArgs > Allow;
//! every ModifyArgs patch of a call applies, in order.
//!
//! The core runs no program and reads no clock here: a hook that runs a
//! command (and its timeout) lives in the product crate, behind the trait.

use serde::Serialize;
use serde_json::Value;

use crate::log::entry::HookOutcome;

use super::ids::AgentId;
use super::provider::ToolRequest;

/// Seed 000's seven events, by the name a config matches them with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum HookEventKind {
    AgentStart,
    TurnStart,
    TurnEnd,
    PreToolUse,
    PostToolUse,
    PostToolUseFailure,
    AgentStop,
}

impl HookEventKind {
    pub const ALL: [HookEventKind; 7] = [
        HookEventKind::AgentStart,
        HookEventKind::TurnStart,
        HookEventKind::TurnEnd,
        HookEventKind::PreToolUse,
        HookEventKind::PostToolUse,
        HookEventKind::PostToolUseFailure,
        HookEventKind::AgentStop,
    ];

    /// The name configs and hook programs see (`PreToolUse`, …).
    pub fn name(self) -> &'static str {
        match self {
            HookEventKind::AgentStart => "AgentStart",
            HookEventKind::TurnStart => "TurnStart",
            HookEventKind::TurnEnd => "TurnEnd",
            HookEventKind::PreToolUse => "PreToolUse",
            HookEventKind::PostToolUse => "PostToolUse",
            HookEventKind::PostToolUseFailure => "PostToolUseFailure",
            HookEventKind::AgentStop => "AgentStop",
        }
    }

    /// The kind named `name`, if any.
    pub fn parse(name: &str) -> Option<HookEventKind> {
        HookEventKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// A call the model asked for, before it is decided.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PreToolUse<'a> {
    pub agent: &'a AgentId,
    /// The turn's provider round and the call's place in it (the call id
    /// is given when the decision is logged, after the hooks answered).
    pub round: u32,
    pub index: usize,
    pub tool_name: &'a str,
    /// The arguments as the model gave them.
    pub tool_input: &'a Value,
    pub irreversible: bool,
}

/// An event the hooks only observe: nothing they answer changes the turn.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "hook_event_name")]
pub enum HookEvent {
    /// A turn of an agent begins (or resumes) with its task.
    AgentStart {
        agent: AgentId,
        task: String,
        /// Where a turn found open in the log resumes (None: a new turn).
        #[serde(skip_serializing_if = "Option::is_none")]
        resumed: Option<Resumed>,
    },
    /// A provider round of the turn begins.
    TurnStart { agent: AgentId, turn: u32 },
    /// A provider round's calls all have their results (its checkpoint).
    TurnEnd { agent: AgentId, turn: u32 },
    /// A call's result is logged and it succeeded.
    PostToolUse {
        agent: AgentId,
        tool_name: String,
        tool_input: Value,
        tool_use_id: String,
        result: String,
    },
    /// A call's result is logged and it failed (denied calls included).
    PostToolUseFailure {
        agent: AgentId,
        tool_name: String,
        tool_input: Value,
        tool_use_id: String,
        error: String,
    },
    /// The turn completed with this response.
    AgentStop { agent: AgentId, result: String },
}

/// Where an interrupted turn resumes: its provider round, and whether
/// that round's decision is logged (its calls run from the log, the model
/// is not asked again) or the model is asked for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Resumed {
    pub round: u32,
    pub decided: bool,
}

impl HookEvent {
    pub fn kind(&self) -> HookEventKind {
        match self {
            HookEvent::AgentStart { .. } => HookEventKind::AgentStart,
            HookEvent::TurnStart { .. } => HookEventKind::TurnStart,
            HookEvent::TurnEnd { .. } => HookEventKind::TurnEnd,
            HookEvent::PostToolUse { .. } => HookEventKind::PostToolUse,
            HookEvent::PostToolUseFailure { .. } => HookEventKind::PostToolUseFailure,
            HookEvent::AgentStop { .. } => HookEventKind::AgentStop,
        }
    }
}

/// One hook's answer to a [`PreToolUse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookDecision {
    Allow,
    /// Never run; the reason is the call's failed result.
    Deny {
        reason: String,
    },
    /// Apply this JSON merge patch (RFC 7386) to the arguments.
    ModifyArgs {
        patch: Value,
    },
    /// Wait for a human's `confirm` before running.
    RequireConfirmation {
        reason: String,
    },
}

/// The hooks of a runtime. Implementations must not panic; a hook that
/// fails is theirs to log and skip (or to turn into a denial, for a policy
/// that fails closed).
pub trait Hooks: Send + Sync + std::fmt::Debug {
    /// Every matching hook's answer for `call`, in configuration order.
    fn pre_tool_use(&self, call: &PreToolUse<'_>) -> Vec<HookDecision>;

    /// Tell the hooks about `event` (observe-only; must not block the
    /// turn for long: the runtime's lock may be held).
    fn observe(&self, event: &HookEvent) {
        let _ = event;
    }
}

/// No hooks: every call is allowed as the model asked for it.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHooks;

impl Hooks for NoHooks {
    fn pre_tool_use(&self, _call: &PreToolUse<'_>) -> Vec<HookDecision> {
        Vec::new()
    }
}

/// A call as the hooks left it: its arguments and, unless it is a plain
/// allow, the outcome the decision logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reviewed {
    pub args: Value,
    pub outcome: Option<HookOutcome>,
}

/// Resolve `decisions` for a call with arguments `args` (see the module
/// docs for the order): the first denial wins outright; otherwise every
/// patch applies in order, and a wait for confirmation keeps the patched
/// arguments.
pub fn resolve(args: &Value, decisions: &[HookDecision]) -> Reviewed {
    if let Some(reason) = decisions.iter().find_map(|d| match d {
        HookDecision::Deny { reason } => Some(reason.clone()),
        _ => None,
    }) {
        return Reviewed {
            args: args.clone(),
            outcome: Some(HookOutcome {
                denied: Some(reason),
                needs_confirmation: None,
                original_args: None,
            }),
        };
    }
    let mut patched = args.clone();
    for d in decisions {
        if let HookDecision::ModifyArgs { patch } = d {
            merge_patch(&mut patched, patch);
        }
    }
    let confirm = decisions.iter().find_map(|d| match d {
        HookDecision::RequireConfirmation { reason } => Some(reason.clone()),
        _ => None,
    });
    let original = (patched != *args).then(|| args.clone());
    let outcome = (confirm.is_some() || original.is_some()).then_some(HookOutcome {
        denied: None,
        needs_confirmation: confirm,
        original_args: original,
    });
    Reviewed {
        args: patched,
        outcome,
    }
}

/// Ask `hooks` about the `index`-th call of `round` and resolve the
/// answers. A call whose arguments were unusable is never run, so it is
/// not shown to the hooks.
pub fn review(hooks: &dyn Hooks, agent: &AgentId, round: u32, index: usize, call: &ToolRequest) -> Reviewed {
    if call.invalid_args.is_some() {
        return Reviewed {
            args: call.args.clone(),
            outcome: None,
        };
    }
    let decisions = hooks.pre_tool_use(&PreToolUse {
        agent,
        round,
        index,
        tool_name: &call.tool,
        tool_input: &call.args,
        irreversible: call.irreversible,
    });
    let reviewed = resolve(&call.args, &decisions);
    if let Some(outcome) = &reviewed.outcome {
        tracing::info!(
            %agent, round, index, tool = %call.tool,
            denied = outcome.denied.is_some(),
            needs_confirmation = outcome.needs_confirmation.is_some(),
            modified = outcome.original_args.is_some(),
            "PreToolUse hooks decided"
        );
        if outcome.original_args.is_some() {
            tracing::debug!(tool = %call.tool, args = %reviewed.args, "hook-modified args");
        }
    }
    reviewed
}

/// Apply JSON merge patch `patch` to `target` (RFC 7386): an object patch
/// merges member by member, `null` removes a member, anything else
/// replaces the target.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(members) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(t) = target {
        for (key, value) in members {
            if value.is_null() {
                t.remove(key);
            } else {
                merge_patch(t.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        // The RFC's appendix A, a few of its cases.
        let cases = [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "b"}), json!({"b": "c"}), json!({"a": "b", "b": "c"})),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (
                json!({"a": {"b": "c"}}),
                json!({"a": {"b": "d", "c": null}}),
                json!({"a": {"b": "d"}}),
            ),
            (json!({"a": [{"b": "c"}]}), json!({"a": [1]}), json!({"a": [1]})),
            (json!(["a", "b"]), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "foo"}), json!("bar"), json!("bar")),
            (
                json!({}),
                json!({"a": {"bb": {"ccc": null}}}),
                json!({"a": {"bb": {}}}),
            ),
        ];
        for (mut target, patch, want) in cases {
            merge_patch(&mut target, &patch);
            assert_eq!(target, want, "patch {patch}");
        }
    }

    #[test]
    fn deny_wins_then_confirmation_then_every_patch_in_order() {
        let args = json!({"to": "a", "cc": "b"});
        let deny = HookDecision::Deny { reason: "no".into() };
        let patch = |p| HookDecision::ModifyArgs { patch: p };
        let confirm = HookDecision::RequireConfirmation { reason: "ask".into() };
        let r = resolve(&args, &[patch(json!({"to": "x"})), deny.clone(), confirm.clone()]);
        assert_eq!(r.args, args, "a denied call keeps the model's arguments");
        assert_eq!(r.outcome.unwrap().denied.as_deref(), Some("no"));
        let r = resolve(
            &args,
            &[
                patch(json!({"to": "x"})),
                confirm,
                patch(json!({"cc": null, "to": "y"})),
            ],
        );
        assert_eq!(r.args, json!({"to": "y"}));
        let outcome = r.outcome.unwrap();
        assert_eq!(outcome.needs_confirmation.as_deref(), Some("ask"));
        assert_eq!(outcome.original_args, Some(args.clone()));
        let r = resolve(&args, &[HookDecision::Allow, patch(json!({"to": "a"}))]);
        assert_eq!(
            (r.args, r.outcome),
            (args, None),
            "a no-op patch is a plain allow"
        );
    }
}
