//! The world outside the daemon, in the soak's own process (which is never
//! killed): the echo mock LLM in rewording mode — it never answers the
//! same way twice (seeded per generation: reworded arguments naming the
//! ask, sometimes another tool, fewer or more calls, or text instead), as
//! a real model asked again does, so a daemon that re-asked the model for
//! a round it had acted on would send a second, differently worded email
//! under a new key — and the non-deduplicating webhook sink, and the
//! config that points `serve` at them.
//!
//! Invariant: the sink's record of deliveries outlives every kill of the
//! daemon, so it is the ground truth for "no irreversible effect twice";
//! it answers each delivery [`SINK_REPLY_DELAY_MS`] late, which holds the
//! daemon inside its tool call (the effect landed, the answer not yet)
//! long enough for a mid-tool kill to land there.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use durable_agent_cli::mock_llm::{MockLlm, Reword};
use durable_agent_cli::webhook_sink::WebhookSink;

use super::workload::{IRREVERSIBLE_TOOL, REVERSIBLE_TOOL};

/// The API token every soak daemon reads from [`TOKEN_ENV`] (its config names it).
pub const TOKEN: &str = "soak-token-0123456789abcdef";
pub const TOKEN_ENV: &str = "DURABLE_AGENT_SOAK_TOKEN";

/// How late the sink answers a delivery.
pub const SINK_REPLY_DELAY_MS: u64 = 20;

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// The mock LLM and the sink of one root.
#[derive(Debug)]
pub struct World {
    pub mock: MockLlm,
    pub sink: WebhookSink,
}

impl World {
    /// The mock rewords with `seed` (the generation's).
    pub fn start(seed: u64) -> Result<World, String> {
        let mock =
            MockLlm::echo_rewording(loopback(), Reword::new(seed)).map_err(|e| format!("mock LLM: {e}"))?;
        let sink = WebhookSink::start(loopback(), false).map_err(|e| format!("webhook sink: {e}"))?;
        sink.delay_replies(SINK_REPLY_DELAY_MS);
        Ok(World { mock, sink })
    }

    /// Write `serve`'s config for `root` to `path`, the API on `api`.
    pub fn write_config(&self, path: &Path, root: &Path, api: SocketAddr) -> Result<PathBuf, String> {
        let text = format!(
            r#"# Written by durable-agent-sim soak.
[provider]
base_url = "{base_url}"
model = "mock-1"
timeout_ms = 15000
max_retries = 2
backoff_base_ms = 10
backoff_max_ms = 50

[runtime]
root = "{root}"

[api]
listen = "{api}"
token_env = "{TOKEN_ENV}"

[[tools]]
kind = "http"
name = "{IRREVERSIBLE_TOOL}"
description = "Send an email (irreversible; the endpoint does not deduplicate)."
url = "{send}"
irreversible = true
dedup = false
timeout_ms = 5000
parameters = {{ type = "object", properties = {{ to = {{ type = "string" }} }}, required = ["to"] }}

[[tools]]
kind = "http"
name = "{REVERSIBLE_TOOL}"
description = "Write a note (reversible: safe to repeat)."
url = "{note}"
irreversible = false
timeout_ms = 5000
parameters = {{ type = "object", properties = {{ text = {{ type = "string" }} }}, required = ["text"] }}
"#,
            base_url = self.mock.base_url(),
            root = root.display(),
            send = self.sink.url("/send"),
            note = self.sink.url("/note"),
        );
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path.to_path_buf())
    }
}

/// A free loopback port for the API (bound, then released).
pub fn free_api_addr() -> Result<SocketAddr, String> {
    std::net::TcpListener::bind(loopback())
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free loopback port: {e}"))
}
