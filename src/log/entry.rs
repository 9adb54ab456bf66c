//! One log entry and the events it can carry: the on-disk format.
//!
//! Invariant: a line is `{"schema_version","session_id","seq","ts","event","data"}`
//! in that key order, plain JSON only. Parsing checks `schema_version` before
//! anything else, so an entry from a newer version is refused with a clear
//! error instead of being misread. Entries without `schema_version` are the
//! pre-versioning format (version 0) and still load.
//!
//! Since version 3 every line is sealed with a checksum (a last member
//! `"crc"`, see [`crate::checksum`]), verified before anything else is
//! read from the line: a flipped bit is a mismatch, never data. Lines of
//! versions 0–2 carry none and still load; a version-3 line without one
//! is damage.

use serde::de::value::{BorrowedStrDeserializer, MapAccessDeserializer};
use serde::de::{DeserializeSeed, MapAccess};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checksum::{self, Sealed};
use crate::runtime::ids::{AgentId, MessageId, SessionId};

/// The newest schema version this build reads (and writes, for the lines
/// that need it: see [`Event::min_version`]).
pub const SCHEMA_VERSION: u32 = 5;

/// The first version whose lines are sealed with a checksum.
pub const CHECKSUM_VERSION: u32 = 3;

/// The first version with durable round decisions (`round.decided`).
pub const DECISION_VERSION: u32 = 4;

/// The first version whose decided calls carry a hook's verdict
/// ([`DecidedCall::hook`]): written only by the `round.decided` lines that
/// carry one, so a version-4 reader — which would ignore the member and run
/// a denied call — refuses such a line as newer instead.
pub const HOOK_VERSION: u32 = 5;

/// What the `PreToolUse` hooks decided for one call, made durable with the
/// call in its round's decision: a resumed round applies it and never asks
/// the hooks again. Absent when every hook allowed the call as it was.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookOutcome {
    /// Denied: the call never runs; the reason is its (failed) result,
    /// which the model reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denied: Option<String>,
    /// The call waits for a human (`confirm`) before it runs, as an
    /// unknown-fate call does; the reason says which hook asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs_confirmation: Option<String>,
    /// The arguments the model gave, when hooks rewrote them: the call's
    /// `args` (and so its idempotency key) are the rewritten ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_args: Option<Value>,
}

/// One call of a round's durable decision: what the model asked for, with
/// the identities the runtime gave it before anything ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecidedCall {
    /// `<session>-<seq of the round.decided entry>.<index>`: the call's
    /// id in the log and in the tool-call ledger, the same on every resume.
    pub call_id: String,
    pub tool: String,
    /// The arguments as the model gave them (the raw text when they were
    /// not JSON: see `invalid_args`).
    pub args: Value,
    pub irreversible: bool,
    /// The idempotency key derived when the decision was made: the key
    /// every attempt of this call carries, whatever the model would say
    /// if asked again.
    pub idempotency_key: String,
    /// Why the arguments could not be used (the call is answered as a
    /// failed tool call, never run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid_args: Option<String>,
    /// The hooks' verdict, when it was not a plain allow (version 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook: Option<HookOutcome>,
}

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
    TurnStart {
        prompt: String,
        /// The unit of work the turn performs when it is not the agent's
        /// own (e.g. `trigger:{dedup_key}`): stable across crashes and
        /// re-claims, so the turn's idempotency keys derive from it and a
        /// completed one is never run again. Absent on older entries.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        work: Option<String>,
        /// The pending messages a work turn reads (they are in its
        /// prompt): they count as delivered only with its `turn.complete`,
        /// and a retry of the work reads the same ones. Absent when none
        /// (and on older entries).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        reads: Vec<MessageId>,
    },
    /// The open turn's provider round `round` and all its tool calls are
    /// done (their results logged): the loop checkpoint (seeds 000/003). A
    /// crash later in the turn resumes after this round; the provider is
    /// not asked for it again.
    #[serde(rename = "round.complete")]
    RoundComplete {
        round: u32,
        /// Tool calls in the turn so far.
        tool_calls: u32,
    },
    /// The model's decision for the open turn's round `round`: every tool
    /// call it asked for, in order, with the call ids and idempotency keys
    /// the runtime gave them. Durable before the first of them starts; a
    /// resumed turn continues this round from here and never asks the
    /// model for it again (Temporal's rule: record the command, then run
    /// the activity).
    #[serde(rename = "round.decided")]
    RoundDecided { round: u32, calls: Vec<DecidedCall> },
    /// The open turn, interrupted by a crash, continues from round
    /// `round`: entries since its last `round.complete` (a partial round)
    /// are rolled back.
    #[serde(rename = "turn.resume")]
    TurnResume {
        round: u32,
        /// The resumed turn's prompt and work when it is not the log's
        /// open turn (a newer turn superseded it and it was parked):
        /// absent when the open turn continues (and on older entries).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prompt: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        work: Option<String>,
    },
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
    /// The turn finished with this response: the turn is acknowledged —
    /// and with it the delivery of the messages it consumed (seed 002's
    /// gap closed: a message counts as delivered only with the turn that
    /// read it).
    #[serde(rename = "turn.complete")]
    TurnComplete {
        response: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        delivered: Vec<MessageId>,
    },
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
            Event::RoundComplete { .. } => "round.complete",
            Event::RoundDecided { .. } => "round.decided",
            Event::TurnResume { .. } => "turn.resume",
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

impl Event {
    /// The oldest schema version whose readers understand this event: a
    /// line carries it, so a line an older build can read stays readable
    /// to it, and one it cannot is refused as newer, never misread.
    /// Version 2 added work turns (`turn.start` with `work`), round
    /// checkpoints, turn resume and deliveries in `turn.complete`; version
    /// 3 the checksum every line carries (a version-2 reader refuses its
    /// `crc` member as an unknown key), so every line written now is at
    /// least 3; version 4 added `round.decided`, which only its lines carry;
    /// version 5 a hook's verdict in a decided call, which only the
    /// decisions with one carry.
    pub fn min_version(&self) -> u32 {
        match self {
            Event::RoundDecided { calls, .. } if calls.iter().any(|c| c.hook.is_some()) => HOOK_VERSION,
            Event::RoundDecided { .. } => DECISION_VERSION,
            Event::TurnResume { prompt: Some(_), .. } => DECISION_VERSION,
            _ => CHECKSUM_VERSION,
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
        let data = serde_json::value::to_raw_value(tagged.get("data").unwrap_or(&Value::Null))?;
        let wire = WireEntry {
            schema_version: self.schema_version,
            session_id: self.session_id.clone(),
            seq: self.seq,
            ts: self.ts,
            event: self.event.name().to_string(),
            data: Some(&data),
            _crc: None,
        };
        let object = serde_json::to_string(&wire)?;
        let mut line = if self.schema_version >= CHECKSUM_VERSION {
            checksum::seal(&object)
        } else {
            object
        };
        line.push('\n');
        Ok(line)
    }

    /// Parse one line (without its newline).
    ///
    /// One pass into the wire shape in the common case (the event's
    /// payload is kept as raw JSON and decoded once its tag is known), no
    /// `Value` tree. Only a line that fails it is probed for a newer
    /// `schema_version`, so a newer entry whose shape this build does not
    /// know is still reported as newer, not as damage.
    ///
    /// A line equal to one this thread parsed lately is not parsed again
    /// (the answer is the same; see [`super::memo`]).
    pub fn parse(line: &[u8]) -> Result<LogEntry, ParseLineError> {
        super::memo::parsed(line, Self::parse_fresh)
    }

    /// [`LogEntry::parse`], parsing.
    fn parse_fresh(line: &[u8]) -> Result<LogEntry, ParseLineError> {
        let sealed = checksum::check(line);
        if let Sealed::Mismatch { stored, computed } = sealed {
            return Err(ParseLineError::Invalid(format!(
                "checksum mismatch: the line says {stored:08x}, its bytes give {computed:08x} \
                 (bits changed at rest or in transit)"
            )));
        }
        let entry = Self::parse_unverified(line)?;
        if sealed == Sealed::Unsealed && entry.schema_version >= CHECKSUM_VERSION {
            return Err(ParseLineError::Invalid(format!(
                "a version-{} entry without its checksum (its seal is damaged)",
                entry.schema_version
            )));
        }
        Ok(entry)
    }

    /// [`LogEntry::parse`] without the checksum: what the
    /// `NoChecksumVerify` canary reads with (and a version-3 line without
    /// a seal is taken as it is).
    pub fn parse_unverified(line: &[u8]) -> Result<LogEntry, ParseLineError> {
        let wire: WireEntry<'_> = match serde_json::from_slice(line) {
            Ok(wire) => wire,
            Err(e) => {
                return Err(match newer_version(line) {
                    Some(found) => ParseLineError::Newer { found },
                    None => ParseLineError::Invalid(e.to_string()),
                })
            }
        };
        if wire.schema_version > SCHEMA_VERSION {
            return Err(ParseLineError::Newer {
                found: wire.schema_version,
            });
        }
        let event = match wire.data {
            // The payload parsed in place, straight from the line.
            Some(data) => Event::deserialize(MapAccessDeserializer::new(TagThenData {
                tag: &wire.event,
                data,
                next: 0,
            })),
            // No payload: as `"data": null`, which no event accepts.
            None => serde_json::from_str(&format!(
                r#"{{"event":{},"data":null}}"#,
                serde_json::to_string(&wire.event).map_err(|e| ParseLineError::Invalid(e.to_string()))?
            )),
        }
        .map_err(|e| ParseLineError::Invalid(format!("event {:?}: {e}", wire.event)))?;
        Ok(LogEntry {
            schema_version: wire.schema_version,
            session_id: wire.session_id,
            seq: wire.seq,
            ts: wire.ts,
            event,
        })
    }
}

/// The wire shape, written and read, the payload as raw JSON. Unknown keys
/// are refused: within a version the shape is fixed, so an unknown key
/// means damage (a newer version is caught first).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireEntry<'a> {
    #[serde(default)]
    schema_version: u32,
    session_id: SessionId,
    seq: u64,
    #[serde(default)]
    ts: u64,
    event: String,
    #[serde(default, borrow)]
    data: Option<&'a serde_json::value::RawValue>,
    /// The seal (checked on the raw line before parsing; see
    /// [`crate::checksum`]). Never serialized here: `to_line` seals.
    #[serde(rename = "crc", default, borrow, skip_serializing)]
    _crc: Option<&'a str>,
}

/// An event as serde's adjacently tagged `Event` reads it — the key
/// `event` with the tag, then `data` with the payload — made of the wire
/// entry's tag and raw payload: the payload is parsed once, where it lies
/// in the line, with no `{"event":…,"data":…}` string built around it.
struct TagThenData<'de> {
    tag: &'de str,
    data: &'de serde_json::value::RawValue,
    /// Entries handed out so far (0, 1 or 2).
    next: u8,
}

impl<'de> MapAccess<'de> for TagThenData<'de> {
    type Error = serde_json::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Self::Error> {
        let key = match self.next {
            0 => "event",
            1 => "data",
            _ => return Ok(None),
        };
        seed.deserialize(BorrowedStrDeserializer::new(key)).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Self::Error> {
        self.next += 1;
        if self.next == 1 {
            seed.deserialize(BorrowedStrDeserializer::new(self.tag))
        } else {
            seed.deserialize(self.data)
        }
    }
}

/// The `schema_version` of a line this build cannot read, when it is newer
/// than [`SCHEMA_VERSION`] (any other line is simply invalid).
fn newer_version(line: &[u8]) -> Option<u32> {
    #[derive(Deserialize)]
    struct Probe {
        #[serde(default)]
        schema_version: Option<Value>,
    }
    let probe: Probe = serde_json::from_slice(line).ok()?;
    let version = probe.schema_version.as_ref().and_then(Value::as_u64)?;
    (version > u64::from(SCHEMA_VERSION)).then(|| u32::try_from(version).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: &str = "00000000000000aa";
    const A1: &str = "00000000000000a1";
    const A2: &str = "00000000000000a2";
    const M: &str = "000000000000000e";

    fn every_event() -> Vec<Event> {
        vec![
            Event::AgentCreated {
                agent_id: AgentId::from_hex(A1).unwrap(),
                name: "n \"quoted\" \u{e9}".into(),
                parent_session_id: None,
                instructions: "line\nbreak".into(),
            },
            Event::AgentTerminated {
                agent_id: AgentId::from_hex(A1).unwrap(),
            },
            Event::TurnStart {
                prompt: "p".into(),
                work: None,
                reads: Vec::new(),
            },
            Event::TurnStart {
                prompt: "p".into(),
                work: Some("trigger:k".into()),
                reads: Vec::new(),
            },
            Event::TurnStart {
                prompt: "p".into(),
                work: Some("api:w".into()),
                reads: vec![MessageId::from_hex("00000000000000aa").unwrap()],
            },
            Event::RoundComplete {
                round: 1,
                tool_calls: 2,
            },
            Event::TurnResume {
                round: 1,
                prompt: None,
                work: None,
            },
            Event::TurnResume {
                round: 2,
                prompt: Some("p".into()),
                work: Some("api:w".into()),
            },
            Event::RoundDecided {
                round: 1,
                calls: vec![
                    DecidedCall {
                        call_id: "c".into(),
                        tool: "t".into(),
                        args: serde_json::json!({"k": 1}),
                        irreversible: true,
                        idempotency_key: "w-r1-c0".into(),
                        invalid_args: None,
                        hook: None,
                    },
                    DecidedCall {
                        call_id: "d".into(),
                        tool: "u".into(),
                        args: serde_json::json!("{not json"),
                        irreversible: false,
                        idempotency_key: "w-r1-c1".into(),
                        invalid_args: Some("not JSON".into()),
                        hook: None,
                    },
                ],
            },
            Event::RoundDecided {
                round: 2,
                calls: vec![
                    DecidedCall {
                        call_id: "e".into(),
                        tool: "t".into(),
                        args: serde_json::json!({"k": 2}),
                        irreversible: true,
                        idempotency_key: "w-r2-c0".into(),
                        invalid_args: None,
                        hook: Some(HookOutcome {
                            denied: None,
                            needs_confirmation: None,
                            original_args: Some(serde_json::json!({"k": 1})),
                        }),
                    },
                    DecidedCall {
                        call_id: "f".into(),
                        tool: "u".into(),
                        args: serde_json::json!({}),
                        irreversible: false,
                        idempotency_key: "w-r2-c1".into(),
                        invalid_args: None,
                        hook: Some(HookOutcome {
                            denied: Some("policy".into()),
                            needs_confirmation: Some("ask".into()),
                            original_args: None,
                        }),
                    },
                ],
            },
            Event::ToolCall {
                call_id: "c".into(),
                tool: "t".into(),
                args: serde_json::json!({"k": [1, null, {"x": "y"}]}),
                irreversible: true,
            },
            Event::ToolResult {
                call_id: "c".into(),
                ok: false,
                output: "o".into(),
            },
            Event::TurnComplete {
                response: "r".into(),
                delivered: Vec::new(),
            },
            Event::TurnComplete {
                response: "r".into(),
                delivered: vec![MessageId::from_hex(M).unwrap()],
            },
            Event::MessageEnqueued {
                message_id: MessageId::from_hex(M).unwrap(),
                sender: AgentId::from_hex(A1).unwrap(),
                recipient: AgentId::from_hex(A2).unwrap(),
                payload: "x".into(),
            },
            Event::MessageDelivered {
                message_ids: vec![MessageId::from_hex(M).unwrap()],
            },
            Event::SuspendResult { state_size: 9 },
            Event::SessionRestored {
                provider: "p".into(),
                model: "m".into(),
            },
        ]
    }

    fn parse_str(line: &str) -> Result<LogEntry, ParseLineError> {
        LogEntry::parse(line.as_bytes())
    }

    #[test]
    fn every_event_round_trips_through_its_line() {
        for (seq, event) in every_event().into_iter().enumerate() {
            let entry = LogEntry {
                schema_version: SCHEMA_VERSION,
                session_id: SessionId::from_hex(S).unwrap(),
                seq: seq as u64,
                ts: 7,
                event,
            };
            let line = entry.to_line().unwrap();
            let parsed = LogEntry::parse(line.trim_end().as_bytes()).unwrap();
            assert_eq!(parsed, entry, "{line}");
        }
    }

    #[test]
    fn a_line_carries_the_oldest_version_that_reads_it() {
        for event in every_event() {
            let oldest = match &event {
                Event::RoundDecided { calls, .. } if calls.iter().any(|c| c.hook.is_some()) => HOOK_VERSION,
                Event::RoundDecided { .. } | Event::TurnResume { prompt: Some(_), .. } => DECISION_VERSION,
                _ => CHECKSUM_VERSION,
            };
            assert_eq!(event.min_version(), oldest, "{event:?}");
            assert!(event.min_version() <= SCHEMA_VERSION);
        }
    }

    #[test]
    fn a_hook_verdict_is_refused_by_a_version_4_reader_and_absent_otherwise() {
        let call = |hook| DecidedCall {
            call_id: "c".into(),
            tool: "t".into(),
            args: serde_json::json!({}),
            irreversible: false,
            idempotency_key: "k".into(),
            invalid_args: None,
            hook,
        };
        let entry = |calls| LogEntry {
            schema_version: Event::RoundDecided {
                round: 0,
                calls: Vec::clone(&calls),
            }
            .min_version(),
            session_id: SessionId::from_hex(S).unwrap(),
            seq: 0,
            ts: 0,
            event: Event::RoundDecided { round: 0, calls },
        };
        // No verdict: the line is what a version-4 build wrote and reads.
        let plain = entry(vec![call(None)]);
        assert_eq!(plain.schema_version, DECISION_VERSION);
        let line = plain.to_line().unwrap();
        assert!(!line.contains("\"hook\""), "{line}");
        // A verdict: version 5, which a version-4 reader refuses as newer
        // (it would drop the member and run a denied call).
        let denied = entry(vec![call(Some(HookOutcome {
            denied: Some("no".into()),
            needs_confirmation: None,
            original_args: None,
        }))]);
        assert_eq!(denied.schema_version, HOOK_VERSION);
        let line = denied.to_line().unwrap();
        assert!(
            line.contains("\"schema_version\":5") && line.contains("\"denied\":\"no\""),
            "{line}"
        );
        const { assert!(HOOK_VERSION > DECISION_VERSION) };
        let parsed = LogEntry::parse(line.trim_end().as_bytes()).unwrap();
        assert_eq!(parsed, denied);
    }

    #[test]
    fn a_newer_entry_is_newer_whatever_its_shape() {
        for line in [
            r#"{"schema_version":7,"session_id":"00000000000000aa","seq":0,"ts":0,"event":"turn.start","data":{"prompt":"p"}}"#,
            r#"{"schema_version":7,"session_id":"00000000000000aa","seq":0,"brand_new":true}"#,
            r#"{"schema_version":7,"seq":"not even a number"}"#,
            r#"{"schema_version":99999999999,"anything":1}"#,
        ] {
            match parse_str(line) {
                Err(ParseLineError::Newer { found }) => assert!(found > SCHEMA_VERSION, "{line}"),
                other => panic!("{line}: expected Newer, got {other:?}"),
            }
        }
    }

    #[test]
    fn damage_in_a_current_or_older_entry_is_invalid() {
        for line in [
            r#"{"schema_version":1,"session_id":"00000000000000aa","seq":0,"ts":0,"event":"turn.start","data":{"prompt":"p"},"extra":1}"#,
            r#"{"schema_version":1,"session_id":"00000000000000aa","seq":0,"ts":0,"event":"no.such","data":{}}"#,
            r#"{"schema_version":1,"session_id":"00000000000000aa","seq":0,"ts":0,"event":"turn.start","data":{"prompt":5}}"#,
            r#"{"schema_version":1,"session_id":"00000000000000aa","seq":0,"ts":0,"event":"turn.start"}"#,
            r#"{"schema_version":"1","session_id":"00000000000000aa","seq":0,"event":"turn.start","data":{"prompt":"p"}}"#,
            r#"{"schema_version":1,"session_id":"00000000000000aa","seq":0,"ts":0,"event":"turn.st"#,
            "not json at all",
            "",
        ] {
            assert!(
                matches!(parse_str(line), Err(ParseLineError::Invalid(_))),
                "{line}: expected Invalid"
            );
        }
        let bad_utf8 = b"{\"schema_version\":1,\"session_id\":\"00000000000000a\xff\",\"seq\":0,\"event\":\"turn.start\",\"data\":{\"prompt\":\"p\"}}";
        assert!(matches!(
            LogEntry::parse(bad_utf8),
            Err(ParseLineError::Invalid(_))
        ));
    }

    /// The event parsed in place from the wire's tag and raw payload is
    /// the event (or the refusal) the `{"event":…,"data":…}` object gives.
    #[test]
    fn an_event_parsed_in_place_equals_the_tagged_object_parse() {
        let mut cases: Vec<(String, String)> = every_event()
            .iter()
            .map(|event| {
                let tagged = serde_json::to_value(event).unwrap();
                (event.name().to_string(), tagged["data"].to_string())
            })
            .collect();
        for (tag, data) in [
            ("no.such", "{}"),
            ("turn.start", r#"{"prompt":5}"#),
            ("turn.start", r#"{"prompt":"p","extra":1}"#),
            ("round.decided", r#"{"round":1,"calls":[{"call_id":"c"}]}"#),
            ("agent.terminated", "[]"),
            ("turn.complete", r#""just a string""#),
        ] {
            cases.push((tag.to_string(), data.to_string()));
        }
        for (tag, data) in cases {
            let raw: Box<serde_json::value::RawValue> = serde_json::from_str(&data).unwrap();
            let in_place = Event::deserialize(MapAccessDeserializer::new(TagThenData {
                tag: &tag,
                data: &raw,
                next: 0,
            }));
            let tagged: Result<Event, _> = serde_json::from_str(&format!(
                r#"{{"event":{},"data":{data}}}"#,
                serde_json::to_string(&tag).unwrap()
            ));
            match (in_place, tagged) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{tag} {data}"),
                (Err(_), Err(_)) => {}
                (a, b) => panic!("{tag} {data}: in place {a:?}, tagged {b:?}"),
            }
        }
    }

    #[test]
    fn a_pre_versioning_entry_loads_as_version_0() {
        let entry = parse_str(
            r#"{"session_id":"00000000000000aa","seq":3,"event":"turn.complete","data":{"response":"r"}}"#,
        )
        .unwrap();
        assert_eq!(entry.schema_version, 0);
        assert_eq!(entry.seq, 3);
        assert_eq!(entry.ts, 0);
        assert_eq!(
            entry.event,
            Event::TurnComplete {
                response: "r".into(),
                delivered: Vec::new()
            }
        );
    }
}
