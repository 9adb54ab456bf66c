//! The context budget: how much of an agent's conversation one provider
//! request carries, so that turn 400 of a chatty agent does not send the
//! provider its whole life.
//!
//! Policy ([`fit`], one pure function):
//! - the system prompt (the agent's instructions) and the whole current
//!   turn — its prompt and every round of it so far — are always sent;
//! - older, completed turns are dropped oldest first, whole turns only. A
//!   turn runs from its prompt to the next prompt, so a tool call is never
//!   sent without its result nor a result without its call (an
//!   OpenAI-compatible endpoint rejects a `tool` message whose assistant
//!   call is missing). The turns kept are the newest ones that fit, with
//!   no hole between them and the current turn;
//! - when any turn was dropped, one marker item stands first in the
//!   history, where they were: a [`ConversationItem::Prompt`] (a user
//!   message) reading `[N earlier turns (M messages) omitted to fit the
//!   context budget]`, so the model knows its memory is partial;
//! - when the system prompt and the current turn alone are over the
//!   budget, the request is sent anyway with every older turn dropped and
//!   [`Cut::over_budget`] set (the runtime logs a warning): the budget
//!   never fails a turn.
//!
//! The estimator (stated, not a tokenizer): an item costs
//! [`MESSAGE_OVERHEAD_TOKENS`] plus its content bytes / [`BYTES_PER_TOKEN`]
//! rounded up — the content being what the wire sends: a prompt's or a
//! response's text, a tool call's name, arguments (as JSON) and call id,
//! a result's output and call id. The system prompt and the marker cost
//! the same way. Messages are counted as the chat wire builds them: a run
//! of consecutive tool calls is one assistant message, every other item
//! one message, the system prompt one.
//!
//! Invariant: the cut is a pure function of (instructions, conversation,
//! where the current turn starts, budget) — no clock, no counter, no
//! memory of earlier cuts. The conversation and the open turn are rebuilt
//! from the log after a crash, so a resumed turn sends the request the
//! interrupted one sent (`tests/runtime_context_budget.rs` crashes
//! mid-turn and compares). Nothing about the cut is logged: a request is
//! not part of any durable decision — `round.decided` records the model's
//! answer, not the question — so a budget changed between a crash and the
//! resume makes a new cut, and the decided calls, their keys and their
//! results stand as logged.

use serde_json::Value;

use super::turn::ConversationItem;

/// Bytes per estimated token (the usual rule of thumb for English text
/// and JSON under BPE tokenizers).
pub const BYTES_PER_TOKEN: u64 = 4;

/// Estimated tokens each message costs beyond its content (role and
/// separators; OpenAI's own rule of thumb is 3-4).
pub const MESSAGE_OVERHEAD_TOKENS: u64 = 4;

/// The limits of one provider request; `None` is no limit. The default
/// is no budget at all: every request carries the whole conversation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContextBudget {
    /// Estimated tokens (see the [module docs](self)) of the system
    /// prompt, the marker and the history together.
    pub max_context_tokens: Option<u64>,
    /// Chat messages, the system prompt and the marker included.
    pub max_messages: Option<u64>,
}

impl ContextBudget {
    /// No limit: requests carry the whole conversation.
    pub fn is_unlimited(&self) -> bool {
        self.max_context_tokens.is_none() && self.max_messages.is_none()
    }

    fn admits(&self, size: Size) -> bool {
        self.max_context_tokens.is_none_or(|max| size.tokens <= max)
            && self.max_messages.is_none_or(|max| size.messages <= max)
    }
}

/// The estimated size of (part of) a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Size {
    pub tokens: u64,
    pub messages: u64,
}

impl std::ops::Add for Size {
    type Output = Size;
    fn add(self, other: Size) -> Size {
        Size {
            tokens: self.tokens.saturating_add(other.tokens),
            messages: self.messages.saturating_add(other.messages),
        }
    }
}

impl std::iter::Sum for Size {
    fn sum<I: Iterator<Item = Size>>(iter: I) -> Size {
        iter.fold(Size::default(), |a, b| a + b)
    }
}

/// What [`fit`] decided: the history to send and what it left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    /// The marker (if any turn was dropped), the kept older turns, then
    /// the current turn.
    pub history: Vec<ConversationItem>,
    /// Older turns dropped, and the chat messages they would have been.
    pub omitted_turns: usize,
    pub omitted_messages: u64,
    /// Older turns sent.
    pub kept_turns: usize,
    /// The request as sent: system prompt, marker and history.
    pub size: Size,
    /// The request is over the budget even so (the system prompt and the
    /// current turn alone are): it is sent anyway.
    pub over_budget: bool,
}

/// The marker's text for `turns` dropped turns of `messages` messages.
pub fn marker_text(turns: usize, messages: u64) -> String {
    let t = if turns == 1 { "turn" } else { "turns" };
    let m = if messages == 1 { "message" } else { "messages" };
    format!("[{turns} earlier {t} ({messages} {m}) omitted to fit the context budget]")
}

/// Cut `history` — completed turns, then the current turn from index
/// `current_start` (its prompt) — to `budget`, by the policy in the
/// [module docs](self).
pub fn fit(
    budget: &ContextBudget,
    instructions: &str,
    history: &[ConversationItem],
    current_start: usize,
) -> Cut {
    debug_assert!(
        current_start <= history.len(),
        "the current turn starts inside the history"
    );
    let (older, current) = history.split_at(current_start.min(history.len()));
    let fixed = system_size(instructions) + size_of(current);
    let turns = turns_of(older);
    let sizes: Vec<Size> = turns.iter().map(|t| size_of(t)).collect();
    let whole = fixed + sizes.iter().copied().sum();
    if budget.admits(whole) || turns.is_empty() {
        return Cut {
            history: history.to_vec(),
            omitted_turns: 0,
            omitted_messages: 0,
            kept_turns: turns.len(),
            size: whole,
            over_budget: !budget.admits(whole),
        };
    }
    // Room for the marker is reserved at its largest (every turn dropped):
    // its real text is no longer, so what is kept still fits.
    let all_messages = sizes.iter().map(|s| s.messages).sum();
    let mut total = fixed + marker_size(turns.len(), all_messages);
    let mut kept = 0;
    for size in sizes.iter().rev() {
        if !budget.admits(total + *size) {
            break; // Oldest first: nothing older than a turn that does not fit.
        }
        total = total + *size;
        kept += 1;
    }
    let dropped = turns.len() - kept;
    let omitted_messages = sizes[..dropped].iter().map(|s| s.messages).sum();
    let marker = ConversationItem::Prompt {
        text: marker_text(dropped, omitted_messages),
    };
    let size = fixed + item_size(&marker) + sizes[dropped..].iter().copied().sum();
    let kept_from = turns[..dropped].iter().map(|t| t.len()).sum::<usize>();
    let mut out = Vec::with_capacity(1 + history.len() - kept_from);
    out.push(marker);
    out.extend_from_slice(&history[kept_from..]);
    debug_assert!(
        out.get(1)
            .is_none_or(|i| matches!(i, ConversationItem::Prompt { .. })),
        "a kept turn starts at its prompt"
    );
    Cut {
        history: out,
        omitted_turns: dropped,
        omitted_messages,
        kept_turns: kept,
        size,
        over_budget: !budget.admits(size),
    }
}

/// The estimated size of `items` as chat messages.
pub fn size_of(items: &[ConversationItem]) -> Size {
    let mut size = Size::default();
    let mut after_call = false;
    for item in items {
        let is_call = matches!(item, ConversationItem::ToolCall { .. });
        let one = item_size(item);
        // Consecutive calls travel as one assistant message.
        size = size
            + Size {
                tokens: one.tokens,
                messages: if is_call && after_call { 0 } else { 1 },
            };
        after_call = is_call;
    }
    size
}

/// Completed turns, each from its prompt to the next one. Items before
/// the first prompt (none in a log this runtime wrote) are dropped or
/// kept together, as a turn of their own.
fn turns_of(items: &[ConversationItem]) -> Vec<&[ConversationItem]> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, item) in items.iter().enumerate() {
        if i > start && matches!(item, ConversationItem::Prompt { .. }) {
            out.push(&items[start..i]);
            start = i;
        }
    }
    if start < items.len() {
        out.push(&items[start..]);
    }
    out
}

fn tokens(bytes: usize) -> u64 {
    MESSAGE_OVERHEAD_TOKENS + (bytes as u64).div_ceil(BYTES_PER_TOKEN)
}

fn item_size(item: &ConversationItem) -> Size {
    let bytes = match item {
        ConversationItem::Prompt { text } | ConversationItem::Response { text } => text.len(),
        ConversationItem::ToolCall {
            call_id, tool, args, ..
        } => {
            // As the wire sends them: a string is the model's raw text.
            let args = match args {
                Value::String(raw) => raw.len(),
                other => other.to_string().len(),
            };
            call_id.len() + tool.len() + args
        }
        ConversationItem::ToolResult { call_id, output, .. } => call_id.len() + output.len(),
    };
    Size {
        tokens: tokens(bytes),
        messages: 1,
    }
}

fn system_size(instructions: &str) -> Size {
    match instructions.is_empty() {
        // No system message is sent for empty instructions.
        true => Size::default(),
        false => Size {
            tokens: tokens(instructions.len()),
            messages: 1,
        },
    }
}

fn marker_size(turns: usize, messages: u64) -> Size {
    item_size(&ConversationItem::Prompt {
        text: marker_text(turns, messages),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn prompt(text: &str) -> ConversationItem {
        ConversationItem::Prompt { text: text.into() }
    }

    fn response(text: &str) -> ConversationItem {
        ConversationItem::Response { text: text.into() }
    }

    fn call(id: &str) -> ConversationItem {
        ConversationItem::ToolCall {
            call_id: id.into(),
            tool: "lookup".into(),
            args: json!({"key": id}),
            irreversible: false,
        }
    }

    fn result(id: &str) -> ConversationItem {
        ConversationItem::ToolResult {
            call_id: id.into(),
            ok: true,
            output: format!("value of {id}"),
        }
    }

    /// `n` completed turns, every other one with two tool calls, then the
    /// current turn (a prompt and one completed round); the index where
    /// the current turn starts.
    fn conversation(n: usize) -> (Vec<ConversationItem>, usize) {
        let mut items = Vec::new();
        for t in 0..n {
            items.push(prompt(&format!("question {t}")));
            if t % 2 == 1 {
                items.extend([call(&format!("c{t}a")), call(&format!("c{t}b"))]);
                items.extend([result(&format!("c{t}a")), result(&format!("c{t}b"))]);
            }
            items.push(response(&format!("answer {t} with some words in it")));
        }
        let start = items.len();
        items.extend([prompt("the current question"), call("now"), result("now")]);
        (items, start)
    }

    fn tokens_only(max: u64) -> ContextBudget {
        ContextBudget {
            max_context_tokens: Some(max),
            max_messages: None,
        }
    }

    #[test]
    fn without_a_budget_or_within_it_the_history_is_sent_whole() {
        let (items, start) = conversation(6);
        for budget in [ContextBudget::default(), tokens_only(1_000_000)] {
            let cut = fit(&budget, "be brief", &items, start);
            assert_eq!(cut.history, items);
            assert_eq!(
                (cut.omitted_turns, cut.kept_turns, cut.over_budget),
                (0, 6, false)
            );
        }
    }

    #[test]
    fn older_turns_are_dropped_oldest_first_and_whole_behind_the_marker() {
        let (items, start) = conversation(10);
        let whole = fit(&ContextBudget::default(), "be brief", &items, start).size;
        let budget = tokens_only(whole.tokens / 2);
        let cut = fit(&budget, "be brief", &items, start);
        assert!(cut.omitted_turns > 0 && cut.kept_turns > 0, "{cut:?}");
        assert_eq!(cut.omitted_turns + cut.kept_turns, 10);
        assert!(!cut.over_budget && cut.size.tokens <= whole.tokens / 2, "{cut:?}");
        // The marker, then a suffix of the conversation starting at a prompt.
        let marker = marker_text(cut.omitted_turns, cut.omitted_messages);
        assert_eq!(cut.history[0], prompt(&marker));
        let rest = &cut.history[1..];
        assert_eq!(rest, &items[items.len() - rest.len()..]);
        let first_kept = 10 - cut.kept_turns;
        assert_eq!(rest[0], prompt(&format!("question {first_kept}")));
        // The omitted messages are those of the dropped turns, as the wire counts them.
        let dropped = &items[..items.len() - rest.len()];
        assert_eq!(cut.omitted_messages, size_of(dropped).messages);
        assert_eq!(cut.size, size_of(&cut.history) + system_size("be brief"));
    }

    #[test]
    fn the_marker_says_how_many_turns_and_messages_were_left_out() {
        assert_eq!(
            marker_text(3, 7),
            "[3 earlier turns (7 messages) omitted to fit the context budget]"
        );
        assert_eq!(
            marker_text(1, 1),
            "[1 earlier turn (1 message) omitted to fit the context budget]"
        );
        // Two turns of two messages and one with two calls and their
        // results (5 messages: the calls travel as one); the current turn apart.
        let (items, start) = conversation(3);
        let budget = ContextBudget {
            max_context_tokens: None,
            max_messages: Some(5),
        };
        let cut = fit(&budget, "", &items, start);
        // Current turn: prompt, calls, result = 3; marker 1; nothing else fits.
        assert_eq!((cut.omitted_turns, cut.omitted_messages), (3, 9));
        assert_eq!(
            cut.history[0],
            prompt("[3 earlier turns (9 messages) omitted to fit the context budget]")
        );
    }

    #[test]
    fn a_tool_call_never_travels_without_its_result_at_any_budget() {
        let (items, start) = conversation(9);
        let whole = fit(&ContextBudget::default(), "sys", &items, start).size;
        for max in 0..=whole.tokens + 1 {
            let cut = fit(&tokens_only(max), "sys", &items, start);
            let ids = |want_call: bool| -> Vec<String> {
                let mut ids: Vec<String> = cut
                    .history
                    .iter()
                    .filter_map(|i| match i {
                        ConversationItem::ToolCall { call_id, .. } if want_call => Some(call_id.clone()),
                        ConversationItem::ToolResult { call_id, .. } if !want_call => Some(call_id.clone()),
                        _ => None,
                    })
                    .collect();
                ids.sort();
                ids
            };
            assert_eq!(ids(true), ids(false), "budget {max}: {:?}", cut.history);
            assert!(cut.over_budget || cut.size.tokens <= max, "budget {max}: {cut:?}");
        }
    }

    #[test]
    fn the_current_turn_is_always_sent_even_over_the_budget() {
        let (items, start) = conversation(4);
        let cut = fit(&tokens_only(1), "a long system prompt", &items, start);
        assert!(cut.over_budget);
        assert_eq!((cut.omitted_turns, cut.kept_turns), (4, 0));
        assert_eq!(cut.history.len(), 1 + items.len() - start);
        assert_eq!(
            &cut.history[1..],
            &items[start..],
            "the whole current turn, every round"
        );
        // A first turn over the budget has nothing to drop: sent whole, flagged.
        let first = [prompt(&"x".repeat(400))];
        let cut = fit(&tokens_only(10), "", &first, 0);
        assert_eq!(
            (cut.history.as_slice(), cut.over_budget, cut.omitted_turns),
            (&first[..], true, 0)
        );
    }

    #[test]
    fn both_limits_apply_and_the_tighter_one_decides() {
        let (items, start) = conversation(20);
        let by_messages = ContextBudget {
            max_context_tokens: Some(1_000_000),
            max_messages: Some(12),
        };
        let cut = fit(&by_messages, "sys", &items, start);
        assert!(cut.size.messages <= 12 && !cut.over_budget, "{cut:?}");
        let by_tokens = ContextBudget {
            max_context_tokens: Some(60),
            max_messages: Some(1_000),
        };
        let cut = fit(&by_tokens, "sys", &items, start);
        assert!(cut.size.tokens <= 60 && !cut.over_budget, "{cut:?}");
    }

    #[test]
    fn consecutive_tool_calls_count_as_one_message() {
        let items = [
            prompt("p"),
            call("a"),
            call("b"),
            result("a"),
            result("b"),
            response("r"),
        ];
        assert_eq!(size_of(&items).messages, 5);
        // 4 overhead + ceil(bytes / 4) per item.
        assert_eq!(size_of(&[prompt("12345")]).tokens, MESSAGE_OVERHEAD_TOKENS + 2);
    }
}
