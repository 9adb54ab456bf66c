//! Telemetry lifecycle events (seed 000's envelope, [`crate::telemetry`]):
//! `agent_start`/`agent_stop` around create/terminate, `turn_start`/
//! `turn_end` around each turn the app runs, and `pre_tool_use`/
//! `post_tool_use`/`tool_failure` around every tool call — reversible ones
//! through [`ObservedTools`], irreversible ones through [`ObservedOutbox`],
//! the two wrappers `boot` hands to `System::boot`.
//!
//! Invariant: observing never changes behaviour — every wrapper calls its
//! inner tool or outbox exactly once and returns its result unchanged, and
//! a telemetry write failure is logged and dropped. Events are written
//! after the fact they report is decided (a `post_tool_use` after the
//! tool returned), never instead of it; they are not runtime state and can
//! be lost in a crash.
//!
//! Why a turn scope: the outbox only sees an idempotency key and an action,
//! not the agent. Every call of a turn is performed on a thread that holds
//! the turn's [`TurnScope`] while it runs (the worker itself for an inline
//! turn, the call's own thread in `serve`, where several turns are in
//! flight at once), so the scope of the calling thread names the agent and
//! session of every irreversible call made inside it.
//!
//! The same calls feed the OpenTelemetry tracer when one is configured
//! ([`crate::otel`]: the turn's root span, its tool calls' spans), and
//! every event of a turn carries the turn's trace id, so the JSONL and
//! POSTed envelopes join the traces. The provider's attempts become
//! `provider_call` events (and `retry` ones) through
//! [`Lifecycle`]'s [`CallObserver`].

use std::cell::RefCell;
use std::sync::Arc;

use durable_agent::runtime::{AgentId, ToolContext, ToolError, ToolExecutor, ToolOutput, ToolRequest};
use durable_agent::system::System;
use durable_agent::world::{DeliveryError, Outbox};
use serde_json::{json, Value};

use crate::observe::{Attempt, AttemptOutcome, CallObserver};
use crate::otel::Otel;
use crate::telemetry::{now_ms, Envelope, EventType, Telemetry};

/// The agent, session and work of a turn in progress (the worker core's).
pub use durable_agent::worker::TurnScope;

thread_local! {
    /// The scope of the turn whose call this thread is performing.
    static SCOPE: RefCell<Option<TurnScope>> = const { RefCell::new(None) };
}

/// The turn's trace id, hex (see [`crate::otel::trace_id`]).
fn trace_id(scope: &TurnScope) -> String {
    crate::otel::trace_id(scope.session.as_deref(), &scope.work).to_string()
}

/// The lifecycle event sink: a no-op without `[telemetry]` sinks or
/// `[telemetry.otlp]`.
#[derive(Debug, Clone, Default)]
pub struct Lifecycle {
    exporter: Option<Arc<Telemetry>>,
    otel: Option<Arc<Otel>>,
    /// The turns in progress by agent: a provider attempt is reported on
    /// whatever thread the provider runs it (not the turn's scope).
    turns: Arc<std::sync::Mutex<std::collections::HashMap<String, TurnScope>>>,
}

impl Lifecycle {
    pub fn new(exporter: Option<Arc<Telemetry>>, otel: Option<Arc<Otel>>) -> Lifecycle {
        Lifecycle {
            exporter,
            otel,
            turns: Arc::default(),
        }
    }

    /// Nothing is exported.
    pub fn disabled() -> Lifecycle {
        Lifecycle::default()
    }

    fn emit(&self, event: EventType, session: Option<&str>, agent: &str, payload: Value) {
        let trace_id = SCOPE.with(|s| s.borrow().as_ref().map(trace_id));
        self.emit_traced(event, session, agent, trace_id, payload);
    }

    fn emit_traced(
        &self,
        event_type: EventType,
        session_id: Option<&str>,
        agent_id: &str,
        trace_id: Option<String>,
        payload: Value,
    ) {
        let Some(exporter) = &self.exporter else { return };
        let envelope = Envelope {
            event_type,
            timestamp_ms: now_ms(),
            session_id,
            agent_id,
            trace_id,
            payload,
        };
        if let Err(e) = exporter.write(&envelope) {
            tracing::warn!(error = %e, event = ?event_type, "telemetry event lost");
        }
    }

    /// Run `f` (a call of the turn `scope`) with `scope` as this
    /// thread's turn.
    pub fn in_scope<T>(scope: &TurnScope, f: impl FnOnce() -> T) -> T {
        let previous = SCOPE.with(|s| s.replace(Some(scope.clone())));
        let result = f();
        SCOPE.with(|s| *s.borrow_mut() = previous);
        result
    }

    /// `agent`'s session id (its session directory's name), if live.
    fn session_of(system: &System, agent: &AgentId) -> Option<String> {
        durable_agent::worker::session_of(system, agent)
    }

    /// `agent` was created (its `agent.created` is durable).
    pub fn agent_start(&self, system: &System, agent: &AgentId, name: &str, parent: Option<&AgentId>) {
        let session = Self::session_of(system, agent);
        let payload = json!({"name": name, "parent": parent});
        self.emit(EventType::AgentStart, session.as_deref(), agent.as_str(), payload);
    }

    /// `agent` is about to be terminated; call [`Self::agent_stopped`]
    /// once it is (the session is looked up first, while it is live).
    pub fn agent_stopping(&self, system: &System, agent: &AgentId) -> Option<String> {
        Self::session_of(system, agent)
    }

    pub fn agent_stopped(&self, agent: &AgentId, session: Option<&str>) {
        self.emit(EventType::AgentStop, session, agent.as_str(), Value::Null);
    }

    /// A turn of `agent` performing `work` starts: `turn_start`. Perform
    /// its calls [`Self::in_scope`] of the returned scope and end it with
    /// [`Self::turn_ended`].
    pub fn turn_started(&self, system: &System, agent: &AgentId, work: &str) -> TurnScope {
        let scope = TurnScope::of(system, agent, work);
        self.emit_traced(
            EventType::TurnStart,
            scope.session.as_deref(),
            &scope.agent,
            Some(trace_id(&scope)),
            json!({"work": work}),
        );
        if let Some(otel) = &self.otel {
            otel.turn_started(&scope.agent, scope.session.as_deref(), work);
        }
        self.turns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(scope.agent.clone(), scope.clone());
        scope
    }

    /// The turn of `scope` ended: `turn_end` with its result.
    pub fn turn_ended(&self, scope: &TurnScope, result: Result<Value, String>) {
        self.turns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&scope.agent);
        if let Some(otel) = &self.otel {
            otel.turn_ended(&scope.agent, result.as_ref().map(|_| ()).map_err(Clone::clone));
        }
        let payload = match result {
            Ok(value) => json!({"work": scope.work, "ok": true, "result": value}),
            Err(e) => json!({"work": scope.work, "ok": false, "error": e}),
        };
        self.emit_traced(
            EventType::TurnEnd,
            scope.session.as_deref(),
            &scope.agent,
            Some(trace_id(scope)),
            payload,
        );
    }

    /// Run `turn` (one turn of `agent` performing `work`, its calls inline)
    /// between `turn_start` and `turn_end`; `describe` turns its result
    /// into the end event's payload.
    pub fn turn<T, E: std::fmt::Display>(
        &self,
        system: &mut System,
        agent: &AgentId,
        work: &str,
        turn: impl FnOnce(&mut System) -> Result<T, E>,
        describe: impl FnOnce(&T) -> Value,
    ) -> Result<T, E> {
        let scope = self.turn_started(system, agent, work);
        let result = Self::in_scope(&scope, || turn(system));
        self.turn_ended(&scope, result.as_ref().map(describe).map_err(|e| e.to_string()));
        result
    }

    fn tool_events(
        &self,
        agent: &str,
        session: Option<&str>,
        tool: Value,
        result: Result<(bool, String), String>,
    ) {
        let (event, payload) = match result {
            Ok((true, output)) => (EventType::PostToolUse, json!({"tool": tool, "output": output})),
            Ok((false, output)) => (EventType::ToolFailure, json!({"tool": tool, "error": output})),
            Err(error) => (EventType::ToolFailure, json!({"tool": tool, "error": error})),
        };
        self.emit(event, session, agent, payload);
    }
}

/// The worker core reports through the inherent methods above.
impl durable_agent::worker::Lifecycle for Lifecycle {
    fn agent_start(&self, system: &System, agent: &AgentId, name: &str, parent: Option<&AgentId>) {
        Lifecycle::agent_start(self, system, agent, name, parent);
    }
    fn agent_stopping(&self, system: &System, agent: &AgentId) -> Option<String> {
        Lifecycle::agent_stopping(self, system, agent)
    }
    fn agent_stopped(&self, agent: &AgentId, session: Option<&str>) {
        Lifecycle::agent_stopped(self, agent, session);
    }
    fn turn_started(&self, system: &System, agent: &AgentId, work: &str) -> TurnScope {
        Lifecycle::turn_started(self, system, agent, work)
    }
    fn turn_ended(&self, scope: &TurnScope, result: Result<Value, String>) {
        Lifecycle::turn_ended(self, scope, result);
    }
    fn in_scope(&self, scope: &TurnScope, f: &mut dyn FnMut()) {
        Lifecycle::in_scope(scope, f);
    }
}

/// Reversible tools, observed.
#[derive(Debug)]
pub struct ObservedTools {
    pub inner: Arc<dyn ToolExecutor>,
    pub lifecycle: Lifecycle,
}

impl ToolExecutor for ObservedTools {
    fn execute(&self, ctx: &ToolContext<'_>, call: &ToolRequest) -> Result<ToolOutput, ToolError> {
        let (agent, session) = (ctx.agent.as_str(), ctx.session.as_str());
        let tool = json!({"name": call.tool, "call_id": ctx.call_id, "idempotency_key": ctx.idempotency_key, "irreversible": false});
        if let Some(otel) = &self.lifecycle.otel {
            otel.tool_started(agent, &call.tool, ctx.idempotency_key, false);
        }
        self.lifecycle.emit(
            EventType::PreToolUse,
            Some(session),
            agent,
            json!({"tool": tool, "args": call.args}),
        );
        let result = self.inner.execute(ctx, call);
        let seen = match &result {
            Ok(out) => Ok((out.ok, out.output.clone())),
            Err(e) => Err(e.to_string()),
        };
        self.lifecycle.tool_events(agent, Some(session), tool, seen);
        result
    }
}

/// Irreversible tools (the activity ledger's outbox), observed: only calls
/// that really go out are seen — one the ledger answers from a DONE record
/// never reaches the outbox.
#[derive(Debug)]
pub struct ObservedOutbox {
    pub inner: Arc<dyn Outbox>,
    pub lifecycle: Lifecycle,
}

impl Outbox for ObservedOutbox {
    fn supports_dedup(&self, action: &str) -> bool {
        self.inner.supports_dedup(action)
    }

    fn send(&self, idem_key: &str, action: &str, payload: &Value) -> Result<String, DeliveryError> {
        let scope = SCOPE.with(|s| s.borrow().clone());
        let (agent, session) = scope
            .as_ref()
            .map_or(("", None), |s| (s.agent.as_str(), s.session.as_deref()));
        let tool =
            json!({"name": action, "idem_key": idem_key, "idempotency_key": idem_key, "irreversible": true});
        if let Some(otel) = &self.lifecycle.otel {
            otel.tool_started(agent, action, idem_key, true);
        }
        self.lifecycle.emit(
            EventType::PreToolUse,
            session,
            agent,
            json!({"tool": tool, "args": payload}),
        );
        let result = self.inner.send(idem_key, action, payload);
        let seen = match &result {
            Ok(provider_ref) => Ok((true, provider_ref.clone())),
            Err(e) => Err(e.to_string()),
        };
        self.lifecycle.tool_events(agent, session, tool, seen);
        result
    }
}

/// Every provider attempt is a `provider_call` event (GenAI's fields:
/// model, tokens); one that will be retried is also a `retry` event.
impl CallObserver for Lifecycle {
    fn on_attempt(&self, attempt: &Attempt) {
        if self.exporter.is_none() {
            return;
        }
        let scope = (self.turns.lock().unwrap_or_else(|e| e.into_inner()))
            .get(&attempt.agent)
            .cloned();
        let session = scope.as_ref().and_then(|s| s.session.as_deref());
        let trace_id = scope.as_ref().map(trace_id);
        let mut call = json!({
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": attempt.model,
            "attempt": attempt.number,
            "elapsed_ms": attempt.elapsed_ms,
        });
        match &attempt.outcome {
            AttemptOutcome::Success { usage } => {
                call["ok"] = json!(true);
                if let Some(u) = usage {
                    call["gen_ai.usage.input_tokens"] = json!(u.prompt_tokens);
                    call["gen_ai.usage.output_tokens"] = json!(u.completion_tokens);
                }
            }
            AttemptOutcome::Failure { error, retry_in_ms } => {
                call["ok"] = json!(false);
                call["error"] = json!(error.to_string());
                if let Some(retry_in_ms) = retry_in_ms {
                    let retry = json!({
                        "model": attempt.model,
                        "attempt": attempt.number,
                        "error": error.to_string(),
                        "retry_in_ms": retry_in_ms,
                    });
                    self.emit_traced(EventType::Retry, session, &attempt.agent, trace_id.clone(), retry);
                }
            }
        }
        self.emit_traced(EventType::ProviderCall, session, &attempt.agent, trace_id, call);
    }
}
