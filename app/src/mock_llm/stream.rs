//! The mock's streamed answers: a completion the mock would have sent
//! whole, as the server-sent-event chunks an OpenAI-compatible server
//! sends for `stream: true` — the text split at word boundaries into
//! several deltas, each tool call's arguments in several fragments, then
//! the finish reason, the usage (if the request asked for it) and
//! `data: [DONE]`.
//!
//! Invariant: the chunks are derived from the whole completion and
//! nothing else, so a streamed answer assembles into exactly the reply
//! the same request would have got whole; a scripted cut
//! (`cut_after_chunks`) sends a prefix of those chunks, never others.

use serde_json::{json, Value};

/// Pieces a tool call's arguments are sent in.
const ARGUMENT_FRAGMENTS: usize = 3;

/// Whether the request asked for a stream.
pub fn wants_stream(request: &Value) -> bool {
    request.get("stream").and_then(Value::as_bool) == Some(true)
}

/// The `data:` payloads streaming `completion` (a whole
/// `chat.completion` body the mock built), `[DONE]` last.
pub fn chunks(request: &Value, completion: &Value) -> Vec<String> {
    let base = |choices: Value| {
        json!({
            "id": completion["id"],
            "object": "chat.completion.chunk",
            "created": completion["created"],
            "model": completion["model"],
            "choices": choices,
        })
    };
    let delta = |delta: Value| base(json!([{"index": 0, "delta": delta, "finish_reason": null}]));
    let choice = &completion["choices"][0];
    let message = &choice["message"];
    let mut out = vec![delta(json!({"role": "assistant", "content": ""}))];
    if let Some(text) = message["content"].as_str() {
        for word in words(text) {
            out.push(delta(json!({"content": word})));
        }
    }
    for (i, call) in message["tool_calls"].as_array().into_iter().flatten().enumerate() {
        out.push(delta(json!({"tool_calls": [{
            "index": i, "id": call["id"], "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }]})));
        let arguments = call["function"]["arguments"].as_str().unwrap_or_default();
        for piece in fragments(arguments, ARGUMENT_FRAGMENTS) {
            out.push(delta(
                json!({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}),
            ));
        }
    }
    out.push(base(
        json!([{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]),
    ));
    if request["stream_options"]["include_usage"].as_bool() == Some(true) {
        let mut usage = base(json!([]));
        usage["usage"] = completion["usage"].clone();
        out.push(usage);
    }
    let mut out: Vec<String> = out.iter().map(Value::to_string).collect();
    out.push("[DONE]".to_string());
    out
}

/// `text` cut before each space: "sent it" → "sent", " it".
fn words(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, c) in text.char_indices() {
        if c == ' ' && i > start {
            out.push(&text[start..i]);
            start = i;
        }
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

/// `text` in at most `n` pieces of about equal length (char boundaries).
fn fragments(text: &str, n: usize) -> Vec<&str> {
    let chars = text.chars().count();
    let size = chars.div_ceil(n.max(1)).max(1);
    let mut out = Vec::new();
    let mut start = 0;
    for (count, (i, _)) in text.char_indices().enumerate() {
        if count > 0 && count % size == 0 {
            out.push(&text[start..i]);
            start = i;
        }
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

/// One SSE event carrying `data`.
pub fn event(data: &str) -> String {
    format!("data: {data}\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_arguments_are_split_and_rejoin_exactly() {
        assert_eq!(words("sent it now"), ["sent", " it", " now"]);
        assert_eq!(words(" x"), [" x"]);
        assert_eq!(fragments("{\"to\":\"é\"}", 3).concat(), "{\"to\":\"é\"}");
        assert_eq!(fragments("{\"to\":\"é\"}", 3).len(), 3);
        assert!(fragments("", 3).is_empty());
    }

    #[test]
    fn chunks_end_with_finish_usage_and_done() {
        let completion = json!({"id": "mock-0", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "a b"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2}});
        let asked = json!({"stream": true, "stream_options": {"include_usage": true}});
        let c = chunks(&asked, &completion);
        assert_eq!(c.last().map(String::as_str), Some("[DONE]"));
        assert!(c[c.len() - 2].contains("\"completion_tokens\":2"), "{c:?}");
        assert!(c[c.len() - 3].contains("\"finish_reason\":\"stop\""), "{c:?}");
        // No usage chunk unless asked.
        assert_eq!(chunks(&json!({"stream": true}), &completion).len(), c.len() - 1);
    }
}
