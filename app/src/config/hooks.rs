//! The `[[hooks]]` and `[retries]` sections: hooks and policy on every
//! tool call, and how each tool's hard failures are retried.
//!
//! Invariant: a section that passed [`validate_hooks`] and
//! [`validate_retries`] can be compiled without another error (every
//! regex compiles, every action has what it needs) and never asks for an
//! irreversible call to be retried at an endpoint that cannot deduplicate
//! (its re-send could happen twice). Every error names its key path.

use std::collections::BTreeMap;

use durable_agent::runtime::HookEventKind;
use serde::Deserialize;

use super::{ToolConfig, MAX_RETRIES_LIMIT};

/// Upper bound on configured hooks: each `PreToolUse` one is asked for
/// every call of every round.
pub const MAX_HOOKS: usize = 64;

/// Upper bound on a command hook's timeout: the round waits for it.
pub const MAX_HOOK_TIMEOUT_MS: u64 = 60_000;

/// One hook.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// One of seed 000's seven events (`PreToolUse`, `PostToolUse`,
    /// `PostToolUseFailure`, `AgentStart`, `TurnStart`, `TurnEnd`,
    /// `AgentStop`).
    #[serde(default = "defaults::event")]
    pub event: String,
    /// A regex on the tool name (tool events only); absent: every tool.
    #[serde(default)]
    pub matcher: Option<String>,
    pub action: HookAction,
    /// Why (`deny`: what the model reads; `require_confirmation`: what
    /// the human sees).
    #[serde(default)]
    pub reason: Option<String>,
    /// `modify_args`: a JSON merge patch (RFC 7386) onto the arguments.
    #[serde(default)]
    pub patch: Option<serde_json::Value>,
    /// `command`: the program and its arguments (no shell); the event as
    /// JSON on its stdin, its answer as JSON on its stdout.
    #[serde(default)]
    pub command: Vec<String>,
    #[serde(default = "defaults::hook_timeout_ms")]
    pub timeout_ms: u64,
    /// `command` on `PreToolUse`: a program that fails or times out
    /// denies the call instead of being skipped (a policy must not be
    /// bypassed by breaking it).
    #[serde(default)]
    pub fail_closed: bool,
}

/// What a hook does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookAction {
    Allow,
    Deny,
    ModifyArgs,
    RequireConfirmation,
    Command,
}

/// `[retries]`: defaults, then per tool by name.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetriesConfig {
    #[serde(default = "defaults::retry_base_ms")]
    pub backoff_base_ms: u64,
    #[serde(default = "defaults::retry_max_ms")]
    pub backoff_max_ms: u64,
    #[serde(default)]
    pub tools: BTreeMap<String, ToolRetryConfig>,
}

impl Default for RetriesConfig {
    fn default() -> Self {
        RetriesConfig {
            backoff_base_ms: defaults::retry_base_ms(),
            backoff_max_ms: defaults::retry_max_ms(),
            tools: BTreeMap::new(),
        }
    }
}

/// `[retries.tools.<name>]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolRetryConfig {
    /// Retries after the first attempt; default 1 for a reversible tool,
    /// 0 for an irreversible one (which may be retried only at an endpoint
    /// with `dedup = true`).
    #[serde(default)]
    pub max_retries: Option<u32>,
    #[serde(default)]
    pub backoff_base_ms: Option<u64>,
    #[serde(default)]
    pub backoff_max_ms: Option<u64>,
}

pub(super) mod defaults {
    pub fn event() -> String {
        "PreToolUse".to_string()
    }
    pub fn hook_timeout_ms() -> u64 {
        5_000
    }
    pub fn retry_base_ms() -> u64 {
        200
    }
    pub fn retry_max_ms() -> u64 {
        5_000
    }
}

impl HookConfig {
    /// The event (valid after validation).
    pub fn event_kind(&self) -> Option<HookEventKind> {
        HookEventKind::parse(&self.event)
    }
}

/// The default retries after the first attempt for a tool: 1 when
/// reversible, 0 when irreversible (never retried blindly).
pub fn default_max_retries(irreversible: bool) -> u32 {
    if irreversible {
        0
    } else {
        1
    }
}

type Invalid = (String, String);

pub(super) fn validate_hooks(hooks: &[HookConfig]) -> Result<(), Invalid> {
    if hooks.len() > MAX_HOOKS {
        return Err((
            "hooks".into(),
            format!("{} hooks, the limit is {MAX_HOOKS}", hooks.len()),
        ));
    }
    for (i, hook) in hooks.iter().enumerate() {
        let key = |field: &str| format!("hooks[{i}].{field}");
        let bad = |field: &str, msg: String| Err((key(field), msg));
        let names: Vec<&str> = HookEventKind::ALL.iter().map(|k| k.name()).collect();
        let Some(kind) = hook.event_kind() else {
            return bad("event", format!("{:?} is not one of {names:?}", hook.event));
        };
        let tool_event = matches!(
            kind,
            HookEventKind::PreToolUse | HookEventKind::PostToolUse | HookEventKind::PostToolUseFailure
        );
        if let Some(m) = &hook.matcher {
            if !tool_event {
                return bad(
                    "matcher",
                    format!("{} has no tool to match; remove the matcher", kind.name()),
                );
            }
            if let Err(e) = regex::Regex::new(m) {
                return bad("matcher", format!("{m:?} is not a valid regex: {e}"));
            }
        }
        if kind != HookEventKind::PreToolUse && hook.action != HookAction::Command {
            return bad(
                "action",
                format!(
                    "{} hooks only observe: the action must be \"command\" (decisions are for PreToolUse)",
                    kind.name()
                ),
            );
        }
        let needs = |field: &str, present: bool, action: &str| match present {
            true => Ok(()),
            false => Err((key(field), format!("required for action = {action:?}"))),
        };
        let unused = |field: &str, present: bool| match present {
            true => Err((
                key(field),
                format!("not used by action = {:?}; remove it", hook.action),
            )),
            false => Ok(()),
        };
        let has_reason = hook.reason.as_deref().is_some_and(|r| !r.trim().is_empty());
        match hook.action {
            HookAction::Deny => needs("reason", has_reason, "deny")?,
            HookAction::RequireConfirmation => needs("reason", has_reason, "require_confirmation")?,
            HookAction::ModifyArgs => {
                needs("patch", hook.patch.is_some(), "modify_args")?;
                if !hook.patch.as_ref().is_some_and(|p| p.is_object()) {
                    return bad(
                        "patch",
                        "must be a table (a JSON merge patch onto the arguments object)".into(),
                    );
                }
            }
            HookAction::Command => {
                needs("command", !hook.command.is_empty(), "command")?;
                if hook.command[0].trim().is_empty() {
                    return bad(
                        "command",
                        "the program (its first element) must not be empty".into(),
                    );
                }
                if hook.timeout_ms == 0 || hook.timeout_ms > MAX_HOOK_TIMEOUT_MS {
                    return bad(
                        "timeout_ms",
                        format!("{} must be within 1..={MAX_HOOK_TIMEOUT_MS}", hook.timeout_ms),
                    );
                }
                if hook.fail_closed && kind != HookEventKind::PreToolUse {
                    return bad(
                        "fail_closed",
                        "only a PreToolUse command decides anything to fail closed on".into(),
                    );
                }
            }
            HookAction::Allow => {}
        }
        if hook.action != HookAction::Command {
            unused("command", !hook.command.is_empty())?;
            unused("fail_closed", hook.fail_closed)?;
        }
        if hook.action != HookAction::ModifyArgs {
            unused("patch", hook.patch.is_some())?;
        }
    }
    Ok(())
}

pub(super) fn validate_retries(retries: &RetriesConfig, tools: &[ToolConfig]) -> Result<(), Invalid> {
    let backoff = |prefix: &str, base: u64, max: u64| match base <= max {
        true => Ok(()),
        false => Err((
            format!("{prefix}backoff_base_ms"),
            format!("{base} exceeds backoff_max_ms = {max}"),
        )),
    };
    backoff("retries.", retries.backoff_base_ms, retries.backoff_max_ms)?;
    for (name, t) in &retries.tools {
        let key = |field: &str| format!("retries.tools.{name}.{field}");
        let Some(tool) = tools.iter().find(|tool| tool.name() == name) else {
            return Err((
                format!("retries.tools.{name}"),
                format!("no tool named {name:?} in [[tools]]"),
            ));
        };
        let irreversible = tool.irreversible();
        let max_retries = t.max_retries.unwrap_or(default_max_retries(irreversible));
        if max_retries > MAX_RETRIES_LIMIT {
            return Err((
                key("max_retries"),
                format!("{max_retries} is above the limit of {MAX_RETRIES_LIMIT}"),
            ));
        }
        let dedup = matches!(tool, ToolConfig::Http(h) if h.dedup);
        if irreversible && !dedup && max_retries > 0 {
            return Err((
                key("max_retries"),
                format!(
                    "{name} is irreversible and its endpoint cannot deduplicate: a retry could do it twice, so it is never retried (set dedup = true on the tool only if the endpoint deduplicates by Idempotency-Key)"
                ),
            ));
        }
        backoff(
            &format!("retries.tools.{name}."),
            t.backoff_base_ms.unwrap_or(retries.backoff_base_ms),
            t.backoff_max_ms.unwrap_or(retries.backoff_max_ms),
        )?;
    }
    Ok(())
}
