//! The context-window oracle: what the scripted provider is asked, under
//! the context budget the harness boots the system with, judged against
//! the promise of `durable_agent::runtime::context` (its module doc).
//!
//! The budget is part of the case: drawn from its seed ([`budget_for`]),
//! small enough that a few turns with tool calls overflow it, set through
//! the product's own config (`SystemConfig::context_budget`) on the one
//! boot. Every ask a live process makes is recorded ([`Asks`]); at each
//! projection ([`ContextOracle::check`]) the asks since the last one are
//! judged against the agent's completed conversation as the previous
//! projection saw it (what the turn started from) and, for a turn that
//! completed, the turn as it completed. Properties, not a second `fit`:
//!
//! | id | every ask ... |
//! | --- | --- |
//! | CTX1 | carries the agent's instructions as its system prompt |
//! | CTX2 | ends with the whole current turn: its prompt and every call and result of the rounds before this one (the script's count), as the turn completed |
//! | CTX3 | sends of the older conversation a suffix of whole completed turns with no hole before the current turn; the whole of it, or the marker first |
//! | CTX4 | has the marker exactly when turns were dropped, reading `[N earlier turn(s) (M message(s)) omitted to fit the context budget]` with N and M those of the dropped turns |
//! | CTX5 | is within the budget, unless no older turn is left in it (the system prompt and the current turn alone are over) |
//! | CTX6 | drops turns only when the whole conversation is over the budget, and keeps the newest turns that fit: with the newest dropped one added (and the marker's room reserved at its largest) it would be over the budget |
//! | CTX7 | after a crash (or an I/O error, or a stop at a confirmation) mid-turn, the first ask of the re-run turn is word for word the interrupted turn's ask at the same round, when the agent's completed conversation is the same (the cut is a pure function of the durable conversation) |
//!
//! Sizes are estimated by the rule the product's module doc states (an
//! item costs 4 tokens plus its wire bytes / 4 rounded up; a run of
//! consecutive tool calls is one message), written here once more on
//! purpose: the oracle must see an estimator that miscounts.
//!
//! Invariant: judging only reads what the provider was asked and the
//! runtime's projected state; it never changes what the model predicts
//! (the scripted provider answers from the current turn's prompt alone,
//! which every ask carries).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use durable_agent::fs::SimFs;
use durable_agent::runtime::context::ContextBudget;
use durable_agent::runtime::{AgentId, ConversationItem, ProviderRequest, RuntimeState};
use serde_json::Value;

/// The context budget of the case with `seed`: one case in eight runs
/// without one (the whole-conversation path); the rest get 30..=229
/// estimated tokens, a third of them also 3..=10 messages — a turn with
/// one tool call costs about 45 tokens and 4 messages, so the model's
/// histories overflow it within a few turns, and a current turn with
/// three calls alone is sometimes over it.
pub fn budget_for(seed: u64) -> ContextBudget {
    let h = splitmix(seed ^ 0xC0_47E7);
    if h.is_multiple_of(8) {
        return ContextBudget::default();
    }
    ContextBudget {
        max_context_tokens: Some(30 + (h >> 8) % 200),
        max_messages: (h >> 24).is_multiple_of(3).then_some(3 + (h >> 32) % 8),
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// One request as the scripted provider saw it.
#[derive(Debug, Clone, PartialEq)]
struct Ask {
    agent: AgentId,
    agent_name: String,
    instructions: String,
    round: u32,
    history: Vec<ConversationItem>,
}

/// The asks live processes made since the last projection (a dead
/// process asks nothing: once the disk's crash point was hit, none is
/// recorded). Clones share the record; the scripted provider holds one.
#[derive(Debug, Clone)]
pub struct Asks {
    fs: SimFs,
    asked: Arc<Mutex<Vec<Ask>>>,
}

impl Asks {
    /// Record `request` (called by the scripted provider).
    pub fn record(&self, request: &ProviderRequest<'_>) {
        if self.fs.crashed() {
            return;
        }
        let mut asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
        asked.push(Ask {
            agent: request.agent.clone(),
            agent_name: request.agent_name.to_string(),
            instructions: request.instructions.to_string(),
            round: request.round,
            history: request.history.to_vec(),
        });
    }

    fn take(&self) -> Vec<Ask> {
        std::mem::take(&mut *self.asked.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// An interrupted turn's ask at one round: the completed conversation it
/// was cut from, and the history sent.
type Interrupted = (Vec<ConversationItem>, Vec<ConversationItem>);

/// The judge of one driver's asks (see the [module docs](self)).
#[derive(Debug)]
pub struct ContextOracle {
    budget: ContextBudget,
    asks: Asks,
    /// Each live agent's instructions and completed conversation at the
    /// last projection: what a turn asked in the next op started from.
    start: BTreeMap<AgentId, (String, Vec<ConversationItem>)>,
    /// The last ask at each round of each turn that did not complete in
    /// its op, by (agent, prompt, round) — for CTX7.
    interrupted: BTreeMap<(AgentId, String, u32), Interrupted>,
}

impl ContextOracle {
    pub fn new(seed: u64, fs: SimFs) -> ContextOracle {
        ContextOracle {
            budget: budget_for(seed),
            asks: Asks {
                fs,
                asked: Arc::default(),
            },
            start: BTreeMap::new(),
            interrupted: BTreeMap::new(),
        }
    }

    /// The budget the system is booted with.
    pub fn budget(&self) -> ContextBudget {
        self.budget
    }

    /// The recorder the scripted provider writes to.
    pub fn recorder(&self) -> Asks {
        self.asks.clone()
    }

    /// Judge the asks made since the last projection against `now`, the
    /// runtime's state at this one; then remember `now` as what the next
    /// op's turns start from.
    pub fn check(&mut self, now: &RuntimeState) -> Vec<String> {
        let asks = self.asks.take();
        let mut violations = Vec::new();
        let mut firsts: Vec<(AgentId, String)> = Vec::new();
        for ask in &asks {
            let Some((instructions, older)) = self.start.get(&ask.agent) else {
                continue; // an agent no projection saw: nothing to judge by
            };
            let prompt = current_prompt(&ask.history).unwrap_or_default();
            // The turn completed since the start only if the conversation
            // grew: an agent's earlier turn with the same prompt (a repeat
            // of it) is not this one.
            let completed = now
                .conversations
                .get(&ask.agent)
                .filter(|c| prompts(c) > prompts(older))
                .and_then(|c| last_turn(c))
                .filter(|turn| matches!(&turn[0], ConversationItem::Prompt { text } if *text == prompt));
            let mut broke = judge(&self.budget, instructions, older, completed, ask);
            let key = (ask.agent.clone(), prompt.clone(), ask.round);
            let first = !firsts.contains(&(key.0.clone(), prompt.clone()));
            if first {
                firsts.push((key.0.clone(), prompt.clone()));
                if let Some((was_older, was_sent)) = self.interrupted.get(&key) {
                    if was_older == older && *was_sent != ask.history {
                        broke.push(format!(
                            "CTX7 (a re-run turn asks what the interrupted one asked): the first ask of the \
                             re-run differs from the interrupted turn's ask at round {}, from the same \
                             completed conversation; the interrupted turn sent {}",
                            ask.round,
                            render(was_sent)
                        ));
                    }
                }
            }
            match completed {
                Some(_) => self
                    .interrupted
                    .retain(|(a, p, _), _| !(*a == key.0 && *p == key.1)),
                None => {
                    self.interrupted.insert(key, (older.clone(), ask.history.clone()));
                }
            }
            violations.extend(broke.into_iter().map(|why| {
                format!(
                    "context budget {}: ask of {} ({}) at round {} of turn {prompt:?}: {why}\n  the ask: {}",
                    show_budget(&self.budget),
                    ask.agent_name,
                    ask.agent,
                    ask.round,
                    render(&ask.history)
                )
            }));
        }
        self.start = now
            .agents
            .iter()
            .map(|(id, view)| {
                let conversation = now.conversations.get(id).cloned().unwrap_or_default();
                (id.clone(), (view.instructions.clone(), conversation))
            })
            .collect();
        violations
    }
}

/// What `ask` breaks of CTX1..CTX6, given the agent's `instructions`, its
/// completed conversation `older` when the turn started, and the turn as
/// it completed (if it did).
fn judge(
    budget: &ContextBudget,
    instructions: &str,
    older: &[ConversationItem],
    completed: Option<&[ConversationItem]>,
    ask: &Ask,
) -> Vec<String> {
    let mut broke = Vec::new();
    if ask.instructions != instructions {
        broke.push(format!(
            "CTX1 (the system prompt): sent {:?}, the agent's instructions are {instructions:?}",
            ask.instructions
        ));
    }
    let Some(at) = ask
        .history
        .iter()
        .rposition(|i| matches!(i, ConversationItem::Prompt { .. }))
    else {
        broke.push("CTX2 (the whole current turn): no prompt in the request".into());
        return broke;
    };
    let (rest, current) = ask.history.split_at(at);
    // CTX2: the current turn, every round before this one whole.
    let ConversationItem::Prompt { text: prompt } = &current[0] else {
        unreachable!("split at a prompt")
    };
    let want_calls = calls_before(prompt, ask.round);
    let calls = current
        .iter()
        .filter(|i| matches!(i, ConversationItem::ToolCall { .. }))
        .count();
    let results = current
        .iter()
        .filter(|i| matches!(i, ConversationItem::ToolResult { .. }))
        .count();
    if (calls, results) != (want_calls, want_calls) {
        broke.push(format!(
            "CTX2 (the whole current turn): {calls} call(s) and {results} result(s) after the prompt, \
             but {want_calls} of each were made in the {} round(s) before this one",
            ask.round
        ));
    }
    if let Some(turn) = completed {
        let whole = turn.len() > current.len()
            && turn[..current.len()] == *current
            && !matches!(turn[current.len()], ConversationItem::ToolResult { .. });
        if !whole {
            broke.push(format!(
                "CTX2 (the whole current turn): the request's current turn is not the start of the turn \
                 as it completed, up to a round: {}",
                render(turn)
            ));
        }
    }
    // CTX3 and CTX4: the older conversation whole, or the marker then a
    // suffix of whole turns.
    let system = system_size(instructions);
    let whole_older = rest == older;
    let (kept, dropped): (&[ConversationItem], &[ConversationItem]) = if whole_older {
        (rest, &[])
    } else {
        let marker = match rest.first() {
            Some(ConversationItem::Prompt { text }) if text.starts_with('[') => text,
            _ => {
                broke.push(format!(
                    "CTX3 (a suffix of whole turns behind the marker): the older history sent is not the \
                     completed conversation, and no marker leads it; the conversation: {}",
                    render(older)
                ));
                return broke;
            }
        };
        let kept = &rest[1..];
        if !older.ends_with(kept) || kept.len() == older.len() {
            broke.push(format!(
                "CTX3 (a suffix of whole turns, no hole): the turns after the marker are not a proper suffix \
                 of the completed conversation {}",
                render(older)
            ));
            return broke;
        }
        if kept
            .first()
            .is_some_and(|i| !matches!(i, ConversationItem::Prompt { .. }))
        {
            broke.push("CTX3 (whole turns): the history after the marker starts inside a turn".into());
        }
        let dropped = &older[..older.len() - kept.len()];
        let (n, m) = (prompts(dropped), estimate(dropped).messages);
        let want = marker_wording(n, m);
        if *marker != want {
            broke.push(format!(
                "CTX4 (the marker names what was dropped): it reads {marker:?}; {n} turn(s) of {m} message(s) \
                 were dropped: {want:?}"
            ));
        }
        (kept, dropped)
    };
    // CTX5: within the budget, unless no older turn is left.
    let sent = system + estimate(&ask.history);
    if !budget.fits(sent) && !kept.is_empty() {
        broke.push(format!(
            "CTX5 (within the budget): {} tokens / {} messages sent with {} older turn(s) still in the request",
            sent.tokens,
            sent.messages,
            prompts(kept)
        ));
    }
    // CTX6: turns dropped only when the whole is over the budget, and
    // the newest dropped one would not have fit.
    if !dropped.is_empty() && budget.fits(system + estimate(older) + estimate(current)) {
        broke.push(format!(
            "CTX6 (turns dropped only when needed): the whole conversation fits the budget ({} tokens / {} \
             messages), yet {} turn(s) were dropped",
            (system + estimate(older) + estimate(current)).tokens,
            (system + estimate(older) + estimate(current)).messages,
            prompts(dropped)
        ));
    }
    if let Some(next) = dropped
        .iter()
        .rposition(|i| matches!(i, ConversationItem::Prompt { .. }))
        .map(|at| &dropped[at..])
    {
        let all = estimate(older);
        let reserved = estimate(&[ConversationItem::Prompt {
            text: marker_wording(prompts(older), all.messages),
        }]);
        let with_next = system + estimate(current) + estimate(kept) + estimate(next) + reserved;
        if budget.fits(with_next) {
            broke.push(format!(
                "CTX6 (the newest turns that fit): the newest dropped turn fits too ({} tokens / {} messages \
                 with it and the marker's room): {}",
                with_next.tokens,
                with_next.messages,
                render(next)
            ));
        }
    }
    broke
}

/// The script's tool calls made before round `round` of the turn with
/// `prompt` (each round's calls are the script's steps joined by `+`).
fn calls_before(prompt: &str, round: u32) -> usize {
    crate::model::script_rounds(prompt)
        .iter()
        .take(round as usize)
        .map(Vec::len)
        .sum()
}

/// The marker's wording, as the product's module doc promises it.
fn marker_wording(turns: usize, messages: u64) -> String {
    let plural = |n: u64, one: &str, many: &str| if n == 1 { one.to_string() } else { many.to_string() };
    format!(
        "[{turns} earlier {} ({messages} {}) omitted to fit the context budget]",
        plural(turns as u64, "turn", "turns"),
        plural(messages, "message", "messages")
    )
}

/// The prompt of the current turn: the request's last prompt.
fn current_prompt(history: &[ConversationItem]) -> Option<String> {
    history.iter().rev().find_map(|i| match i {
        ConversationItem::Prompt { text } => Some(text.clone()),
        _ => None,
    })
}

/// The last completed turn of `conversation`, from its prompt.
fn last_turn(conversation: &[ConversationItem]) -> Option<&[ConversationItem]> {
    let at = conversation
        .iter()
        .rposition(|i| matches!(i, ConversationItem::Prompt { .. }))?;
    Some(&conversation[at..])
}

fn prompts(items: &[ConversationItem]) -> usize {
    items
        .iter()
        .filter(|i| matches!(i, ConversationItem::Prompt { .. }))
        .count()
}

/// Estimated tokens and chat messages.
#[derive(Debug, Clone, Copy, Default)]
struct Estimate {
    tokens: u64,
    messages: u64,
}

impl std::ops::Add for Estimate {
    type Output = Estimate;
    fn add(self, o: Estimate) -> Estimate {
        Estimate {
            tokens: self.tokens + o.tokens,
            messages: self.messages + o.messages,
        }
    }
}

trait Fits {
    fn fits(&self, e: Estimate) -> bool;
}

impl Fits for ContextBudget {
    fn fits(&self, e: Estimate) -> bool {
        self.max_context_tokens.is_none_or(|max| e.tokens <= max)
            && self.max_messages.is_none_or(|max| e.messages <= max)
    }
}

/// 4 tokens per message plus its bytes / 4, rounded up.
///
/// This and [`estimate`] state `runtime::context`'s estimator again on
/// purpose, from its module doc rather than its code: judged by the
/// product's own `item_size`, an estimator that miscounts would agree with
/// itself (the `item_size` mutant is killed by CTX6 through this copy).
fn tokens(bytes: usize) -> u64 {
    4 + (bytes as u64).div_ceil(4)
}

/// The items as chat messages: a run of consecutive tool calls is one.
fn estimate(items: &[ConversationItem]) -> Estimate {
    let mut out = Estimate::default();
    let mut after_call = false;
    for item in items {
        let bytes = match item {
            ConversationItem::Prompt { text } | ConversationItem::Response { text } => text.len(),
            ConversationItem::ToolCall {
                call_id, tool, args, ..
            } => {
                let args = match args {
                    Value::String(raw) => raw.len(),
                    other => other.to_string().len(),
                };
                call_id.len() + tool.len() + args
            }
            ConversationItem::ToolResult { call_id, output, .. } => call_id.len() + output.len(),
        };
        let is_call = matches!(item, ConversationItem::ToolCall { .. });
        out = out
            + Estimate {
                tokens: tokens(bytes),
                messages: u64::from(!(is_call && after_call)),
            };
        after_call = is_call;
    }
    out
}

fn system_size(instructions: &str) -> Estimate {
    match instructions.is_empty() {
        true => Estimate::default(),
        false => Estimate {
            tokens: tokens(instructions.len()),
            messages: 1,
        },
    }
}

fn show_budget(b: &ContextBudget) -> String {
    let show = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    format!(
        "(tokens {}, messages {})",
        show(b.max_context_tokens),
        show(b.max_messages)
    )
}

/// A history on one line: `prompt "p3:R" | call lookup {..} | result ok "…" | response "r3"`.
fn render(items: &[ConversationItem]) -> String {
    let mut out = String::new();
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(" | ");
        }
        let _ = match item {
            ConversationItem::Prompt { text } => write!(out, "prompt {text:?}"),
            ConversationItem::ToolCall {
                call_id, tool, args, ..
            } => write!(out, "call {call_id} {tool} {args}"),
            ConversationItem::ToolResult { call_id, ok, output } => {
                write!(out, "result {call_id} ok={ok} {output:?}")
            }
            ConversationItem::Response { text } => write!(out, "response {text:?}"),
        };
    }
    format!("[{out}]")
}

#[cfg(test)]
mod tests {
    use durable_agent::fs::SimConfig;
    use durable_agent::runtime::context::fit;
    use durable_agent::runtime::state::AgentView;
    use durable_agent::runtime::SessionId;
    use durable_agent::store::session::SessionState;
    use serde_json::json;

    use super::*;

    const AGENT: &str = "00000000000000a1";

    fn prompt(text: &str) -> ConversationItem {
        ConversationItem::Prompt { text: text.into() }
    }

    fn call_and_result(id: &str, key: &str) -> [ConversationItem; 2] {
        [
            ConversationItem::ToolCall {
                call_id: id.into(),
                tool: "lookup".into(),
                args: json!({"key": key, "ok": true}),
                irreversible: false,
            },
            ConversationItem::ToolResult {
                call_id: id.into(),
                ok: true,
                output: format!("lookup:{key}"),
            },
        ]
    }

    /// Completed turns as the harness's model writes them, some with
    /// calls (one round each).
    fn conversation(turns: usize) -> Vec<ConversationItem> {
        let mut out = Vec::new();
        for t in 0..turns {
            let p = if t % 2 == 0 {
                format!("p{t}:R")
            } else {
                format!("p{t}:")
            };
            out.push(prompt(&p));
            if t % 2 == 0 {
                out.extend(call_and_result(&format!("s-{t}.0"), &format!("{p}#0")));
            }
            out.push(ConversationItem::Response {
                text: format!("r{t}"),
            });
        }
        out
    }

    fn state(conversation: Vec<ConversationItem>) -> RuntimeState {
        let id = AgentId::from_hex(AGENT).unwrap();
        let view = AgentView {
            name: "a001".into(),
            instructions: "root".into(),
            parent: None,
            session_id: SessionId::from_hex("00000000000000b1").unwrap(),
            session_state: SessionState::Active,
        };
        RuntimeState {
            agents: BTreeMap::from([(id.clone(), view)]),
            conversations: BTreeMap::from([(id, conversation)]),
            pending: BTreeMap::new(),
            delivered: BTreeMap::new(),
        }
    }

    fn ask(oracle: &ContextOracle, round: u32, history: &[ConversationItem]) {
        let id = AgentId::from_hex(AGENT).unwrap();
        oracle.recorder().record(&ProviderRequest {
            agent: &id,
            agent_name: "a001",
            instructions: "root",
            history,
            round,
        });
    }

    fn oracle(budget: ContextBudget) -> ContextOracle {
        let mut oracle = ContextOracle::new(0, SimFs::new(SimConfig::new(0)));
        oracle.budget = budget;
        oracle
    }

    #[test]
    fn every_cut_the_product_makes_keeps_the_promise() {
        let older = conversation(7);
        let mut current = vec![prompt("p9:RR")];
        current.extend(call_and_result("s-9.0", "p9:RR#0"));
        let mut history = older.clone();
        history.extend(current.clone());
        let mut cuts = 0;
        for max in 0..400 {
            for messages in [None, Some(max / 8)] {
                let budget = ContextBudget {
                    max_context_tokens: Some(max),
                    max_messages: messages,
                };
                let cut = fit(&budget, "root", &history, older.len());
                cuts += usize::from(cut.omitted_turns > 0);
                let asked = Ask {
                    agent: AgentId::from_hex(AGENT).unwrap(),
                    agent_name: "a001".into(),
                    instructions: "root".into(),
                    round: 1,
                    history: cut.history.clone(),
                };
                let mut turn = current.clone();
                turn.push(ConversationItem::Response { text: "r9".into() });
                let broke = judge(&budget, "root", &older, Some(&turn), &asked);
                assert!(
                    broke.is_empty(),
                    "budget {budget:?}: {broke:?}\n{}",
                    render(&cut.history)
                );
            }
        }
        assert!(cuts > 300, "{cuts} cuts");
    }

    #[test]
    fn a_rerun_turn_that_asks_otherwise_than_the_interrupted_one_is_caught() {
        let mut oracle = oracle(ContextBudget::default());
        let older = conversation(2);
        assert_eq!(oracle.check(&state(older.clone())), Vec::<String>::new());
        let mut sent = older.clone();
        sent.push(prompt("p5:R"));
        // The turn is interrupted after its first ask: not in the conversation.
        ask(&oracle, 0, &sent);
        assert_eq!(oracle.check(&state(older.clone())), Vec::<String>::new());
        // Re-run with the same ask, and completed: nothing is kept of it.
        ask(&oracle, 0, &sent);
        let mut done = sent.clone();
        done.extend(call_and_result("s-5.0", "p5:R#0"));
        done.push(ConversationItem::Response { text: "r5".into() });
        assert_eq!(oracle.check(&state(done.clone())), Vec::<String>::new());
        assert!(oracle.interrupted.is_empty());
        // The next turn is interrupted; its re-run asks something else.
        let mut sent = done.clone();
        sent.push(prompt("p6:"));
        ask(&oracle, 0, &sent);
        assert_eq!(oracle.check(&state(done.clone())), Vec::<String>::new());
        ask(&oracle, 0, &sent[4..]);
        let broke = oracle.check(&state(done.clone()));
        assert!(broke.iter().any(|v| v.contains("CTX7")), "{broke:?}");
    }

    #[test]
    fn a_marker_that_miscounts_is_caught() {
        let older = conversation(4);
        let budget = ContextBudget {
            max_context_tokens: None,
            max_messages: Some(6),
        };
        let mut history = vec![prompt(&marker_wording(2, 5))];
        history.extend_from_slice(&older[older.len() - 2..]);
        history.push(prompt("p9:"));
        let asked = Ask {
            agent: AgentId::from_hex(AGENT).unwrap(),
            agent_name: "a001".into(),
            instructions: "root".into(),
            round: 0,
            history,
        };
        let broke = judge(&budget, "root", &older, None, &asked);
        assert!(broke.iter().any(|v| v.starts_with("CTX4")), "{broke:?}");
    }

    #[test]
    fn the_marker_wording_agrees_in_number() {
        assert_eq!(
            marker_wording(1, 1),
            "[1 earlier turn (1 message) omitted to fit the context budget]"
        );
        assert_eq!(
            marker_wording(3, 7),
            "[3 earlier turns (7 messages) omitted to fit the context budget]"
        );
    }

    #[test]
    fn most_cases_run_under_a_budget_and_some_without() {
        let budgets: Vec<ContextBudget> = (0..400).map(budget_for).collect();
        let none = budgets.iter().filter(|b| b.is_unlimited()).count();
        let messages = budgets.iter().filter(|b| b.max_messages.is_some()).count();
        assert!((20..90).contains(&none), "{none} of 400 without a budget");
        assert!(
            (60..160).contains(&messages),
            "{messages} of 400 with a message limit"
        );
    }
}
