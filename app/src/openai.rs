//! [`OpenAiProvider`]: the system crate's `Provider` over an
//! OpenAI-compatible `POST {base_url}/chat/completions`.
//!
//! Invariant: one `complete` makes at most `1 + max_retries` HTTP attempts,
//! each bounded by `timeout_ms`, separated by waits no longer than
//! `backoff_max_ms`; only transient failures are retried (timeouts,
//! connection failures, 408, 429, 5xx) — a 4xx or a malformed reply is
//! returned at once, since sending the same bytes again cannot fix it.
//! Every attempt is reported to the [`CallObserver`]. Provider calls have
//! no side effect outside the model, so retrying them is always safe.
//!
//! With `[provider] stream = true` each attempt asks for server-sent
//! events and hands the text to the observer as it arrives
//! ([`CallObserver::on_text_delta`]); the reply it returns is the complete
//! one, assembled and checked like a whole body ([`stream`]), so what the
//! runtime logs — and so durability — does not depend on the setting. A
//! server that answers a whole JSON body anyway is taken at its word.
//!
//! The tools offered with a request are the asking agent's own: every
//! configured `[[tools]]` entry except the orchestration tools its
//! `[orchestration]` grant leaves out ([`OpenAiProvider::tools_for`]), so
//! a model is never offered a tool the runtime would refuse it. (The
//! runtime still checks the grant on every call: an offer is a courtesy,
//! the check is the policy.)

mod stream;
mod wire;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use durable_agent::runtime::{
    Orchestration, OrchestrationTool, Provider, ProviderError, ProviderReply, ProviderRequest,
};

use crate::config::{Config, ProviderConfig, ToolConfig};
use crate::http::{self, TransportFailure};
use crate::observe::{Attempt, AttemptOutcome, CallObserver, NoopObserver, TextDelta, Usage};
use crate::retry::{RetryPolicy, Sleeper, ThreadSleeper};
pub use stream::{Assembly, SseDecoder};
pub use wire::{messages, parse_reply, request_body, Delivery, ToolSpec};

/// Why a completion failed. Clone + Eq so observers can keep them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenAiError {
    #[error("environment variable {var} (provider.api_key_env) is not set")]
    MissingApiKey { var: String },
    #[error("{url}: no complete reply within {timeout_ms} ms")]
    Timeout { url: String, timeout_ms: u64 },
    #[error("{url}: {detail} (is the provider running and provider.base_url right?)")]
    Connection { url: String, detail: String },
    #[error("{url}: request failed: {detail}")]
    Transport { url: String, detail: String },
    #[error("{url}: HTTP {status}: {body_excerpt}")]
    Status {
        url: String,
        status: u16,
        body_excerpt: String,
        /// From `Retry-After` / `retry-after-ms`, before capping.
        retry_after_ms: Option<u64>,
    },
    #[error("malformed reply: {detail} (body: {body_excerpt})")]
    MalformedResponse { detail: String, body_excerpt: String },
    /// A streamed reply that stopped before it said it was complete: none
    /// of it is used (the text already shown was shown, nothing more).
    #[error("{url}: the streamed reply was cut short: {detail}")]
    StreamCut { url: String, detail: String },
    #[error("unknown finish_reason {reason:?}")]
    UnknownFinish { reason: String },
    #[error("the provider refused: {detail}")]
    Refused { detail: String },
    #[error("gave up after {attempts} attempts; last: {last}")]
    RetriesExhausted { attempts: u32, last: Box<OpenAiError> },
}

impl OpenAiError {
    /// Whether the same request may succeed if sent again.
    pub fn is_transient(&self) -> bool {
        match self {
            // A cut stream is a dropped connection by another name.
            OpenAiError::Timeout { .. } | OpenAiError::Connection { .. } | OpenAiError::StreamCut { .. } => {
                true
            }
            OpenAiError::Status { status, .. } => matches!(status, 408 | 429) || (500..=599).contains(status),
            _ => false,
        }
    }

    fn retry_after_ms(&self) -> Option<u64> {
        match self {
            OpenAiError::Status { retry_after_ms, .. } => *retry_after_ms,
            _ => None,
        }
    }
}

impl From<OpenAiError> for ProviderError {
    fn from(e: OpenAiError) -> Self {
        ProviderError(e.to_string())
    }
}

/// A successful completion with what it cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub reply: ProviderReply,
    pub usage: Option<Usage>,
    /// 1-based number of the attempt that succeeded.
    pub attempts: u32,
}

/// An OpenAI-compatible chat-completions client.
pub struct OpenAiProvider {
    agent: ureq::Agent,
    url: String,
    model: String,
    api_key: Option<String>,
    tools: Vec<ToolSpec>,
    /// Who may call which orchestration tool (`None`: none configured).
    grants: Option<Orchestration>,
    irreversible: BTreeMap<String, bool>,
    timeout_ms: u64,
    delivery: Delivery,
    policy: RetryPolicy,
    sleeper: Arc<dyn Sleeper>,
    observer: Arc<dyn CallObserver>,
}

// By hand: the derived one would print the API key into logs.
impl std::fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiProvider")
            .field("url", &self.url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("tools", &self.tools.len())
            .field("timeout_ms", &self.timeout_ms)
            .field("delivery", &self.delivery)
            .field("policy", &self.policy)
            .finish()
    }
}

impl OpenAiProvider {
    /// From `[provider]`, `[[tools]]` and `[orchestration]`, reading the
    /// key from the environment variable `api_key_env` names.
    pub fn from_config(config: &Config) -> Result<Self, OpenAiError> {
        let api_key = match &config.provider.api_key_env {
            None => None,
            Some(var) => {
                Some(std::env::var(var).map_err(|_| OpenAiError::MissingApiKey { var: var.clone() })?)
            }
        };
        Ok(Self::with_key(config, api_key))
    }

    /// From the config, with an explicit key (or none: a command that
    /// runs no turn).
    pub fn with_key(config: &Config, api_key: Option<String>) -> Self {
        Self::new(&config.provider, api_key, &config.tools).with_grants(config.orchestration_policy())
    }

    /// With an explicit key (tests, embedding). Sleeps with
    /// [`ThreadSleeper`] and reports to [`NoopObserver`] until told
    /// otherwise.
    pub fn new(settings: &ProviderConfig, api_key: Option<String>, tools: &[ToolConfig]) -> Self {
        let url = format!("{}/chat/completions", settings.base_url.trim_end_matches('/'));
        let tools: Vec<ToolSpec> = tools
            .iter()
            .map(|t| ToolSpec {
                name: t.name().to_string(),
                description: t.description().to_string(),
                parameters: t.parameters(),
                irreversible: t.irreversible(),
            })
            .collect();
        let irreversible = tools.iter().map(|t| (t.name.clone(), t.irreversible)).collect();
        OpenAiProvider {
            agent: http::agent(&url, Duration::from_millis(settings.timeout_ms), 0),
            url,
            model: settings.model.clone(),
            api_key,
            tools,
            grants: None,
            irreversible,
            timeout_ms: settings.timeout_ms,
            delivery: if settings.stream {
                Delivery::Streamed
            } else {
                Delivery::Whole
            },
            policy: RetryPolicy {
                max_retries: settings.max_retries,
                base_ms: settings.backoff_base_ms,
                max_ms: settings.backoff_max_ms,
            },
            sleeper: Arc::new(ThreadSleeper),
            observer: Arc::new(NoopObserver),
        }
    }

    pub fn with_sleeper(mut self, sleeper: Arc<dyn Sleeper>) -> Self {
        self.sleeper = sleeper;
        self
    }

    pub fn with_observer(mut self, observer: Arc<dyn CallObserver>) -> Self {
        self.observer = observer;
        self
    }

    /// Offer each agent only the orchestration tools `grants` gives it
    /// (`None`: every configured tool to every agent).
    pub fn with_grants(mut self, grants: Option<Orchestration>) -> Self {
        self.grants = grants;
        self
    }

    /// Every configured tool.
    pub fn tools(&self) -> &[ToolSpec] {
        &self.tools
    }

    /// The tools offered to the agent named `agent_name`: the configured
    /// ones, less the orchestration tools its grant leaves out.
    pub fn tools_for(&self, agent_name: &str) -> Vec<&ToolSpec> {
        self.tools
            .iter()
            .filter(|t| match (&self.grants, OrchestrationTool::from_name(&t.name)) {
                (Some(grants), Some(tool)) if grants.enabled.contains(&tool) => {
                    grants.granted(agent_name, tool)
                }
                _ => true,
            })
            .collect()
    }

    /// One completion, with retries; the typed form of `Provider::complete`.
    pub fn complete_detailed(&self, request: &ProviderRequest<'_>) -> Result<Completion, OpenAiError> {
        let tools = self.tools_for(request.agent_name);
        let body = wire::request_body(&self.model, &tools, request, self.delivery).to_string();
        let max_attempts = self.policy.max_attempts();
        let mut number = 1;
        loop {
            debug_assert!(number <= max_attempts, "retry loop overran its bound");
            let started = Instant::now();
            let result = self.attempt(&body, request.agent.as_str(), number);
            let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            let report = |outcome| {
                self.observer.on_attempt(&Attempt {
                    agent: request.agent.to_string(),
                    model: self.model.clone(),
                    number,
                    elapsed_ms,
                    outcome,
                })
            };
            let error = match result {
                Ok((reply, usage)) => {
                    report(AttemptOutcome::Success { usage });
                    return Ok(Completion {
                        reply,
                        usage,
                        attempts: number,
                    });
                }
                Err(error) => error,
            };
            let retry_in_ms = (error.is_transient() && number < max_attempts)
                .then(|| self.policy.delay_ms(number + 1, error.retry_after_ms()));
            report(AttemptOutcome::Failure {
                error: error.clone(),
                retry_in_ms,
            });
            let Some(wait_ms) = retry_in_ms else {
                return Err(if error.is_transient() {
                    OpenAiError::RetriesExhausted {
                        attempts: number,
                        last: Box::new(error),
                    }
                } else {
                    error
                });
            };
            tracing::warn!(
                agent = %request.agent,
                attempt = number,
                wait_ms,
                error = %error,
                "provider call failed; retrying"
            );
            self.sleeper.sleep(Duration::from_millis(wait_ms));
            number += 1;
        }
    }

    /// One HTTP exchange: attempt `number` of `agent`'s completion.
    fn attempt(
        &self,
        body: &str,
        agent: &str,
        number: u32,
    ) -> Result<(ProviderReply, Option<Usage>), OpenAiError> {
        let mut request = self
            .agent
            .post(&self.url)
            .header("Content-Type", "application/json");
        if let Some(key) = &self.api_key {
            request = request.header("Authorization", format!("Bearer {key}"));
        }
        let transport = |f: TransportFailure| match f {
            TransportFailure::Timeout => OpenAiError::Timeout {
                url: self.url.clone(),
                timeout_ms: self.timeout_ms,
            },
            TransportFailure::Connection(detail) => OpenAiError::Connection {
                url: self.url.clone(),
                detail,
            },
            TransportFailure::Fatal(detail) => OpenAiError::Transport {
                url: self.url.clone(),
                detail,
            },
        };
        let mut response = request
            .send(body.as_bytes())
            .map_err(|e| transport(http::classify(&e)))?;
        let status = response.status().as_u16();
        let retry_after_ms = retry_after_ms(response.headers());
        let event_stream = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        if (200..300).contains(&status) && event_stream {
            let mut reader = std::io::BufReader::new(response.body_mut().as_reader());
            let mut on_text = |text: &str| {
                self.observer.on_text_delta(&TextDelta {
                    agent,
                    attempt: number,
                    text,
                })
            };
            return stream::read(
                &mut reader,
                http::MAX_BODY_BYTES,
                &self.url,
                &self.irreversible,
                &transport,
                &mut on_text,
            );
        }
        // A whole body: an error status, a non-streaming config, or a
        // server that ignored `stream: true` (some do).
        let text = http::read_body(&mut response, http::MAX_BODY_BYTES).map_err(transport)?;
        if !(200..300).contains(&status) {
            return Err(OpenAiError::Status {
                url: self.url.clone(),
                status,
                body_excerpt: http::excerpt(&text, 300),
                retry_after_ms,
            });
        }
        wire::parse_reply(&text, &self.irreversible)
    }
}

/// `retry-after-ms` (OpenAI's) if present, else `Retry-After` in seconds.
/// The HTTP-date form is ignored: the backoff applies instead.
fn retry_after_ms(headers: &ureq::http::HeaderMap) -> Option<u64> {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v >= 0.0)
    };
    get("retry-after-ms")
        .map(|ms| ms as u64)
        .or_else(|| get("retry-after").map(|s| (s * 1000.0) as u64))
}

impl Provider for OpenAiProvider {
    fn name(&self) -> &str {
        "openai-compatible"
    }

    fn model(&self) -> &str {
        &self.model
    }

    fn complete(&self, request: &ProviderRequest<'_>) -> Result<ProviderReply, ProviderError> {
        self.complete_detailed(request)
            .map(|c| c.reply)
            .map_err(ProviderError::from)
    }
}
