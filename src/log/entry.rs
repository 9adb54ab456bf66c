//! One log entry and the events it can carry: the on-disk format.
//!
//! Invariant: a line is `{"schema_version","session_id","seq","ts","event","data"}`
//! in that key order, plain JSON only. Parsing checks `schema_version` before
//! anything else, so an entry from a newer version is refused with a clear
//! error instead of being misread. Entries without `schema_version` are the
//! pre-versioning format (version 0) and still load.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::runtime::ids::{AgentId, MessageId, SessionId};

/// The schema version this build writes, and the newest it reads.
pub const SCHEMA_VERSION: u32 = 1;

/// What happened. `event` is the tag, `data` the payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", content = "data")]
pub enum Event {
    /// An agent's session exists and the agent is in the tree. The only
    /// persistence of the tree: `parent_session_id` links to the parent's
    /// session directory name.
    #[serde(rename = "agent.created")]
    AgentCreated {
        agent_id: AgentId,
        name: String,
        parent_session_id: Option<SessionId>,
        instructions: String,
    },
    /// The agent is dead; recovery skips its session.
    #[serde(rename = "agent.terminated")]
    AgentTerminated { agent_id: AgentId },
    /// A turn began with this prompt.
    #[serde(rename = "turn.start")]
    TurnStart { prompt: String },
    /// The provider asked for a tool inside the open turn.
    #[serde(rename = "tool.call")]
    ToolCall {
        call_id: String,
        tool: String,
        args: Value,
        irreversible: bool,
    },
    /// A tool's result inside the open turn.
    #[serde(rename = "tool.result")]
    ToolResult {
        call_id: String,
        ok: bool,
        output: String,
    },
    /// The turn finished with this response: the turn is acknowledged.
    #[serde(rename = "turn.complete")]
    TurnComplete { response: String },
    /// A message for this session's agent, logged to the RECIPIENT's log
    /// before it reaches the inbox.
    #[serde(rename = "message.enqueued")]
    MessageEnqueued {
        message_id: MessageId,
        sender: AgentId,
        recipient: AgentId,
        payload: String,
    },
    /// These messages were collected from the inbox by one `deliver` (one
    /// entry per delivery so a delivery is all-or-nothing).
    #[serde(rename = "message.delivered")]
    MessageDelivered { message_ids: Vec<MessageId> },
    /// The session was evicted from its slot; the blob went to session.json.
    #[serde(rename = "suspend.result")]
    SuspendResult { state_size: u64 },
    /// A suspended session was re-acquired.
    #[serde(rename = "session.restored")]
    SessionRestored { provider: String, model: String },
}

impl Event {
    /// The `event` tag, for labels and error messages.
    pub fn name(&self) -> &'static str {
        match self {
            Event::AgentCreated { .. } => "agent.created",
            Event::AgentTerminated { .. } => "agent.terminated",
            Event::TurnStart { .. } => "turn.start",
            Event::ToolCall { .. } => "tool.call",
            Event::ToolResult { .. } => "tool.result",
            Event::TurnComplete { .. } => "turn.complete",
            Event::MessageEnqueued { .. } => "message.enqueued",
            Event::MessageDelivered { .. } => "message.delivered",
            Event::SuspendResult { .. } => "suspend.result",
            Event::SessionRestored { .. } => "session.restored",
        }
    }
}

/// One line of `events.jsonl`.
#[derive(Debug, Clone, PartialEq)]
pub struct LogEntry {
    pub schema_version: u32,
    pub session_id: SessionId,
    /// Position in this session's log, contiguous from 0.
    pub seq: u64,
    /// Logical time (runtime clock ticks).
    pub ts: u64,
    pub event: Event,
}

/// The wire shape. Unknown keys are refused: within a version the shape is
/// fixed, so an unknown key means damage (a newer version is caught first).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    #[serde(default)]
    schema_version: u32,
    session_id: SessionId,
    seq: u64,
    #[serde(default)]
    ts: u64,
    event: String,
    #[serde(default)]
    data: Value,
}

/// Why a line is not a valid entry.
#[derive(Debug)]
pub enum ParseLineError {
    Newer { found: u32 },
    Invalid(String),
}

impl LogEntry {
    /// The line as written, with its trailing newline.
    pub fn to_line(&self) -> Result<String, serde_json::Error> {
        let tagged = serde_json::to_value(&self.event)?;
        let data = tagged.get("data").cloned().unwrap_or(Value::Null);
        let raw = RawEntry {
            schema_version: self.schema_version,
            session_id: self.session_id.clone(),
            seq: self.seq,
            ts: self.ts,
            event: self.event.name().to_string(),
            data,
        };
        let mut line = serde_json::to_string(&raw)?;
        line.push('\n');
        Ok(line)
    }

    /// Parse one line (without its newline).
    pub fn parse(line: &[u8]) -> Result<LogEntry, ParseLineError> {
        let value: Value =
            serde_json::from_slice(line).map_err(|e| ParseLineError::Invalid(e.to_string()))?;
        // The version decides how to read the rest, so it is checked first.
        let version = value.get("schema_version").and_then(Value::as_u64).unwrap_or(0);
        if version > u64::from(SCHEMA_VERSION) {
            return Err(ParseLineError::Newer {
                found: u32::try_from(version).unwrap_or(u32::MAX),
            });
        }
        let raw: RawEntry =
            serde_json::from_value(value).map_err(|e| ParseLineError::Invalid(e.to_string()))?;
        let tagged = serde_json::json!({ "event": raw.event, "data": raw.data });
        let event: Event = serde_json::from_value(tagged)
            .map_err(|e| ParseLineError::Invalid(format!("event {:?}: {e}", raw.event)))?;
        Ok(LogEntry {
            schema_version: raw.schema_version,
            session_id: raw.session_id,
            seq: raw.seq,
            ts: raw.ts,
            event,
        })
    }
}
