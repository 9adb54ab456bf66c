//! The OpenAI-compatible provider against the scripted mock LLM on
//! loopback: round trips, retries (with Retry-After), timeouts, malformed
//! replies and an unreachable server. Waits go through a recording sleeper,
//! so no test sleeps for its backoff.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

use durable_agent::runtime::{AgentId, ConversationItem, Provider, ProviderRequest};
use durable_agent_cli::config::{HttpToolConfig, ProviderConfig, ToolConfig};
use durable_agent_cli::mock_llm::{MockLlm, Reply, Script};
use durable_agent_cli::observe::{AttemptOutcome, RecordingObserver, Usage};
use durable_agent_cli::openai::{OpenAiError, OpenAiProvider};
use durable_agent_cli::retry::RecordingSleeper;
use serde_json::json;

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn agent() -> AgentId {
    AgentId::from_hex("00000000000000a1").expect("valid agent id")
}

fn http_tool(name: &str, irreversible: bool) -> ToolConfig {
    ToolConfig::Http(HttpToolConfig {
        name: name.to_string(),
        description: format!("the {name} tool"),
        method: "POST".to_string(),
        url: "http://127.0.0.1:9/unused".to_string(),
        headers: Default::default(),
        allow_hosts: vec![],
        parameters: json!({"type": "object", "properties": {"key": {"type": "string"}}}),
        irreversible,
        dedup: irreversible,
        timeout_ms: 1_000,
    })
}

struct Harness {
    provider: OpenAiProvider,
    sleeper: Arc<RecordingSleeper>,
    observer: Arc<RecordingObserver>,
}

fn harness(base_url: String, timeout_ms: u64, max_retries: u32) -> Harness {
    let settings = ProviderConfig {
        base_url,
        model: "mock-1".to_string(),
        api_key_env: None,
        timeout_ms,
        max_retries,
        backoff_base_ms: 10,
        backoff_max_ms: 5_000,
        stream: false,
    };
    let tools = [http_tool("lookup", false), http_tool("send_email", true)];
    let sleeper = Arc::new(RecordingSleeper::new());
    let observer = Arc::new(RecordingObserver::new());
    let provider = OpenAiProvider::new(&settings, Some("test-key".to_string()), &tools)
        .with_sleeper(sleeper.clone())
        .with_observer(observer.clone());
    Harness {
        provider,
        sleeper,
        observer,
    }
}

fn scripted(replies: Vec<Reply>) -> MockLlm {
    let script = Script::new(replies).expect("valid script");
    MockLlm::scripted(loopback(), script).expect("mock starts")
}

fn prompt(text: &str) -> Vec<ConversationItem> {
    vec![ConversationItem::Prompt {
        text: text.to_string(),
    }]
}

fn request<'a>(agent: &'a AgentId, history: &'a [ConversationItem]) -> ProviderRequest<'a> {
    ProviderRequest {
        agent,
        agent_name: "tester",
        instructions: "You are a test.",
        history,
        round: 0,
    }
}

#[test]
fn tool_call_round_trip_maps_history_and_irreversible_flags() {
    let mock = scripted(vec![
        Reply {
            tool_calls: vec![
                durable_agent_cli::mock_llm::ScriptedCall {
                    name: "lookup".into(),
                    arguments: json!({"key": "a"}),
                },
                durable_agent_cli::mock_llm::ScriptedCall {
                    name: "send_email".into(),
                    arguments: json!({"to": "x@example.com"}),
                },
            ],
            ..Reply::default()
        },
        Reply::text("done"),
    ]);
    let h = harness(mock.base_url(), 2_000, 0);
    let id = agent();
    let mut history = prompt("hi");

    let first = h
        .provider
        .complete_detailed(&request(&id, &history))
        .expect("first completion");
    assert_eq!(first.reply.text, "");
    assert_eq!(first.reply.tool_calls.len(), 2);
    assert_eq!(first.reply.tool_calls[0].tool, "lookup");
    assert_eq!(first.reply.tool_calls[0].args, json!({"key": "a"}));
    assert!(!first.reply.tool_calls[0].irreversible);
    assert!(first.reply.tool_calls[1].irreversible, "flag from config");
    assert!(first.usage.is_some_and(|u| u.prompt_tokens > 0));

    history.push(ConversationItem::ToolCall {
        call_id: "s-1".into(),
        tool: "lookup".into(),
        args: json!({"key": "a"}),
        irreversible: false,
    });
    history.push(ConversationItem::ToolResult {
        call_id: "s-1".into(),
        ok: true,
        output: "value a".into(),
    });
    let second = h
        .provider
        .complete(&request(&id, &history))
        .expect("second completion");
    assert_eq!(second.text, "done");
    assert!(second.tool_calls.is_empty());

    let bodies = mock.request_bodies();
    assert_eq!(bodies.len(), 2);
    assert_eq!(bodies[0]["model"], "mock-1");
    assert_eq!(bodies[0]["tools"].as_array().map(Vec::len), Some(2));
    assert_eq!(bodies[0]["tools"][1]["function"]["name"], "send_email");
    assert_eq!(
        bodies[0]["messages"],
        json!([{"role": "system", "content": "You are a test."}, {"role": "user", "content": "hi"}])
    );
    let messages = &bodies[1]["messages"];
    assert_eq!(messages[2]["tool_calls"][0]["id"], "s-1");
    assert_eq!(
        messages[2]["tool_calls"][0]["function"]["arguments"],
        "{\"key\":\"a\"}"
    );
    assert_eq!(
        messages[3],
        json!({"role": "tool", "tool_call_id": "s-1", "content": "value a"})
    );
    let requests = mock.requests();
    assert_eq!(requests[0].header("authorization"), Some("Bearer test-key"));
    assert_eq!(h.observer.numbers(), vec![1, 1]);
}

#[test]
fn rate_limit_honours_retry_after_then_succeeds() {
    let mock = scripted(vec![Reply::status(429, Some(2)), Reply::text("ok")]);
    let h = harness(mock.base_url(), 2_000, 3);
    let id = agent();
    let history = prompt("hi");
    let done = h
        .provider
        .complete_detailed(&request(&id, &history))
        .expect("succeeds on the retry");
    assert_eq!(done.reply.text, "ok");
    assert_eq!(done.attempts, 2);
    assert_eq!(h.sleeper.slept(), vec![Duration::from_secs(2)]);
    assert_eq!(h.observer.numbers(), vec![1, 2]);
    let attempts = h.observer.attempts();
    match &attempts[0].outcome {
        AttemptOutcome::Failure { error, retry_in_ms } => {
            assert_eq!(*retry_in_ms, Some(2_000));
            assert!(
                matches!(
                    error,
                    OpenAiError::Status {
                        status: 429,
                        retry_after_ms: Some(2_000),
                        ..
                    }
                ),
                "{error:?}"
            );
        }
        other => panic!("attempt 1 should fail, got {other:?}"),
    }
    assert!(matches!(
        attempts[1].outcome,
        AttemptOutcome::Success {
            usage: Some(Usage { .. })
        }
    ));
    assert_eq!(attempts[1].agent, id.to_string());
}

#[test]
fn server_errors_until_retries_are_exhausted_is_a_typed_error() {
    let mock = scripted(vec![
        Reply::status(500, None),
        Reply::status(502, None),
        Reply::status(503, None),
    ]);
    let h = harness(mock.base_url(), 2_000, 2);
    let id = agent();
    let history = prompt("hi");
    let err = h
        .provider
        .complete_detailed(&request(&id, &history))
        .expect_err("all attempts fail");
    match &err {
        OpenAiError::RetriesExhausted { attempts, last } => {
            assert_eq!(*attempts, 3);
            assert!(
                matches!(**last, OpenAiError::Status { status: 503, .. }),
                "{last:?}"
            );
        }
        other => panic!("expected RetriesExhausted, got {other:?}"),
    }
    // Exponential backoff from 10 ms, no Retry-After.
    assert_eq!(
        h.sleeper.slept(),
        vec![Duration::from_millis(10), Duration::from_millis(20)]
    );
    assert_eq!(h.observer.numbers(), vec![1, 2, 3]);
    assert_eq!(mock.request_bodies().len(), 3);
    // At the Provider boundary it is the system crate's ProviderError (the
    // mock answers 500 past the end of its script).
    let provider_err = h
        .provider
        .complete(&request(&id, &history))
        .expect_err("script exhausted");
    assert!(
        provider_err.0.contains("gave up after 3 attempts"),
        "{provider_err}"
    );
    assert!(provider_err.0.contains("HTTP 500"), "{provider_err}");
}

#[test]
fn a_reply_slower_than_the_timeout_is_retried() {
    let mock = scripted(vec![
        Reply::text("too late").delayed(1_500),
        Reply::text("in time"),
    ]);
    let h = harness(mock.base_url(), 300, 1);
    let id = agent();
    let history = prompt("hi");
    let started = Instant::now();
    let done = h
        .provider
        .complete_detailed(&request(&id, &history))
        .expect("the retry answers in time");
    assert_eq!(done.reply.text, "in time");
    assert!(
        started.elapsed() < Duration::from_millis(1_400),
        "did not wait for the slow reply"
    );
    let attempts = h.observer.attempts();
    match &attempts[0].outcome {
        AttemptOutcome::Failure {
            error: OpenAiError::Timeout { timeout_ms, .. },
            retry_in_ms: Some(_),
        } => assert_eq!(*timeout_ms, 300),
        other => panic!("attempt 1 should time out, got {other:?}"),
    }
    assert_eq!(h.observer.numbers(), vec![1, 2]);
}

#[test]
fn malformed_replies_are_typed_errors_and_not_retried_and_bad_arguments_are_not_errors() {
    let mock = scripted(vec![
        Reply::raw("{\"choices\": [oops"),
        Reply::tool_call("lookup", json!("[1, 2]")),
        Reply {
            text: Some("x".into()),
            finish_reason: Some("mystery".into()),
            ..Reply::default()
        },
    ]);
    let h = harness(mock.base_url(), 2_000, 3);
    let id = agent();
    let history = prompt("hi");
    let run = || h.provider.complete_detailed(&request(&id, &history));
    assert!(matches!(run(), Err(OpenAiError::MalformedResponse { .. })));
    // Arguments that are not an object do not fail the reply: the call
    // carries the raw text and why (the system answers it as a failed call).
    match run() {
        Ok(done) => {
            let call = &done.reply.tool_calls[0];
            assert_eq!(call.tool, "lookup");
            assert_eq!(call.args, json!("[1, 2]"));
            let why = call.invalid_args.as_deref().unwrap_or_default();
            assert!(why.contains("not a JSON object"), "{why}");
        }
        other => panic!("expected a call with invalid_args, got {other:?}"),
    }
    assert!(matches!(run(), Err(OpenAiError::UnknownFinish { reason }) if reason == "mystery"));
    // One attempt each: resending the same request cannot fix a bad reply.
    assert_eq!(h.observer.numbers(), vec![1, 1, 1]);
    assert!(h.sleeper.slept().is_empty());
}

#[test]
fn an_unreachable_provider_is_a_clear_error() {
    let addr = {
        let listener = TcpListener::bind(loopback()).expect("bind");
        listener.local_addr().expect("addr")
        // Dropped here: nothing listens on `addr` any more.
    };
    let h = harness(format!("http://{addr}/v1"), 1_000, 1);
    let id = agent();
    let history = prompt("hi");
    let err = h
        .provider
        .complete(&request(&id, &history))
        .expect_err("nothing listens");
    assert!(err.0.contains(&addr.to_string()), "{err}");
    assert!(err.0.contains("gave up after 2 attempts"), "{err}");
    assert!(err.0.contains("is the provider running"), "{err}");
    assert_eq!(h.observer.numbers(), vec![1, 2]);
}

#[test]
fn echo_mode_asks_for_a_tool_then_answers() {
    let mock = MockLlm::echo(loopback()).expect("mock starts");
    let h = harness(mock.base_url(), 2_000, 0);
    let id = agent();
    let mut history = prompt("ping");
    let first = h.provider.complete(&request(&id, &history)).expect("tool call");
    assert_eq!(first.tool_calls.len(), 1);
    assert_eq!(first.tool_calls[0].tool, "lookup");
    history.push(ConversationItem::ToolCall {
        call_id: "c".into(),
        tool: "lookup".into(),
        args: first.tool_calls[0].args.clone(),
        irreversible: false,
    });
    history.push(ConversationItem::ToolResult {
        call_id: "c".into(),
        ok: true,
        output: "pong".into(),
    });
    let second = h.provider.complete(&request(&id, &history)).expect("text");
    assert_eq!(second.text, "echo: ping (tool said: pong)");
}

/// The tools a request offers are the asking agent's own: the
/// orchestration tools its grant leaves out are not offered at all.
#[test]
fn each_agent_is_offered_only_the_orchestration_tools_granted_to_it() {
    let mock = scripted(vec![Reply::text("a"), Reply::text("b"), Reply::text("c")]);
    let text = format!(
        "[provider]\nbase_url = \"{}\"\nmodel = \"mock-1\"\n\n\
         [[tools]]\nkind = \"spawn_agent\"\n[[tools]]\nkind = \"send_message\"\n[[tools]]\nkind = \"list_agents\"\n\n\
         [orchestration]\ndefault_tools = [\"send_message\"]\nagents = {{ boss = [\"spawn_agent\", \"send_message\", \"list_agents\"], mute = [] }}\n",
        mock.base_url()
    );
    let config = durable_agent_cli::config::Config::parse(std::path::Path::new("/etc/agent.toml"), &text)
        .expect("valid");
    let provider = OpenAiProvider::with_key(&config, None);
    let id = agent();
    let history = prompt("hi");
    for name in ["boss", "worker", "mute"] {
        let request = ProviderRequest {
            agent_name: name,
            ..request(&id, &history)
        };
        provider.complete(&request).expect("completes");
    }
    let offered: Vec<Vec<String>> = mock
        .request_bodies()
        .iter()
        .map(|b| {
            b["tools"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["function"]["name"].as_str().map(str::to_string))
                .collect()
        })
        .collect();
    assert_eq!(
        offered,
        [
            vec!["spawn_agent", "send_message", "list_agents"],
            vec!["send_message"],
            vec![],
        ]
    );
    assert!(
        mock.request_bodies()[2].get("tools").is_none(),
        "no tool to offer: no `tools` key"
    );
}
