//! The context budget through the binary: `serve` with a `[context]`
//! section and the echo mock LLM on loopback, a chatty agent of 500 turns
//! (each a tool round, then an answer: 1,000 requests), beside the same
//! conversation without a budget for its first 30 turns (500 of them
//! unbounded would send 100 MB and take most of a minute). What the mock receives stays
//! bounded: the system prompt first, then the marker naming what was left
//! out, then whole turns — every `tool` message after the assistant call
//! it answers — ending with the current turn.

mod common;

use std::io::{BufRead, BufReader};
use std::time::Duration;

use common::*;
use durable_agent_cli::access::Token;
use durable_agent_cli::api::Client;
use durable_agent_cli::mock_llm::MockLlm;
use serde_json::{json, Value};

const TURNS: usize = 500;
/// Turns of the unbounded run the bounded one is compared with.
const COMPARED_TURNS: usize = 30;
const MAX_TOKENS: u64 = 900;
const INSTRUCTIONS: &str = "You are a chatty assistant. Keep answers short.";

fn config(dir: &std::path::Path, base_url: &str, context: &str) -> std::io::Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir.join("ws"))?;
    let path = dir.join("agent.toml");
    std::fs::write(
        &path,
        format!(
            r#"[provider]
base_url = "{base_url}"
model = "mock-1"
timeout_ms = 15000
max_retries = 0

[runtime]
root = "root"

[api]
listen = "{api}"
token_env = "{TOKEN_ENV}"

[[tools]]
kind = "read_file"
workspace = "ws"

{context}
"#,
            api = free_addr()?,
        ),
    )?;
    Ok(path)
}

/// Run `turns` turns of one agent through `serve`; the completion bodies
/// the mock received.
fn chat(context: &str, turns: usize) -> Result<Vec<Value>, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mock = MockLlm::echo(loopback())?;
    let config = config(dir.path(), &mock.base_url(), context)?;
    let check = run(&["check-config", path_str(&config)])?;
    assert!(check.status.success(), "{check:?}");
    let mut child = spawn(&["serve", "--config", path_str(&config)])?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
    let addr = line.trim().trim_start_matches("http://").parse()?;
    let api = Client::new(addr, Duration::from_secs(10)).with_token(Token::new(TEST_TOKEN));
    api.call(
        "POST",
        "/agents",
        Some(&json!({"name": "chatty", "instructions": INSTRUCTIONS})),
    )?;
    for i in 0..turns {
        let prompt =
            format!("turn {i}: please look into notes-{i}.txt and tell me what the plan for day {i} is");
        let done = api.call("POST", "/agents/chatty/turn", Some(&json!({"prompt": prompt})))?;
        assert!(
            done["response"].as_str().is_some_and(|r| r.starts_with("echo: ")),
            "{done}"
        );
    }
    signal(&child, "TERM")?;
    let status = child.wait()?;
    assert!(status.success(), "serve exited {status}");
    Ok(mock.request_bodies())
}

fn messages(body: &Value) -> &[Value] {
    body["messages"].as_array().map_or(&[], |m| m.as_slice())
}

/// Every `tool` message answers a call of an assistant message before it.
fn assert_calls_precede_results(body: &Value) {
    let mut called = Vec::new();
    for m in messages(body) {
        for c in m["tool_calls"].as_array().into_iter().flatten() {
            called.push(c["id"].clone());
        }
        if m["role"] == "tool" {
            assert!(
                called.contains(&m["tool_call_id"]),
                "a tool result without its call: {body}"
            );
        }
    }
}

/// The marker's numbers, if `text` is the marker.
fn marker(text: &str) -> Option<(usize, usize)> {
    let rest = text
        .strip_prefix('[')?
        .strip_suffix(" omitted to fit the context budget]")?;
    let (turns, rest) = rest.split_once(" earlier turns (")?;
    let messages = rest.strip_suffix(" messages)")?;
    Some((turns.parse().ok()?, messages.parse().ok()?))
}

/// `bodies`' sizes, min/median/max: whole-body bytes and messages.
fn size_figures(bodies: &[Value]) -> String {
    let mut bytes: Vec<usize> = bodies.iter().map(|b| b.to_string().len()).collect();
    let mut counts: Vec<usize> = bodies.iter().map(|b| messages(b).len()).collect();
    bytes.sort_unstable();
    counts.sort_unstable();
    let (mid, last) = (bodies.len() / 2, bodies.len().saturating_sub(1));
    format!(
        "{} requests; body bytes min/median/max {}/{}/{}; messages min/median/max {}/{}/{}",
        bodies.len(),
        bytes.first().unwrap_or(&0),
        bytes.get(mid).unwrap_or(&0),
        bytes.get(last).unwrap_or(&0),
        counts.first().unwrap_or(&0),
        counts.get(mid).unwrap_or(&0),
        counts.get(last).unwrap_or(&0)
    )
}

/// `ms` (a bounded request's messages, made in turn `turn`): the system
/// prompt, the marker, whole earlier turns, the current turn's round so
/// far — every earlier turn kept or counted in the marker. Returns the
/// marker's count of dropped messages.
fn assert_cut_shape(ms: &[Value], turn: usize) -> Result<usize, Box<dyn std::error::Error>> {
    assert_eq!(ms[1]["role"], "user");
    let text = ms[1]["content"].as_str().unwrap_or_default();
    let (dropped, dropped_messages) = marker(text).ok_or_else(|| format!("no marker: {text:?}"))?;
    let users = ms.iter().filter(|m| m["role"] == "user").count();
    let kept = users - 2; // the marker and the current prompt
    assert_eq!(
        dropped + kept,
        turn,
        "every earlier turn is kept or counted in the marker"
    );
    assert_eq!(ms[2]["role"], "user", "a kept turn starts at its prompt");
    let current = &ms[ms.len() - 3..];
    assert!(
        current[0]["content"]
            .as_str()
            .is_some_and(|p| p.starts_with(&format!("turn {turn}:"))),
        "{current:?}"
    );
    assert_eq!(current[2]["role"], "tool", "the current turn's round so far");
    Ok(dropped_messages)
}

#[test]
fn a_chatty_agent_of_500_turns_under_a_context_budget_sends_bounded_requests_with_the_marker() -> TestResult {
    let unbounded = chat("", COMPARED_TURNS)?;
    let bounded = chat(
        &format!("[context]\nmax_context_tokens = {MAX_TOKENS}\nmax_messages = 40\n"),
        TURNS,
    )?;
    assert_eq!(
        unbounded.len(),
        2 * COMPARED_TURNS,
        "a tool round and an answer per turn"
    );
    assert_eq!(bounded.len(), 2 * TURNS);
    // The figures for the record (app/README.md, "Context budget").
    eprintln!("unbounded, {COMPARED_TURNS} turns: {}", size_figures(&unbounded));
    eprintln!(
        "budget {MAX_TOKENS} tokens / 40 messages, {TURNS} turns: {}",
        size_figures(&bounded)
    );

    let size = |b: &Value| (messages(b).len(), b["messages"].to_string().len());
    let u = unbounded.last().ok_or("none")?;
    assert!(size(u).0 > 100, "the unbounded request grows: {}", size(u).0);
    // Bounded: within the message limit, and at most the estimator's
    // budget in bytes (4 bytes a token) plus the JSON around the text.
    for (i, body) in bounded.iter().enumerate() {
        let (n, bytes) = size(body);
        assert!(n <= 40, "request {i}: {n} messages");
        assert!(bytes < 2 * 4 * MAX_TOKENS as usize, "request {i}: {bytes} B");
        assert_calls_precede_results(body);
        assert_eq!(
            messages(body)[0]["content"],
            INSTRUCTIONS,
            "the system prompt is always first"
        );
    }
    for body in &unbounded {
        assert_calls_precede_results(body);
    }

    // The last request of the 500th turn has the shape of a cut.
    assert_cut_shape(messages(bounded.last().ok_or("none")?), TURNS - 1)?;
    // The same point of the conversation with and without the budget (the
    // echo mock answers alike): the cut request is the unbounded one with
    // the oldest turns replaced by the marker.
    let ms = messages(&bounded[2 * COMPARED_TURNS - 1]);
    let dropped_messages = assert_cut_shape(ms, COMPARED_TURNS - 1)?;
    let um = messages(u);
    assert_eq!(
        um.len() - 1,
        dropped_messages + ms.len() - 2,
        "the marker counts what was dropped"
    );
    assert_eq!(
        um[um.len() - (ms.len() - 2)..],
        ms[2..],
        "the kept turns are sent as they are"
    );
    Ok(())
}
