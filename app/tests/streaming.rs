//! Streaming, end to end against the mock LLM on loopback: the provider
//! with `[provider] stream = true` assembles SSE chunks into exactly the
//! reply a whole body gives (text and tool calls), a stream cut short or
//! malformed is a typed error and never half a reply, `run` shows the text
//! as it arrives and logs nothing of a cut stream, and `serve` streams a
//! turn as server-sent events whose last event is the non-streamed answer.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Child;
use std::sync::{Arc, Mutex};

use common::*;
use durable_agent::runtime::{AgentId, ConversationItem, ProviderRequest};
use durable_agent_cli::config::{HttpToolConfig, ProviderConfig, ToolConfig};
use durable_agent_cli::mock_llm::{MockLlm, Reply, Script};
use durable_agent_cli::observe::{Attempt, AttemptOutcome, CallObserver, TextDelta};
use durable_agent_cli::openai::{Completion, OpenAiError, OpenAiProvider};
use durable_agent_cli::retry::RecordingSleeper;
use durable_agent_cli::webhook_sink::WebhookSink;
use serde_json::{json, Value};

fn email() -> Value {
    json!({"to": "ada@example.com", "body": "the release is out"})
}

/// Attempts and text deltas, in the order they were seen.
#[derive(Debug, Default)]
struct Seen(Mutex<Vec<String>>);

impl Seen {
    fn all(&self) -> Vec<String> {
        self.0.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl CallObserver for Seen {
    fn on_attempt(&self, attempt: &Attempt) {
        let what = match &attempt.outcome {
            AttemptOutcome::Success { .. } => format!("attempt {} ok", attempt.number),
            AttemptOutcome::Failure { error, .. } => format!("attempt {} failed: {error}", attempt.number),
        };
        if let Ok(mut v) = self.0.lock() {
            v.push(what);
        }
    }

    fn on_text_delta(&self, delta: &TextDelta<'_>) {
        if let Ok(mut v) = self.0.lock() {
            v.push(format!("text {}: {}", delta.attempt, delta.text));
        }
    }
}

fn provider(mock: &MockLlm, stream: bool, max_retries: u32) -> (OpenAiProvider, Arc<Seen>) {
    let settings = ProviderConfig {
        base_url: mock.base_url(),
        model: "mock-1".to_string(),
        api_key_env: None,
        timeout_ms: 5_000,
        max_retries,
        backoff_base_ms: 10,
        backoff_max_ms: 50,
        stream,
    };
    let tools = [ToolConfig::Http(HttpToolConfig {
        name: "send_email".to_string(),
        description: "mail".to_string(),
        method: "POST".to_string(),
        url: "http://127.0.0.1:9/unused".to_string(),
        headers: Default::default(),
        allow_hosts: vec![],
        parameters: json!({"type": "object"}),
        irreversible: true,
        dedup: true,
        timeout_ms: 1_000,
    })];
    let seen = Arc::new(Seen::default());
    let provider = OpenAiProvider::new(&settings, None, &tools)
        .with_sleeper(Arc::new(RecordingSleeper::new()))
        .with_observer(seen.clone());
    (provider, seen)
}

fn complete(provider: &OpenAiProvider) -> Result<Completion, OpenAiError> {
    let agent = AgentId::from_hex("00000000000000a1").map_err(|detail| OpenAiError::Refused { detail })?;
    let history = vec![ConversationItem::Prompt { text: "hi".into() }];
    provider.complete_detailed(&ProviderRequest {
        agent: &agent,
        agent_name: "a",
        instructions: "be brief",
        history: &history,
        round: 0,
    })
}

fn mock(replies: Vec<Reply>) -> Result<MockLlm, Box<dyn std::error::Error>> {
    Ok(MockLlm::scripted(loopback(), Script::new(replies)?)?)
}

#[test]
fn a_streamed_reply_is_the_reply_a_whole_body_gives_and_its_text_is_seen_as_it_arrives() -> TestResult {
    let replies = || {
        vec![
            Reply::tool_call("send_email", email()),
            Reply::text("sent it to ada"),
        ]
    };
    let (whole_mock, streamed_mock) = (mock(replies())?, mock(replies())?);
    let (whole, _) = provider(&whole_mock, false, 0);
    let (streamed, seen) = provider(&streamed_mock, true, 0);
    for round in 0..2 {
        let (a, b) = (complete(&whole)?, complete(&streamed)?);
        if round == 0 {
            // Sent in several argument fragments, put back together.
            assert_eq!(b.reply.tool_calls.first().map(|c| &c.args), Some(&email()));
        }
        assert_eq!(
            (&a.reply.text, &a.reply.tool_calls),
            (&b.reply.text, &b.reply.tool_calls),
            "streamed and whole replies differ"
        );
        // The mock counts the request's bytes as its prompt tokens (a
        // streamed request is longer); the reply's are the same.
        let (a, b) = (
            a.usage.ok_or("no usage")?,
            b.usage.ok_or("the usage chunk was not read")?,
        );
        assert_eq!(a.completion_tokens, b.completion_tokens);
    }
    assert_eq!(
        streamed_mock.request_bodies()[0]["stream_options"],
        json!({"include_usage": true})
    );
    assert_eq!(streamed_mock.request_bodies()[0]["stream"], true);
    // A config without streaming sends what it always sent.
    assert!(whole_mock.request_bodies()[0].get("stream").is_none());
    assert_eq!(
        seen.all(),
        [
            "attempt 1 ok",
            "text 1: sent",
            "text 1:  it",
            "text 1:  to",
            "text 1:  ada",
            "attempt 1 ok"
        ],
        "the text arrives in several deltas, before its attempt ends"
    );
    Ok(())
}

#[test]
fn a_cut_stream_is_a_retryable_typed_error_never_half_a_reply() -> TestResult {
    let cut = || Reply::text("ALPHA BRAVO CHARLIE").cut_after_chunks(2);
    // Retried: the second attempt's whole reply is the reply.
    let m = mock(vec![cut(), Reply::text("DELTA ECHO")])?;
    let (p, seen) = provider(&m, true, 1);
    let done = complete(&p)?;
    assert_eq!(done.reply.text, "DELTA ECHO");
    assert_eq!(done.attempts, 2);
    let seen = seen.all();
    assert_eq!(seen[0], "text 1: ALPHA", "{seen:?}");
    assert!(
        seen[1].starts_with("attempt 1 failed: ") && seen[1].contains("cut short"),
        "{seen:?}"
    );
    // Not retried: the typed error, with the cut as its cause.
    let m = mock(vec![cut()])?;
    let (p, _) = provider(&m, true, 0);
    match complete(&p) {
        Err(OpenAiError::RetriesExhausted { attempts: 1, last }) => {
            assert!(matches!(*last, OpenAiError::StreamCut { .. }), "{last}")
        }
        other => return Err(format!("a cut stream gave {other:?}").into()),
    }
    Ok(())
}

#[test]
fn nonsense_in_a_stream_is_a_typed_error_and_a_json_body_despite_stream_is_taken() -> TestResult {
    let cases = [
        ("data: {oops\n\n", "not a completion chunk"),
        (
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n",
            "never got a name",
        ),
    ];
    for (body, want) in cases {
        let m = mock(vec![Reply::sse(body), Reply::text("never asked")])?;
        let (p, _) = provider(&m, true, 2);
        match complete(&p) {
            Err(e @ OpenAiError::MalformedResponse { .. }) => assert!(e.to_string().contains(want), "{e}"),
            other => return Err(format!("{body:?} gave {other:?}").into()),
        }
        assert_eq!(m.request_bodies().len(), 1, "a malformed stream was retried");
    }
    // A server that ignores `stream: true` and answers one JSON body.
    let whole = json!({"choices": [{"message": {"content": "whole"}, "finish_reason": "stop"}]});
    let m = mock(vec![Reply::raw(&whole.to_string())])?;
    let (p, _) = provider(&m, true, 0);
    assert_eq!(complete(&p)?.reply.text, "whole");
    Ok(())
}

/// A config whose provider streams, with `max_retries` retries.
fn streaming_config(
    dir: &std::path::Path,
    mock: &MockLlm,
    sink: &WebhookSink,
    max_retries: u32,
) -> Result<std::path::PathBuf, Box<dyn std::error::Error>> {
    let config = write_config(dir, &mock.base_url(), &sink.url("/send"), false, free_addr()?)?;
    let text = std::fs::read_to_string(&config)?;
    std::fs::write(
        &config,
        text.replace(
            "max_retries = 0",
            &format!("max_retries = {max_retries}\nstream = true"),
        ),
    )?;
    Ok(config)
}

/// Every file under `dir` holding `needle`.
fn files_holding(dir: &std::path::Path, needle: &str) -> std::io::Result<Vec<String>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            found.extend(files_holding(&path, needle)?);
        } else if String::from_utf8_lossy(&std::fs::read(&path)?).contains(needle) {
            found.push(path.display().to_string());
        }
    }
    Ok(found)
}

/// Each of `wanted` on a line of `text`, each on a later line.
fn in_order(text: &str, wanted: &[&str]) -> TestResult {
    let lines: Vec<&str> = text.lines().collect();
    let mut from = 0;
    for w in wanted {
        match lines[from..].iter().position(|l| l.contains(w)) {
            Some(i) => from += i + 1,
            None => return Err(format!("no line with {w:?} after line {from} of:\n{text}").into()),
        }
    }
    Ok(())
}

#[test]
fn run_shows_streamed_text_as_it_arrives_and_a_cut_stream_is_retried_with_nothing_of_it_logged() -> TestResult
{
    let dir = tempfile::tempdir()?;
    let mock = mock(vec![
        Reply::tool_call("send_email", email()),
        Reply::text("ALPHA BRAVO CHARLIE").cut_after_chunks(3),
        Reply::text("sent it"),
    ])?;
    let sink = WebhookSink::start(loopback(), false)?;
    let config = streaming_config(dir.path(), &mock, &sink, 1)?;
    let job = write_job(dir.path(), "job.toml", None, "tell ada")?;
    let out = run(&["run", path_str(&job), "--config", path_str(&config)])?;
    assert!(out.status.success(), "{out:?}");
    let summary = out.json()?;
    assert_eq!(summary["outcome"], "succeeded", "{summary}");
    assert_eq!(summary["response"], "sent it", "{summary}");
    assert_eq!(sink.requests(), 1);
    in_order(
        &out.stderr,
        &[
            "round 0: asking the model",
            "round 0: tool send_email [r0-c0-",
            "round 1: asking the model",
            "round 1: reply: ALPHA BRAVO",
            "round 1: provider failed: ",
            "round 1: reply: sent it",
            "run job-1: succeeded (1 tool call)",
        ],
    )?;
    assert!(out.stderr.contains("cut short"), "{}", out.stderr);
    // The cut attempt's text was shown, never logged.
    let root = dir.path().join("root");
    assert_eq!(files_holding(&root, "ALPHA")?, Vec::<String>::new());
    assert!(
        !files_holding(&root, "sent it")?.is_empty(),
        "the reply was not logged"
    );
    Ok(())
}

#[test]
fn a_run_whose_stream_is_cut_and_not_retried_fails_with_the_typed_error() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mock = mock(vec![Reply::text("ALPHA BRAVO").cut_after_chunks(2)])?;
    let sink = WebhookSink::start(loopback(), false)?;
    let config = streaming_config(dir.path(), &mock, &sink, 0)?;
    let job = write_job(dir.path(), "job.toml", None, "hello")?;
    let out = run(&["run", path_str(&job), "--config", path_str(&config)])?;
    let summary = out.json()?;
    assert_eq!(summary["outcome"], "failed", "{summary}");
    let error = summary["error"].as_str().unwrap_or_default();
    assert!(error.contains("cut short"), "{summary}");
    assert_eq!(summary["response"], Value::Null, "{summary}");
    assert_eq!(
        files_holding(&dir.path().join("root"), "ALPHA")?,
        Vec::<String>::new()
    );
    Ok(())
}

/// A daemon on a fresh root whose provider streams `replies`, with the
/// agent `mailer` created.
struct Served {
    _dir: tempfile::TempDir,
    _mock: MockLlm,
    _sink: WebhookSink,
    child: Child,
    url: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn served(replies: Vec<Reply>) -> Result<Served, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mock = mock(replies)?;
    let sink = WebhookSink::start(loopback(), false)?;
    let config = streaming_config(dir.path(), &mock, &sink, 0)?;
    let (child, url) = start_serve(&config)?;
    let served = Served {
        _dir: dir,
        _mock: mock,
        _sink: sink,
        child,
        url,
    };
    client(&served.url)?.call(
        "POST",
        "/agents",
        Some(&json!({"name": "mailer", "instructions": "Send what you are asked to."})),
    )?;
    Ok(served)
}

/// Server-sent events: (`event` name, `data` JSON), in order.
type Events = Vec<(String, Value)>;

/// `POST path` with `body`, asking for events; the status, the content
/// type and the events (`event` name, `data` JSON), in order.
fn post_streamed(
    url: &str,
    path: &str,
    body: &Value,
    token: Option<&str>,
) -> Result<(u16, String, Events), Box<dyn std::error::Error>> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(DEADLINE))
        .http_status_as_error(false)
        .build()
        .into();
    let mut request = agent
        .post(&format!("{url}{path}"))
        .header("Accept", "text/event-stream")
        .header("Content-Type", "application/json");
    if let Some(token) = token {
        request = request.header("Authorization", format!("Bearer {token}"));
    }
    let mut response = request.send(body.to_string().as_bytes())?;
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let mut events = Vec::new();
    let mut name = String::new();
    for line in BufReader::new(response.body_mut().as_reader()).lines() {
        let line = line?;
        if let Some(n) = line.strip_prefix("event: ") {
            name = n.to_string();
        } else if let Some(data) = line.strip_prefix("data: ") {
            events.push((std::mem::take(&mut name), serde_json::from_str(data)?));
        }
    }
    Ok((status, content_type, events))
}

#[test]
fn a_streamed_api_turn_sends_its_steps_in_order_and_ends_with_the_unstreamed_answer() -> TestResult {
    let replies = || vec![Reply::tool_call("send_email", email()), Reply::text("sent it")];
    let turn = json!({"prompt": "tell ada", "work_id": "w1"});
    // The same turn on two identical fresh daemons: streamed, and not.
    let streamed = served(replies())?;
    let plain = served(replies())?;
    let (status, content_type, events) =
        post_streamed(&streamed.url, "/agents/mailer/turn", &turn, Some(TEST_TOKEN))?;
    assert_eq!(status, 200);
    assert!(content_type.starts_with("text/event-stream"), "{content_type}");
    let unstreamed = client(&plain.url)?.call("POST", "/agents/mailer/turn", Some(&turn))?;

    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["round", "tool", "round", "text", "text", "end"],
        "{events:?}"
    );
    assert_eq!(events[0].1, json!({"event": "round", "round": 0}));
    let tool = &events[1].1;
    assert_eq!(
        (tool["tool"].as_str(), tool["ok"].as_bool()),
        (Some("send_email"), Some(true))
    );
    let key = unstreamed["tool_calls"][0]["idem_key"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let short = tool["key"].as_str().unwrap_or_default();
    assert!(
        short.starts_with("r0-c0-") && durable_agent_cli::progress::shorten(&key, "api:w1") == short,
        "{short} is not {key} shortened"
    );
    let text: String = events[3..5]
        .iter()
        .map(|(_, e)| e["delta"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(text, "sent it");
    let end = &events[5].1;
    assert_eq!(end["status"], 200);
    assert_eq!(
        end["body"], unstreamed,
        "the end event is not the unstreamed answer"
    );
    assert_eq!(end["body"]["response"], "sent it");
    Ok(())
}

#[test]
fn a_streamed_turn_is_refused_like_any_request() -> TestResult {
    let s = served(vec![Reply::text("never asked")])?;
    // No token: 401, plainly, before any stream.
    let (status, content_type, _) =
        post_streamed(&s.url, "/agents/mailer/turn", &json!({"prompt": "hi"}), None)?;
    assert_eq!(status, 401);
    assert!(content_type.starts_with("application/json"), "{content_type}");
    // A bad body: 400, plainly.
    let (status, _, _) = post_streamed(
        &s.url,
        "/agents/mailer/turn",
        &json!({"prompt": "hi", "nope": 1}),
        Some(TEST_TOKEN),
    )?;
    assert_eq!(status, 400);
    // An unknown agent: the stream's only event is the 404 it answers.
    let (status, _, events) = post_streamed(
        &s.url,
        "/agents/nobody/turn?stream=1",
        &json!({"prompt": "hi"}),
        Some(TEST_TOKEN),
    )?;
    assert_eq!(status, 200);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, "end");
    assert_eq!(events[0].1["status"], 404, "{events:?}");
    Ok(())
}
