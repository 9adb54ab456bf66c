//! Damage outside the crash model, found before recovery changes a byte.
//!
//! The crash model (a torn tail, lost unsynced writes, a power cut, one
//! rotted line) is repaired silently by the recovery steps. What no crash
//! can produce is refused here, naming the file and what is missing, so
//! that recovery never mistakes it for a crash and "cleans it up":
//! - a log that lost acknowledged entries: it ends before the `seq` its
//!   `events.pending` high-water mark holds (an emptied, shortened or
//!   lost `events.jsonl`; see [`crate::log::repair`]);
//! - a session whose log has no `agent.created` although another session's
//!   `agent.created` names it as parent (the parent's creation was durable
//!   before any child's): a damaged log, not a crash orphan;
//! - a root whose manifest says it has a store, without `store.db` (or
//!   with an emptied one) — and, after the store is opened, a store whose
//!   identity is not the manifest's (checked by the boot).
//!
//! A crash orphan — a session whose log never held `agent.created`, with
//! no mark and no child saying the agent existed — is not damage: the
//! recovery steps clean it up as before.
//!
//! Invariant: [`preflight`] only reads. A file it cannot parse is left to
//! the recovery steps, which report it with its line and offset.
//! `durable-agent verify` ([`super::verify`]) runs the same read-only
//! checks ([`scan_sessions`], [`session_damage`], [`store_is_missing`])
//! over the whole root and reports every finding, not just the first.

use std::io;
use std::path::{Path, PathBuf};

use crate::fs::Fs;
use crate::log::repair::LogInspection;
use crate::log::{self, Event, LogError, EVENTS_FILE, PENDING_FILE};
use crate::runtime::SessionId;
use crate::store::manifest::{self, Manifest, ManifestError, MANIFEST_FILE};
use crate::store::session::SESSION_FILE;

/// Damage outside the crash model: the root is left as it was.
#[derive(Debug, thiserror::Error)]
pub enum DamageError {
    #[error(
        "{}: the log ends after {found} entries, but {expected} were acknowledged ({PENDING_FILE} \
         beside it holds seq {}): acknowledged entries were lost (the file was emptied, shortened or \
         replaced). Nothing was changed. Restore the file from a backup, or move the session aside with \
         `durable-agent repair --quarantine` (see docs/OPERATING.md)",
        path.display(), expected.saturating_sub(1)
    )]
    LostEntries {
        path: PathBuf,
        expected: u64,
        found: u64,
    },
    #[error(
        "{}: no agent.created, but the agent existed ({evidence}): the log is damaged, not a crash \
         orphan. Nothing was changed. Restore the file from a backup, or move the session aside with \
         `durable-agent repair --quarantine` (see docs/OPERATING.md)",
        path.display()
    )]
    MissingCreated { path: PathBuf, evidence: String },
    #[error(
        "{}: missing, but the session's log holds agent.created (the record is written, and made \
         durable, before it): the record was lost or deleted, not a crash orphan, and the boot would \
         delete the log. Nothing was changed. Restore session.json from a backup, or move the session \
         aside with `durable-agent repair --quarantine` (see docs/OPERATING.md)",
        path.display()
    )]
    MissingRecord { path: PathBuf },
    #[error(
        "{}: missing or empty, but {} says this root has a store (store id {store_id:08x}): \
         triggers, runs and the side-effect ledger would be forgotten. Nothing was changed. Restore \
         store.db from a backup, or give it up with `durable-agent repair --quarantine \
         --accept-store-loss` (see docs/OPERATING.md)",
        path.display(), manifest.display()
    )]
    StoreMissing {
        path: PathBuf,
        manifest: PathBuf,
        store_id: u32,
    },
    #[error(
        "{}: store id {found:08x}, but {} names {expected:08x}: the store was emptied or replaced \
         by another root's. Nothing was changed. Restore this root's store.db from a backup, or give it up \
         with `durable-agent repair --quarantine --accept-store-loss` (see docs/OPERATING.md)",
        path.display(), manifest.display()
    )]
    StoreReplaced {
        path: PathBuf,
        manifest: PathBuf,
        expected: u32,
        found: u32,
    },
    #[error("{0}")]
    Manifest(#[from] ManifestError),
    #[error("{step} on {}: {source}", path.display())]
    Io {
        path: PathBuf,
        step: &'static str,
        #[source]
        source: io::Error,
    },
}

impl DamageError {
    /// The file the damage is in.
    pub fn path(&self) -> Option<&Path> {
        match self {
            DamageError::LostEntries { path, .. }
            | DamageError::MissingCreated { path, .. }
            | DamageError::MissingRecord { path }
            | DamageError::StoreMissing { path, .. }
            | DamageError::StoreReplaced { path, .. }
            | DamageError::Io { path, .. } => Some(path),
            DamageError::Manifest(ManifestError::Io { path, .. } | ManifestError::Invalid { path, .. }) => {
                Some(path)
            }
        }
    }
}

/// One session directory under `{root}/agents/`, read only: what both
/// [`preflight`] and [`super::verify::verify`] judge.
#[derive(Debug)]
pub struct SessionScan {
    pub id: SessionId,
    pub dir: PathBuf,
    /// `session.json` exists (a directory without one is a crash orphan
    /// from session creation, cleaned by recovery).
    pub has_record: bool,
    /// The log as [`log::repair::inspect`] reads it (only with a record).
    pub log: Option<Result<LogInspection, LogError>>,
    /// Without a record: the log nevertheless holds a readable
    /// `agent.created` — which is only appended after the record is
    /// durable, so the record was lost (damage), not never written.
    pub created_without_record: bool,
}

impl SessionScan {
    fn entries(&self) -> &[log::LogEntry] {
        match &self.log {
            Some(Ok(found)) => &found.entries,
            _ => &[],
        }
    }

    /// The log holds `agent.created`.
    pub fn created(&self) -> bool {
        self.entries()
            .iter()
            .any(|e| matches!(e.event, Event::AgentCreated { .. }))
    }

    /// The log holds `agent.terminated`.
    pub fn terminated(&self) -> bool {
        self.entries()
            .iter()
            .any(|e| matches!(e.event, Event::AgentTerminated { .. }))
    }

    /// The parent session its `agent.created` names.
    pub fn parent(&self) -> Option<&SessionId> {
        self.entries().iter().find_map(|e| match &e.event {
            Event::AgentCreated {
                parent_session_id, ..
            } => parent_session_id.as_ref(),
            _ => None,
        })
    }
}

/// Every damage this module knows, in `root`, before anything changes;
/// `db_path` is the store's file. Returns the manifest, if any (the boot
/// checks the opened store's identity against it).
pub fn preflight(fs: &dyn Fs, root: &Path, db_path: &Path) -> Result<Option<Manifest>, DamageError> {
    let found = manifest::read(fs, root)?;
    if let Some(m) = &found {
        if store_is_missing(fs, db_path)? {
            return Err(DamageError::StoreMissing {
                path: db_path.to_path_buf(),
                manifest: root.join(MANIFEST_FILE),
                store_id: m.store_id,
            });
        }
    }
    let scans = scan_sessions(fs, root)?;
    if let Some(first) = session_damage(&scans).into_iter().next() {
        return Err(first);
    }
    Ok(found)
}

/// Every session directory under `{root}/agents/` (sorted by name; names
/// that are not session ids are skipped), read only.
pub fn scan_sessions(fs: &dyn Fs, root: &Path) -> Result<Vec<SessionScan>, DamageError> {
    let agents = root.join("agents");
    let io = |path: &Path, step| {
        let path = path.to_path_buf();
        move |source| DamageError::Io { path, step, source }
    };
    if !fs
        .exists(&agents, "agents dir exists (preflight)")
        .map_err(io(&agents, "exists"))?
    {
        return Ok(Vec::new());
    }
    let names = fs
        .list(&agents, "agents dir list (preflight)")
        .map_err(io(&agents, "list"))?;
    let mut out = Vec::new();
    for name in names {
        let Ok(id) = SessionId::from_hex(&name) else {
            continue;
        };
        let dir = agents.join(&name);
        let record = dir.join(SESSION_FILE);
        let has_record = fs
            .exists(&record, "session.json exists (preflight)")
            .map_err(io(&record, "exists"))?;
        let log = has_record.then(|| log::repair::inspect(fs, &dir, &id));
        let created_without_record = !has_record
            && log::repair::inspect(fs, &dir, &id).is_ok_and(|found| {
                found
                    .entries
                    .iter()
                    .any(|e| matches!(e.event, Event::AgentCreated { .. }))
            });
        out.push(SessionScan {
            id,
            dir,
            has_record,
            log,
            created_without_record,
        });
    }
    Ok(out)
}

/// The session damage in `scans` (see the module doc), in the order
/// [`preflight`] reports it: lost entries by session, then missing
/// `agent.created`. A log that does not parse is not here: the recovery
/// steps report it with its line and offset ([`verify`] reports it too).
pub fn session_damage(scans: &[SessionScan]) -> Vec<DamageError> {
    let mut out: Vec<DamageError> = scans
        .iter()
        .filter(|s| s.created_without_record)
        .map(|s| DamageError::MissingRecord {
            path: s.dir.join(SESSION_FILE),
        })
        .collect();
    for s in scans {
        if let Some(Ok(found)) = &s.log {
            if let Some((expected, found)) = found.lost_entries() {
                out.push(DamageError::LostEntries {
                    path: s.dir.join(EVENTS_FILE),
                    expected,
                    found,
                });
            }
        }
    }
    for s in scans {
        if !matches!(s.log, Some(Ok(_))) || s.created() || s.terminated() {
            continue;
        }
        let child = scans
            .iter()
            .find(|c| matches!(c.log, Some(Ok(_))) && c.parent() == Some(&s.id));
        if let Some(child) = child {
            out.push(DamageError::MissingCreated {
                path: s.dir.join(EVENTS_FILE),
                evidence: format!(
                    "session {}'s agent.created names session {} as its parent",
                    child.id, s.id
                ),
            });
        }
    }
    out
}

/// A file SQLite keeps beside `db_path`: `db_path` with `suffix`
/// (`-wal`, `-journal`) appended.
pub(super) fn beside(db_path: &Path, suffix: &str) -> PathBuf {
    let mut path = db_path.as_os_str().to_owned();
    path.push(suffix);
    PathBuf::from(path)
}

/// `store.db` is absent, or empty with no write-ahead log holding its
/// pages (a store that ever committed has one or the other).
pub fn store_is_missing(fs: &dyn Fs, db_path: &Path) -> Result<bool, DamageError> {
    let io = |step| {
        let path = db_path.to_path_buf();
        move |source| DamageError::Io { path, step, source }
    };
    if !fs
        .exists(db_path, "store.db exists (preflight)")
        .map_err(io("exists"))?
    {
        return Ok(true);
    }
    if fs.len(db_path, "store.db size (preflight)").map_err(io("size"))? > 0 {
        return Ok(false);
    }
    let wal = beside(db_path, "-wal");
    let wal_len = match fs.len(&wal, "store.db-wal size (preflight)") {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
        Err(source) => {
            return Err(DamageError::Io {
                path: wal,
                step: "size",
                source,
            })
        }
    };
    Ok(wal_len == 0)
}
