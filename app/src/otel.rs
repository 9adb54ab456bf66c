//! OpenTelemetry traces of the turns the binary runs, exported over
//! OTLP/HTTP (protobuf) when `[telemetry.otlp]` is configured.
//!
//! One trace per unit of work — a `run`, an API turn, a trigger fire —
//! with a root span, a child span per provider round, and under each round
//! a span per provider attempt (`chat {model}`, GenAI semantic
//! conventions: `gen_ai.operation.name`, `gen_ai.request.model`,
//! `gen_ai.usage.input_tokens`/`output_tokens`) and per tool call
//! (`execute_tool {name}`: `gen_ai.tool.name`, `gen_ai.tool.call.id`, the
//! idempotency key). Errors are span status.
//!
//! No event mechanism of its own (as [`crate::progress`]): [`Otel`] watches
//! the runtime's hook events ([`Otel::hooks`], after the configured hooks),
//! the provider's attempts ([`Otel::observer`], after telemetry) and the
//! [`crate::lifecycle`] calls that already bracket every turn and tool call.
//!
//! Identity across a crash, without a new log line: a turn's trace id and
//! its root span id are a hash of what the log already holds for the turn
//! and what every process that runs it knows — its agent's session id and
//! its work (`run:{id}`, `trigger:{key}`, an API work id). So the spans of
//! an interrupted process and of the process that resumes the turn share
//! one trace, and the rounds of both are children of one root span. That
//! root is exported once the turn ends in a process that ran it: a process
//! killed or stopped mid-turn exports its rounds and calls (they point at
//! the root) but not the root, which the resuming process exports with the
//! resume facts (`durable_agent.resumed`, `.resumed.round`,
//! `.resumed.decided`). A turn resumed after it *failed* exports its root
//! a second time (the same id; backends keep the later). A turn found
//! already done runs nothing and exports nothing.
//!
//! Invariants: export never blocks a turn and never fails it. Ending a
//! span only queues it (the SDK's `BatchSpanProcessor`, a bounded queue of
//! `max_queue_spans` drained by its own thread); a full queue drops the
//! span, and the drops are counted (spans ended minus spans handed to the
//! exporter, logged at shutdown: the SDK keeps its own count private). An
//! export request takes at most `timeout_ms`, on the export thread only.
//! At exit the last flush waits at most `shutdown_timeout_ms`. Nothing
//! here is runtime state: spans are lost in a crash like log lines.

pub mod http;

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use durable_agent::runtime::ids::fnv1a;
use durable_agent::runtime::{HookDecision, HookEvent, Hooks, PreToolUse, Resumed};
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer as _,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, IdGenerator, RandomIdGenerator, SdkTracer, SdkTracerProvider,
    SpanData, SpanExporter,
};
use opentelemetry_sdk::Resource;

use crate::config::OtlpConfig;
use crate::interrupt::Stop;
use crate::observe::{Attempt, AttemptOutcome, CallObserver};

/// Attribute keys of this product (the GenAI ones are the convention's).
pub mod attr {
    pub const WORK: &str = "durable_agent.work";
    pub const SESSION: &str = "durable_agent.session";
    pub const TURN_KIND: &str = "durable_agent.turn.kind";
    pub const RESUMED: &str = "durable_agent.resumed";
    pub const RESUMED_ROUND: &str = "durable_agent.resumed.round";
    pub const RESUMED_DECIDED: &str = "durable_agent.resumed.decided";
    pub const ROUND: &str = "durable_agent.round";
    /// The round's calls come from its logged decision: the model was not
    /// asked again.
    pub const ROUND_FROM_LOG: &str = "durable_agent.round.from_log";
    pub const IDEMPOTENCY_KEY: &str = "durable_agent.idempotency_key";
    pub const IRREVERSIBLE: &str = "durable_agent.irreversible";
    /// False: the call's result did not come from calling the tool in this
    /// process (the activity ledger answered it, or a hook denied it).
    pub const TOOL_SENT: &str = "durable_agent.tool.sent";
    pub const ATTEMPT: &str = "durable_agent.attempt";
}

#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// A turn's trace id: a hash of its session and work (see the module doc).
pub fn trace_id(session: Option<&str>, work: &str) -> TraceId {
    let identity = format!("{}\n{work}", session.unwrap_or_default());
    let hi = fnv1a(format!("otel trace hi\n{identity}").as_bytes());
    let lo = fnv1a(format!("otel trace lo\n{identity}").as_bytes());
    // The all-zero id is invalid; a hash that lands on it is nudged.
    TraceId::from((u128::from(hi) << 64 | u128::from(lo)).max(1))
}

/// A turn's root span id (same inputs as [`trace_id`]).
pub fn root_span_id(session: Option<&str>, work: &str) -> SpanId {
    let identity = format!("{}\n{work}", session.unwrap_or_default());
    SpanId::from(fnv1a(format!("otel root\n{identity}").as_bytes()).max(1))
}

thread_local! {
    /// Ids the next span started on this thread takes (the root's).
    static PINNED: Cell<Option<(TraceId, SpanId)>> = const { Cell::new(None) };
}

/// Random ids, except for a span started inside [`with_pinned_ids`]: the
/// SDK gives a span no way to choose its own id.
#[derive(Debug, Default)]
struct PinnableIds(RandomIdGenerator);

impl IdGenerator for PinnableIds {
    fn new_trace_id(&self) -> TraceId {
        PINNED
            .with(Cell::get)
            .map_or_else(|| self.0.new_trace_id(), |(t, _)| t)
    }
    fn new_span_id(&self) -> SpanId {
        PINNED
            .with(Cell::get)
            .map_or_else(|| self.0.new_span_id(), |(_, s)| s)
    }
}

fn with_pinned_ids<T>(ids: (TraceId, SpanId), f: impl FnOnce() -> T) -> T {
    PINNED.with(|p| p.set(Some(ids)));
    let out = f();
    PINNED.with(|p| p.set(None));
    out
}

/// Spans ended, handed to the exporter, and in failed exports.
#[derive(Debug, Default)]
struct Counts {
    ended: AtomicU64,
    exported: AtomicU64,
    failed: AtomicU64,
}

/// The OTLP exporter, counting what reaches it.
#[derive(Debug)]
struct CountingExporter<E> {
    inner: E,
    counts: Arc<Counts>,
}

impl<E: SpanExporter> SpanExporter for CountingExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len() as u64;
        self.counts.exported.fetch_add(n, Ordering::Relaxed);
        let result = self.inner.export(batch).await;
        if let Err(e) = &result {
            self.counts.failed.fetch_add(n, Ordering::Relaxed);
            tracing::debug!(error = %e, spans = n, "OTLP export failed");
        }
        result
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }
    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }
    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// What kind of unit of work a turn performs (from its work id).
fn turn_kind(work: &str) -> (&'static str, String) {
    if let Some(run) = work.strip_prefix("run:") {
        ("run", format!("run {run}"))
    } else if let Some(key) = work.strip_prefix("trigger:") {
        ("trigger_fire", format!("trigger {key}"))
    } else {
        ("api_turn", format!("turn {work}"))
    }
}

/// The spans of one agent's turn in progress.
#[derive(Debug)]
struct TurnSpans {
    work: String,
    session: Option<String>,
    /// The root's parent context for rounds (the root itself is started
    /// only when the turn ends, see the module doc).
    root: Context,
    started: SystemTime,
    /// The turn ran here (its `AgentStart` was seen): not already done.
    ran: bool,
    resumed: Option<Resumed>,
    round: Option<Context>,
    /// The tool call in progress (one at a time within a turn).
    tool: Option<Context>,
    input_tokens: u64,
    output_tokens: u64,
}

/// The tracer of one process: spans of every turn, by agent.
#[derive(Debug)]
pub struct Otel {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    model: String,
    stop: Stop,
    turns: Mutex<HashMap<String, TurnSpans>>,
    counts: Arc<Counts>,
    shutdown_timeout: Duration,
}

impl Otel {
    /// Start the export thread for `config`; spans name `model` (the one
    /// the provider config sets). A turn ending while `stop` is requested
    /// was interrupted: its root is left to the resume.
    pub fn start(config: &OtlpConfig, model: &str, stop: &Stop) -> Result<Arc<Otel>, OtelError> {
        let timeout = Duration::from_millis(config.timeout_ms);
        let mut builder = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(http::UreqClient::new(timeout))
            .with_timeout(timeout)
            .with_headers(config.headers.clone().into_iter().collect());
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint.clone());
        }
        let counts = Arc::new(Counts::default());
        let exporter = CountingExporter {
            inner: builder.build()?,
            counts: counts.clone(),
        };
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(config.max_queue_spans)
            .with_max_export_batch_size(config.max_export_batch_spans)
            .with_scheduled_delay(Duration::from_millis(config.scheduled_delay_ms))
            .build();
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batch)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_id_generator(PinnableIds::default())
            .with_resource(
                Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("durable-agent");
        tracing::info!(
            endpoint = config
                .endpoint
                .as_deref()
                .unwrap_or("(OTEL_EXPORTER_OTLP_* or the default)"),
            "OpenTelemetry traces on"
        );
        Ok(Arc::new(Otel {
            provider,
            tracer,
            model: model.to_string(),
            stop: stop.clone(),
            turns: Mutex::new(HashMap::new()),
            counts,
            shutdown_timeout: Duration::from_millis(config.shutdown_timeout_ms),
        }))
    }

    /// `inner`, with this tracer watching the events it observes.
    pub fn hooks(self: &Arc<Self>, inner: Arc<dyn Hooks>) -> Arc<dyn Hooks> {
        Arc::new(TracedHooks {
            inner,
            otel: self.clone(),
        })
    }

    /// `inner`, with this tracer watching the provider's attempts.
    pub fn observer(self: &Arc<Self>, inner: Arc<dyn CallObserver>) -> Arc<dyn CallObserver> {
        Arc::new(TracedAttempts {
            inner,
            otel: self.clone(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, TurnSpans>> {
        // Span handles and counters: nothing a panic leaves half-done.
        self.turns.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn child(&self, name: String, kind: SpanKind, parent: &Context, attrs: Vec<KeyValue>) -> Context {
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attrs)
            .start_with_context(&self.tracer, parent);
        parent.with_span(span)
    }

    fn end(&self, cx: &Context, error: Option<String>, attrs: Vec<KeyValue>) {
        let span = cx.span();
        span.set_attributes(attrs);
        if let Some(e) = error {
            span.set_status(Status::error(e));
        }
        span.end();
        self.counts.ended.fetch_add(1, Ordering::Relaxed);
    }

    /// A turn of `agent` performing `work` (in `session`) starts.
    pub fn turn_started(&self, agent: &str, session: Option<&str>, work: &str) {
        let sc = SpanContext::new(
            trace_id(session, work),
            root_span_id(session, work),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        );
        let turn = TurnSpans {
            work: work.to_string(),
            session: session.map(str::to_string),
            root: Context::new().with_remote_span_context(sc),
            started: SystemTime::now(),
            ran: false,
            resumed: None,
            round: None,
            tool: None,
            input_tokens: 0,
            output_tokens: 0,
        };
        if let Some(old) = self.lock().insert(agent.to_string(), turn) {
            // An agent has one turn at a time; a leftover never ended.
            self.close(agent, old, Some("superseded by a new turn".into()));
        }
    }

    /// The turn of `agent` ended (`Err`: with that error).
    pub fn turn_ended(&self, agent: &str, result: Result<(), String>) {
        let Some(turn) = self.lock().remove(agent) else {
            return;
        };
        self.close(agent, turn, result.err());
    }

    /// End what is open of `turn`, and its root when it ran and was not
    /// interrupted (see the module doc).
    fn close(&self, agent: &str, mut turn: TurnSpans, error: Option<String>) {
        let interrupted = error.is_some() && self.stop.requested();
        let open_error = match (&error, interrupted) {
            (_, true) => Some("interrupted; the turn resumes from its log".to_string()),
            (e, false) => e.clone(),
        };
        if let Some(tool) = turn.tool.take() {
            self.end(&tool, open_error.clone(), Vec::new());
        }
        if let Some(round) = turn.round.take() {
            self.end(&round, open_error, Vec::new());
        }
        if !turn.ran || interrupted {
            return;
        }
        let (kind, name) = turn_kind(&turn.work);
        let session = turn.session.as_deref();
        let mut attrs = vec![
            KeyValue::new("gen_ai.operation.name", "invoke_agent"),
            KeyValue::new("gen_ai.agent.id", agent.to_string()),
            KeyValue::new("gen_ai.request.model", self.model.clone()),
            KeyValue::new(
                "gen_ai.usage.input_tokens",
                i64::try_from(turn.input_tokens).unwrap_or(i64::MAX),
            ),
            KeyValue::new(
                "gen_ai.usage.output_tokens",
                i64::try_from(turn.output_tokens).unwrap_or(i64::MAX),
            ),
            KeyValue::new(attr::WORK, turn.work.clone()),
            KeyValue::new(attr::TURN_KIND, kind),
            KeyValue::new(attr::RESUMED, turn.resumed.is_some()),
        ];
        if let Some(s) = session {
            attrs.push(KeyValue::new("gen_ai.conversation.id", s.to_string()));
            attrs.push(KeyValue::new(attr::SESSION, s.to_string()));
        }
        if let Some(r) = turn.resumed {
            attrs.push(KeyValue::new(attr::RESUMED_ROUND, i64::from(r.round)));
            attrs.push(KeyValue::new(attr::RESUMED_DECIDED, r.decided));
        }
        let ids = (trace_id(session, &turn.work), root_span_id(session, &turn.work));
        let builder = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_start_time(turn.started)
            .with_attributes(attrs);
        let root = with_pinned_ids(ids, || builder.start_with_context(&self.tracer, &Context::new()));
        self.end(&Context::new().with_span(root), error, Vec::new());
    }

    fn on_event(&self, event: &HookEvent) {
        let agent = match event {
            HookEvent::AgentStart { agent, .. }
            | HookEvent::TurnStart { agent, .. }
            | HookEvent::TurnEnd { agent, .. }
            | HookEvent::PostToolUse { agent, .. }
            | HookEvent::PostToolUseFailure { agent, .. }
            | HookEvent::AgentStop { agent, .. } => agent.to_string(),
        };
        let mut turns = self.lock();
        let Some(turn) = turns.get_mut(&agent) else { return };
        match event {
            HookEvent::AgentStart { resumed, .. } => {
                turn.ran = true;
                turn.resumed = *resumed;
                if let Some(r) = resumed.filter(|r| r.decided) {
                    // No TurnStart for a round resumed from its decision.
                    turn.round = Some(self.round(turn, r.round, true));
                }
            }
            HookEvent::TurnStart { turn: round, .. } => {
                if let Some(open) = turn.round.take() {
                    self.end(&open, None, Vec::new());
                }
                turn.round = Some(self.round(turn, *round, false));
            }
            HookEvent::TurnEnd { .. } | HookEvent::AgentStop { .. } => {
                if let Some(open) = turn.round.take() {
                    self.end(&open, None, Vec::new());
                }
            }
            HookEvent::PostToolUse {
                tool_name,
                tool_use_id,
                ..
            }
            | HookEvent::PostToolUseFailure {
                tool_name,
                tool_use_id,
                ..
            } => {
                let error = match event {
                    HookEvent::PostToolUseFailure { error, .. } => Some(crate::http::excerpt(error, 300)),
                    _ => None,
                };
                let call_id = KeyValue::new("gen_ai.tool.call.id", tool_use_id.clone());
                let tool = match turn.tool.take() {
                    Some(tool) => tool,
                    None => self.child(
                        format!("execute_tool {tool_name}"),
                        SpanKind::Internal,
                        turn.round.as_ref().unwrap_or(&turn.root),
                        vec![
                            KeyValue::new("gen_ai.operation.name", "execute_tool"),
                            KeyValue::new("gen_ai.tool.name", tool_name.clone()),
                            KeyValue::new(attr::TOOL_SENT, false),
                        ],
                    ),
                };
                self.end(&tool, error, vec![call_id]);
            }
        }
    }

    fn round(&self, turn: &TurnSpans, round: u32, from_log: bool) -> Context {
        self.child(
            format!("round {round}"),
            SpanKind::Internal,
            &turn.root,
            vec![
                KeyValue::new(attr::ROUND, i64::from(round)),
                KeyValue::new(attr::ROUND_FROM_LOG, from_log),
            ],
        )
    }

    /// A tool call of `agent`'s turn goes out now (ended by its
    /// `PostToolUse`/`PostToolUseFailure`).
    pub fn tool_started(&self, agent: &str, tool: &str, idempotency_key: &str, irreversible: bool) {
        let mut turns = self.lock();
        let Some(turn) = turns.get_mut(agent) else { return };
        let span = self.child(
            format!("execute_tool {tool}"),
            SpanKind::Internal,
            turn.round.as_ref().unwrap_or(&turn.root),
            vec![
                KeyValue::new("gen_ai.operation.name", "execute_tool"),
                KeyValue::new("gen_ai.tool.name", tool.to_string()),
                KeyValue::new(attr::IDEMPOTENCY_KEY, idempotency_key.to_string()),
                KeyValue::new(attr::IRREVERSIBLE, irreversible),
                KeyValue::new(attr::TOOL_SENT, true),
            ],
        );
        if let Some(old) = turn.tool.replace(span) {
            self.end(&old, Some("no result observed".into()), Vec::new());
        }
    }

    fn on_attempt(&self, attempt: &Attempt) {
        let mut turns = self.lock();
        let Some(turn) = turns.get_mut(&attempt.agent) else {
            return;
        };
        let end = SystemTime::now();
        let start = end
            .checked_sub(Duration::from_millis(attempt.elapsed_ms))
            .unwrap_or(end);
        let mut attrs = vec![
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new("gen_ai.provider.name", "openai"),
            KeyValue::new("gen_ai.request.model", attempt.model.clone()),
            KeyValue::new(attr::ATTEMPT, i64::from(attempt.number)),
        ];
        let error = match &attempt.outcome {
            AttemptOutcome::Success { usage } => {
                if let Some(u) = usage {
                    turn.input_tokens = turn.input_tokens.saturating_add(u.prompt_tokens);
                    turn.output_tokens = turn.output_tokens.saturating_add(u.completion_tokens);
                    let tokens = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                    attrs.push(KeyValue::new(
                        "gen_ai.usage.input_tokens",
                        tokens(u.prompt_tokens),
                    ));
                    attrs.push(KeyValue::new(
                        "gen_ai.usage.output_tokens",
                        tokens(u.completion_tokens),
                    ));
                }
                None
            }
            AttemptOutcome::Failure { error, retry_in_ms } => {
                attrs.push(KeyValue::new("error.type", error_type(error)));
                if let Some(ms) = retry_in_ms {
                    attrs.push(KeyValue::new(
                        "durable_agent.retry_in_ms",
                        i64::try_from(*ms).unwrap_or(i64::MAX),
                    ));
                }
                Some(crate::http::excerpt(&error.to_string(), 300))
            }
        };
        let span = self
            .tracer
            .span_builder(format!("chat {}", attempt.model))
            .with_kind(SpanKind::Client)
            .with_start_time(start)
            .with_attributes(attrs)
            .start_with_context(&self.tracer, turn.round.as_ref().unwrap_or(&turn.root));
        let cx = Context::new().with_span(span);
        let span = cx.span();
        if let Some(e) = error {
            span.set_status(Status::error(e));
        }
        span.end_with_timestamp(end);
        self.counts.ended.fetch_add(1, Ordering::Relaxed);
    }
}

/// The error's kind, for `error.type` (its variant's name).
fn error_type(error: &crate::openai::OpenAiError) -> String {
    let debug = format!("{error:?}");
    debug
        .split(|c: char| !c.is_alphanumeric() && c != '_')
        .next()
        .unwrap_or("error")
        .to_string()
}

impl Drop for Otel {
    /// The last flush, bounded; then what was lost is said once.
    fn drop(&mut self) {
        let open: Vec<(String, TurnSpans)> = self.lock().drain().collect();
        for (agent, turn) in open {
            self.close(&agent, turn, Some("the process ended during the turn".into()));
        }
        if let Err(e) = self.provider.shutdown_with_timeout(self.shutdown_timeout) {
            tracing::warn!(error = %e, "OpenTelemetry: the last export did not finish");
        }
        let ended = self.counts.ended.load(Ordering::Relaxed);
        let exported = self.counts.exported.load(Ordering::Relaxed);
        let failed = self.counts.failed.load(Ordering::Relaxed);
        let dropped = ended.saturating_sub(exported);
        if dropped > 0 || failed > 0 {
            tracing::warn!(
                ended,
                dropped,
                failed,
                "OpenTelemetry: spans lost (queue full, receiver down or slow)"
            );
        } else {
            tracing::debug!(ended, "OpenTelemetry: every span exported");
        }
    }
}

/// Hooks with an [`Otel`] watching what they observe.
#[derive(Debug)]
struct TracedHooks {
    inner: Arc<dyn Hooks>,
    otel: Arc<Otel>,
}

impl Hooks for TracedHooks {
    fn pre_tool_use(&self, call: &PreToolUse<'_>) -> Vec<HookDecision> {
        self.inner.pre_tool_use(call)
    }

    fn observe(&self, event: &HookEvent) {
        self.inner.observe(event);
        self.otel.on_event(event);
    }
}

/// A call observer with an [`Otel`] watching the attempts.
#[derive(Debug)]
struct TracedAttempts {
    inner: Arc<dyn CallObserver>,
    otel: Arc<Otel>,
}

impl CallObserver for TracedAttempts {
    fn on_attempt(&self, attempt: &Attempt) {
        self.inner.on_attempt(attempt);
        self.otel.on_attempt(attempt);
    }

    fn on_text_delta(&self, delta: &crate::observe::TextDelta<'_>) {
        self.inner.on_text_delta(delta);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_keeps_its_trace_and_root_across_processes() {
        let a = trace_id(Some("s-1"), "run:job-1");
        assert_eq!(a, trace_id(Some("s-1"), "run:job-1"));
        assert_ne!(a, trace_id(Some("s-1"), "run:job-2"));
        assert_ne!(a, trace_id(Some("s-2"), "run:job-1"));
        assert_ne!(a, TraceId::INVALID);
        assert_eq!(root_span_id(Some("s-1"), "w"), root_span_id(Some("s-1"), "w"));
        assert_ne!(root_span_id(Some("s-1"), "w"), SpanId::INVALID);
    }

    #[test]
    fn pinned_ids_apply_inside_the_scope_only() {
        let ids = PinnableIds::default();
        let pinned = (TraceId::from(7u128), SpanId::from(9u64));
        let (t, s) = with_pinned_ids(pinned, || (ids.new_trace_id(), ids.new_span_id()));
        assert_eq!((t, s), pinned);
        assert_ne!(ids.new_span_id(), pinned.1);
    }

    #[test]
    fn turn_kinds_follow_the_work_id() {
        assert_eq!(turn_kind("run:job-1"), ("run", "run job-1".into()));
        assert_eq!(turn_kind("trigger:k"), ("trigger_fire", "trigger k".into()));
        assert_eq!(turn_kind("w-1"), ("api_turn", "turn w-1".into()));
    }
}
