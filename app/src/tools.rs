//! The configured `[[tools]]`: irreversible HTTP tools become
//! [`HttpOutbox`]es (the system crate routes them through its activity
//! ledger), everything else is run by [`ConfigTools`].
//!
//! Invariant: [`ConfigTools`] never performs an irreversible tool — such a
//! call reaching it is a routing fault and fails with `ToolError` before any
//! I/O. A tool that fails (bad arguments, an HTTP 4xx, a missing file) is
//! a normal `ToolOutput { ok: false }` the model can read; a hard failure
//! of an HTTP tool — not reached (timeout, connection), or a 5xx or 429
//! answer — is `ToolError::Transient`, which the system retries as
//! `[retries]` says before the model reads it; any other `ToolError` is a
//! fault of the executor itself. Outputs are capped at
//! [`MAX_OUTPUT_BYTES`] because they go into the log and the next prompt.
//!
//! Every HTTP tool is fenced ([`fence`]): the daemon's own API is never
//! reached, and loopback, link-local and private addresses only when the
//! tool's `allow_hosts` lists them; `http_get` with an `allow_hosts` reaches
//! only those hosts.

mod endpoint;
pub mod fence;
mod outbox;
mod read_file;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use durable_agent::runtime::{ToolContext, ToolError, ToolExecutor, ToolOutput, ToolRequest};
use durable_agent::world::Outbox;

use crate::config::{HttpGetToolConfig, ToolConfig};
use crate::http::{self, excerpt};
use endpoint::Endpoint;
use fence::Fence;
pub use outbox::HttpOutbox;
use read_file::ReadFile;

/// Largest tool output handed back to the runtime.
pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;

/// The tools of one config, split by who runs them.
#[derive(Debug)]
pub struct ToolSet {
    /// Irreversible tools by name: the ledger's side-effect providers.
    pub outboxes: BTreeMap<String, Arc<dyn Outbox>>,
    /// Everything else.
    pub executor: Arc<ConfigTools>,
}

impl ToolSet {
    /// `daemon`: the API's address (`[api] listen`), which no tool reaches.
    pub fn from_config(tools: &[ToolConfig], daemon: Option<SocketAddr>) -> ToolSet {
        let mut outboxes: BTreeMap<String, Arc<dyn Outbox>> = BTreeMap::new();
        let mut runners = BTreeMap::new();
        for tool in tools {
            let runner = match tool {
                ToolConfig::Http(t) if t.irreversible => {
                    outboxes.insert(t.name.clone(), Arc::new(HttpOutbox::fenced(t, daemon)));
                    Runner::Irreversible
                }
                ToolConfig::Http(t) => Runner::Http(Endpoint::new(t, daemon)),
                ToolConfig::ReadFile(t) => Runner::ReadFile(ReadFile::new(t)),
                ToolConfig::HttpGet(t) => Runner::HttpGet(HttpGet::new(t, daemon)),
                ToolConfig::SpawnAgent(_) | ToolConfig::SendMessage(_) | ToolConfig::ListAgents(_) => {
                    Runner::Runtime
                }
            };
            runners.insert(tool.name().to_string(), runner);
        }
        ToolSet {
            outboxes,
            executor: Arc::new(ConfigTools { runners }),
        }
    }
}

#[derive(Debug)]
enum Runner {
    /// Known, but not ours to run (see the module invariant).
    Irreversible,
    /// An orchestration tool: the runtime performs it before any executor
    /// (`durable_agent::runtime::orchestration`).
    Runtime,
    Http(Endpoint),
    ReadFile(ReadFile),
    HttpGet(HttpGet),
}

/// Runs the reversible configured tools.
#[derive(Debug)]
pub struct ConfigTools {
    runners: BTreeMap<String, Runner>,
}

impl ToolExecutor for ConfigTools {
    fn execute(&self, ctx: &ToolContext<'_>, call: &ToolRequest) -> Result<ToolOutput, ToolError> {
        let runner = self.runners.get(&call.tool);
        tracing::debug!(tool = %call.tool, call_id = ctx.call_id, "tool call");
        let result: Result<String, Failure> = match (runner, call.irreversible) {
            (Some(Runner::Irreversible), _) | (_, true) => {
                return Err(ToolError::Failed(format!(
                    "irreversible tool {} reached the reversible executor (call {}): it must go through the activity ledger",
                    call.tool, ctx.call_id
                )))
            }
            // The system answers these before any executor (defence in
            // depth: never run a call on arguments the model got wrong).
            _ if call.invalid_args.is_some() => Err(Failure::Soft(format!(
                "arguments unusable: {}",
                call.invalid_args.as_deref().unwrap_or_default()
            ))),
            (None, false) => Err(Failure::Soft(format!("unknown tool {:?}", call.tool))),
            // Only reached if the runtime was booted without the policy.
            (Some(Runner::Runtime), false) => Err(Failure::Soft(format!(
                "{} is performed by the runtime, and orchestration is not enabled there",
                call.tool
            ))),
            (Some(Runner::Http(endpoint)), false) => {
                run_http(endpoint, ctx.idempotency_key, &call.args)
            }
            (Some(Runner::ReadFile(tool)), false) => string_arg(&call.args, "path")
                .and_then(|path| tool.read(&path))
                .map_err(Failure::Soft),
            (Some(Runner::HttpGet(tool)), false) => string_arg(&call.args, "url")
                .map_err(Failure::Soft)
                .and_then(|url| tool.get(&url)),
        };
        let (ok, output) = match result {
            Ok(text) => (true, text),
            Err(Failure::Soft(reason)) => {
                tracing::info!(tool = %call.tool, call_id = ctx.call_id, reason, "tool failed");
                (false, reason)
            }
            Err(Failure::Hard(reason)) => {
                tracing::info!(tool = %call.tool, call_id = ctx.call_id, reason, "tool failed hard");
                return Err(ToolError::Transient(cap(reason)));
            }
        };
        Ok(ToolOutput {
            ok,
            output: cap(output),
        })
    }
}

fn string_arg(args: &serde_json::Value, key: &str) -> Result<String, String> {
    args.get(key)
        .and_then(|v| v.as_str())
        .map(str::to_string)
        .ok_or_else(|| format!("argument `{key}` (a string) is required"))
}

/// Why a tool call has no good answer.
#[derive(Debug)]
enum Failure {
    /// The tool answered that the call failed: the model's to read.
    Soft(String),
    /// The tool was not reached, or failed itself (5xx, 429): worth
    /// another attempt.
    Hard(String),
}

/// Whether an HTTP status is the server's failure rather than an answer
/// about the request: 5xx, and 429 (try again later).
fn hard_status(status: u16) -> bool {
    status >= 500 || status == 429
}

/// A transport failure that another attempt may not meet (a timeout, a
/// broken connection); a fatal one (a bad URL, the tool fence) will.
fn hard_transport(failure: &http::TransportFailure) -> bool {
    !matches!(failure, http::TransportFailure::Fatal(_))
}

fn run_http(endpoint: &Endpoint, idem_key: &str, args: &serde_json::Value) -> Result<String, Failure> {
    // The key costs nothing and lets a deduplicating endpoint absorb the
    // re-run of a turn lost in a crash — and a retry.
    match endpoint.call(idem_key, args) {
        Ok(reply) if (200..300).contains(&reply.status) => Ok(reply.body),
        Ok(reply) => {
            let text = format!(
                "HTTP {} {}: {}",
                reply.status,
                reply.reason,
                excerpt(&reply.body, 500)
            );
            Err(match hard_status(reply.status) {
                true => Failure::Hard(text),
                false => Failure::Soft(text),
            })
        }
        Err(failed) => {
            let text = format!("{}: {}", endpoint.url(), failed.failure);
            Err(match hard_transport(&failed.failure) {
                true => Failure::Hard(text),
                false => Failure::Soft(text),
            })
        }
    }
}

/// The `http_get` builtin.
#[derive(Debug)]
struct HttpGet {
    timeout: Duration,
    max_bytes: u64,
    fence: Arc<Fence>,
}

impl HttpGet {
    fn new(tool: &HttpGetToolConfig, daemon: Option<SocketAddr>) -> Self {
        HttpGet {
            timeout: Duration::from_millis(tool.timeout_ms),
            max_bytes: tool.max_bytes,
            fence: Arc::new(Fence::for_http_get(&tool.allow_hosts, daemon)),
        }
    }

    fn get(&self, url: &str) -> Result<String, Failure> {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(Failure::Soft(format!(
                "{url:?} is not an http:// or https:// URL"
            )));
        }
        let transport = |f: http::TransportFailure| {
            let text = format!("{url}: {f}");
            match hard_transport(&f) {
                true => Failure::Hard(text),
                false => Failure::Soft(text),
            }
        };
        // A GET may follow a few redirects (it has no side effect to
        // replay); the fence checks every hop's address.
        let agent = http::fenced_agent(self.timeout, 5, Arc::clone(&self.fence));
        let mut response = agent.get(url).call().map_err(|e| transport(http::classify(&e)))?;
        let status = response.status();
        let body = http::read_body(&mut response, self.max_bytes).map_err(transport)?;
        if status.is_success() {
            Ok(body)
        } else {
            let text = format!("{url}: HTTP {}: {}", status.as_u16(), excerpt(&body, 500));
            Err(match hard_status(status.as_u16()) {
                true => Failure::Hard(text),
                false => Failure::Soft(text),
            })
        }
    }
}

/// `s`, cut to [`MAX_OUTPUT_BYTES`] on a char boundary with a marker.
fn cap(mut s: String) -> String {
    if s.len() <= MAX_OUTPUT_BYTES {
        return s;
    }
    let mut end = MAX_OUTPUT_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push_str(&format!("\n[output truncated at {MAX_OUTPUT_BYTES} bytes]"));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_cuts_on_a_char_boundary() {
        let s = "é".repeat(MAX_OUTPUT_BYTES);
        let capped = cap(s);
        assert!(capped.ends_with("bytes]"));
        assert!(capped.len() < MAX_OUTPUT_BYTES + 64);
        assert_eq!(cap("short".into()), "short");
    }
}
