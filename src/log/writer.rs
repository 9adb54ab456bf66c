//! [`EventLog`]: appends entries to one session's `events.jsonl` through the
//! pending-file WAL.
//!
//! Invariant: `append` returns `Ok` only after the entry's line is fsynced in
//! `events.jsonl` (acknowledged means durable). Any I/O error is an unknown
//! outcome: the entry may or may not be in the log, and the caller must stop
//! and recover.
//!
//! Invariant of the WAL: while an append writes `events.jsonl`, the whole
//! entry is durable in `events.pending` — its data fsynced, and its
//! directory entry too. A power cut may persist the log append's pages in
//! any order (a complete last line with old or zero bytes in it); only the
//! pending copy lets recovery tell that torn, unacknowledged append from
//! corruption, so the copy must not be lost with the same cut. The file is
//! created once per opened log, with a directory fsync, then overwritten in
//! place (`O_TRUNC` + write + fsync: no directory change) for every later
//! append and never unlinked by the writer: it always holds the last entry
//! or a torn write of the next one, which recovery dedups by `seq` or
//! ignores, then removes.
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::canary::{Canaries, Canary};
use crate::fs::{Fs, OpenMode};
use crate::runtime::ids::SessionId;

use super::{Event, LogEntry, LogError, EVENTS_FILE, PENDING_FILE};

/// The writer of one session's log. Holds the next `seq`.
#[derive(Debug, Clone)]
pub struct EventLog {
    fs: Arc<dyn Fs>,
    dir: PathBuf,
    session_id: SessionId,
    next_seq: u64,
    canaries: Canaries,
    /// `events.pending`'s directory entry is durable (created and
    /// dir-fsynced by this writer).
    pending_durable: bool,
}

impl EventLog {
    /// Create an empty `events.jsonl` in `dir` (an existing session
    /// directory) and make its directory entry durable.
    pub fn create(
        fs: Arc<dyn Fs>,
        dir: &Path,
        session_id: SessionId,
        canaries: Canaries,
    ) -> Result<EventLog, LogError> {
        let path = dir.join(EVENTS_FILE);
        fs.open(&path, OpenMode::Create, "events.jsonl create")
            .map_err(|e| LogError::io(&path, "create", e))?;
        if !canaries.has(Canary::NoDirFsync) {
            fs.sync_dir(dir, "session dir fsync (events.jsonl create)")
                .map_err(|e| LogError::io(dir, "dir fsync", e))?;
        }
        Ok(EventLog {
            fs,
            dir: dir.to_path_buf(),
            session_id,
            next_seq: 0,
            canaries,
            pending_durable: false,
        })
    }

    /// Reopen a log that recovery repaired; `next_seq` is one past its last entry.
    pub fn reopen(
        fs: Arc<dyn Fs>,
        dir: &Path,
        session_id: SessionId,
        next_seq: u64,
        canaries: Canaries,
    ) -> EventLog {
        EventLog {
            fs,
            dir: dir.to_path_buf(),
            session_id,
            next_seq,
            canaries,
            pending_durable: false,
        }
    }

    /// Path of `events.jsonl`.
    pub fn path(&self) -> PathBuf {
        self.dir.join(EVENTS_FILE)
    }

    /// The session this log belongs to.
    pub fn session_id(&self) -> &SessionId {
        &self.session_id
    }

    /// The `seq` the next entry will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Append `event` at logical time `ts`; returns the entry once durable.
    pub fn append(&mut self, ts: u64, event: Event) -> Result<LogEntry, LogError> {
        let entry = LogEntry {
            schema_version: event.min_version(),
            session_id: self.session_id.clone(),
            seq: self.next_seq,
            ts,
            event,
        };
        let name = entry.event.name();
        let path = self.path();
        let line = entry.to_line().map_err(|source| LogError::Serialize {
            path: path.clone(),
            event: name.to_string(),
            source,
        })?;
        if self.canaries.has(Canary::AckBeforeLog) {
            // CANARY: fire-and-forget append, acknowledged without waiting
            // for (or even checking) durability.
            let _ = self
                .fs
                .append(&path, line.as_bytes(), &format!("events.jsonl append {name}"));
            self.next_seq += 1;
            return Ok(entry);
        }
        let pending = self.dir.join(PENDING_FILE);
        let io = |p: &Path, step: &str| {
            let p = p.to_path_buf();
            let step = step.to_string();
            move |e| LogError::io(&p, &step, e)
        };
        self.fs
            .open(
                &pending,
                OpenMode::Truncate,
                &format!("events.pending create {name}"),
            )
            .map_err(io(&pending, "create"))?;
        self.fs
            .write_at(
                &pending,
                0,
                line.as_bytes(),
                &format!("events.pending write {name}"),
            )
            .map_err(io(&pending, "write"))?;
        self.fs
            .sync(&pending, &format!("events.pending fsync {name}"))
            .map_err(io(&pending, "fsync"))?;
        if !self.pending_durable && !self.canaries.has(Canary::NoDirFsync) {
            // Recovery removed the file, so this append created it: its
            // entry must survive the power cut the copy is there for.
            self.fs
                .sync_dir(
                    &self.dir,
                    &format!("session dir fsync (events.pending create {name})"),
                )
                .map_err(io(&self.dir, "dir fsync"))?;
            self.pending_durable = true;
        }
        self.fs
            .append(&path, line.as_bytes(), &format!("events.jsonl append {name}"))
            .map_err(io(&path, "append"))?;
        self.fs
            .sync(&path, &format!("events.jsonl fsync {name}"))
            .map_err(io(&path, "fsync"))?;
        self.next_seq += 1;
        tracing::trace!(session = %self.session_id, seq = entry.seq, event = name, "logged");
        Ok(entry)
    }
}
