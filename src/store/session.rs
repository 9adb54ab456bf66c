//! Session records: `<root>/agents/<session_id>/session.json`, written
//! atomically (write `session.json.tmp`, fsync, rename, fsync the directory).
//!
//! Invariant: a reader sees either the previous complete record or the new
//! complete one, never a torn one; once [`SessionStore::write`] returns the
//! new record survives power loss. A session directory's creation is synced
//! up the chain (`agents/`, the root, the directory holding the root: `.`
//! for a bare relative one) before a record is
//! written in it. `.tmp` leftovers are never read, and [`SessionStore::scan`]
//! removes them. A record is read version first: one a newer build wrote
//! is [`SessionError::NewerSchema`] whatever its shape, never damage.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::canary::{Canaries, Canary};
use crate::checksum::{self, Sealed};
use crate::fs::{holding_dir, Fs, OpenMode};
use crate::runtime::ids::{AgentId, SessionId};

/// Schema version of `session.json`.
/// Version 2 writes the record as one sealed JSON line (see
/// [`crate::checksum`]); version-1 records (pretty-printed, no checksum)
/// still load.
pub const SESSION_SCHEMA_VERSION: u32 = 2;
/// The first version whose records carry a checksum.
const CHECKSUM_VERSION: u32 = 2;
/// Record file name inside a session directory.
pub const SESSION_FILE: &str = "session.json";
const SESSION_TMP: &str = "session.json.tmp";

/// Lifecycle state of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SessionState {
    /// Holds a provider slot.
    Active,
    /// Evicted (or recovered); restored on next use.
    Suspended,
    /// The agent is dead.
    Terminated,
}

/// The metadata snapshot of one session (no tree data: that lives in the log).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub schema_version: u32,
    pub session_id: SessionId,
    pub agent_id: AgentId,
    pub provider: String,
    pub model: String,
    pub state: SessionState,
    /// Provider blob saved at suspend (a fast path; the log is the truth).
    pub provider_state: Option<String>,
    /// Logical time of the last write.
    pub updated_ts: u64,
}

/// A session store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// I/O failed; the outcome is unknown. Reopen the runtime to recover.
    #[error("{step} on {path}: {source} (outcome unknown: reopen to recover)")]
    Io {
        path: PathBuf,
        step: String,
        #[source]
        source: io::Error,
    },
    /// `session.json` does not parse, or names another session.
    #[error("{path}: invalid session record: {reason} (inspect or quarantine the directory)")]
    Invalid { path: PathBuf, reason: String },
    /// `session.json` was written by a newer version of durable-agent: not
    /// damage, so never quarantined; an upgrade reads it.
    #[error(
        "{path}: line 1 (byte 0) has schema_version {found}, newer than the supported \
         {supported}: upgrade durable-agent to read this record"
    )]
    NewerSchema {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    /// `session.json` fails its checksum: bits changed after it was
    /// written. The record (one line) is at line 1, byte 0.
    #[error("{path}: line 1 (byte 0) is corrupt: {reason} (inspect or quarantine the directory; nothing was dropped)")]
    Corrupt { path: PathBuf, reason: String },
}

fn io_err(path: &Path, step: &str) -> impl FnOnce(io::Error) -> SessionError {
    let path = path.to_path_buf();
    let step = step.to_string();
    move |source| SessionError::Io { path, step, source }
}

/// The `schema_version` of a record, read alone: the one member every
/// version of `session.json` writes, so it is known before the rest of the
/// record is fitted to this build's shape.
fn record_version(bytes: &[u8]) -> Result<u32, serde_json::Error> {
    #[derive(Deserialize)]
    struct Probe {
        schema_version: u32,
    }
    serde_json::from_slice::<Probe>(bytes).map(|p| p.schema_version)
}

/// One directory found by [`SessionStore::scan`].
#[derive(Debug, Clone, PartialEq)]
pub enum ScannedSession {
    /// A directory with a valid record.
    Record(SessionRecord),
    /// A directory without `session.json` (crash between mkdir and record).
    NoRecord(SessionId),
    /// An entry whose name is not a session id (not ours; left alone).
    Foreign(String),
}

/// The session records under `<root>/agents/`.
#[derive(Debug, Clone)]
pub struct SessionStore {
    fs: Arc<dyn Fs>,
    agents_dir: PathBuf,
    canaries: Canaries,
}

impl SessionStore {
    /// Open the store, creating `<root>/agents/` durably if missing: every
    /// newly created directory's entry is synced in its parent.
    pub fn open(fs: Arc<dyn Fs>, root: &Path, canaries: Canaries) -> Result<Self, SessionError> {
        let agents_dir = root.join("agents");
        let mut missing = Vec::new();
        for dir in agents_dir.ancestors() {
            if dir.as_os_str().is_empty() {
                break;
            }
            let exists = fs
                .exists(dir, "agents dir exists")
                .map_err(io_err(dir, "exists"))?;
            if exists {
                break;
            }
            missing.push(dir.to_path_buf());
        }
        if !missing.is_empty() {
            fs.create_dir_all(&agents_dir, "agents dir mkdir")
                .map_err(io_err(&agents_dir, "mkdir"))?;
        }
        if !canaries.has(Canary::NoDirFsync) {
            // Every new entry is synced in its parent, deepest first. The
            // chain root/agents is synced even when it already existed: a
            // process crash may have cut its first creation short of the
            // fsync, and everything acknowledged later depends on it.
            // A bare relative root's entry is in `.` (see `holding_dir`).
            let mut dirs: Vec<&Path> = missing.iter().filter_map(|d| holding_dir(d)).collect();
            dirs.extend([agents_dir.as_path(), root]);
            dirs.extend(holding_dir(root));
            let mut done = std::collections::BTreeSet::new();
            for dir in dirs {
                if !dir.as_os_str().is_empty() && done.insert(dir) {
                    fs.sync_dir(dir, "dir fsync (agents chain)")
                        .map_err(io_err(dir, "dir fsync"))?;
                }
            }
        }
        Ok(SessionStore {
            fs,
            agents_dir,
            canaries,
        })
    }

    /// `<root>/agents/<id>/`.
    pub fn dir(&self, id: &SessionId) -> PathBuf {
        self.agents_dir.join(id.as_str())
    }

    /// Create the session directory (synced into `agents/`) and write its
    /// first record.
    pub fn create(&self, record: &SessionRecord) -> Result<PathBuf, SessionError> {
        let dir = self.dir(&record.session_id);
        self.fs
            .create_dir_all(&dir, "session dir mkdir")
            .map_err(io_err(&dir, "mkdir"))?;
        if !self.canaries.has(Canary::NoDirFsync) {
            self.fs
                .sync_dir(&self.agents_dir, "agents dir fsync (session mkdir)")
                .map_err(io_err(&self.agents_dir, "dir fsync"))?;
        }
        self.write(record)?;
        Ok(dir)
    }

    /// Atomically replace the record.
    pub fn write(&self, record: &SessionRecord) -> Result<(), SessionError> {
        let dir = self.dir(&record.session_id);
        let tmp = dir.join(SESSION_TMP);
        let path = dir.join(SESSION_FILE);
        let object = serde_json::to_string(record).map_err(|e| SessionError::Invalid {
            path: path.clone(),
            reason: format!("cannot serialize: {e}"),
        })?;
        let mut bytes = if record.schema_version >= CHECKSUM_VERSION {
            checksum::seal(&object).into_bytes()
        } else {
            object.into_bytes()
        };
        bytes.push(b'\n');
        let fs = &self.fs;
        fs.open(&tmp, OpenMode::Truncate, "session.json.tmp create")
            .map_err(io_err(&tmp, "create"))?;
        fs.write_at(&tmp, 0, &bytes, "session.json.tmp write")
            .map_err(io_err(&tmp, "write"))?;
        if !self.canaries.has(Canary::NoFsyncBeforeRename) {
            fs.sync(&tmp, "session.json.tmp fsync")
                .map_err(io_err(&tmp, "fsync"))?;
        }
        fs.rename(&tmp, &path, "session.json rename")
            .map_err(io_err(&path, "rename"))?;
        if !self.canaries.has(Canary::NoDirFsync) {
            fs.sync_dir(&dir, "session dir fsync (session.json rename)")
                .map_err(io_err(&dir, "dir fsync"))?;
        }
        Ok(())
    }

    /// Read one record (a missing file is `Ok(None)`).
    pub fn load(&self, id: &SessionId) -> Result<Option<SessionRecord>, SessionError> {
        let path = self.dir(id).join(SESSION_FILE);
        let bytes = match self.fs.read(&path, "session.json read") {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(&path, "read")(e)),
        };
        let line = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
        let sealed = if self.canaries.has(Canary::NoChecksumVerify) {
            Sealed::Unsealed
        } else {
            checksum::check(line)
        };
        if let Sealed::Mismatch { stored, computed } = sealed {
            return Err(SessionError::Corrupt {
                path,
                reason: format!(
                    "checksum mismatch: the record says {stored:08x}, its bytes give {computed:08x} \
                     (bits changed at rest or in transit)"
                ),
            });
        }
        // The version first, from only the key every version writes: a
        // newer build's record may have a shape this build does not know
        // (that is why versions are bumped), and it is refused as newer,
        // never as damage. A line without even that much is damaged
        // whatever its version (a flip in a sealed record's seal can break
        // its JSON too).
        let version = record_version(&bytes).map_err(|e| SessionError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        if sealed == Sealed::Unsealed
            && version >= CHECKSUM_VERSION
            && !self.canaries.has(Canary::NoChecksumVerify)
        {
            return Err(SessionError::Corrupt {
                path,
                reason: format!("a version-{version} record without its checksum (its seal is damaged)"),
            });
        }
        if version > SESSION_SCHEMA_VERSION {
            return Err(SessionError::NewerSchema {
                path,
                found: version,
                supported: SESSION_SCHEMA_VERSION,
            });
        }
        let record: SessionRecord = serde_json::from_slice(&bytes).map_err(|e| SessionError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        if record.session_id != *id {
            return Err(SessionError::Invalid {
                path,
                reason: format!("record names session {} in directory {id}", record.session_id),
            });
        }
        Ok(Some(record))
    }

    /// Every session directory, sorted by id; removes `.tmp` leftovers
    /// (returns how many were removed).
    pub fn scan(&self) -> Result<(Vec<ScannedSession>, u64), SessionError> {
        let names = self
            .fs
            .list(&self.agents_dir, "agents dir list")
            .map_err(io_err(&self.agents_dir, "list"))?;
        let mut out = Vec::new();
        let mut tmp_removed = 0;
        for name in names {
            let Ok(id) = SessionId::from_hex(&name) else {
                // Not a name this runtime ever creates, so it holds nothing
                // acknowledged: reported, left alone.
                tracing::warn!(entry = %name, "ignoring a foreign entry in agents/");
                out.push(ScannedSession::Foreign(name));
                continue;
            };
            let tmp = self.dir(&id).join(SESSION_TMP);
            let has_tmp = self
                .fs
                .exists(&tmp, "session.json.tmp exists (scan)")
                .map_err(io_err(&tmp, "exists"))?;
            if has_tmp {
                self.fs
                    .remove(&tmp, "session.json.tmp unlink (scan)")
                    .map_err(io_err(&tmp, "unlink"))?;
                tmp_removed += 1;
            }
            match self.load(&id)? {
                Some(record) => out.push(ScannedSession::Record(record)),
                None => out.push(ScannedSession::NoRecord(id)),
            }
        }
        Ok((out, tmp_removed))
    }

    /// Remove every file of a session (orphan cleanup). `session.json` goes
    /// first so a crash mid-cleanup leaves a record-less directory, which
    /// the next recovery cleans again. The empty directory stays (the seam
    /// has no rmdir); its id is never reused.
    pub fn remove_files(&self, id: &SessionId) -> Result<(), SessionError> {
        let dir = self.dir(id);
        let mut names = self
            .fs
            .list(&dir, "session dir list (cleanup)")
            .map_err(io_err(&dir, "list"))?;
        names.sort_by_key(|n| n != SESSION_FILE);
        for name in names {
            let path = dir.join(&name);
            self.fs
                .remove(&path, "session file unlink (orphan cleanup)")
                .map_err(io_err(&path, "unlink"))?;
        }
        self.fs
            .sync_dir(&dir, "session dir fsync (orphan cleanup)")
            .map_err(io_err(&dir, "dir fsync"))?;
        Ok(())
    }
}
