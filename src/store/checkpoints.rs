//! Conversation messages and per-tool-round loop checkpoints (seeds 000 and
//! 003).
//!
//! Invariant: a checkpoint names a consistent boundary — `last_msg_id` is
//! `MAX(messages.id)` of its session and `messages` is exactly the session's
//! messages up to it, both read in the checkpoint's own transaction — and
//! a session's checkpoints are all one run's: its messages are one
//! sequence with no run column, so a second run's checkpoint is refused
//! ([`StoreError::SessionOfAnotherRun`]) rather than let either run's
//! resume roll back the other's acknowledged messages. Resume
//! rolls the messages table back to that boundary (deleting the partial
//! round a crash left behind) before reloading, and refuses a checkpoint
//! from a newer schema ([`LoopCheckpoint::ensure_loadable`]).
//!
//! Who writes these tables — one checkpoint story: the product's agent
//! loop does not. Its per-tool-round checkpoint is `round.complete` in the
//! agent's own event log (the round's decision, `round.decided`, opens it),
//! so a turn's rounds and their checkpoint commit in one store and resume
//! from one place (docs/GUARANTEES.md #5, docs/STORES.md). The
//! `messages` and `loop_checkpoints` tables are written only through this
//! store by the harness's `LoopRound` op (`sim/src/driver/project.rs`),
//! which keeps seed 003's SQLite contract proven under the crash sweep;
//! `System::boot` still resumes whatever they hold ([`CheckpointStore::resume_all`]),
//! which in a root written by the product is nothing. They stay in the
//! schema because the harness writes them: dropping them is a schema
//! migration the harness must learn first (its `LoopRound` op and the
//! oracle's checkpointed-loop model would go with them).

use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

use crate::canary::{Canaries, Canary};
use crate::store::cached::{CachedSql, WriteTx};
use crate::store::schema::{sql, StoreError};

/// Schema version of [`LoopCheckpoint`]; loads from a newer one are refused.
pub const LOOP_CHECKPOINT_SCHEMA_VERSION: u32 = 1;

/// A message as the loop sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// "system" | "user" | "assistant" | "tool".
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    /// JSON of the tool calls an assistant message requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_args: Option<String>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.to_string(),
            content: content.to_string(),
            tool_call_id: None,
            tool_name: None,
            tool_args: None,
        }
    }
}

/// A stored message with its id (the checkpoint boundary unit).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredMessage {
    pub id: i64,
    pub session_id: String,
    pub turn: u64,
    pub message: Message,
}

/// Running token usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// Snapshot of the loop between tool rounds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopCheckpoint {
    pub schema_version: u32,
    pub run_id: String,
    pub session_id: String,
    /// 1-based tool round; 0 means no round completed.
    pub turn: u64,
    pub last_msg_id: i64,
    pub messages: Vec<StoredMessage>,
    pub total_usage: TokenUsage,
    pub tool_calls_count: u64,
    pub checkpoint_ms: u64,
}

impl LoopCheckpoint {
    /// Refuse a checkpoint written by a newer, incompatible build (older
    /// ones load).
    pub fn ensure_loadable(&self) -> Result<(), StoreError> {
        if self.schema_version > LOOP_CHECKPOINT_SCHEMA_VERSION {
            return Err(StoreError::FutureCheckpoint {
                run_id: self.run_id.clone(),
                found: self.schema_version,
                supported: LOOP_CHECKPOINT_SCHEMA_VERSION,
            });
        }
        Ok(())
    }
}

/// What the loop reports at a tool-round boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInput {
    pub run_id: String,
    pub session_id: String,
    pub turn: u64,
    pub total_usage: TokenUsage,
    pub tool_calls_count: u64,
}

/// Where a resumed loop starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    pub checkpoint: Option<LoopCheckpoint>,
    /// The history to continue from.
    pub messages: Vec<StoredMessage>,
    /// Messages deleted past the checkpoint (a crashed partial round).
    pub rolled_back: usize,
}

/// Messages and checkpoints. Stateless apart from its canaries.
#[derive(Debug, Clone, Default)]
pub struct CheckpointStore {
    pub canaries: Canaries,
}

impl CheckpointStore {
    pub fn new(canaries: Canaries) -> Self {
        CheckpointStore { canaries }
    }

    /// Persist one message; returns its id. Returns after COMMIT.
    pub fn append_message(
        &self,
        conn: &Connection,
        session_id: &str,
        turn: u64,
        msg: &Message,
        now_ms: u64,
    ) -> Result<i64, StoreError> {
        conn.execute_cached(
            "INSERT INTO messages (session_id, turn, role, content, tool_call_id, tool_name, \
             tool_args, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                session_id,
                turn,
                msg.role,
                msg.content,
                msg.tool_call_id,
                msg.tool_name,
                msg.tool_args,
                now_ms
            ],
        )
        .map_err(sql("message append"))?;
        Ok(conn.last_insert_rowid())
    }

    /// Write the checkpoint for a completed tool round, in one transaction
    /// with the read of its boundary.
    pub fn write_checkpoint(
        &self,
        conn: &Connection,
        input: &CheckpointInput,
        now_ms: u64,
    ) -> Result<LoopCheckpoint, StoreError> {
        let tx = WriteTx::begin(conn).map_err(sql("checkpoint begin"))?;
        let other_run: Option<String> = tx
            .query_row_cached(
                "SELECT run_id FROM loop_checkpoints WHERE session_id = ?1 AND run_id != ?2 LIMIT 1",
                params![input.session_id, input.run_id],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql("checkpoint read other runs"))?;
        if let Some(other_run) = other_run {
            return Err(StoreError::SessionOfAnotherRun {
                run_id: input.run_id.clone(),
                session_id: input.session_id.clone(),
                other_run,
            });
        }
        let last_msg_id: i64 = tx
            .query_row_cached(
                "SELECT COALESCE(MAX(id), 0) FROM messages WHERE session_id = ?1",
                [&input.session_id],
                |r| r.get(0),
            )
            .map_err(sql("checkpoint read boundary"))?;
        let messages = self.messages_up_to(&tx, &input.session_id, last_msg_id)?;
        let cp = LoopCheckpoint {
            schema_version: LOOP_CHECKPOINT_SCHEMA_VERSION,
            run_id: input.run_id.clone(),
            session_id: input.session_id.clone(),
            turn: input.turn,
            last_msg_id,
            messages,
            total_usage: input.total_usage,
            tool_calls_count: input.tool_calls_count,
            checkpoint_ms: now_ms,
        };
        let json = |what: &str, r: serde_json::Result<String>| {
            r.map_err(|source| StoreError::Json {
                what: format!("checkpoint {what} of run {}", cp.run_id),
                source,
            })
        };
        let messages_json = json("messages", serde_json::to_string(&cp.messages))?;
        let usage_json = json("usage", serde_json::to_string(&cp.total_usage))?;
        tx.execute_cached(
            "INSERT INTO loop_checkpoints (run_id, session_id, turn, last_msg_id, messages_json, \
             usage_json, tool_calls_count, schema_version, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![
                cp.run_id,
                cp.session_id,
                cp.turn,
                cp.last_msg_id,
                messages_json,
                usage_json,
                cp.tool_calls_count,
                cp.schema_version,
                now_ms
            ],
        )
        .map_err(sql("checkpoint insert"))?;
        tx.commit().map_err(sql("checkpoint commit"))?;
        Ok(cp)
    }

    /// The newest checkpoint of `run_id`, refused if from a future schema.
    pub fn latest_checkpoint(
        &self,
        conn: &Connection,
        run_id: &str,
    ) -> Result<Option<LoopCheckpoint>, StoreError> {
        type Raw = (String, u64, i64, String, String, u64, u32, u64);
        // Not cached: run once per resumed run (boot), so a cached prepare
        // would only cost (see `crate::store::cached`).
        let raw: Option<Raw> = conn
            .query_row(
                "SELECT session_id, turn, last_msg_id, messages_json, usage_json, \
                 tool_calls_count, schema_version, created_at FROM loop_checkpoints \
                 WHERE run_id = ?1 ORDER BY id DESC LIMIT 1",
                [run_id],
                |r| Raw::try_from(r),
            )
            .optional()
            .map_err(sql("checkpoint load"))?;
        let Some((session_id, turn, last_msg_id, messages_json, usage_json, calls, version, at)) = raw else {
            return Ok(None);
        };
        let bad = |what: &str| {
            let what = format!("loop_checkpoints.{what} of run {run_id}");
            move |source| StoreError::Json { what, source }
        };
        // Check the version before decoding: a future format may not parse.
        let head = LoopCheckpoint {
            schema_version: version,
            run_id: run_id.to_string(),
            session_id,
            turn,
            last_msg_id,
            messages: Vec::new(),
            total_usage: TokenUsage::default(),
            tool_calls_count: calls,
            checkpoint_ms: at,
        };
        head.ensure_loadable()?;
        Ok(Some(LoopCheckpoint {
            messages: serde_json::from_str(&messages_json).map_err(bad("messages_json"))?,
            total_usage: serde_json::from_str(&usage_json).map_err(bad("usage_json"))?,
            ..head
        }))
    }

    /// Resume `run_id` of `session_id`: with a checkpoint, roll back past
    /// its boundary and reload up to it; without one, load every message.
    pub fn resume(&self, conn: &Connection, run_id: &str, session_id: &str) -> Result<Resume, StoreError> {
        let Some(cp) = self.latest_checkpoint(conn, run_id)? else {
            let messages = self.messages_up_to(conn, session_id, i64::MAX)?;
            return Ok(Resume {
                checkpoint: None,
                messages,
                rolled_back: 0,
            });
        };
        self.resume_from(conn, cp)
    }

    /// Resume from the checkpoint `cp` (already loaded): roll back past its
    /// boundary and reload up to it.
    fn resume_from(&self, conn: &Connection, cp: LoopCheckpoint) -> Result<Resume, StoreError> {
        let run_id = cp.run_id.as_str();
        let rolled_back = if self.canaries.has(Canary::CheckpointRollbackSkipped) {
            0
        } else {
            self.rollback_to(conn, &cp.session_id, cp.last_msg_id)?
        };
        // Canary: without the rollback the partial round reloads too.
        let upto = if self.canaries.has(Canary::CheckpointRollbackSkipped) {
            i64::MAX
        } else {
            cp.last_msg_id
        };
        let messages = self.messages_up_to(conn, &cp.session_id, upto)?;
        if rolled_back > 0 {
            tracing::info!(run_id, rolled_back, "rolled back a partial tool round");
        }
        Ok(Resume {
            checkpoint: Some(cp),
            messages,
            rolled_back,
        })
    }

    /// Boot: resume every run that has a checkpoint (in run id order),
    /// rolling back each one's partial round. Returns each run's resume.
    pub fn resume_all(&self, conn: &Connection) -> Result<Vec<(String, Resume)>, StoreError> {
        let runs = {
            // Not cached: once per boot (see `crate::store::cached`).
            let mut stmt = conn
                .prepare("SELECT DISTINCT run_id FROM loop_checkpoints ORDER BY run_id")
                .map_err(sql("checkpoint runs"))?;
            let rows = stmt
                .query_map([], |r| r.get::<_, String>(0))
                .map_err(sql("checkpoint runs"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(sql("checkpoint runs"))?
        };
        let mut out = Vec::with_capacity(runs.len());
        for run in runs {
            // Every listed run has a checkpoint; one read serves the resume.
            let Some(cp) = self.latest_checkpoint(conn, &run)? else {
                continue;
            };
            let resume = self.resume_from(conn, cp)?;
            out.push((run, resume));
        }
        Ok(out)
    }

    /// Delete the session's messages past `last_msg_id`; returns how many.
    pub fn rollback_to(
        &self,
        conn: &Connection,
        session_id: &str,
        last_msg_id: i64,
    ) -> Result<usize, StoreError> {
        // Not cached: once per resumed run (see `crate::store::cached`).
        conn.execute(
            "DELETE FROM messages WHERE session_id = ?1 AND id > ?2",
            params![session_id, last_msg_id],
        )
        .map_err(sql("messages rollback"))
    }

    /// The session's messages with `id <= last_msg_id`, in order.
    pub fn messages_up_to(
        &self,
        conn: &Connection,
        session_id: &str,
        last_msg_id: i64,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        conn.query_all_cached(
            "SELECT id, session_id, turn, role, content, tool_call_id, tool_name, tool_args \
             FROM messages WHERE session_id = ?1 AND id <= ?2 ORDER BY id",
            params![session_id, last_msg_id],
            |r| {
                Ok(StoredMessage {
                    id: r.get(0)?,
                    session_id: r.get(1)?,
                    turn: r.get(2)?,
                    message: Message {
                        role: r.get(3)?,
                        content: r.get(4)?,
                        tool_call_id: r.get(5)?,
                        tool_name: r.get(6)?,
                        tool_args: r.get(7)?,
                    },
                })
            },
        )
        .map_err(sql("messages load"))
    }
}
