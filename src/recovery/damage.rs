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
//!   identity is not the manifest's (checked by the boot);
//! - a store **older than the logs** (an older copy of this root's own
//!   `store.db` put back): an open turn's log holds the result of an
//!   irreversible call ([`SettledCall`]) whose tool-call ledger row the
//!   store lacks. The row is committed before that result is appended, and
//!   GC keeps an open turn's rows, so no crash leaves the result without
//!   it; a boot over such a store would resume the turn and send the
//!   settled effect again (checked by the boot once the store is open:
//!   [`store_behind`]). An older copy that no open turn's log contradicts
//!   is not detected (a stated limit, docs/OPERATING.md), nor checked once
//!   the manifest records a store given up (`--accept-store-loss`: the
//!   new store lacks every row by the operator's choice).
//!
//! A crash orphan — a session whose log never held `agent.created`, with
//! no mark and no child saying the agent existed — is not damage: the
//! recovery steps clean it up as before.
//!
//! Invariant: [`preflight`] only reads. A file it cannot parse is left to
//! the recovery steps, which report it with its line and offset — except
//! the log of a session without `session.json`: a complete line there,
//! readable or not, says the record was lost (no crash leaves an orphan's
//! log a complete line), and the boot would delete it, so it is refused.
//! `durable-agent verify` ([`super::verify`]) runs the same read-only
//! checks ([`scan_sessions`], [`session_damage`], [`store_is_missing`])
//! over the whole root and reports every finding, not just the first.

use std::io;
use std::path::{Path, PathBuf};

use crate::fs::Fs;
use crate::log::repair::LogInspection;
use crate::log::{self, Event, LogError, EVENTS_FILE, PENDING_FILE};
use crate::runtime::orchestration::OrchestrationTool;
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
        "{}: missing, but {evidence} (the record is written, and made durable, before the log's first \
         line): the record was lost or deleted, not a crash orphan, and the boot would delete the log. \
         Nothing was changed. Restore session.json from a backup, or move the session aside with \
         `durable-agent repair --quarantine` (see docs/OPERATING.md)",
        path.display()
    )]
    MissingRecord { path: PathBuf, evidence: String },
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
    #[error(
        "{}: older than the logs: {} holds the result of irreversible call {call_id} (key \
         {idempotency_key}) of an open turn, but the store has no ledger row for it (written before \
         the result): an older copy of this root's store was put back, and a resumed turn would send \
         the effect again. Nothing was changed. Restore the store.db the logs were written with (or the \
         whole root from one backup), or give it up with `durable-agent repair --quarantine \
         --accept-store-loss` (see docs/OPERATING.md)",
        path.display(), log.display()
    )]
    StoreBehind {
        path: PathBuf,
        log: PathBuf,
        call_id: String,
        idempotency_key: String,
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
            | DamageError::MissingRecord { path, .. }
            | DamageError::StoreMissing { path, .. }
            | DamageError::StoreReplaced { path, .. }
            | DamageError::StoreBehind { path, .. }
            | DamageError::Io { path, .. } => Some(path),
            DamageError::Manifest(e) => Some(e.path()),
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
    /// Without a record: what in the log says it was written — a
    /// readable `agent.created`, or a complete line that does not read (a
    /// damaged line, or a newer build's). Every line is appended after the
    /// record is durable, so the record was lost (damage), not never
    /// written; a crash orphan's log holds no complete line.
    pub created_without_record: Option<String>,
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

/// What [`preflight`] found that the boot checks once the store is open.
#[derive(Debug, Default)]
pub struct Preflight {
    /// The root's manifest, if any (the opened store's identity must be
    /// the one it names).
    pub manifest: Option<Manifest>,
    /// The settled irreversible calls of open turns (the store must hold
    /// their ledger rows: [`store_behind`]).
    pub settled: Vec<SettledCall>,
}

/// Every damage this module knows, in `root`, before anything changes;
/// `db_path` is the store's file.
pub fn preflight(fs: &dyn Fs, root: &Path, db_path: &Path) -> Result<Preflight, DamageError> {
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
    let mut settled = settled_calls(&scans);
    // A store given up (`repair --accept-store-loss`, recorded in the
    // manifest) is new and empty by the operator's choice: its ledger
    // lacks every row the logs prove, and is not older than them.
    if !settled.is_empty() && !manifest::read_lost(fs, root)?.is_empty() {
        settled.clear();
    }
    Ok(Preflight {
        manifest: found,
        settled,
    })
}

/// An irreversible call of a session's open turn (its last `turn.start`,
/// no `turn.complete` after it, the agent not terminated) whose
/// `tool.result` the log holds. `SystemTools::execute` commits the call's
/// tool-call ledger row before it returns the result the runtime then
/// appends, and GC never collects an open turn's rows (GUARANTEES 29): a
/// store without the row is older than the log. Denied calls and the
/// runtime's own orchestration tools never reach the ledger and are not
/// listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettledCall {
    pub log: PathBuf,
    pub call_id: String,
    pub idempotency_key: String,
}

/// The [`SettledCall`]s of `scans`' readable logs.
pub fn settled_calls(scans: &[SessionScan]) -> Vec<SettledCall> {
    let mut out = Vec::new();
    for s in scans {
        if s.terminated() {
            continue;
        }
        let entries = s.entries();
        let Some(start) = entries
            .iter()
            .rposition(|e| matches!(e.event, Event::TurnStart { .. }))
        else {
            continue;
        };
        let open = &entries[start..];
        if open.iter().any(|e| matches!(e.event, Event::TurnComplete { .. })) {
            continue;
        }
        let decided: Vec<&log::DecidedCall> = open
            .iter()
            .filter_map(|e| match &e.event {
                Event::RoundDecided { calls, .. } => Some(calls),
                _ => None,
            })
            .flatten()
            .collect();
        for e in open {
            let Event::ToolResult { call_id, .. } = &e.event else {
                continue;
            };
            let call = decided.iter().rev().find(|c| &c.call_id == call_id);
            if let Some(c) = call.filter(|c| {
                c.irreversible
                    && c.hook.as_ref().is_none_or(|h| h.denied.is_none())
                    && OrchestrationTool::from_name(&c.tool).is_none()
            }) {
                out.push(SettledCall {
                    log: s.dir.join(EVENTS_FILE),
                    call_id: c.call_id.clone(),
                    idempotency_key: c.idempotency_key.clone(),
                });
            }
        }
    }
    out
}

/// The first of `settled` whose ledger row `known` (by call id or
/// idempotency key: a re-run of a rolled-back turn answers from the row
/// of the same key) does not hold, as [`DamageError::StoreBehind`].
pub fn store_behind(
    db_path: &Path,
    settled: &[SettledCall],
    mut known: impl FnMut(&SettledCall) -> Result<bool, DamageError>,
) -> Result<(), DamageError> {
    for call in settled {
        if !known(call)? {
            return Err(DamageError::StoreBehind {
                path: db_path.to_path_buf(),
                log: call.log.clone(),
                call_id: call.call_id.clone(),
                idempotency_key: call.idempotency_key.clone(),
            });
        }
    }
    Ok(())
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
        // Without a record, what the log holds decides between a crash
        // orphan (deleted) and a lost record (refused): `agent.created`, or
        // any complete line — a damaged one too (two damages at once: the
        // record lost and a line rotted must not make the session an
        // orphan the boot deletes). A read that failed decides nothing,
        // so it fails the scan (found by the harness's F2: an EIO here had
        // the lost record's log taken for an orphan's).
        let created_without_record = if has_record {
            None
        } else {
            match log::repair::inspect(fs, &dir, &id) {
                Ok(found) => found
                    .entries
                    .iter()
                    .any(|e| matches!(e.event, Event::AgentCreated { .. }))
                    .then(|| "the session's log holds agent.created".to_string()),
                Err(LogError::Io { path, source, .. }) => {
                    return Err(DamageError::Io {
                        path,
                        step: "log read without session.json (preflight)",
                        source,
                    })
                }
                Err(e) => Some(format!("the session's log holds a complete line ({e})")),
            }
        };
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
/// `agent.created`. A log that does not parse is not here (the recovery
/// steps report it with its line and offset, and [`verify`] too) unless
/// its record is missing: then it is a lost record ([`SessionScan`]).
pub fn session_damage(scans: &[SessionScan]) -> Vec<DamageError> {
    let mut out: Vec<DamageError> = scans
        .iter()
        .filter_map(|s| {
            s.created_without_record
                .as_ref()
                .map(|evidence| DamageError::MissingRecord {
                    path: s.dir.join(SESSION_FILE),
                    evidence: evidence.clone(),
                })
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
