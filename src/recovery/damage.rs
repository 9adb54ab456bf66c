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

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use crate::fs::Fs;
use crate::log::{self, Event, EVENTS_FILE, PENDING_FILE};
use crate::runtime::SessionId;
use crate::store::manifest::{self, Manifest, ManifestError, MANIFEST_FILE};
use crate::store::session::SESSION_FILE;

/// Damage outside the crash model: the root is left as it was.
#[derive(Debug, thiserror::Error)]
pub enum DamageError {
    #[error(
        "{}: the log ends after {found} entries, but {expected} were acknowledged ({PENDING_FILE} \
         beside it holds seq {}): acknowledged entries were lost (the file was emptied, shortened or \
         replaced). Nothing was changed. Restore the file from a backup, or move the session's directory \
         to quarantine/ (see docs/OPERATING.md)",
        path.display(), expected.saturating_sub(1)
    )]
    LostEntries {
        path: PathBuf,
        expected: u64,
        found: u64,
    },
    #[error(
        "{}: no agent.created, but the agent existed ({evidence}): the log is damaged, not a crash \
         orphan. Nothing was changed. Restore the file from a backup, or move the session's directory to quarantine/ \
         (see docs/OPERATING.md)",
        path.display()
    )]
    MissingCreated { path: PathBuf, evidence: String },
    #[error(
        "{}: missing or empty, but {} says this root has a store (store id {store_id:08x}): \
         triggers, runs and the side-effect ledger would be forgotten. Nothing was changed. Restore \
         store.db from a backup (see docs/OPERATING.md)",
        path.display(), manifest.display()
    )]
    StoreMissing {
        path: PathBuf,
        manifest: PathBuf,
        store_id: u32,
    },
    #[error(
        "{}: store id {found:08x}, but {} names {expected:08x}: the store was emptied or replaced \
         by another root's. Restore this root's store.db from a backup (see docs/OPERATING.md)",
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
            | DamageError::StoreMissing { path, .. }
            | DamageError::StoreReplaced { path, .. }
            | DamageError::Io { path, .. } => Some(path),
            DamageError::Manifest(ManifestError::Io { path, .. } | ManifestError::Invalid { path, .. }) => {
                Some(path)
            }
        }
    }
}

/// One session's log as the recovery steps would find it.
#[derive(Debug)]
struct Seen {
    dir: PathBuf,
    created: bool,
    terminated: bool,
    parent: Option<SessionId>,
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
    check_sessions(fs, root)?;
    Ok(found)
}

/// `store.db` is absent, or empty with no write-ahead log holding its
/// pages (a store that ever committed has one or the other).
fn store_is_missing(fs: &dyn Fs, db_path: &Path) -> Result<bool, DamageError> {
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
    let mut wal = db_path.as_os_str().to_owned();
    wal.push("-wal");
    let wal = PathBuf::from(wal);
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

/// The session checks (see the module doc).
fn check_sessions(fs: &dyn Fs, root: &Path) -> Result<(), DamageError> {
    let agents = root.join("agents");
    let io = |path: &Path, step| {
        let path = path.to_path_buf();
        move |source| DamageError::Io { path, step, source }
    };
    if !fs
        .exists(&agents, "agents dir exists (preflight)")
        .map_err(io(&agents, "exists"))?
    {
        return Ok(());
    }
    let names = fs
        .list(&agents, "agents dir list (preflight)")
        .map_err(io(&agents, "list"))?;
    let mut seen: BTreeMap<SessionId, Seen> = BTreeMap::new();
    for name in names {
        let Ok(id) = SessionId::from_hex(&name) else {
            continue;
        };
        let dir = agents.join(&name);
        let record = dir.join(SESSION_FILE);
        if !fs
            .exists(&record, "session.json exists (preflight)")
            .map_err(io(&record, "exists"))?
        {
            continue; // a crash orphan from session creation
        }
        // A log that does not parse is the recovery steps' to report.
        let Ok(found) = log::repair::inspect(fs, &dir, &id) else {
            continue;
        };
        if let Some((expected, found)) = found.lost_entries() {
            return Err(DamageError::LostEntries {
                path: dir.join(EVENTS_FILE),
                expected,
                found,
            });
        }
        let mut s = Seen {
            dir,
            created: false,
            terminated: false,
            parent: None,
        };
        for e in &found.entries {
            match &e.event {
                Event::AgentCreated {
                    parent_session_id, ..
                } => {
                    s.created = true;
                    s.parent = parent_session_id.clone();
                }
                Event::AgentTerminated { .. } => s.terminated = true,
                _ => {}
            }
        }
        seen.insert(id, s);
    }
    for (id, s) in &seen {
        if s.created || s.terminated {
            continue;
        }
        let child = seen
            .iter()
            .find(|(_, c)| c.parent.as_ref() == Some(id))
            .map(|(child, _)| child);
        if let Some(child) = child {
            return Err(DamageError::MissingCreated {
                path: s.dir.join(EVENTS_FILE),
                evidence: format!("session {child}'s agent.created names session {id} as its parent"),
            });
        }
    }
    Ok(())
}
