//! The configured `[[tools]]`: irreversible HTTP tools become
//! [`HttpOutbox`]es (the system crate routes them through its activity
//! ledger), everything else is run by [`ConfigTools`].
//!
//! Invariant: [`ConfigTools`] never performs an irreversible tool — such a
//! call reaching it is a routing fault and fails with `ToolError` before any
//! I/O. A tool that fails (bad arguments, HTTP error, missing file) is a
//! normal `ToolOutput { ok: false }` the model can read; `ToolError` is
//! only for faults of the executor itself. Outputs are capped at
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
        let result = match (runner, call.irreversible) {
            (Some(Runner::Irreversible), _) | (_, true) => {
                return Err(ToolError::Failed(format!(
                    "irreversible tool {} reached the reversible executor (call {}): it must go through the activity ledger",
                    call.tool, ctx.call_id
                )))
            }
            // The system answers these before any executor (defence in
            // depth: never run a call on arguments the model got wrong).
            _ if call.invalid_args.is_some() => Err(format!(
                "arguments unusable: {}",
                call.invalid_args.as_deref().unwrap_or_default()
            )),
            (None, false) => Err(format!("unknown tool {:?}", call.tool)),
            (Some(Runner::Http(endpoint)), false) => {
                run_http(endpoint, ctx.idempotency_key, &call.args)
            }
            (Some(Runner::ReadFile(tool)), false) => {
                string_arg(&call.args, "path").and_then(|path| tool.read(&path))
            }
            (Some(Runner::HttpGet(tool)), false) => {
                string_arg(&call.args, "url").and_then(|url| tool.get(&url))
            }
        };
        let (ok, output) = match result {
            Ok(text) => (true, text),
            Err(reason) => {
                tracing::info!(tool = %call.tool, call_id = ctx.call_id, reason, "tool failed");
                (false, reason)
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

fn run_http(endpoint: &Endpoint, idem_key: &str, args: &serde_json::Value) -> Result<String, String> {
    // The key costs nothing and lets a deduplicating endpoint absorb the
    // re-run of a turn lost in a crash.
    match endpoint.call(idem_key, args) {
        Ok(reply) if (200..300).contains(&reply.status) => Ok(reply.body),
        Ok(reply) => Err(format!(
            "HTTP {} {}: {}",
            reply.status,
            reply.reason,
            excerpt(&reply.body, 500)
        )),
        Err(failed) => Err(format!("{}: {}", endpoint.url(), failed.failure)),
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

    fn get(&self, url: &str) -> Result<String, String> {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!("{url:?} is not an http:// or https:// URL"));
        }
        // A GET may follow a few redirects (it has no side effect to
        // replay); the fence checks every hop's address.
        let agent = http::fenced_agent(self.timeout, 5, Arc::clone(&self.fence));
        let mut response = agent
            .get(url)
            .call()
            .map_err(|e| format!("{url}: {}", http::classify(&e)))?;
        let status = response.status();
        let body = http::read_body(&mut response, self.max_bytes).map_err(|f| format!("{url}: {f}"))?;
        if status.is_success() {
            Ok(body)
        } else {
            Err(format!(
                "{url}: HTTP {}: {}",
                status.as_u16(),
                excerpt(&body, 500)
            ))
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
