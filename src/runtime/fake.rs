//! `FakeProvider` (cargo feature `fakes`: tests and the harness only): a
//! deterministic stand-in for the LLM.
//!
//! Invariant: its reply is a pure function of its seed, the current prompt
//! and the round within the turn, so a reference model can compute the same
//! conversation.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use super::ids::fnv1a;
use super::provider::{Provider, ProviderError, ProviderReply, ProviderRequest, ToolRequest, Usage};
use super::turn::ConversationItem;

/// Deterministic fake (cargo feature `fakes`: tests and the harness): tool
/// requests and replies from the seed and prompt.
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
            invalid_args: None,
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
