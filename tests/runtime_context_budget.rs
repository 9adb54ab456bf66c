//! The context budget in the turn loop, on SimFs: a chatty agent's
//! requests stay bounded (older turns dropped whole behind the marker, the
//! current turn always whole), and — the cut being a pure function of the
//! durable conversation and the budget — a turn crashed at any I/O point
//! and resumed sends, round for round, the requests the uninterrupted turn
//! sent. A budget changed across the crash makes a new cut, and the
//! round's logged decision still stands.

use std::path::Path;
use std::sync::{Arc, Mutex};

use durable_agent::fs::{CrashMode, DirModel, Fault, Fs, SimConfig, SimFs};
use durable_agent::runtime::context::{marker_text, size_of, ContextBudget, Size};
use durable_agent::runtime::{
    AgentId, ConversationItem, FakeProvider, Provider, ProviderError, ProviderReply, ProviderRequest,
    Runtime, RuntimeConfig,
};

const SEED: u64 = 25;
const INSTRUCTIONS: &str = "You are a helpful assistant. Answer briefly.";
/// The turn the crash tests interrupt: round 0 asks for a lookup, round 1
/// answers after its result.
const LAST: &str = "lookup the weather for the picnic";

/// One request as the provider saw it.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    round: u32,
    instructions: String,
    history: Vec<ConversationItem>,
}

impl Seen {
    /// Chat messages and estimated tokens, the system prompt included.
    fn size(&self) -> Size {
        let system = [ConversationItem::Prompt {
            text: self.instructions.clone(),
        }];
        size_of(&system) + size_of(&self.history)
    }

    /// The same request with every call id blanked (an id is the log
    /// position of its decision).
    fn without_ids(&self) -> Seen {
        let mut out = self.clone();
        for item in &mut out.history {
            match item {
                ConversationItem::ToolCall { call_id, .. } | ConversationItem::ToolResult { call_id, .. } => {
                    call_id.clear()
                }
                _ => {}
            }
        }
        out
    }

    /// The request's bytes as JSON (instructions and items).
    fn bytes(&self) -> usize {
        self.instructions.len() + serde_json::to_string(&self.history).map_or(0, |s| s.len())
    }
}

/// `FakeProvider`, recording every request. Outlives crashes, as the
/// provider does.
#[derive(Debug)]
struct Recording {
    inner: FakeProvider,
    seen: Mutex<Vec<Seen>>,
}

impl Recording {
    fn new() -> Arc<Recording> {
        Arc::new(Recording {
            inner: FakeProvider::new(SEED),
            seen: Mutex::new(Vec::new()),
        })
    }

    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

impl Provider for Recording {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn model(&self) -> &str {
        self.inner.model()
    }
    fn complete(&self, request: &ProviderRequest<'_>) -> Result<ProviderReply, ProviderError> {
        self.seen.lock().unwrap().push(Seen {
            round: request.round,
            instructions: request.instructions.to_string(),
            history: request.history.to_vec(),
        });
        self.inner.complete(request)
    }
}

fn budget(tokens: u64) -> ContextBudget {
    ContextBudget {
        max_context_tokens: Some(tokens),
        max_messages: None,
    }
}

fn open(sim: &SimFs, provider: &Arc<Recording>, budget: ContextBudget) -> Runtime {
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    let mut config = RuntimeConfig::new(SEED);
    config.provider = provider.clone();
    config.context_budget = budget;
    Runtime::open(fs, Path::new("/data"), config).unwrap().0
}

/// The `i`-th prompt of the chatty agent: every third one forces a tool
/// round, the others let the fake provider decide.
fn prompt(i: usize) -> String {
    match i % 3 {
        0 => format!("lookup item {i} and summarise what you find in a sentence or two"),
        1 => format!("write_note about turn {i}: the meeting moved to Thursday afternoon"),
        _ => format!("question {i}: what should we plan next, in a few words?"),
    }
}

/// An agent with `turns` completed turns.
fn chatty(rt: &mut Runtime, turns: usize) -> AgentId {
    let agent = rt.create_root("chatty", INSTRUCTIONS).unwrap();
    for i in 0..turns {
        rt.run_turn(&agent, &prompt(i)).unwrap();
    }
    agent
}

#[test]
fn a_chatty_agent_under_a_small_budget_sends_bounded_requests() {
    const TURNS: usize = 50;
    const MAX_TOKENS: u64 = 600;
    let run = |b: ContextBudget| {
        let provider = Recording::new();
        let mut rt = open(&SimFs::new(SimConfig::new(SEED)), &provider, b);
        chatty(&mut rt, TURNS);
        (provider.take(), rt.state())
    };
    let (unbounded, state_a) = run(ContextBudget::default());
    let (bounded, state_b) = run(budget(MAX_TOKENS));
    // The fake answers from the prompt and round alone: the same
    // conversation either way, only the requests differ.
    assert_eq!(state_a.conversations, state_b.conversations);
    assert_eq!(unbounded.len(), bounded.len());

    eprintln!("request (turn, round)   unbounded: msgs bytes est.tokens | budget {MAX_TOKENS}: msgs bytes est.tokens");
    let mut turn = 0;
    for (i, (u, b)) in unbounded.iter().zip(&bounded).enumerate() {
        turn += usize::from(u.round == 0);
        let (us, bs) = (u.size(), b.size());
        if [1, 10, 25, 50].contains(&turn) && u.round == 0 || i + 1 == unbounded.len() {
            eprintln!(
                "  #{i:>3} ({turn:>2}, {})        {:>5} {:>6} {:>6}         | {:>5} {:>6} {:>6}",
                u.round,
                us.messages,
                u.bytes(),
                us.tokens,
                bs.messages,
                b.bytes(),
                bs.tokens
            );
        }
        assert!(bs.tokens <= MAX_TOKENS, "request {i} over the budget: {bs:?}");
        // The current turn is whole: it ends the request exactly as it
        // ends the unbounded one, from its prompt on.
        let start = u
            .history
            .iter()
            .rposition(|it| matches!(it, ConversationItem::Prompt { .. }))
            .unwrap();
        assert!(
            b.history.ends_with(&u.history[start..]),
            "request {i}: the current turn was cut"
        );
        assert_eq!(b.instructions, INSTRUCTIONS, "the system prompt is always sent");
    }
    // The last request: the marker names exactly what was left out.
    let (u, b) = (unbounded.last().unwrap(), bounded.last().unwrap());
    let kept = b.history.len() - 1;
    let dropped = &u.history[..u.history.len() - kept];
    let turns = dropped
        .iter()
        .filter(|it| matches!(it, ConversationItem::Prompt { .. }))
        .count();
    assert!(turns > 40, "{turns} turns dropped");
    let marker = marker_text(turns, size_of(dropped).messages);
    assert_eq!(b.history[0], ConversationItem::Prompt { text: marker });
    assert!(
        u.bytes() > 5 * b.bytes(),
        "unbounded {} B, bounded {} B",
        u.bytes(),
        b.bytes()
    );
}

/// The requests of the uninterrupted `LAST` turn after 20 turns, and the
/// I/O points of that turn: (first, last, the first `turn.complete` one).
fn uninterrupted(b: ContextBudget) -> (Vec<Seen>, u64, u64, u64) {
    let sim = SimFs::new(SimConfig::new(SEED));
    let provider = Recording::new();
    let mut rt = open(&sim, &provider, b);
    let agent = chatty(&mut rt, 20);
    provider.take();
    let first = sim.points() + 1;
    rt.run_turn(&agent, LAST).unwrap();
    let complete = sim
        .trace_from(first)
        .into_iter()
        .find(|t| t.label.ends_with("turn.complete"))
        .map(|t| t.point)
        .unwrap();
    (provider.take(), first, sim.points(), complete)
}

/// The chatty agent's 20 turns, then `LAST` crashed at I/O `point`, and
/// the root rebooted under `mode` with `after` as the budget; `None` when
/// the turn completed durably before the crash (nothing to resume).
fn crashed_at(
    point: u64,
    mode: CrashMode,
    before: ContextBudget,
    after: ContextBudget,
) -> Option<(Runtime, Arc<Recording>, AgentId)> {
    let sim = SimFs::new(SimConfig::new(SEED));
    let provider = Recording::new();
    let mut rt = open(&sim, &provider, before);
    let agent = chatty(&mut rt, 20);
    let done = rt.state().conversations[&agent].len();
    sim.set_fault(Some(Fault::CrashAt(point)));
    assert!(rt.run_turn(&agent, LAST).is_err(), "point {point}: no crash");
    drop(rt);
    sim.restart(mode);
    provider.take();
    let rt = open(&sim, &provider, after);
    (rt.state().conversations[&agent].len() == done).then_some((rt, provider, agent))
}

#[test]
fn a_turn_crashed_at_any_point_and_resumed_rebuilds_the_same_requests() {
    let b = budget(500);
    let (dry, first, last, _) = uninterrupted(b);
    assert_eq!(dry.iter().map(|s| s.round).collect::<Vec<_>>(), [0, 1]);
    let cut =
        |s: &Seen| matches!(&s.history[0], ConversationItem::Prompt { text } if text.contains("omitted"));
    assert!(dry.iter().all(cut), "the budget cuts every request of the turn");
    let modes = [
        CrashMode::ProcessCrash,
        CrashMode::PowerLoss(DirModel::Strict),
        CrashMode::PowerLoss(DirModel::Eager),
    ];
    let (mut resumed_mid_turn, mut resumed) = (0, 0);
    for point in first..=last {
        for mode in modes {
            let Some((mut rt, provider, agent)) = crashed_at(point, mode, b, b) else {
                continue;
            };
            rt.run_turn(&agent, LAST).unwrap();
            // The first ask after the reboot is the resumed round's, built
            // from the log alone: exactly the dry run's. A round decided
            // after the reboot is the same cut, its new calls named by
            // their new log positions (the reboot logged
            // `session.restored` and `turn.resume` before them).
            let again = provider.take();
            for (i, seen) in again.iter().enumerate() {
                let want = dry.iter().find(|s| s.round == seen.round).unwrap();
                let (seen, want) = match i {
                    0 => (seen.clone(), want.clone()),
                    _ => (seen.without_ids(), want.without_ids()),
                };
                assert_eq!(
                    seen, want,
                    "point {point} {mode:?}: round {} asked differently",
                    seen.round
                );
            }
            resumed += 1;
            resumed_mid_turn += usize::from(again.first().is_some_and(|s| s.round == 1));
        }
    }
    eprintln!(
        "{} crash points x 3 modes: {resumed} resumed, {resumed_mid_turn} of them after the tool round",
        last - first + 1
    );
    assert!(
        resumed_mid_turn > 0,
        "no crash point resumed after the tool round"
    );
}

#[test]
fn a_budget_changed_across_a_crash_makes_a_new_cut_and_the_decision_stands() {
    let (small, larger) = (budget(300), budget(2_000));
    let (dry, _, _, complete) = uninterrupted(small);
    let dry_round1 = dry.iter().find(|s| s.round == 1).unwrap();
    // Crashed writing `turn.complete`: round 0 (its call and result) is
    // durable, round 1 is asked again after the reboot.
    let (mut rt, provider, agent) =
        crashed_at(complete, CrashMode::ProcessCrash, small, larger).expect("the turn is open");
    let outcome = rt.run_turn(&agent, LAST).unwrap();
    let again = provider.take();
    assert_eq!(again.len(), 1, "only round 1 is asked again: {again:?}");
    let resumed = &again[0];
    assert_eq!(resumed.round, 1);
    assert!(
        resumed.history.len() > dry_round1.history.len(),
        "the larger budget keeps more: a new cut"
    );
    // The current turn — the prompt, the logged call and its result — is the same.
    let tail = |h: &[ConversationItem]| h[h.len() - 3..].to_vec();
    assert_eq!(tail(&resumed.history), tail(&dry_round1.history));
    let ConversationItem::ToolCall { call_id, .. } = &dry_round1.history[dry_round1.history.len() - 2] else {
        panic!("round 1's request does not end with the call and its result");
    };
    assert_eq!(outcome.tool_calls.len(), 1);
    assert_eq!(
        &outcome.tool_calls[0].0, call_id,
        "the decided call and its id stand"
    );
}

#[test]
fn the_next_turn_after_a_power_loss_asks_what_it_asks_on_a_machine_that_stayed_up() {
    let b = budget(500);
    let stayed_up = {
        let provider = Recording::new();
        let mut rt = open(&SimFs::new(SimConfig::new(SEED)), &provider, b);
        let agent = chatty(&mut rt, 20);
        provider.take();
        rt.run_turn(&agent, LAST).unwrap();
        provider.take()
    };
    let sim = SimFs::new(SimConfig::new(SEED));
    let provider = Recording::new();
    let mut rt = open(&sim, &provider, b);
    let agent = chatty(&mut rt, 20);
    drop(rt);
    sim.restart(CrashMode::PowerLoss(DirModel::Strict));
    let mut rt = open(&sim, &provider, b);
    provider.take();
    rt.run_turn(&agent, LAST).unwrap();
    // Round 0 is the rebuilt conversation, cut the same way; round 1 too,
    // its new call named by its log position, which the reboot's
    // `session.restored` moved on.
    let after = provider.take();
    assert_eq!(after[0], stayed_up[0]);
    assert_eq!(after[1].without_ids(), stayed_up[1].without_ids());
    assert_ne!(after[1], stayed_up[1]);
}

#[test]
fn a_turn_over_the_budget_on_its_own_is_sent_whole_and_completes() {
    let provider = Recording::new();
    let tiny = ContextBudget {
        max_context_tokens: Some(64),
        max_messages: Some(3),
    };
    let mut rt = open(&SimFs::new(SimConfig::new(SEED)), &provider, tiny);
    let agent = chatty(&mut rt, 3);
    let earlier = size_of(&rt.state().conversations[&agent]).messages;
    provider.take();
    let long = format!("lookup {}", "the whole quarterly report, ".repeat(40));
    let outcome = rt.run_turn(&agent, &long).unwrap();
    assert_eq!(outcome.tool_calls.len(), 1, "the turn ran its round");
    let seen = provider.take();
    assert_eq!(seen.len(), 2);
    for s in &seen {
        assert!(s.size().tokens > 64, "over the budget: {:?}", s.size());
        assert_eq!(
            s.history[0],
            ConversationItem::Prompt {
                text: marker_text(3, earlier)
            }
        );
        assert_eq!(s.history[1], ConversationItem::Prompt { text: long.clone() });
    }
}
