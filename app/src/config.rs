//! The product's TOML config: `[provider]`, `[runtime]`, `[api]`,
//! `[telemetry]` (`config/telemetry.rs`), `[[tools]]`, `[[hooks]]` and
//! `[retries]` (the last two in `config/hooks.rs`), `[gc]` (`config/gc.rs`),
//! `[context]` (`config/context.rs`), `[orchestration]`
//! (`config/orchestration.rs`).
//!
//! Invariant: a [`Config`] returned by [`Config::load`] / [`Config::parse`]
//! is valid as a whole — every check in [`Config::validate`] passed — and
//! every relative path in it has been resolved against the config file's
//! directory (so `check-config` and `serve` mean the same files whatever the
//! working directory). Every error names the file, the line and the key
//! path (`tools[1].method`), because the reader is a human editing that file.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use durable_agent::runtime::orchestration::{LIST_AGENTS, SEND_MESSAGE, SPAWN_AGENT};
use durable_agent::runtime::{Orchestration, OrchestrationTool};
use serde::Deserialize;

use locate::{key_at, line_col, line_of_key};

/// Upper bound on provider retries: a retry storm against a paid API is a
/// bill, and past a handful of attempts the provider is down, not flaky.
pub const MAX_RETRIES_LIMIT: u32 = 10;

/// Upper bound on the number of configured tools (the provider receives all
/// of them in every request).
pub const MAX_TOOLS: usize = 128;

/// The config file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read config: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Not TOML, or TOML that does not fit the schema (unknown key, wrong
    /// type, missing key).
    #[error("{path}:{line}:{column}: `{key}`: {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        column: usize,
        key: String,
        message: String,
    },
    /// Well-formed, but a value breaks a rule (see [`Config::validate`]).
    #[error("{path}:{line}: `{key}`: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        key: String,
        message: String,
    },
}

/// The whole config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub provider: ProviderConfig,
    #[serde(default)]
    pub runtime: RuntimeSection,
    #[serde(default)]
    pub api: ApiConfig,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    #[serde(default)]
    pub tools: Vec<ToolConfig>,
    /// Hooks and policy on every tool call (seed 000's hook events).
    #[serde(default)]
    pub hooks: Vec<HookConfig>,
    /// How each tool's hard failures are retried.
    #[serde(default)]
    pub retries: RetriesConfig,
    /// How `serve` keeps the root tidy.
    #[serde(default)]
    pub gc: GcConfig,
    /// The context budget of every provider request (default: none).
    #[serde(default)]
    pub context: ContextConfig,
    /// Who may call the orchestration tools, the spawning limits, and
    /// `serve`'s wake-ups (`config/orchestration.rs`).
    #[serde(default)]
    pub orchestration: Option<OrchestrationConfig>,
}

/// An OpenAI-compatible chat-completions endpoint.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// e.g. `https://api.openai.com/v1` (`/chat/completions` is appended).
    pub base_url: String,
    pub model: String,
    /// The NAME of the environment variable holding the API key (never the
    /// key itself: config files get committed). None for local servers.
    #[serde(default)]
    pub api_key_env: Option<String>,
    #[serde(default = "defaults::provider_timeout_ms")]
    pub timeout_ms: u64,
    /// Retries after the first attempt (so `max_retries + 1` attempts).
    #[serde(default = "defaults::max_retries")]
    pub max_retries: u32,
    #[serde(default = "defaults::backoff_base_ms")]
    pub backoff_base_ms: u64,
    /// Also caps a server's `Retry-After`.
    #[serde(default = "defaults::backoff_max_ms")]
    pub backoff_max_ms: u64,
    /// Ask for the reply as server-sent events (`stream: true`) and show
    /// its text as it arrives; only the complete reply is logged. Off by
    /// default: some OpenAI-compatible servers refuse `stream_options`.
    #[serde(default)]
    pub stream: bool,
}

/// Where and how the runtime keeps its state.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSection {
    #[serde(default = "defaults::root")]
    pub root: PathBuf,
    #[serde(default = "defaults::slots")]
    pub slots: usize,
    #[serde(default = "defaults::max_tool_rounds")]
    pub max_tool_rounds: u32,
}

impl Default for RuntimeSection {
    fn default() -> Self {
        RuntimeSection {
            root: defaults::root(),
            slots: defaults::slots(),
            max_tool_rounds: defaults::max_tool_rounds(),
        }
    }
}

/// The local control API.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiConfig {
    #[serde(default = "defaults::listen")]
    pub listen: SocketAddr,
    /// Binding beyond loopback must be asked for explicitly, and then the
    /// token must come from `token_env` (see [`crate::access`]).
    #[serde(default)]
    pub allow_non_loopback: bool,
    /// The NAME of the environment variable holding the API token. Unset:
    /// `serve` generates one into `{root}/api-token` (0600) at first start
    /// and the CLI clients read it there.
    #[serde(default)]
    pub token_env: Option<String>,
    /// Request bodies above this get 413 before they are read.
    #[serde(default = "defaults::max_body_bytes")]
    pub max_body_bytes: u64,
    /// DNS names clients may use in `Host` besides the listen address
    /// (and, on a wildcard listener, any IP address): e.g. the machine's
    /// name when the API is exposed. A name not listed is refused, which
    /// is what stops DNS rebinding (see `access`).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: defaults::listen(),
            allow_non_loopback: false,
            token_env: None,
            max_body_bytes: defaults::max_body_bytes(),
            allowed_hosts: Vec::new(),
        }
    }
}

/// One tool the agent may call.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ToolConfig {
    Http(HttpToolConfig),
    ReadFile(ReadFileToolConfig),
    HttpGet(HttpGetToolConfig),
    /// Orchestration tools: performed by the runtime itself (see
    /// `config/orchestration.rs`); their names are fixed.
    SpawnAgent(RuntimeToolConfig),
    SendMessage(RuntimeToolConfig),
    ListAgents(RuntimeToolConfig),
}

/// An orchestration tool: only its description can be changed.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeToolConfig {
    #[serde(default)]
    pub description: Option<String>,
}

/// An HTTP endpoint called with the tool's JSON arguments as its body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpToolConfig {
    pub name: String,
    pub description: String,
    #[serde(default = "defaults::method")]
    pub method: String,
    pub url: String,
    /// Header values may name environment variables as `${VAR}` (how a
    /// secret stays out of this file); read at call time, never logged.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Loopback, link-local or private hosts this tool may reach besides
    /// its `url`'s (see `tools::fence`).
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// JSON schema of the arguments, written as a TOML table.
    #[serde(default = "defaults::parameters")]
    pub parameters: serde_json::Value,
    /// The side effect cannot be undone: routed through the activity ledger
    /// (INTENT before the request), never blindly re-run.
    #[serde(default)]
    pub irreversible: bool,
    /// The endpoint deduplicates by `Idempotency-Key`.
    #[serde(default)]
    pub dedup: bool,
    #[serde(default = "defaults::tool_timeout_ms")]
    pub timeout_ms: u64,
}

/// Builtin: read a file under `workspace` (args `{"path": "..."}`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadFileToolConfig {
    #[serde(default = "defaults::read_file_name")]
    pub name: String,
    #[serde(default = "defaults::read_file_description")]
    pub description: String,
    pub workspace: PathBuf,
    #[serde(default = "defaults::max_read_bytes")]
    pub max_bytes: u64,
}

/// Builtin: GET a URL (args `{"url": "..."}`), return the body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpGetToolConfig {
    #[serde(default = "defaults::http_get_name")]
    pub name: String,
    #[serde(default = "defaults::http_get_description")]
    pub description: String,
    #[serde(default = "defaults::tool_timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default = "defaults::max_read_bytes")]
    pub max_bytes: u64,
    /// If not empty, the only hosts it may fetch from; loopback,
    /// link-local and private addresses need to be listed here in any case
    /// (see `tools::fence`). The daemon's own API is never reachable.
    #[serde(default)]
    pub allow_hosts: Vec<String>,
}

impl ToolConfig {
    pub fn name(&self) -> &str {
        match self {
            ToolConfig::Http(t) => &t.name,
            ToolConfig::ReadFile(t) => &t.name,
            ToolConfig::HttpGet(t) => &t.name,
            ToolConfig::SpawnAgent(_) => SPAWN_AGENT,
            ToolConfig::SendMessage(_) => SEND_MESSAGE,
            ToolConfig::ListAgents(_) => LIST_AGENTS,
        }
    }

    pub fn description(&self) -> &str {
        match self {
            ToolConfig::Http(t) => &t.description,
            ToolConfig::ReadFile(t) => &t.description,
            ToolConfig::HttpGet(t) => &t.description,
            ToolConfig::SpawnAgent(t) => t.description.as_deref().unwrap_or(
                "Spawn a child agent with a name and instructions (its system prompt). It is created when your turn ends; messages you send it meanwhile are delivered then.",
            ),
            ToolConfig::SendMessage(t) => t.description.as_deref().unwrap_or(
                "Send a message to another agent: `to` is a name (your children first, then your parent, siblings, anyone), an agent id, or \"parent\". The recipient is woken to read it.",
            ),
            ToolConfig::ListAgents(t) => t
                .description
                .as_deref()
                .unwrap_or("List the agents of the tree: ids, names, parents, depths, pending messages."),
        }
    }

    /// The orchestration tool this is, if it is one.
    pub fn orchestration(&self) -> Option<OrchestrationTool> {
        match self {
            ToolConfig::SpawnAgent(_) => Some(OrchestrationTool::SpawnAgent),
            ToolConfig::SendMessage(_) => Some(OrchestrationTool::SendMessage),
            ToolConfig::ListAgents(_) => Some(OrchestrationTool::ListAgents),
            _ => None,
        }
    }

    /// Whether calls must go through the activity ledger.
    pub fn irreversible(&self) -> bool {
        matches!(self, ToolConfig::Http(t) if t.irreversible)
    }

    /// JSON schema of the arguments, as sent to the provider.
    pub fn parameters(&self) -> serde_json::Value {
        match self {
            ToolConfig::Http(t) => t.parameters.clone(),
            ToolConfig::ReadFile(_) => serde_json::json!({
                "type": "object",
                "properties": {"path": {"type": "string", "description": "path relative to the workspace"}},
                "required": ["path"],
            }),
            ToolConfig::HttpGet(_) => serde_json::json!({
                "type": "object",
                "properties": {"url": {"type": "string", "description": "http or https URL"}},
                "required": ["url"],
            }),
            ToolConfig::SpawnAgent(_) => serde_json::json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "the child's name, unique among your children"},
                    "instructions": {"type": "string", "description": "the child's system prompt"},
                },
                "required": ["name", "instructions"],
            }),
            ToolConfig::SendMessage(_) => serde_json::json!({
                "type": "object",
                "properties": {
                    "to": {"type": "string", "description": "a name, an agent id, or \"parent\""},
                    "payload": {"type": "string", "description": "the message"},
                },
                "required": ["to", "payload"],
            }),
            ToolConfig::ListAgents(_) => serde_json::json!({"type": "object", "properties": {}}),
        }
    }
}

mod defaults {
    use std::net::{Ipv4Addr, SocketAddr};
    use std::path::PathBuf;

    pub fn provider_timeout_ms() -> u64 {
        60_000
    }
    pub fn max_retries() -> u32 {
        3
    }
    pub fn backoff_base_ms() -> u64 {
        500
    }
    pub fn backoff_max_ms() -> u64 {
        30_000
    }
    pub fn root() -> PathBuf {
        PathBuf::from("durable-agent-data")
    }
    // Same defaults as the system crate's `RuntimeConfig::new`.
    pub fn slots() -> usize {
        3
    }
    pub fn max_tool_rounds() -> u32 {
        4
    }
    pub fn listen() -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, 7341))
    }
    pub fn max_body_bytes() -> u64 {
        1024 * 1024
    }
    pub fn method() -> String {
        "POST".to_string()
    }
    pub fn parameters() -> serde_json::Value {
        serde_json::json!({"type": "object", "properties": {}})
    }
    pub fn tool_timeout_ms() -> u64 {
        10_000
    }
    pub fn max_read_bytes() -> u64 {
        256 * 1024
    }
    pub fn read_file_name() -> String {
        "read_file".to_string()
    }
    pub fn read_file_description() -> String {
        "Read a UTF-8 text file from the agent's workspace.".to_string()
    }
    pub fn http_get_name() -> String {
        "http_get".to_string()
    }
    pub fn http_get_description() -> String {
        "Fetch a URL with HTTP GET and return the response body.".to_string()
    }
}

impl Config {
    /// Read, parse and validate `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(path, &text)
    }

    /// Parse and validate `text`, which was read from `path` (named in
    /// errors; relative paths resolve against its directory).
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| {
            let span = e.span().unwrap_or(0..0);
            let key = key_at(text, span.start);
            let (start, key, message) =
                tool_entry_error(text, &key).unwrap_or((span.start, key, e.message().trim_end().to_string()));
            let (line, column) = line_col(text, start);
            ConfigError::Parse {
                path: path.to_path_buf(),
                line,
                column,
                key,
                message,
            }
        })?;
        config.validate().map_err(|(key, message)| ConfigError::Invalid {
            path: path.to_path_buf(),
            line: line_of_key(text, &key),
            key,
            message,
        })?;
        let base = path.parent().unwrap_or(Path::new(""));
        config.resolve_paths(base);
        Ok(config)
    }

    /// The rules serde cannot express. Returns the offending key path and
    /// what is wrong with it.
    fn validate(&self) -> Result<(), (String, String)> {
        let p = &self.provider;
        let err = |key: &str, msg: String| Err((key.to_string(), msg));
        if p.model.trim().is_empty() {
            return err("provider.model", "must not be empty".into());
        }
        if !is_http_url(&p.base_url) {
            return err(
                "provider.base_url",
                format!("{:?} is not an http:// or https:// URL", p.base_url),
            );
        }
        if let Some(var) = &p.api_key_env {
            if var.is_empty() || var.contains('=') || var.starts_with("sk-") {
                return err(
                    "provider.api_key_env",
                    "must be the NAME of an environment variable (e.g. OPENAI_API_KEY), not the key".into(),
                );
            }
        }
        if p.timeout_ms == 0 {
            return err("provider.timeout_ms", "must be > 0".into());
        }
        if p.max_retries > MAX_RETRIES_LIMIT {
            return err(
                "provider.max_retries",
                format!("{} is above the limit of {MAX_RETRIES_LIMIT}", p.max_retries),
            );
        }
        if p.backoff_base_ms > p.backoff_max_ms {
            return err(
                "provider.backoff_base_ms",
                format!(
                    "{} exceeds backoff_max_ms = {}",
                    p.backoff_base_ms, p.backoff_max_ms
                ),
            );
        }
        if self.runtime.root.as_os_str().is_empty() {
            // Resolved against the config's directory, an empty root would
            // be that directory itself (or, for a bare `--config
            // agent.toml`, the empty path): no root at all.
            return err(
                "runtime.root",
                "must not be empty: name the root's directory (e.g. \"durable-agent-data\")".into(),
            );
        }
        if self.runtime.slots == 0 {
            return err("runtime.slots", "must be >= 1".into());
        }
        if self.runtime.max_tool_rounds == 0 {
            return err("runtime.max_tool_rounds", "must be >= 1".into());
        }
        if self.api.listen.port() == 0 {
            // The CLI clients find the daemon at this address, and the tool
            // fence refuses it: a port the kernel picks would hide it
            // from both.
            return err(
                "api.listen",
                format!(
                    "{}: give a port (0 would pick one no client or tool fence knows)",
                    self.api.listen
                ),
            );
        }
        if !self.api.listen.ip().is_loopback() && !self.api.allow_non_loopback {
            return err(
                "api.listen",
                format!(
                    "{} is not a loopback address; set api.allow_non_loopback = true (and api.token_env) to expose the API",
                    self.api.listen
                ),
            );
        }
        if let Some(var) = &self.api.token_env {
            if !is_env_name(var) {
                return err(
                    "api.token_env",
                    format!(
                        "{var:?}: must be the NAME of an environment variable (A-Z, 0-9, _), not the token"
                    ),
                );
            }
        }
        if !self.api.listen.ip().is_loopback() && self.api.token_env.is_none() {
            return err(
                "api.token_env",
                format!(
                    "{} is not a loopback address: the token must come from the environment (set api.token_env)",
                    self.api.listen
                ),
            );
        }
        if self.api.max_body_bytes == 0 {
            return err("api.max_body_bytes", "must be > 0".into());
        }
        for (i, name) in self.api.allowed_hosts.iter().enumerate() {
            if !is_dns_name(name) {
                return err(
                    &format!("api.allowed_hosts[{i}]"),
                    format!(
                        "{name:?} is not a DNS name (no port, scheme or IP address: those need no listing)"
                    ),
                );
            }
        }
        if self.tools.len() > MAX_TOOLS {
            return err(
                "tools",
                format!("{} tools, the limit is {MAX_TOOLS}", self.tools.len()),
            );
        }
        let mut names = BTreeSet::new();
        for (i, tool) in self.tools.iter().enumerate() {
            let key = |field: &str| format!("tools[{i}].{field}");
            if !is_tool_name(tool.name()) {
                return Err((
                    key("name"),
                    format!("{:?}: use 1-64 characters from a-z A-Z 0-9 _ -", tool.name()),
                ));
            }
            if !names.insert(tool.name()) {
                return Err((key("name"), format!("duplicate tool name {:?}", tool.name())));
            }
            match tool {
                ToolConfig::Http(t) => validate_http_tool(t).map_err(|(f, m)| (key(f), m))?,
                ToolConfig::ReadFile(t) if t.max_bytes == 0 => {
                    return Err((key("max_bytes"), "must be > 0".into()))
                }
                ToolConfig::HttpGet(t) if t.timeout_ms == 0 => {
                    return Err((key("timeout_ms"), "must be > 0".into()))
                }
                _ => {}
            }
        }
        hooks::validate_hooks(&self.hooks)?;
        hooks::validate_retries(&self.retries, &self.tools)?;
        gc::validate_gc(&self.gc)?;
        context::validate_context(&self.context)?;
        orchestration::validate_orchestration(self.orchestration.as_ref(), &self.tools)?;
        telemetry::validate_telemetry(&self.telemetry)?;
        Ok(())
    }

    fn resolve_paths(&mut self, base: &Path) {
        let resolve = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        resolve(&mut self.runtime.root);
        if let Some(p) = self.telemetry.events_jsonl.as_mut() {
            resolve(p);
        }
        for tool in &mut self.tools {
            if let ToolConfig::ReadFile(t) = tool {
                resolve(&mut t.workspace);
            }
        }
    }

    /// The runtime's orchestration policy (`None`: no orchestration tool
    /// configured).
    pub fn orchestration_policy(&self) -> Option<Orchestration> {
        orchestration::policy(self.orchestration.as_ref(), &self.tools)
    }

    /// Whether `serve` wakes an agent that has a pending message.
    pub fn wakes_agents(&self) -> bool {
        orchestration::wakes(self.orchestration.as_ref(), &self.tools)
    }

    /// A few lines for `check-config`.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "provider: {} model {} (key from {}; timeout {} ms, {} retries{})\nruntime: root {}, {} slots, {} tool rounds\napi: {}\ntelemetry: {}\ntools: {}\n",
            self.provider.base_url,
            self.provider.model,
            self.provider.api_key_env.as_deref().unwrap_or("<none>"),
            self.provider.timeout_ms,
            self.provider.max_retries,
            if self.provider.stream { ", streamed" } else { "" },
            self.runtime.root.display(),
            self.runtime.slots,
            self.runtime.max_tool_rounds,
            self.api.listen,
            self.telemetry.summary(),
            self.tools.len(),
        );
        for tool in &self.tools {
            let kind = match tool {
                ToolConfig::Http(t) => format!(
                    "http {} {}{}",
                    t.method,
                    t.url,
                    match (t.irreversible, t.dedup) {
                        (true, true) => " [irreversible, dedup]",
                        (true, false) => " [irreversible, no dedup: needs confirmation after a crash]",
                        _ => "",
                    }
                ),
                ToolConfig::ReadFile(t) => format!("read_file {}", t.workspace.display()),
                ToolConfig::HttpGet(_) => "http_get".to_string(),
                ToolConfig::SpawnAgent(_) | ToolConfig::SendMessage(_) | ToolConfig::ListAgents(_) => {
                    "orchestration (performed by the runtime)".to_string()
                }
            };
            s.push_str(&format!("  - {}: {kind}\n", tool.name()));
        }
        s.push_str(&format!("hooks: {}\n", self.hooks.len()));
        for hook in &self.hooks {
            let matcher = hook.matcher.as_deref().unwrap_or("*");
            s.push_str(&format!("  - {} {matcher}: {:?}\n", hook.event, hook.action));
        }
        let gc = &self.gc;
        s.push_str(&match gc.enabled {
            true => format!(
                "gc: every {} ms, rows after {} ms, bodies after {} ms\n",
                gc.period_ms, gc.ttl_ms, gc.payload_ttl_ms
            ),
            false => "gc: off in serve (`durable-agent gc` runs it by hand)\n".to_string(),
        });
        s.push_str(&self.context.summary());
        s
    }
}

fn validate_http_tool(t: &HttpToolConfig) -> Result<(), (&'static str, String)> {
    const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];
    if !METHODS.contains(&t.method.as_str()) {
        return Err(("method", format!("{:?} is not one of {METHODS:?}", t.method)));
    }
    // An irreversible effect behind GET would be re-run by any cache,
    // crawler or retrying proxy; the ledger's guarantee would be a lie.
    if t.irreversible && t.method == "GET" {
        return Err((
            "method",
            "an irreversible tool cannot use GET (GET must be safe to repeat); use POST".into(),
        ));
    }
    if !is_http_url(&t.url) {
        return Err(("url", format!("{:?} is not an http:// or https:// URL", t.url)));
    }
    for (name, value) in &t.headers {
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(("headers", format!("{name:?} is not an HTTP header name")));
        }
        // A `${VAR}` is read at call time; the text around it must be a
        // header value already.
        if http::HeaderValue::from_str(&without_placeholders(value)).is_err() {
            return Err((
                "headers",
                format!("{name}: not a valid HTTP header value (visible ASCII only)"),
            ));
        }
    }
    if t.timeout_ms == 0 {
        return Err(("timeout_ms", "must be > 0".into()));
    }
    if !t.parameters.is_object() {
        return Err(("parameters", "must be a table (a JSON-schema object)".into()));
    }
    if t.dedup && !t.irreversible {
        tracing::debug!(tool = t.name, "dedup set on a reversible tool: it has no effect");
    }
    Ok(())
}

/// An http:// or https:// URL a request can be made to: it parses, and
/// names a host.
fn is_http_url(s: &str) -> bool {
    let rest = s.strip_prefix("http://").or_else(|| s.strip_prefix("https://"));
    matches!(rest, Some(r) if !r.is_empty())
        && s.parse::<http::Uri>()
            .is_ok_and(|u| u.host().is_some_and(|h| !h.is_empty()))
}

/// A DNS name as a `Host` header carries it: dot-separated labels of
/// letters, digits and `-`, not all digits and dots (an IP address).
fn is_dns_name(s: &str) -> bool {
    (1..=253).contains(&s.len())
        && s.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
        && s.parse::<std::net::IpAddr>().is_err()
        && !s.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

/// The error inside a `[[tools]]` entry at its own key
/// (`tools[3].timeout_ms`) when serde reported it at `key` = `tools` or
/// `tools[i]`: an internally tagged entry's errors come with the span of
/// the array's first header and no key. Serde stopped at the first entry
/// that fails, so each entry is read again alone, in order, as its kind's
/// type ([`locate::entry_alone`]) and the first that fails is the one.
/// `None` when reading them alone finds nothing to add.
fn tool_entry_error(text: &str, key: &str) -> Option<(usize, String, String)> {
    if key != "tools" && !key.starts_with("tools[") {
        return None;
    }
    fn error_of<T: serde::de::DeserializeOwned>(text: &str) -> Option<toml::de::Error> {
        toml::from_str::<T>(text).err()
    }
    for index in 0.. {
        let (alone, kind) = locate::entry_alone(text, "tools", index, "kind")?;
        let failed = match kind.as_str() {
            "http" => error_of::<HttpToolConfig>(&alone),
            "read_file" => error_of::<ReadFileToolConfig>(&alone),
            "http_get" => error_of::<HttpGetToolConfig>(&alone),
            "spawn_agent" | "send_message" | "list_agents" => error_of::<RuntimeToolConfig>(&alone),
            _ => return None,
        };
        let Some(e) = failed else { continue };
        let start = e.span()?.start;
        let inner = key_at(&alone, start);
        if inner == "<document>" {
            return None;
        }
        return Some((
            start,
            format!("tools[{index}].{inner}"),
            e.message().trim_end().to_string(),
        ));
    }
    None
}

/// `value` with each `${NAME}` replaced by `x`: what a header value's
/// own text must be valid as, whatever the variable will hold.
fn without_placeholders(value: &str) -> String {
    match expand_placeholders(value, |_| Ok::<_, std::convert::Infallible>("x".into())) {
        Ok(text) => text,
        Err(never) => match never {},
    }
}

/// `value` with each `${NAME}` replaced by `lookup(NAME)`, the first
/// error returned as is; a `${` with no closing `}` is text. The one
/// reading of placeholders: the config checks a header's text with it
/// (`without_placeholders`) and a tool call fills the header with it
/// (`tools::endpoint::expand_env`), so the two cannot disagree on where
/// a placeholder ends.
pub(crate) fn expand_placeholders<E>(
    value: &str,
    mut lookup: impl FnMut(&str) -> Result<String, E>,
) -> Result<String, E> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else { break };
        out.push_str(&rest[..start]);
        out.push_str(&lookup(&after[..end])?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// An environment variable's name as a config may give it.
pub(crate) fn is_env_name(s: &str) -> bool {
    (1..=128).contains(&s.len())
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

fn is_tool_name(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

mod context;
mod gc;
mod hooks;
mod locate;
mod orchestration;
mod telemetry;
#[cfg(test)]
mod tests;

pub use context::{ContextConfig, MIN_CONTEXT_MESSAGES, MIN_CONTEXT_TOKENS};
pub use gc::{GcConfig, DEFAULT_GC_PERIOD_MS, DEFAULT_PAYLOAD_TTL_MS, MIN_GC_PERIOD_MS};
pub use hooks::{
    default_max_retries, HookAction, HookConfig, RetriesConfig, ToolRetryConfig, MAX_HOOKS,
    MAX_HOOK_TIMEOUT_MS,
};
pub use orchestration::{OrchestrationConfig, MAX_AGENTS_LIMIT, MAX_CHILDREN_LIMIT, MAX_DEPTH_LIMIT};
pub use telemetry::{OtlpConfig, TelemetryConfig, MAX_HTTP_QUEUE_EVENTS, MAX_OTLP_QUEUE_SPANS};
