//! The mock LLM's script: replies served in order, from JSON or TOML.
//!
//! ```toml
//! [[replies]]
//! tool_calls = [{ name = "lookup", arguments = { key = "a" } }]
//! [[replies]]
//! status = 429
//! retry_after = 1
//! [[replies]]
//! delay_ms = 3000        # longer than the client's timeout
//! text = "slow"
//! [[replies]]
//! raw = "not json"       # a malformed 200 body
//! [[replies]]
//! text = "half of this"  # to a `stream: true` request: the first 2 of
//! cut_after_chunks = 2   # its SSE chunks, then the body ends (no [DONE])
//! [[replies]]
//! sse = "data: {oops\n\n"  # a 200 text/event-stream body, as written
//! [[replies]]
//! text = "done"
//!
//! # optional: answer every ask differently (see `mock_llm::reword`)
//! [reword]
//! seed = 7
//! ```
//!
//! Invariant: a loaded [`Script`] is unambiguous — each reply is exactly
//! one of a completion (text and/or tool calls), an HTTP error (`status`),
//! a raw body or a raw event stream (`sse`) — a cut goes with a completion
//! only, and its delays are bounded by [`MAX_DELAY_MS`].

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::reword::Reword;

/// Longest scripted delay (a test that needs more is waiting on nothing).
pub const MAX_DELAY_MS: u64 = 60_000;

#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("{path}: cannot read script: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: replies[{index}]: {message}")]
    Invalid {
        path: PathBuf,
        index: usize,
        message: String,
    },
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    #[serde(default)]
    pub replies: Vec<Reply>,
    /// Reword every answer (absent: the replies exactly as written).
    #[serde(default)]
    pub reword: Option<Reword>,
}

/// One scripted answer.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reply {
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ScriptedCall>,
    /// Answer with this HTTP status instead of a completion.
    #[serde(default)]
    pub status: Option<u16>,
    /// `Retry-After` seconds (with `status`).
    #[serde(default)]
    pub retry_after: Option<u64>,
    /// Error body (with `status`).
    #[serde(default)]
    pub body: Option<String>,
    /// Wait this long before answering.
    #[serde(default)]
    pub delay_ms: u64,
    /// Answer 200 with exactly this body.
    #[serde(default)]
    pub raw: Option<String>,
    /// Override `finish_reason`.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Streamed (`stream: true` requests): send only this many of the
    /// completion's chunks, then end the body without `[DONE]`.
    #[serde(default)]
    pub cut_after_chunks: Option<usize>,
    /// Answer 200 `text/event-stream` with exactly this body.
    #[serde(default)]
    pub sse: Option<String>,
}

/// A tool call the mock asks for.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedCall {
    pub name: String,
    /// An object is sent JSON-encoded, as the API does; a string is sent
    /// verbatim (to script malformed arguments).
    #[serde(default = "empty_object")]
    pub arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

impl Script {
    /// `.toml` files as TOML, anything else as JSON.
    pub fn load(path: &Path) -> Result<Script, ScriptError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let is_toml = path.extension().is_some_and(|e| e == "toml");
        let script: Script = if is_toml {
            toml::from_str(&text).map_err(|e| ScriptError::Parse {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?
        } else {
            serde_json::from_str(&text).map_err(|e| ScriptError::Parse {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?
        };
        script.validate(path)?;
        Ok(script)
    }

    /// A script built in code (tests).
    pub fn new(replies: Vec<Reply>) -> Result<Script, ScriptError> {
        let script = Script {
            replies,
            reword: None,
        };
        script.validate(Path::new("<inline script>"))?;
        Ok(script)
    }

    /// The same replies, each reworded per `reword` (see
    /// `mock_llm::reword`).
    pub fn reworded(mut self, reword: Reword) -> Script {
        self.reword = Some(reword);
        self
    }

    fn validate(&self, path: &Path) -> Result<(), ScriptError> {
        for (index, r) in self.replies.iter().enumerate() {
            let invalid = |message: &str| {
                Err(ScriptError::Invalid {
                    path: path.to_path_buf(),
                    index,
                    message: message.to_string(),
                })
            };
            let completion = r.text.is_some() || !r.tool_calls.is_empty();
            let kinds = usize::from(completion)
                + usize::from(r.status.is_some())
                + usize::from(r.raw.is_some())
                + usize::from(r.sse.is_some());
            if kinds > 1 {
                return invalid("give one of text/tool_calls, status, raw, sse");
            }
            if r.cut_after_chunks.is_some() && !completion {
                return invalid("cut_after_chunks goes with text/tool_calls");
            }
            if r.status.is_some_and(|s| !(100..=599).contains(&s)) {
                return invalid("status must be 100..=599");
            }
            if r.status.is_none() && (r.retry_after.is_some() || r.body.is_some()) {
                return invalid("retry_after and body go with status");
            }
            if r.delay_ms > MAX_DELAY_MS {
                return invalid("delay_ms is above 60000");
            }
        }
        Ok(())
    }
}

impl Reply {
    pub fn text(text: &str) -> Reply {
        Reply {
            text: Some(text.to_string()),
            ..Reply::default()
        }
    }

    pub fn tool_call(name: &str, arguments: Value) -> Reply {
        Reply {
            tool_calls: vec![ScriptedCall {
                name: name.to_string(),
                arguments,
            }],
            ..Reply::default()
        }
    }

    pub fn status(status: u16, retry_after: Option<u64>) -> Reply {
        Reply {
            status: Some(status),
            retry_after,
            ..Reply::default()
        }
    }

    pub fn raw(body: &str) -> Reply {
        Reply {
            raw: Some(body.to_string()),
            ..Reply::default()
        }
    }

    /// A raw event-stream body (`sse`).
    pub fn sse(body: &str) -> Reply {
        Reply {
            sse: Some(body.to_string()),
            ..Reply::default()
        }
    }

    /// Streamed, this reply stops after `chunks` chunks, without `[DONE]`.
    pub fn cut_after_chunks(mut self, chunks: usize) -> Reply {
        self.cut_after_chunks = Some(chunks);
        self
    }

    pub fn delayed(mut self, delay_ms: u64) -> Reply {
        self.delay_ms = delay_ms;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_and_json_scripts_load_and_ambiguity_is_refused() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let toml_path = dir.path().join("s.toml");
        std::fs::write(
            &toml_path,
            "[[replies]]\nstatus = 429\nretry_after = 1\n[[replies]]\ntext = \"hi\"\n",
        )?;
        let s = Script::load(&toml_path).expect("valid toml script");
        assert_eq!(s.replies.len(), 2);
        assert_eq!(s.replies[0].status, Some(429));
        assert_eq!(s.reword, None);
        std::fs::write(&toml_path, "[reword]\nseed = 9\n[[replies]]\ntext = \"hi\"\n")?;
        let s = Script::load(&toml_path).expect("valid toml script");
        assert_eq!(s.reword, Some(Reword { seed: 9 }));

        let json_path = dir.path().join("s.json");
        std::fs::write(&json_path, r#"{"replies":[{"text":"a","raw":"b"}]}"#)?;
        let e = Script::load(&json_path).expect_err("ambiguous").to_string();
        assert!(e.contains("replies[0]") && e.contains("one of"), "{e}");

        std::fs::write(&json_path, r#"{"replies":[{"txt":"a"}]}"#)?;
        let e = Script::load(&json_path).expect_err("unknown field").to_string();
        assert!(e.contains("unknown field `txt`"), "{e}");
        Ok(())
    }
}
