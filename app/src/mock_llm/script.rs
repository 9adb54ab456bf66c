//! The mock LLM's script: replies served in order, from JSON or TOML —
//! or, for several agents sharing one mock, each to the request it fits.
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
//! **Which reply answers a request**: the first reply in the file that is
//! not used up and whose conditions the request meets. A reply without
//! conditions meets every request, so a script without any answers the
//! n-th request with the n-th reply. The conditions (all optional, all
//! must hold):
//!
//! | key | holds when |
//! |---|---|
//! | `when_system = "regex"` | the system message (the agent's instructions) contains a match |
//! | `when_user = "regex"` | the last user message (the turn's prompt, or the messages it reads) contains a match |
//! | `when_round = N` | the request is round N of its turn: N assistant tool-call messages follow the last user message |
//!
//! A reply is used up once it answers, unless `repeat = true`: then it
//! answers every request it fits — what a model that a kill made ask again
//! needs. The request carries no agent name (the wire format has none), so
//! an agent is told apart by its instructions (`when_system`).
//!
//! ```toml
//! [[replies]]                          # the boss, asked to begin
//! when_system = "^You run a team"
//! when_user = "^go"
//! when_round = 0
//! repeat = true
//! tool_calls = [{ name = "spawn_agent", arguments = { name = "a", instructions = "Do your task." } }]
//! [[replies]]                          # the boss, any other time
//! when_system = "^You run a team"
//! repeat = true
//! text = "done"
//! ```
//!
//! Invariant: a loaded [`Script`] is unambiguous — each reply is exactly
//! one of a completion (text and/or tool calls), an HTTP error (`status`),
//! a raw body or a raw event stream (`sse`) — a cut goes with a completion
//! only, its delays are bounded by [`MAX_DELAY_MS`], and its `when_*`
//! patterns compile.

use std::path::{Path, PathBuf};

use regex::Regex;
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
    /// Only for a request whose system message matches this regex.
    #[serde(default)]
    pub when_system: Option<String>,
    /// Only for a request whose last user message matches this regex.
    #[serde(default)]
    pub when_user: Option<String>,
    /// Only for round N of a turn (see the module doc).
    #[serde(default)]
    pub when_round: Option<u32>,
    /// Never used up: answers every request it fits.
    #[serde(default)]
    pub repeat: bool,
}

/// What a request shows the `when_*` conditions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked {
    /// The first system message's content ("" if none).
    pub system: String,
    /// The last user message's content ("" if none).
    pub user: String,
    /// Assistant messages with `tool_calls` after the last user message.
    pub round: u32,
}

impl Asked {
    /// Read from a chat-completions request body (anything else asks
    /// with empty texts at round 0).
    pub fn of(request: &Value) -> Asked {
        let empty = Vec::new();
        let messages = request
            .get("messages")
            .and_then(Value::as_array)
            .unwrap_or(&empty);
        let role = |m: &Value, r: &str| m.get("role").and_then(Value::as_str) == Some(r);
        let content = |m: &Value| m.get("content").and_then(Value::as_str).unwrap_or("").to_string();
        let last_user = messages.iter().rposition(|m| role(m, "user"));
        let round = messages[last_user.map_or(0, |i| i + 1)..]
            .iter()
            .filter(|m| role(m, "assistant") && m.get("tool_calls").is_some_and(|c| !c.is_null()))
            .count();
        Asked {
            system: messages
                .iter()
                .find(|m| role(m, "system"))
                .map(content)
                .unwrap_or_default(),
            user: last_user.map(|i| content(&messages[i])).unwrap_or_default(),
            round: u32::try_from(round).unwrap_or(u32::MAX),
        }
    }
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

    /// The reply answering `asked`: the first not in `used` (or
    /// `repeat`) whose conditions hold; marked used. `used` is as long as
    /// the replies (the server's state).
    pub fn select(&self, used: &mut [bool], asked: &Asked) -> Option<usize> {
        debug_assert_eq!(used.len(), self.replies.len(), "one flag per reply");
        let index = self
            .replies
            .iter()
            .enumerate()
            .position(|(i, r)| (r.repeat || !used.get(i).copied().unwrap_or(true)) && r.fits(asked))?;
        if let Some(flag) = used.get_mut(index) {
            *flag = true;
        }
        Some(index)
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
            for (key, pattern) in [("when_system", &r.when_system), ("when_user", &r.when_user)] {
                if let Some(Err(e)) = pattern.as_deref().map(Regex::new) {
                    return invalid(&format!("{key} is not a regex: {e}"));
                }
            }
        }
        Ok(())
    }
}

impl Reply {
    /// Whether this reply's conditions hold for `asked`. A pattern that
    /// does not compile holds for nothing (a validated script has none).
    pub fn fits(&self, asked: &Asked) -> bool {
        let matches = |pattern: &Option<String>, text: &str| {
            pattern
                .as_deref()
                .is_none_or(|p| Regex::new(p).is_ok_and(|re| re.is_match(text)))
        };
        matches(&self.when_system, &asked.system)
            && matches(&self.when_user, &asked.user)
            && self.when_round.is_none_or(|n| n == asked.round)
    }

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

    /// Only for requests whose system message matches `pattern`.
    pub fn when_system(mut self, pattern: &str) -> Reply {
        self.when_system = Some(pattern.to_string());
        self
    }

    /// Only for requests whose last user message matches `pattern`.
    pub fn when_user(mut self, pattern: &str) -> Reply {
        self.when_user = Some(pattern.to_string());
        self
    }

    /// Only for round `round` of a turn.
    pub fn when_round(mut self, round: u32) -> Reply {
        self.when_round = Some(round);
        self
    }

    /// Never used up.
    pub fn repeated(mut self) -> Reply {
        self.repeat = true;
        self
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

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

        std::fs::write(
            &json_path,
            r#"{"replies":[{"text":"a"},{"text":"b","when_user":"(oops"}]}"#,
        )?;
        let e = Script::load(&json_path).expect_err("bad regex").to_string();
        assert!(
            e.contains("replies[1]") && e.contains("when_user is not a regex"),
            "{e}"
        );
        Ok(())
    }

    fn request(system: &str, user: &str, tool_rounds: usize) -> Value {
        let mut messages = vec![
            json!({"role": "system", "content": system}),
            json!({"role": "user", "content": "an older turn"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "old"}]}),
            json!({"role": "tool", "tool_call_id": "old", "content": "x"}),
            json!({"role": "assistant", "content": "older answer"}),
            json!({"role": "user", "content": user}),
        ];
        for i in 0..tool_rounds {
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": i}]}));
            messages.push(json!({"role": "tool", "tool_call_id": i, "content": "y"}));
        }
        json!({"messages": messages})
    }

    #[test]
    fn asked_reads_the_system_prompt_the_last_prompt_and_the_round_of_the_turn() {
        let asked = Asked::of(&request("You are B.", "go", 2));
        assert_eq!(
            asked,
            Asked {
                system: "You are B.".into(),
                user: "go".into(),
                round: 2
            }
        );
        assert_eq!(Asked::of(&json!("not a request")).round, 0);
    }

    #[test]
    fn without_conditions_the_nth_request_gets_the_nth_reply() -> Result<(), ScriptError> {
        let script = Script::new(vec![Reply::text("1"), Reply::text("2")])?;
        let mut used = vec![false; 2];
        let any = Asked::of(&request("s", "u", 0));
        assert_eq!(script.select(&mut used, &any), Some(0));
        assert_eq!(script.select(&mut used, &any), Some(1));
        assert_eq!(script.select(&mut used, &any), None, "exhausted");
        Ok(())
    }

    #[test]
    fn a_reply_goes_to_the_first_request_it_fits_whoever_asks_first() -> Result<(), ScriptError> {
        let script = Script::new(vec![
            Reply::tool_call("spawn_agent", json!({"name": "a"}))
                .when_system("^Boss")
                .when_user("^go$")
                .when_round(0),
            Reply::text("boss done").when_system("^Boss").repeated(),
            Reply::text("child a").when_system("^Child").when_user("task a"),
            Reply::text("child b").when_system("^Child").when_user("task b"),
        ])?;
        let mut used = vec![false; 4];
        // The children ask first, in either order: each gets its own.
        let b = Asked::of(&request("Child.", "from boss: task b", 0));
        assert_eq!(script.select(&mut used, &b), Some(3));
        assert_eq!(script.select(&mut used, &b), None, "used up");
        let boss_go = Asked::of(&request("Boss.", "go", 0));
        assert_eq!(script.select(&mut used, &boss_go), Some(0));
        // Asked again (a kill lost the answer): the spawn is used up, the
        // repeated reply answers.
        assert_eq!(script.select(&mut used, &boss_go), Some(1));
        let boss_later = Asked::of(&request("Boss.", "go", 1));
        assert_eq!(script.select(&mut used, &boss_later), Some(1));
        assert_eq!(
            script.select(&mut used, &boss_later),
            Some(1),
            "repeat is never used up"
        );
        let a = Asked::of(&request("Child.", "task a", 0));
        assert_eq!(script.select(&mut used, &a), Some(2));
        assert_eq!(
            script.select(&mut used, &Asked::of(&request("Other.", "x", 0))),
            None
        );
        Ok(())
    }

    #[test]
    fn conditions_load_from_toml() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("s.toml");
        std::fs::write(
            &path,
            "[[replies]]\nwhen_system = \"^B\"\nwhen_round = 1\nrepeat = true\ntext = \"x\"\n",
        )?;
        let s = Script::load(&path).expect("valid");
        assert_eq!(s.replies[0].when_system.as_deref(), Some("^B"));
        assert_eq!(s.replies[0].when_round, Some(1));
        assert!(s.replies[0].repeat);
        Ok(())
    }
}
