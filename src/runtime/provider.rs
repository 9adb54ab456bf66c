//! The `Provider` trait (the LLM) and [`NoProvider`].
//!
//! Invariant: a provider is stateless towards the runtime: everything it
//! needs comes in the request (the whole conversation, rebuilt from the log
//! after a crash).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ids::AgentId;
use super::turn::ConversationItem;

/// What a provider sees for one completion.
#[derive(Debug, Clone, Copy)]
pub struct ProviderRequest<'a> {
    pub agent: &'a AgentId,
    /// The agent's name: what per-agent configuration (the orchestration
    /// grants, so the tools offered) is keyed by.
    pub agent_name: &'a str,
    pub instructions: &'a str,
    /// Completed turns, then the open turn so far (its prompt first).
    pub history: &'a [ConversationItem],
    /// 0 for the first completion of the turn, +1 after each tool batch.
    pub round: u32,
}

/// A tool the provider asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolRequest {
    pub tool: String,
    pub args: Value,
    /// The side effect cannot be undone (must never happen twice).
    pub irreversible: bool,
    /// Why the model's arguments could not be used (not JSON, not an
    /// object), with `args` holding the raw text: the call is logged and
    /// answered as a failed tool call the model can correct, never run,
    /// and never fails the turn. Absent for a well-formed call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid_args: Option<String>,
}

/// A completion: tool requests (another round follows) or a final text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderReply {
    pub text: String,
    pub tool_calls: Vec<ToolRequest>,
    /// What the call cost, when the provider says (seed 000: persisted per
    /// call).
    pub usage: Option<Usage>,
}

/// Token counts of one completion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// The provider failed (the turn is abandoned, nothing acknowledged).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProviderError(pub String);

/// The LLM. Bare-LLM providers are stateless: the runtime passes the whole
/// conversation (rebuilt from the log after a crash) on every call.
pub trait Provider: Send + Sync + std::fmt::Debug {
    /// Provider name (logged in `session.restored`, stored in `session.json`).
    fn name(&self) -> &str;
    /// Model name.
    fn model(&self) -> &str;
    /// One completion.
    fn complete(&self, request: &ProviderRequest<'_>) -> Result<ProviderReply, ProviderError>;
}

/// The provider of a runtime configured without one: refuses every call
/// (a production composition always hands in its real provider).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProvider;

impl Provider for NoProvider {
    fn name(&self) -> &str {
        "none"
    }

    fn model(&self) -> &str {
        "none"
    }

    fn complete(&self, _request: &ProviderRequest<'_>) -> Result<ProviderReply, ProviderError> {
        Err(ProviderError("no provider configured".into()))
    }
}
