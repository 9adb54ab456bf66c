//! A streamed chat completion (`stream: true`): the server-sent-events body
//! read line by line, its `data:` chunks assembled into the one choice a
//! whole body would have carried, then judged by the same
//! [`super::wire::reply_from`] — so a streamed reply reaches the runtime
//! exactly as a non-streamed one would (same type, same checks, same
//! logging: only the complete reply is ever logged).
//!
//! Invariant: a reply comes out of here only from a stream that said it
//! was complete — `data: [DONE]`, or a `finish_reason` followed by a clean
//! end of the body. A stream that ends before either is
//! [`OpenAiError::StreamCut`] (retryable, like a dropped connection), a
//! chunk that is not JSON or tool-call fragments that cannot be put
//! together are [`OpenAiError::MalformedResponse`] (not retryable): a half
//! reply is never taken for a whole one. The text deltas handed to the
//! caller on the way are for watching only. Reading is bounded: at most
//! `limit_bytes` in all and [`MAX_LINE_BYTES`] per line.
//!
//! The SSE parser is written here rather than taken from a crate: the
//! maintained ones (eventsource-stream, reqwest-eventsource) are async and
//! this crate is deliberately synchronous (ureq), and the part of the
//! format a completion uses is a few lines (`data:` fields, blank-line
//! dispatch, `:` comments; `event:`/`id:`/`retry:` ignored).

use std::collections::BTreeMap;
use std::io::BufRead;

use serde::Deserialize;
use serde_json::Value;

use super::wire::{reply_from, Choice, FunctionWire, MessageWire, ToolCallWire, UsageWire};
use super::OpenAiError;
use crate::http::{excerpt, TransportFailure};
use crate::observe::Usage;
use durable_agent::runtime::ProviderReply;

/// Longest SSE line accepted (a chunk is one line; a few KB in practice).
pub const MAX_LINE_BYTES: u64 = 1024 * 1024;

/// The end-of-stream sentinel OpenAI-compatible servers send.
const DONE: &str = "[DONE]";

/// The SSE field parser: lines in, each event's `data` out.
#[derive(Debug, Default)]
pub struct SseDecoder {
    data: String,
    has_data: bool,
}

impl SseDecoder {
    /// One line without its line ending. Returns the data of the event a
    /// blank line completes, if it had any.
    pub fn line(&mut self, line: &str) -> Option<String> {
        if line.is_empty() {
            if !self.has_data {
                return None;
            }
            self.has_data = false;
            return Some(std::mem::take(&mut self.data));
        }
        if line.starts_with(':') {
            return None; // a comment (keep-alive)
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        if field == "data" {
            // Several data lines in one event are joined with newlines.
            if self.has_data {
                self.data.push('\n');
            }
            self.data.push_str(value);
            self.has_data = true;
        }
        None
    }

    /// The body ended: an event without its closing blank line is dropped
    /// (the spec's rule — it may be cut), except the end sentinel, which
    /// cannot be half of anything.
    pub fn end(&mut self) -> Option<String> {
        (self.has_data && self.data == DONE).then(|| std::mem::take(&mut self.data))
    }
}

#[derive(Deserialize)]
struct ChunkWire {
    #[serde(default)]
    choices: Vec<ChunkChoice>,
    #[serde(default)]
    usage: Option<UsageWire>,
    /// Some servers report a failure mid-stream as a chunk.
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    index: u32,
    #[serde(default)]
    delta: Option<DeltaWire>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct DeltaWire {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolDeltaWire>>,
}

#[derive(Deserialize)]
struct ToolDeltaWire {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDeltaWire>,
}

#[derive(Deserialize)]
struct FunctionDeltaWire {
    #[serde(default)]
    name: Option<String>,
    /// A fragment of the arguments' text; a server that sends JSON
    /// instead of text gets its JSON text (`null`: nothing).
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Debug, Default)]
struct PartialCall {
    id: Option<String>,
    name: String,
    arguments: String,
}

/// The reply so far, chunk by chunk.
#[derive(Debug, Default)]
pub struct Assembly {
    chunks: usize,
    text: Option<String>,
    refusal: Option<String>,
    calls: BTreeMap<u32, PartialCall>,
    finish_reason: Option<String>,
    usage: Option<UsageWire>,
    done: bool,
}

/// What one event did.
#[derive(Debug, PartialEq, Eq)]
pub enum Fed {
    /// A chunk; its text, if it carried any.
    Chunk(Option<String>),
    /// `[DONE]`: nothing after it is read.
    Done,
}

impl Assembly {
    /// One event's data.
    pub fn feed(&mut self, data: &str, url: &str) -> Result<Fed, OpenAiError> {
        if data.trim() == DONE {
            self.done = true;
            return Ok(Fed::Done);
        }
        let number = self.chunks + 1;
        let malformed = |detail: String| OpenAiError::MalformedResponse {
            detail: format!("stream chunk {number}: {detail}"),
            body_excerpt: excerpt(data, 200),
        };
        let chunk: ChunkWire =
            serde_json::from_str(data).map_err(|e| malformed(format!("not a completion chunk: {e}")))?;
        self.chunks = number;
        if let Some(error) = chunk.error {
            let detail = error
                .get("message")
                .and_then(serde_json::Value::as_str)
                .map_or_else(|| excerpt(&error.to_string(), 200), str::to_string);
            return Err(OpenAiError::StreamCut {
                url: url.to_string(),
                detail: format!("the server sent an error mid-stream: {detail}"),
            });
        }
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        let mut text = None;
        // We ask for one choice (no `n`); a server sending others is
        // answered as if it had not.
        for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
            if let Some(reason) = choice.finish_reason {
                self.finish_reason = Some(reason);
            }
            let Some(delta) = choice.delta else { continue };
            if let Some(piece) = delta.content.filter(|p| !p.is_empty()) {
                self.text.get_or_insert_with(String::new).push_str(&piece);
                text.get_or_insert_with(String::new).push_str(&piece);
            }
            if let Some(piece) = delta.refusal {
                self.refusal.get_or_insert_with(String::new).push_str(&piece);
            }
            for fragment in delta.tool_calls.unwrap_or_default() {
                self.call_fragment(fragment).map_err(&malformed)?;
            }
        }
        Ok(Fed::Chunk(text))
    }

    /// Put a tool-call fragment with the call it continues: by `index`
    /// (OpenAI's); without one, a fragment with a new `id` starts a call
    /// and any other continues the last (servers that omit the index).
    fn call_fragment(&mut self, fragment: ToolDeltaWire) -> Result<(), String> {
        // An empty id is no id (some servers send `""` in continuations).
        let fragment_id = fragment.id.filter(|s| !s.is_empty());
        let last = self.calls.last_key_value().map(|(i, c)| (*i, c.id.clone()));
        let index = match (fragment.index, last) {
            (Some(i), _) => i,
            (None, None) => 0,
            (None, Some((i, id))) => match (&fragment_id, id) {
                (Some(new), Some(old)) if *new != old => i + 1,
                (Some(_), None) if !self.calls.is_empty() => i + 1,
                _ => i,
            },
        };
        let call = self.calls.entry(index).or_default();
        if let Some(id) = fragment_id {
            match &call.id {
                Some(old) if *old != id => {
                    return Err(format!("tool call {index} changed its id from {old:?} to {id:?}"))
                }
                _ => call.id = Some(id),
            }
        }
        if let Some(function) = fragment.function {
            if let Some(name) = function.name.filter(|s| !s.is_empty()) {
                // Sent whole in the call's first fragment; some servers
                // repeat it in every fragment.
                if call.name.is_empty() {
                    call.name = name;
                } else if call.name != name {
                    return Err(format!(
                        "tool call {index} renamed from {:?} to {name:?}",
                        call.name
                    ));
                }
            }
            match function.arguments {
                Some(Value::String(piece)) => call.arguments.push_str(&piece),
                None | Some(Value::Null) => {}
                Some(sent) => call.arguments.push_str(&sent.to_string()),
            }
        }
        Ok(())
    }

    /// The body ended: the reply, if the stream said it was complete.
    pub fn finish(
        self,
        url: &str,
        irreversible: &BTreeMap<String, bool>,
    ) -> Result<(ProviderReply, Option<Usage>), OpenAiError> {
        if !self.done && self.finish_reason.is_none() {
            return Err(OpenAiError::StreamCut {
                url: url.to_string(),
                detail: format!(
                    "the body ended after {} chunk(s) with neither a finish_reason nor [DONE]",
                    self.chunks
                ),
            });
        }
        let summary = format!(
            "{} chunk(s), {} text bytes, {} tool call(s)",
            self.chunks,
            self.text.as_ref().map_or(0, String::len),
            self.calls.len()
        );
        let malformed = |detail: String| OpenAiError::MalformedResponse {
            detail,
            body_excerpt: summary.clone(),
        };
        if self.chunks == 0 {
            return Err(malformed("the stream held no chunk before [DONE]".into()));
        }
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (index, call) in self.calls {
            if call.name.is_empty() {
                return Err(malformed(format!(
                    "streamed tool call {index} never got a name (arguments: {})",
                    excerpt(&call.arguments, 80)
                )));
            }
            // Arguments that are not a JSON object, in a stream that
            // completed, are the model's mistake as in a whole body: the
            // call is answered as failed (`invalid_args`), the turn goes on.
            tool_calls.push(ToolCallWire {
                function: FunctionWire {
                    name: call.name,
                    arguments: Value::String(call.arguments),
                },
            });
        }
        let choice = Choice {
            message: MessageWire {
                content: self.text,
                tool_calls: (!tool_calls.is_empty()).then_some(tool_calls),
                refusal: self.refusal,
            },
            finish_reason: self.finish_reason,
        };
        reply_from(choice, self.usage, irreversible, &malformed)
    }
}

/// Read an SSE body to its complete reply, handing each text delta to
/// `on_text` as it arrives. `transport` names a read failure (a timeout,
/// a reset) the way the request's own failures are named.
pub fn read(
    body: &mut dyn BufRead,
    limit_bytes: u64,
    url: &str,
    irreversible: &BTreeMap<String, bool>,
    transport: &dyn Fn(TransportFailure) -> OpenAiError,
    on_text: &mut dyn FnMut(&str),
) -> Result<(ProviderReply, Option<Usage>), OpenAiError> {
    let mut decoder = SseDecoder::default();
    let mut assembly = Assembly::default();
    let mut read_bytes: u64 = 0;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = std::io::Read::take(&mut *body, MAX_LINE_BYTES + 1)
            .read_until(b'\n', &mut line)
            // ureq wraps its own errors (a timeout) in io::Error; From unwraps.
            .map_err(|e| transport(crate::http::classify(&ureq::Error::from(e))))?;
        read_bytes = read_bytes.saturating_add(n as u64);
        if read_bytes > limit_bytes {
            return Err(transport(TransportFailure::Fatal(format!(
                "streamed body exceeds {limit_bytes} bytes"
            ))));
        }
        if n as u64 > MAX_LINE_BYTES {
            return Err(OpenAiError::MalformedResponse {
                detail: format!("a stream line exceeds {MAX_LINE_BYTES} bytes"),
                body_excerpt: excerpt(&String::from_utf8_lossy(&line[..200.min(line.len())]), 200),
            });
        }
        let event = if n == 0 {
            decoder.end()
        } else {
            let text = String::from_utf8_lossy(&line);
            decoder.line(text.trim_end_matches(['\n', '\r']))
        };
        if let Some(data) = event {
            match assembly.feed(&data, url)? {
                Fed::Done => break,
                Fed::Chunk(Some(text)) => on_text(&text),
                Fed::Chunk(None) => {}
            }
        }
        if n == 0 {
            break;
        }
    }
    assembly.finish(url, irreversible)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    type Outcome = Result<(ProviderReply, Option<Usage>), OpenAiError>;

    fn run(body: &str) -> (Outcome, Vec<String>) {
        let flags = BTreeMap::from([("send".to_string(), true)]);
        let mut deltas = Vec::new();
        let mut reader = std::io::Cursor::new(body.as_bytes().to_vec());
        let result = read(
            &mut reader,
            1 << 20,
            "http://x/chat/completions",
            &flags,
            &|f| OpenAiError::Transport {
                url: "x".into(),
                detail: f.to_string(),
            },
            &mut |t| deltas.push(t.to_string()),
        );
        (result, deltas)
    }

    fn sse(chunks: &[serde_json::Value], done: bool) -> String {
        let mut body = String::from(": keep-alive\n\n");
        for c in chunks {
            body.push_str(&format!("data: {c}\r\n\r\n"));
        }
        if done {
            body.push_str("data: [DONE]\n\n");
        }
        body
    }

    fn text_chunk(t: &str) -> serde_json::Value {
        json!({"choices": [{"index": 0, "delta": {"content": t}, "finish_reason": null}]})
    }

    #[test]
    fn text_deltas_assemble_into_the_reply_and_are_seen_in_order() {
        let body = sse(
            &[
                json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
                text_chunk("Hel"),
                text_chunk("lo"),
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
                json!({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}),
            ],
            true,
        );
        let (result, deltas) = run(&body);
        let (reply, usage) = result.expect("complete");
        assert_eq!(reply.text, "Hello");
        assert_eq!(deltas, ["Hel", "lo"]);
        assert_eq!(usage.map(|u| u.completion_tokens), Some(2));
        assert_eq!(reply.usage.map(|u| u.input_tokens), Some(5));
    }

    #[test]
    fn tool_call_fragments_assemble_by_index() {
        let frag = |i: u32, id: Option<&str>, name: Option<&str>, args: &str| {
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": i, "id": id, "type": "function", "function": {"name": name, "arguments": args}}]}}]})
        };
        let body = sse(
            &[
                frag(0, Some("a"), Some("send"), ""),
                frag(1, Some("b"), Some("other"), "{\"k\""),
                frag(0, None, None, "{\"to\":"),
                frag(1, None, None, ":2}"),
                frag(0, None, None, "\"x\"}"),
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            ],
            true,
        );
        let (reply, _) = run(&body).0.expect("complete");
        assert_eq!(reply.tool_calls.len(), 2);
        assert_eq!(reply.tool_calls[0].tool, "send");
        assert_eq!(reply.tool_calls[0].args, json!({"to": "x"}));
        assert!(reply.tool_calls[0].irreversible);
        assert_eq!(reply.tool_calls[1].args, json!({"k": 2}));
        assert!(reply.tool_calls.iter().all(|c| c.invalid_args.is_none()));
    }

    /// Without an index, a continuation whose id is `""` continues the
    /// call, as one with no id does (found by a review: each such fragment
    /// started a nameless call and the reply failed).
    #[test]
    fn fragments_with_an_empty_id_and_no_index_continue_their_call() {
        let body = sse(
            &[
                json!({"choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_1","type":"function","function":{"name":"lookup","arguments":""}}]}}]}),
                json!({"choices":[{"index":0,"delta":{"tool_calls":[{"id":"","function":{"arguments":"{\"key\":"}}]}}]}),
                json!({"choices":[{"index":0,"delta":{"tool_calls":[{"id":"","function":{"arguments":"\"a\"}"}}]}}]}),
                json!({"choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_2","function":{"name":"lookup","arguments":{"k":2}}}]}}]}),
                json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
            ],
            true,
        );
        let (reply, _) = run(&body).0.expect("complete");
        assert_eq!(reply.tool_calls.len(), 2, "{reply:?}");
        assert_eq!(reply.tool_calls[0].args, json!({"key": "a"}));
        // Arguments sent as JSON, not text: taken as their text.
        assert_eq!(reply.tool_calls[1].args, json!({"k": 2}));
        assert!(reply.tool_calls.iter().all(|c| c.invalid_args.is_none()));
    }

    #[test]
    fn a_stream_cut_before_done_or_finish_is_a_retryable_cut() {
        let (result, deltas) = run(&sse(&[text_chunk("Hel"), text_chunk("lo")], false));
        let e = result.expect_err("cut");
        assert!(matches!(e, OpenAiError::StreamCut { .. }), "{e}");
        assert!(e.is_transient(), "{e}");
        assert!(e.to_string().contains("after 2 chunk(s)"), "{e}");
        assert_eq!(deltas, ["Hel", "lo"], "what was seen was seen");
        // A half event (no closing blank line) is not dispatched.
        let half = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}";
        assert!(matches!(run(half).0, Err(OpenAiError::StreamCut { .. })));
    }

    #[test]
    fn finish_then_a_clean_end_without_done_is_complete() {
        let body = sse(
            &[
                text_chunk("ok"),
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            ],
            false,
        );
        assert_eq!(run(&body).0.expect("complete").0.text, "ok");
    }

    #[test]
    fn nonsense_is_a_typed_error_never_a_reply() {
        let cases = [
            (
                "data: {not json\n\n".to_string(),
                "stream chunk 1: not a completion chunk",
            ),
            ("data: [DONE]\n\n".to_string(), "no chunk"),
            (
                sse(
                    &[
                        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}, "finish_reason": "tool_calls"}]}),
                    ],
                    true,
                ),
                "never got a name",
            ),
            (
                sse(
                    &[
                        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "send"}}]}}]}),
                        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "other"}}]}}]}),
                    ],
                    true,
                ),
                "renamed",
            ),
            (
                sse(
                    &[text_chunk("x"), json!({"error": {"message": "overloaded"}})],
                    true,
                ),
                "overloaded",
            ),
        ];
        for (body, want) in cases {
            match run(&body).0 {
                Ok(r) => panic!("{body}: taken as {r:?}"),
                Err(e) => assert!(e.to_string().contains(want), "{body}: {e}"),
            }
        }
    }

    #[test]
    fn decoder_joins_data_lines_and_skips_comments_and_other_fields() {
        let mut d = SseDecoder::default();
        assert_eq!(d.line(": ping"), None);
        assert_eq!(d.line("event: message"), None);
        assert_eq!(d.line("data: a"), None);
        assert_eq!(d.line("data:b"), None);
        assert_eq!(d.line(""), Some("a\nb".to_string()));
        assert_eq!(d.line(""), None);
        assert_eq!(d.line("data: [DONE]"), None);
        assert_eq!(d.end(), Some("[DONE]".to_string()));
    }
}
