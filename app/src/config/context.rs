//! The `[context]` section: the context budget of every provider request
//! (`durable_agent::runtime::context` states the policy and the
//! estimator).
//!
//! ```toml
//! [context]
//! max_context_tokens = 16000   # estimated: bytes / 4 + 4 per message
//! max_messages = 200           # chat messages, system prompt included
//! ```
//!
//! Invariant: a section that passed [`validate_context`] has every limit
//! it sets at or above its minimum (room for a system prompt, the
//! omission marker and a prompt); an absent key is no limit, and an
//! absent section is no budget — every request carries the whole
//! conversation, as before the section existed. Every error names its
//! key path (`context.max_messages`).

use durable_agent::runtime::context::ContextBudget;
use serde::Deserialize;

/// Smallest `max_context_tokens` accepted: below it not even a short
/// system prompt, the marker and a one-line prompt fit, and every turn
/// would go out over the budget (sent anyway, with a warning).
pub const MIN_CONTEXT_TOKENS: u64 = 64;

/// Smallest `max_messages` accepted: the system prompt, the marker and
/// the current prompt.
pub const MIN_CONTEXT_MESSAGES: u64 = 3;

/// `[context]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextConfig {
    /// Estimated tokens per request; absent: no token limit.
    #[serde(default)]
    pub max_context_tokens: Option<u64>,
    /// Chat messages per request; absent: no message limit.
    #[serde(default)]
    pub max_messages: Option<u64>,
}

impl ContextConfig {
    /// The runtime's budget.
    pub fn budget(&self) -> ContextBudget {
        ContextBudget {
            max_context_tokens: self.max_context_tokens,
            max_messages: self.max_messages,
        }
    }

    /// One line for `check-config`.
    pub fn summary(&self) -> String {
        let limit = |v: Option<u64>| v.map_or("unlimited".to_string(), |v| v.to_string());
        match self.budget().is_unlimited() {
            true => "context: no budget (every request carries the whole conversation)\n".to_string(),
            false => format!(
                "context: at most {} estimated tokens, {} messages per request (older turns dropped first)\n",
                limit(self.max_context_tokens),
                limit(self.max_messages)
            ),
        }
    }
}

/// The rules of `[context]`; the offending key path and what is wrong.
pub(super) fn validate_context(c: &ContextConfig) -> Result<(), (String, String)> {
    let err = |key: &str, msg: String| Err((format!("context.{key}"), msg));
    if let Some(max) = c.max_context_tokens.filter(|&m| m < MIN_CONTEXT_TOKENS) {
        return err(
            "max_context_tokens",
            format!("{max} is below the minimum of {MIN_CONTEXT_TOKENS} (remove the key for no limit)"),
        );
    }
    if let Some(max) = c.max_messages.filter(|&m| m < MIN_CONTEXT_MESSAGES) {
        return err(
            "max_messages",
            format!("{max} is below the minimum of {MIN_CONTEXT_MESSAGES} (remove the key for no limit)"),
        );
    }
    Ok(())
}
