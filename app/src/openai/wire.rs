//! The chat-completions wire format: the request body built from a
//! `ProviderRequest`, and the reply parsed into a `ProviderReply`.
//!
//! Invariant: parsing is total — any body (not JSON, missing `choices`,
//! an unknown `finish_reason`) yields a `ProviderReply` or an
//! [`OpenAiError`], never a panic; tool-call arguments that are not a JSON
//! object do not fail the reply: the call carries the raw text and
//! `invalid_args` (the system answers it as a failed call the model can
//! correct); and a parsed reply's `irreversible` flags come from the
//! config, never from the model.

use std::collections::BTreeMap;

use durable_agent::runtime::{ConversationItem, ProviderReply, ProviderRequest, ToolRequest};
use serde::Deserialize;
use serde_json::{json, Value};

use super::OpenAiError;
use crate::http::excerpt;
use crate::observe::Usage;

/// A tool as offered to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: Value,
    pub irreversible: bool,
}

/// Whether the reply is asked for whole or as server-sent events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// One JSON body (the request carries no `stream` key at all, so a
    /// non-streaming config sends the bytes it always sent).
    Whole,
    /// `stream: true`, with the usage in the last chunk.
    Streamed,
}

/// The JSON body of one chat-completions request.
pub fn request_body(
    model: &str,
    tools: &[&ToolSpec],
    request: &ProviderRequest<'_>,
    delivery: Delivery,
) -> Value {
    let mut body = json!({
        "model": model,
        "messages": messages(request),
    });
    if delivery == Delivery::Streamed {
        body["stream"] = json!(true);
        // Without it a stream carries no token counts (seed 000 keeps them).
        body["stream_options"] = json!({"include_usage": true});
    }
    if !tools.is_empty() {
        let specs: Vec<Value> = tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                })
            })
            .collect();
        body["tools"] = Value::Array(specs);
    }
    body
}

/// `system` (the instructions), then the history: a prompt is a user
/// message; consecutive tool calls are one assistant message with
/// `tool_calls`; each result is a `tool` message answering its call id; a
/// response is an assistant message.
pub fn messages(request: &ProviderRequest<'_>) -> Vec<Value> {
    let mut out = Vec::with_capacity(request.history.len() + 1);
    if !request.instructions.is_empty() {
        out.push(json!({"role": "system", "content": request.instructions}));
    }
    let mut pending_calls: Vec<Value> = Vec::new();
    for item in request.history {
        if !matches!(item, ConversationItem::ToolCall { .. }) && !pending_calls.is_empty() {
            out.push(assistant_calls(std::mem::take(&mut pending_calls)));
        }
        match item {
            ConversationItem::Prompt { text } => out.push(json!({"role": "user", "content": text})),
            ConversationItem::ToolCall {
                call_id, tool, args, ..
            } => pending_calls.push(json!({
                "id": call_id,
                "type": "function",
                // The API wants the arguments as a JSON *string*; a string
                // here is the raw text of arguments the model got wrong
                // (`invalid_args`), sent back as the model wrote it.
                "function": {"name": tool, "arguments": match args {
                    Value::String(raw) => raw.clone(),
                    other => other.to_string(),
                }},
            })),
            ConversationItem::ToolResult { call_id, ok, output } => {
                // The model must be able to tell a failed tool from a
                // successful one whose output happens to look like an error.
                let content = if *ok {
                    output.clone()
                } else {
                    format!("error: {output}")
                };
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": content}));
            }
            ConversationItem::Response { text } => out.push(json!({"role": "assistant", "content": text})),
        }
    }
    if !pending_calls.is_empty() {
        out.push(assistant_calls(pending_calls));
    }
    out
}

fn assistant_calls(calls: Vec<Value>) -> Value {
    json!({"role": "assistant", "content": Value::Null, "tool_calls": calls})
}

#[derive(Deserialize)]
struct ChatResponse {
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<UsageWire>,
}

/// One choice of a reply: parsed from a whole body, or assembled from a
/// stream's chunks (`super::stream`), then judged by [`reply_from`].
#[derive(Deserialize)]
pub(super) struct Choice {
    pub(super) message: MessageWire,
    #[serde(default)]
    pub(super) finish_reason: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct MessageWire {
    #[serde(default)]
    pub(super) content: Option<String>,
    #[serde(default)]
    pub(super) tool_calls: Option<Vec<ToolCallWire>>,
    #[serde(default)]
    pub(super) refusal: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct ToolCallWire {
    pub(super) function: FunctionWire,
}

#[derive(Deserialize)]
pub(super) struct FunctionWire {
    pub(super) name: String,
    /// A string holding JSON, as OpenAI sends it; some compatible servers
    /// send the object itself, or `null` for no arguments. Taken as any
    /// JSON value so that none of them fails the whole reply
    /// ([`tool_arguments`] judges it).
    #[serde(default)]
    pub(super) arguments: Value,
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub(super) struct UsageWire {
    #[serde(default)]
    pub(super) prompt_tokens: u64,
    #[serde(default)]
    pub(super) completion_tokens: u64,
}

/// Parse a 2xx body. `irreversible` maps tool names to their config flag
/// (a tool the config does not know is reversible: the executor then
/// answers it with `ok: false`, it is never routed to an outbox).
pub fn parse_reply(
    body: &str,
    irreversible: &BTreeMap<String, bool>,
) -> Result<(ProviderReply, Option<Usage>), OpenAiError> {
    let malformed = |detail: String| OpenAiError::MalformedResponse {
        detail,
        body_excerpt: excerpt(body, 200),
    };
    let parsed: ChatResponse =
        serde_json::from_str(body).map_err(|e| malformed(format!("not a chat completion: {e}")))?;
    let choice = parsed
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| malformed("`choices` is empty".into()))?;
    reply_from(choice, parsed.usage, irreversible, &malformed)
}

/// The reply a choice stands for — the one judgement of finish reasons,
/// tool calls and usage, whether the choice came whole or streamed.
pub(super) fn reply_from(
    choice: Choice,
    usage: Option<UsageWire>,
    irreversible: &BTreeMap<String, bool>,
    malformed: &dyn Fn(String) -> OpenAiError,
) -> Result<(ProviderReply, Option<Usage>), OpenAiError> {
    let usage = usage.map(|u| Usage {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
    });
    let calls = choice.message.tool_calls.unwrap_or_default();
    match choice.finish_reason.as_deref() {
        // Absent/null: some compatible servers omit it; judge by content.
        None | Some("stop") | Some("tool_calls") => {}
        // A truncated answer: the tool-call arguments (if any) are checked
        // below; a truncated text is still the model's answer.
        Some("length") => tracing::warn!("completion truncated (finish_reason = length)"),
        Some("content_filter") => {
            return Err(OpenAiError::Refused {
                detail: choice
                    .message
                    .refusal
                    .unwrap_or_else(|| "finish_reason = content_filter".into()),
            })
        }
        Some(other) => {
            return Err(OpenAiError::UnknownFinish {
                reason: other.to_string(),
            })
        }
    }
    if choice.finish_reason.as_deref() == Some("tool_calls") && calls.is_empty() {
        return Err(malformed("finish_reason = tool_calls but no tool_calls".into()));
    }
    let mut tool_calls = Vec::with_capacity(calls.len());
    for call in calls {
        let name = call.function.name;
        let irreversible = irreversible.get(&name).copied().unwrap_or(false);
        let (args, invalid_args) = match call.function.arguments {
            Value::String(raw) => tool_arguments(&raw),
            sent => tool_arguments_sent_as_json(sent),
        };
        if let Some(detail) = &invalid_args {
            // The model's mistake, not the reply's: the call is answered as
            // a failed tool call it can correct (the turn goes on).
            tracing::warn!(tool = %name, detail, "tool-call arguments unusable");
        }
        tool_calls.push(ToolRequest {
            tool: name,
            args,
            irreversible,
            invalid_args,
        });
    }
    let text = choice.message.content.unwrap_or_default();
    // The runtime persists every call's usage (seed 000) from the reply.
    let runtime_usage = usage.map(|u| durable_agent::runtime::Usage {
        input_tokens: u.prompt_tokens,
        output_tokens: u.completion_tokens,
    });
    Ok((
        ProviderReply {
            text,
            tool_calls,
            usage: runtime_usage,
        },
        usage,
    ))
}

/// A call's arguments as the model sent them: a JSON object, or — not
/// JSON, or JSON that is not an object — the raw text, with why it cannot
/// be used. Some servers send "" for a function without parameters: `{}`.
fn tool_arguments(raw: &str) -> (Value, Option<String>) {
    if raw.trim().is_empty() {
        return (Value::Object(serde_json::Map::new()), None);
    }
    match serde_json::from_str::<Value>(raw) {
        Ok(args) if args.is_object() => (args, None),
        Ok(_) => (
            Value::String(raw.to_string()),
            Some(format!("not a JSON object: {}", excerpt(raw, 120))),
        ),
        Err(e) => (
            Value::String(raw.to_string()),
            Some(format!("not JSON ({e}): {}", excerpt(raw, 120))),
        ),
    }
}

/// Arguments a server sent as JSON rather than as a string holding it:
/// an object is the arguments, `null` none (`{}`, as `""` is), anything
/// else the model's mistake, carried as its JSON text like a string that
/// is not an object.
fn tool_arguments_sent_as_json(sent: Value) -> (Value, Option<String>) {
    match sent {
        Value::Object(_) => (sent, None),
        Value::Null => (Value::Object(serde_json::Map::new()), None),
        other => tool_arguments(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use durable_agent::runtime::AgentId;

    fn agent() -> AgentId {
        AgentId::from_hex("00000000000000aa").expect("valid id")
    }

    #[test]
    fn history_maps_to_chat_messages() {
        let history = vec![
            ConversationItem::Prompt { text: "hi".into() },
            ConversationItem::ToolCall {
                call_id: "c1".into(),
                tool: "lookup".into(),
                args: json!({"k": 1}),
                irreversible: false,
            },
            ConversationItem::ToolResult {
                call_id: "c1".into(),
                ok: false,
                output: "boom".into(),
            },
            ConversationItem::Response { text: "done".into() },
            ConversationItem::Prompt { text: "again".into() },
            ConversationItem::ToolCall {
                call_id: "c2".into(),
                tool: "lookup".into(),
                args: json!("{\"k\": "),
                irreversible: false,
            },
        ];
        let id = agent();
        let req = ProviderRequest {
            agent: &id,
            agent_name: "a",
            instructions: "be brief",
            history: &history,
            round: 1,
        };
        let m = messages(&req);
        assert_eq!(m.len(), 7);
        assert_eq!(m[0]["role"], "system");
        assert_eq!(m[1], json!({"role": "user", "content": "hi"}));
        assert_eq!(m[2]["tool_calls"][0]["function"]["arguments"], "{\"k\":1}");
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "c1", "content": "error: boom"})
        );
        assert_eq!(m[4], json!({"role": "assistant", "content": "done"}));
        // Unusable arguments go back as the model wrote them.
        assert_eq!(m[6]["tool_calls"][0]["function"]["arguments"], "{\"k\": ");
    }

    #[test]
    fn malformed_bodies_are_typed_errors() {
        let none = BTreeMap::new();
        let cases = [
            ("not json", "not a chat completion"),
            ("{}", "missing field `choices`"),
            (r#"{"choices": []}"#, "`choices` is empty"),
            (
                r#"{"choices":[{"message":{"content":"x"},"finish_reason":"weird"}]}"#,
                "weird",
            ),
            (
                r#"{"choices":[{"message":{"content":null},"finish_reason":"tool_calls"}]}"#,
                "no tool_calls",
            ),
        ];
        for (body, want) in cases {
            match parse_reply(body, &none) {
                Ok(r) => panic!("{body}: parsed as {r:?}"),
                Err(e) => assert!(e.to_string().contains(want), "{body}: {e}"),
            }
        }
    }

    #[test]
    fn unusable_tool_arguments_are_a_failed_call_not_a_failed_reply() {
        let flags = BTreeMap::from([("send".to_string(), true)]);
        let body = r#"{"choices":[{"message":{"content":null,"tool_calls":[
            {"id":"a","type":"function","function":{"name":"send","arguments":"{\"to\": \"x\""}},
            {"id":"b","type":"function","function":{"name":"other","arguments":"[1]"}},
            {"id":"c","type":"function","function":{"name":"other","arguments":"{\"k\":2}"}}]},
            "finish_reason":"tool_calls"}]}"#;
        let (reply, _) = parse_reply(body, &flags).expect("the reply parses");
        let calls = &reply.tool_calls;
        assert_eq!(calls.len(), 3);
        // Not JSON: the raw text, why, and the config's flag.
        assert_eq!(calls[0].tool, "send");
        assert_eq!(calls[0].args, json!("{\"to\": \"x\""));
        assert!(calls[0].irreversible);
        let why = calls[0].invalid_args.as_deref().unwrap_or_default();
        assert!(why.starts_with("not JSON (") && why.contains("{\"to\""), "{why}");
        // JSON, not an object.
        assert_eq!(calls[1].args, json!("[1]"));
        assert!(
            calls[1]
                .invalid_args
                .as_deref()
                .is_some_and(|d| d.contains("not a JSON object: [1]")),
            "{:?}",
            calls[1]
        );
        // Well-formed: no `invalid_args`, and none serialised.
        assert_eq!(calls[2].args, json!({"k": 2}));
        assert_eq!(calls[2].invalid_args, None);
        let wire = serde_json::to_value(&calls[2]).expect("serialises");
        assert!(wire.get("invalid_args").is_none(), "{wire}");
    }

    /// Servers that send `arguments` as JSON, not as a string holding it:
    /// no reply fails for it (found by a review: `null` and an object
    /// failed the whole reply as malformed, which is not retried).
    #[test]
    fn arguments_sent_as_json_rather_than_as_text_are_taken() {
        let body = r#"{"choices":[{"message":{"content":null,"tool_calls":[
            {"id":"a","type":"function","function":{"name":"lookup","arguments":{"key":"a"}}},
            {"id":"b","type":"function","function":{"name":"lookup","arguments":null}},
            {"id":"c","type":"function","function":{"name":"lookup"}},
            {"id":"d","type":"function","function":{"name":"lookup","arguments":[1]}},
            {"id":"e","type":"function","function":{"name":"lookup","arguments":7}}]},
            "finish_reason":"tool_calls"}]}"#;
        let (reply, _) = parse_reply(body, &BTreeMap::new()).expect("the reply parses");
        let calls = &reply.tool_calls;
        assert_eq!(calls.len(), 5);
        assert_eq!(
            (&calls[0].args, &calls[0].invalid_args),
            (&json!({"key": "a"}), &None)
        );
        assert_eq!((&calls[1].args, &calls[1].invalid_args), (&json!({}), &None));
        assert_eq!((&calls[2].args, &calls[2].invalid_args), (&json!({}), &None));
        for (call, raw) in [(&calls[3], "[1]"), (&calls[4], "7")] {
            assert_eq!(call.args, json!(raw));
            let why = call.invalid_args.as_deref().unwrap_or_default();
            assert!(why.contains(&format!("not a JSON object: {raw}")), "{why}");
        }
    }

    #[test]
    fn irreversible_flag_comes_from_config() {
        let flags = BTreeMap::from([("send".to_string(), true)]);
        let body = r#"{"choices":[{"message":{"content":null,"tool_calls":[
            {"id":"a","type":"function","function":{"name":"send","arguments":"{\"to\":\"x\"}"}},
            {"id":"b","type":"function","function":{"name":"other","arguments":""}}]},
            "finish_reason":"tool_calls"}],"usage":{"prompt_tokens":7,"completion_tokens":3}}"#;
        let (reply, usage) = parse_reply(body, &flags).expect("valid");
        assert!(reply.tool_calls[0].irreversible);
        assert!(!reply.tool_calls[1].irreversible);
        assert_eq!(reply.tool_calls[1].args, json!({}));
        assert!(reply.tool_calls.iter().all(|c| c.invalid_args.is_none()));
        assert_eq!(
            usage,
            Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 3
            })
        );
    }
}
