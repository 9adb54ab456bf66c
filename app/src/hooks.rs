//! The configured `[[hooks]]` ([`ConfigHooks`], the system crate's
//! `Hooks`) and `[retries]` ([`ConfigRetries`], its `ToolRetries`).
//!
//! Invariants: a hook never fails a turn. A `command` hook that cannot be
//! run, exits with an error, answers something that is not a decision or
//! overruns its timeout is logged (`warn`) and skipped — unless it is a
//! `PreToolUse` hook with `fail_closed = true`, whose failure denies the
//! call (a policy is not bypassed by breaking it). A command runs with the
//! event as JSON on its stdin, no shell, in a process group of its own,
//! and is answered within its timeout: at the deadline the whole group is
//! killed (what it started too), and a hook that exited but left a
//! process holding its output is not waited for past it (that process is
//! killed; the answer is what the hook wrote);
//! observe-only events run their commands on a thread of their own, so a
//! slow one never holds the turn (dropping the hooks waits for them, each
//! bounded by its timeout). The answer follows Claude Code's
//! convention: exit 0 with `{"decision": "allow"|"deny"|"modify_args"|
//! "require_confirmation", "reason"?, "args"?}` on stdout (nothing: allow;
//! `args` is a JSON merge patch), or exit 2 to deny with stderr as the
//! reason. Retries never ask for an irreversible call at an endpoint that
//! cannot deduplicate.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use durable_agent::runtime::{
    HookDecision, HookEvent, HookEventKind, Hooks, PreToolUse, ToolRequest, ToolRetries,
};
use serde::Deserialize;
use serde_json::Value;

use crate::config::{default_max_retries, Config, HookAction, HookConfig, ToolConfig};
use crate::retry::{RetryPolicy, Sleeper};

/// Largest answer read from a hook program.
const MAX_ANSWER_BYTES: u64 = 64 * 1024;

/// The hooks of one config, compiled.
#[derive(Debug)]
pub struct ConfigHooks {
    hooks: Vec<Compiled>,
    /// Observer programs still running: waited for (each bounded by its
    /// timeout) when the hooks are dropped, so a `run` that ends right
    /// after its turn does not cut its `AgentStop` observer short.
    observers: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Drop for ConfigHooks {
    fn drop(&mut self) {
        let running = std::mem::take(self.observers.get_mut().unwrap_or_else(|e| e.into_inner()));
        for t in running {
            let _ = t.join();
        }
    }
}

#[derive(Debug)]
struct Compiled {
    /// `hooks[i]`, for logs and reasons.
    name: String,
    kind: HookEventKind,
    /// `None`: every tool.
    matcher: Option<regex::Regex>,
    action: Action,
}

#[derive(Debug, Clone)]
enum Action {
    Allow,
    Deny(String),
    Modify(Value),
    Confirm(String),
    Command(HookCommand),
}

/// A hook program and how long it may take.
#[derive(Debug, Clone)]
pub struct HookCommand {
    pub argv: Vec<String>,
    pub timeout: Duration,
    pub fail_closed: bool,
}

/// Why a hook program gave no decision.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("cannot run {program:?}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no answer within {0:?}; killed")]
    Timeout(Duration),
    #[error("exited with {status}: {stderr}")]
    Exit { status: String, stderr: String },
    #[error("its answer is not a decision ({0})")]
    Answer(String),
    #[error("waiting for it failed: {0}")]
    Wait(std::io::Error),
}

/// What a program printed, and how it ended.
#[derive(Debug)]
struct Finished {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// A program's answer (Claude Code's hook convention).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Answer {
    decision: String,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    args: Option<Value>,
}

impl ConfigHooks {
    /// Compile a validated `[[hooks]]` section. A matcher that does not
    /// compile (validation refuses it) matches every tool: a deny policy
    /// must not fail open.
    pub fn from_config(hooks: &[HookConfig]) -> ConfigHooks {
        let hooks = hooks
            .iter()
            .enumerate()
            .filter_map(|(i, h)| {
                let name = format!("hooks[{i}]");
                let kind = h.event_kind()?;
                let matcher = h.matcher.as_deref().and_then(|m| match regex::Regex::new(m) {
                    Ok(re) => Some(re),
                    Err(e) => {
                        tracing::error!(hook = name, matcher = m, %e, "hook matcher does not compile; it matches every tool");
                        None
                    }
                });
                let reason = || h.reason.clone().unwrap_or_else(|| format!("{name} says so"));
                let action = match h.action {
                    HookAction::Allow => Action::Allow,
                    HookAction::Deny => Action::Deny(reason()),
                    HookAction::ModifyArgs => Action::Modify(h.patch.clone().unwrap_or(Value::Null)),
                    HookAction::RequireConfirmation => Action::Confirm(format!("{name}: {}", reason())),
                    HookAction::Command => Action::Command(HookCommand {
                        argv: h.command.clone(),
                        timeout: Duration::from_millis(h.timeout_ms),
                        fail_closed: h.fail_closed,
                    }),
                };
                Some(Compiled {
                    name,
                    kind,
                    matcher,
                    action,
                })
            })
            .collect();
        ConfigHooks {
            hooks,
            observers: Mutex::new(Vec::new()),
        }
    }

    fn matching<'a>(
        &'a self,
        kind: HookEventKind,
        tool: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Compiled> {
        self.hooks.iter().filter(move |h| {
            h.kind == kind
                && match (&h.matcher, tool) {
                    (Some(re), Some(tool)) => re.is_match(tool),
                    (Some(_), None) => false,
                    (None, _) => true,
                }
        })
    }
}

impl Hooks for ConfigHooks {
    fn pre_tool_use(&self, call: &PreToolUse<'_>) -> Vec<HookDecision> {
        let mut decisions = Vec::new();
        for hook in self.matching(HookEventKind::PreToolUse, Some(call.tool_name)) {
            let decision = match &hook.action {
                Action::Allow => HookDecision::Allow,
                Action::Deny(reason) => HookDecision::Deny {
                    reason: reason.clone(),
                },
                Action::Modify(patch) => HookDecision::ModifyArgs { patch: patch.clone() },
                Action::Confirm(reason) => HookDecision::RequireConfirmation {
                    reason: reason.clone(),
                },
                Action::Command(cmd) => {
                    let event = event_json("PreToolUse", serde_json::to_value(call));
                    match decide(&hook.name, cmd, &event) {
                        Ok(decision) => decision,
                        Err(e) if cmd.fail_closed => {
                            tracing::warn!(hook = hook.name, tool = call.tool_name, %e, "hook failed; it fails closed: the call is denied");
                            HookDecision::Deny {
                                reason: format!("policy hook {} failed ({e}) and fails closed", hook.name),
                            }
                        }
                        Err(e) => {
                            tracing::warn!(hook = hook.name, tool = call.tool_name, %e, "hook failed; skipped");
                            continue;
                        }
                    }
                }
            };
            tracing::debug!(
                hook = hook.name,
                tool = call.tool_name,
                ?decision,
                "hook answered"
            );
            decisions.push(decision);
        }
        decisions
    }

    fn observe(&self, event: &HookEvent) {
        let tool = match event {
            HookEvent::PostToolUse { tool_name, .. } | HookEvent::PostToolUseFailure { tool_name, .. } => {
                Some(tool_name.as_str())
            }
            _ => None,
        };
        let kind = event.kind();
        for hook in self.matching(kind, tool) {
            let Action::Command(cmd) = &hook.action else {
                continue;
            };
            let input = event_json(kind.name(), serde_json::to_value(event));
            let (name, cmd) = (hook.name.clone(), cmd.clone());
            // Fire and forget: an observer never holds the turn.
            let spawned = std::thread::Builder::new()
                .name("hook".into())
                .spawn(move || match run(&cmd, &input) {
                    Ok(done) if done.code == Some(0) => {}
                    Ok(done) => tracing::warn!(hook = name, code = ?done.code, stderr = done.stderr.trim(), "observer hook failed"),
                    Err(e) => tracing::warn!(hook = name, %e, "observer hook failed"),
                });
            match spawned {
                Ok(t) => {
                    // A poisoned list is still a list of handles.
                    let mut running = self.observers.lock().unwrap_or_else(|e| e.into_inner());
                    running.retain(|t| !t.is_finished());
                    running.push(t);
                }
                Err(e) => {
                    tracing::warn!(hook = hook.name, %e, "cannot start a thread for an observer hook; skipped")
                }
            }
        }
    }
}

/// The event a program reads: `hook_event_name` first, then its fields.
fn event_json(name: &str, fields: Result<Value, serde_json::Error>) -> Vec<u8> {
    let mut event = serde_json::Map::new();
    event.insert("hook_event_name".into(), Value::String(name.into()));
    if let Ok(Value::Object(fields)) = fields {
        for (k, v) in fields {
            event.entry(k).or_insert(v);
        }
    }
    Value::Object(event).to_string().into_bytes()
}

/// Run a `PreToolUse` program and read its decision.
fn decide(name: &str, cmd: &HookCommand, event: &[u8]) -> Result<HookDecision, HookError> {
    let done = run(cmd, event)?;
    match done.code {
        Some(0) => {}
        // Claude Code's convention: exit 2 blocks, stderr says why.
        Some(2) => {
            let reason = done.stderr.trim();
            return Ok(HookDecision::Deny {
                reason: match reason.is_empty() {
                    true => format!("{name} denied the call"),
                    false => reason.to_string(),
                },
            });
        }
        code => {
            return Err(HookError::Exit {
                status: code.map_or("a signal".to_string(), |c| format!("status {c}")),
                stderr: crate::http::excerpt(done.stderr.trim(), 300),
            })
        }
    }
    if done.stdout.trim().is_empty() {
        return Ok(HookDecision::Allow);
    }
    let answer: Answer =
        serde_json::from_str(done.stdout.trim()).map_err(|e| HookError::Answer(e.to_string()))?;
    let reason = answer.reason.unwrap_or_else(|| format!("{name} says so"));
    match answer.decision.as_str() {
        "allow" => Ok(HookDecision::Allow),
        "deny" => Ok(HookDecision::Deny { reason }),
        "require_confirmation" => Ok(HookDecision::RequireConfirmation {
            reason: format!("{name}: {reason}"),
        }),
        "modify_args" => match answer.args {
            Some(patch @ Value::Object(_)) => Ok(HookDecision::ModifyArgs { patch }),
            _ => Err(HookError::Answer(
                "modify_args needs `args`, an object (a JSON merge patch)".into(),
            )),
        },
        other => Err(HookError::Answer(format!(
            "decision {other:?} is not allow, deny, modify_args or require_confirmation"
        ))),
    }
}

/// Run `cmd` with `input` on stdin, in a process group of its own; at
/// its timeout kill the group. The deadline bounds the whole answer: the
/// program's exit and the end of its output, which a process it left
/// behind may hold open (found by a review: a hook that ran `cmd &` held
/// the round until `cmd` ended, and a killed hook's children ran on).
fn run(cmd: &HookCommand, input: &[u8]) -> Result<Finished, HookError> {
    use std::os::unix::process::CommandExt;

    let program = cmd.argv.first().cloned().unwrap_or_default();
    let mut child = Command::new(&program)
        .args(cmd.argv.iter().skip(1))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|source| HookError::Spawn {
            program: program.clone(),
            source,
        })?;
    let group = Group(child.id());
    // Each pipe on its own thread: a program that writes before reading,
    // or never reads, cannot deadlock us.
    let stdin = child.stdin.take().map(|mut pipe| {
        let input = input.to_vec();
        std::thread::spawn(move || {
            // A program that ignores its input closes the pipe: fine.
            let _ = pipe.write_all(&input);
        })
    });
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(pipe) = pipe {
                let _ = pipe.take(MAX_ANSWER_BYTES).read_to_end(&mut bytes);
            }
            String::from_utf8_lossy(&bytes).into_owned()
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = Instant::now() + cmd.timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                // The group killed and the program reaped: no zombie, and
                // every holder of its pipes gone, so the readers end.
                group.kill();
                let _ = child.wait();
                return Err(HookError::Timeout(cmd.timeout));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => {
                group.kill();
                let _ = child.wait();
                return Err(HookError::Wait(e));
            }
        }
    };
    // Exited: its output ends when the last holder of the pipes closes
    // them, which a process it started may delay; not past the deadline.
    // There the group is killed and the answer is what the program wrote
    // (it exited: its answer is whole).
    while !(stdout.is_finished() && stderr.is_finished()) {
        if Instant::now() >= deadline {
            tracing::warn!(
                program,
                "hook exited but left a process holding its output; killed at its timeout"
            );
            group.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if let Some(t) = stdin {
        let _ = t.join();
    }
    Ok(Finished {
        code: status.code(),
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// A hook's process group (its id is the hook program's pid).
struct Group(u32);

impl Group {
    /// SIGKILL to every process of the group. An error (the group is
    /// already gone) leaves nothing to do.
    fn kill(&self) {
        let Ok(pgid) = libc::pid_t::try_from(self.0) else {
            return;
        };
        // SAFETY: kill(2) takes plain integers and touches no memory of
        // ours; a negative pid names the process group.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
}

/// `[retries]`: each tool's plan, and the host's way to wait.
#[derive(Debug)]
pub struct ConfigRetries {
    plans: BTreeMap<String, RetryPolicy>,
    /// For tools not configured: the class default.
    base_ms: u64,
    max_ms: u64,
    /// Irreversible tools whose endpoint cannot deduplicate: never retried.
    no_dedup: Vec<String>,
    sleeper: Arc<dyn Sleeper>,
}

impl ConfigRetries {
    pub fn from_config(config: &Config, sleeper: Arc<dyn Sleeper>) -> ConfigRetries {
        let r = &config.retries;
        let mut plans = BTreeMap::new();
        let mut no_dedup = Vec::new();
        for tool in &config.tools {
            let irreversible = tool.irreversible();
            if irreversible && !matches!(tool, ToolConfig::Http(h) if h.dedup) {
                no_dedup.push(tool.name().to_string());
            }
            let own = r.tools.get(tool.name()).cloned().unwrap_or_default();
            plans.insert(
                tool.name().to_string(),
                RetryPolicy {
                    max_retries: own.max_retries.unwrap_or(default_max_retries(irreversible)),
                    base_ms: own.backoff_base_ms.unwrap_or(r.backoff_base_ms),
                    max_ms: own.backoff_max_ms.unwrap_or(r.backoff_max_ms),
                },
            );
        }
        ConfigRetries {
            plans,
            base_ms: r.backoff_base_ms,
            max_ms: r.backoff_max_ms,
            no_dedup,
            sleeper,
        }
    }
}

impl ToolRetries for ConfigRetries {
    fn delay_before(&self, call: &ToolRequest, next_attempt: u32) -> Option<u64> {
        if call.irreversible && self.no_dedup.contains(&call.tool) {
            return None;
        }
        let policy = self.plans.get(&call.tool).copied().unwrap_or(RetryPolicy {
            max_retries: default_max_retries(call.irreversible),
            base_ms: self.base_ms,
            max_ms: self.max_ms,
        });
        (next_attempt >= 2 && next_attempt <= policy.max_attempts())
            .then(|| policy.delay_ms(next_attempt, None))
    }

    fn wait(&self, delay_ms: u64) {
        self.sleeper.sleep(Duration::from_millis(delay_ms));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(script: &str, timeout_ms: u64) -> HookCommand {
        HookCommand {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            timeout: Duration::from_millis(timeout_ms),
            fail_closed: false,
        }
    }

    #[test]
    fn a_program_answers_with_json_or_exit_2() {
        let d = |script| decide("hooks[0]", &cmd(script, 5_000), b"{}");
        assert_eq!(d("true").unwrap(), HookDecision::Allow);
        assert_eq!(
            d(r#"echo '{"decision":"deny","reason":"no"}'"#).unwrap(),
            HookDecision::Deny { reason: "no".into() }
        );
        assert_eq!(
            d(r#"echo '{"decision":"modify_args","args":{"a":1}}'"#).unwrap(),
            HookDecision::ModifyArgs {
                patch: serde_json::json!({"a": 1})
            }
        );
        assert_eq!(
            d("echo blocked >&2; exit 2").unwrap(),
            HookDecision::Deny {
                reason: "blocked".into()
            }
        );
        assert!(matches!(d("exit 3"), Err(HookError::Exit { .. })));
        assert!(matches!(d("echo nonsense"), Err(HookError::Answer(_))));
        assert!(matches!(
            d(r#"echo '{"decision":"modify_args"}'"#),
            Err(HookError::Answer(_))
        ));
    }

    #[test]
    fn retries_follow_the_plan_and_never_an_irreversible_tool_without_dedup() {
        let text = r#"
[provider]
base_url = "http://127.0.0.1:1/v1"
model = "m"

[[tools]]
kind = "http"
name = "lookup"
description = "d"
url = "http://127.0.0.1:1/l"

[[tools]]
kind = "http"
name = "pay"
description = "d"
url = "http://127.0.0.1:1/p"
irreversible = true
dedup = true

[[tools]]
kind = "http"
name = "mail"
description = "d"
url = "http://127.0.0.1:1/m"
irreversible = true

[retries]
backoff_base_ms = 100
backoff_max_ms = 300

[retries.tools.pay]
max_retries = 2
"#;
        let config = Config::parse(std::path::Path::new("/x/agent.toml"), text).unwrap();
        let retries = ConfigRetries::from_config(&config, Arc::new(crate::retry::RecordingSleeper::new()));
        let call = |tool: &str, irreversible| ToolRequest {
            tool: tool.into(),
            args: serde_json::json!({}),
            irreversible,
            invalid_args: None,
        };
        // Reversible default: one retry.
        assert_eq!(retries.delay_before(&call("lookup", false), 2), Some(100));
        assert_eq!(retries.delay_before(&call("lookup", false), 3), None);
        // A dedup endpoint, as configured: doubling, capped.
        let pay = call("pay", true);
        let delays: Vec<_> = (2..=4).map(|n| retries.delay_before(&pay, n)).collect();
        assert_eq!(delays, [Some(100), Some(200), None]);
        // Irreversible without dedup, and an unknown irreversible tool: never.
        assert_eq!(retries.delay_before(&call("mail", true), 2), None);
        assert_eq!(retries.delay_before(&call("other", true), 2), None);
        assert_eq!(retries.delay_before(&call("other", false), 2), Some(100));
    }

    #[test]
    fn a_program_reads_the_event_and_is_killed_at_its_timeout() {
        let echo = run(&cmd("cat", 5_000), br#"{"tool_name":"x"}"#).unwrap();
        assert_eq!(echo.stdout, r#"{"tool_name":"x"}"#);
        let started = Instant::now();
        assert!(matches!(
            run(&cmd("sleep 5", 100), b""),
            Err(HookError::Timeout(_))
        ));
        assert!(started.elapsed() < Duration::from_secs(3));
        let missing = HookCommand {
            argv: vec!["/nonexistent/hook".into()],
            timeout: Duration::from_secs(1),
            fail_closed: false,
        };
        assert!(matches!(run(&missing, b""), Err(HookError::Spawn { .. })));
    }
}
