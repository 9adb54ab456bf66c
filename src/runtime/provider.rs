//! The `Provider` trait (the LLM) and [`FakeProvider`], its deterministic
//! stand-in for tests.
//!
//! Invariant: `FakeProvider`'s reply is a pure function of its seed, the
//! current prompt and the round within the turn, so a reference model can
//! compute the same conversation.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::ids::{fnv1a, AgentId};
use super::turn::ConversationItem;

/// What a provider sees for one completion.
#[derive(Debug, Clone, Copy)]
pub struct ProviderRequest<'a> {
    pub agent: &'a AgentId,
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

/// Deterministic fake: tool requests and replies from the seed and prompt.
#[derive(Debug, Clone)]
pub struct FakeProvider {
    seed: u64,
}

impl FakeProvider {
    pub fn new(seed: u64) -> Self {
        FakeProvider { seed }
    }

    /// The tool requests for round 0 of a turn with `prompt` (rounds after
    /// tool results always answer with text).
    fn tools_for(rng: &mut ChaCha8Rng, prompt: &str) -> Vec<ToolRequest> {
        // Prompts can force a tool, so tests reach each kind on purpose.
        let forced = ["send_email", "lookup", "write_note"]
            .into_iter()
            .find(|t| prompt.contains(t));
        let tool = match forced {
            Some(t) => t,
            None => match rng.random_range(0..4u32) {
                0 => return Vec::new(),
                1 => "lookup",
                2 => "write_note",
                _ => "send_email",
            },
        };
        let n = rng.random::<u32>();
        let (args, irreversible) = match tool {
            "lookup" => (json!({ "key": format!("k{:x}", n % 16) }), false),
            "write_note" => (json!({ "text": format!("note {n:08x}") }), false),
            _ => (
                json!({ "to": format!("user{}@example.com", n % 4), "body": format!("re: {prompt}") }),
                true,
            ),
        };
        vec![ToolRequest {
            tool: tool.to_string(),
            args,
            irreversible,
        }]
    }
}

impl Provider for FakeProvider {
    fn name(&self) -> &str {
        "fake"
    }

    fn model(&self) -> &str {
        "fake-1"
    }

    fn complete(&self, request: &ProviderRequest<'_>) -> Result<ProviderReply, ProviderError> {
        let prompt = request
            .history
            .iter()
            .rev()
            .find_map(|item| match item {
                ConversationItem::Prompt { text } => Some(text.as_str()),
                _ => None,
            })
            .ok_or_else(|| ProviderError("no prompt in the open turn".into()))?;
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ fnv1a(prompt.as_bytes()));
        let tool_calls = if request.round == 0 {
            Self::tools_for(&mut rng, prompt)
        } else {
            Vec::new()
        };
        let text = if tool_calls.is_empty() {
            format!("reply {:08x} to {prompt:?}", rng.random::<u32>())
        } else {
            String::new()
        };
        let usage = Some(Usage {
            input_tokens: request.history.len() as u64 * 10,
            output_tokens: text.len() as u64 / 4 + 1,
        });
        Ok(ProviderReply {
            text,
            tool_calls,
            usage,
        })
    }
}
