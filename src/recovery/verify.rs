//! `durable-agent verify` and `repair --quarantine`: the read-only check
//! of a whole root, and moving what it found damaged aside.
//!
//! [`verify`] judges a root with the same read-only code the boot's
//! [`super::preflight`] runs ([`super::damage::scan_sessions`],
//! [`super::damage::session_damage`], [`crate::log::repair::inspect`]),
//! plus what the boot leaves to its recovery steps or finds while opening
//! the store: a corrupt log line or session record, a record and log that
//! disagree, the store's `integrity_check` and identity. It is not a
//! second recovery procedure: it repairs nothing and says, for each
//! finding, whether the next boot repairs it (the crash model) or refuses
//! it (damage), and what would move it aside.
//!
//! Invariant: [`verify`] changes nothing and takes no lock. Every call goes
//! through [`ReadOnlyFs`], which refuses every mutation. The store is
//! judged on an in-memory copy of `store.db` and its WAL (a [`SimFs`] with
//! no faults), taken so that a live daemon's writes cannot make it
//! inconsistent (the WAL header is the same before the database is read
//! and after the WAL is; a checkpoint in between only rewrites pages the
//! copied WAL holds). Readers beside a live writer see a log's mark before
//! the log (see [`crate::log::repair::inspect`]), and a log that looks
//! damaged is read again a few times before it is believed (a writer caught
//! between two writes moves on; damage on disk stays), so a live root is
//! not reported damaged.
//!
//! Invariant: [`quarantine`] only renames (never unlinks), under the root
//! lock its caller holds, each move fsynced in both directories, after a
//! `NOTE.txt` (fsynced) saying what was wrong, where it was and how to put
//! it back.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

mod store_read;
use store_read::{StoreCopy, StoreRead};

use super::damage::{
    beside, scan_sessions, session_damage, settled_calls, store_is_missing, DamageError, SessionScan,
};
use crate::canary::Canaries;
use crate::fs::Fs;
use crate::fs::{FsLock, OpenMode};
use crate::log::{self, Event, LogError, EVENTS_FILE};
use crate::runtime::{AgentId, SessionId};
use crate::store::manifest::{self, LostStore, Manifest, ManifestError, MANIFEST_FILE, MANIFEST_VERSION};
use crate::store::session::{SessionError, SessionRecord, SessionState, SessionStore};

/// Where [`quarantine`] moves things, under the root.
pub const QUARANTINE_DIR: &str = "quarantine";
/// The note in every quarantine batch.
pub const NOTE_FILE: &str = "NOTE.txt";

/// A view of an [`Fs`] that reads and refuses every change (`verify`).
/// `sync`/`sync_dir` succeed without doing anything: nothing was written.
#[derive(Debug)]
pub struct ReadOnlyFs(pub Arc<dyn Fs>);

fn refused(path: &Path, label: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{label}: {}: refused, a read-only check changes nothing",
            path.display()
        ),
    )
}

impl Fs for ReadOnlyFs {
    fn create_dir_all(&self, path: &Path, label: &str) -> io::Result<()> {
        Err(refused(path, label))
    }
    fn open(&self, path: &Path, mode: OpenMode, label: &str) -> io::Result<()> {
        match mode {
            OpenMode::Existing => self.0.open(path, mode, label),
            _ => Err(refused(path, label)),
        }
    }
    fn write_at(&self, path: &Path, _offset: u64, _data: &[u8], label: &str) -> io::Result<()> {
        Err(refused(path, label))
    }
    fn append(&self, path: &Path, _data: &[u8], label: &str) -> io::Result<u64> {
        Err(refused(path, label))
    }
    fn read_at(&self, path: &Path, offset: u64, buf: &mut [u8], label: &str) -> io::Result<usize> {
        self.0.read_at(path, offset, buf, label)
    }
    fn read(&self, path: &Path, label: &str) -> io::Result<Vec<u8>> {
        self.0.read(path, label)
    }
    fn len(&self, path: &Path, label: &str) -> io::Result<u64> {
        self.0.len(path, label)
    }
    fn truncate(&self, path: &Path, _len: u64, label: &str) -> io::Result<()> {
        Err(refused(path, label))
    }
    fn sync(&self, _path: &Path, _label: &str) -> io::Result<()> {
        Ok(())
    }
    fn sync_dir(&self, _path: &Path, _label: &str) -> io::Result<()> {
        Ok(())
    }
    fn rename(&self, from: &Path, _to: &Path, label: &str) -> io::Result<()> {
        Err(refused(from, label))
    }
    fn remove(&self, path: &Path, label: &str) -> io::Result<()> {
        Err(refused(path, label))
    }
    fn list(&self, dir: &Path, label: &str) -> io::Result<Vec<String>> {
        self.0.list(dir, label)
    }
    fn exists(&self, path: &Path, label: &str) -> io::Result<bool> {
        self.0.exists(path, label)
    }
    fn lock_exclusive(&self, path: &Path, label: &str) -> io::Result<FsLock> {
        Err(refused(path, label))
    }
}

/// What kind of damage a [`Finding`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// The log ends before its high-water mark (emptied, shortened).
    LostEntries,
    /// No `agent.created`, but a child names the session as parent.
    MissingCreated,
    /// No `session.json`, but the log holds `agent.created` (written only
    /// after the record was durable): the record was lost.
    MissingRecord,
    /// A complete log line fails its checksum or does not parse.
    CorruptLine,
    /// `session.json` fails its checksum, does not parse, or names
    /// another session.
    RecordDamaged,
    /// `session.json` and the log's `agent.created` name different agents.
    AgentMismatch,
    /// A line, record or store (its schema, or a loop checkpoint's) from a
    /// newer durable-agent (not damage: upgrade).
    NewerSchema,
    /// `root.json` says the root has a store; there is none (or it is empty).
    StoreMissing,
    /// `store.db`'s identity is not the one `root.json` names.
    StoreReplaced,
    /// `store.db` is older than the logs: an open turn's log holds the
    /// result of an irreversible call the tool-call ledger has no row for
    /// (an older copy of this root's store put back).
    StoreBehind,
    /// `store.db` does not open, or fails `PRAGMA integrity_check`.
    StoreCorrupt,
    /// `root.json` does not parse.
    ManifestInvalid,
    /// A file could not be read (permissions, I/O).
    Unreadable,
    /// `schedules.json` does not parse, or holds a schedule `POST
    /// /schedules` refuses (the daemon's acknowledged schedules:
    /// `worker::schedule`; checked by the product's `verify`).
    SchedulesInvalid,
}

/// What would repair a [`Finding`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Remedy {
    /// Restore the file from a backup, or `repair --quarantine` (moves the
    /// session's directory aside).
    QuarantineSession,
    /// Restore `store.db` from a backup, or `repair --quarantine
    /// --accept-store-loss` (a new, empty store).
    AcceptStoreLoss,
    /// Restore `root.json`, or `repair --quarantine` (moves it aside; the
    /// next boot writes one from the store present).
    QuarantineManifest,
    /// Nothing quarantine can do (upgrade, fix permissions).
    Manual,
}

/// One damaged thing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub path: PathBuf,
    /// 1-based line of the damage (a session record is line 1).
    pub line: Option<u64>,
    /// Byte offset the damage begins at.
    pub offset: Option<u64>,
    /// The session whose directory holds it.
    pub session: Option<SessionId>,
    pub message: String,
    pub remedy: Remedy,
}

/// One thing checked and found healthy, or one the next boot repairs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Checked {
    pub path: PathBuf,
    pub what: String,
}

/// One session as the logs say (for who depends on whom).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SessionInfo {
    pub session: SessionId,
    /// From its `agent.created`, when the log reads.
    pub parent: Option<SessionId>,
    pub has_record: bool,
    /// Its log holds `agent.created` (without it, and not terminated, the
    /// session is a crash orphan the next boot removes).
    pub created: bool,
    /// `agent.terminated` is logged (a damaged log counts as live).
    pub terminated: bool,
}

/// What [`verify`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Verification {
    pub root: PathBuf,
    pub healthy: Vec<Checked>,
    /// The crash model: what the next boot repairs by itself.
    pub repaired_at_boot: Vec<Checked>,
    pub damaged: Vec<Finding>,
    pub sessions: Vec<SessionInfo>,
    /// The store's identity as `root.json` has it.
    pub manifest_store_id: Option<u32>,
    /// `store.db` exists and is not empty.
    pub store_present: bool,
}

impl Verification {
    pub fn is_healthy(&self) -> bool {
        self.damaged.is_empty()
    }

    /// The live sessions that descend from `session` (their parent chain
    /// reaches it), nearest first.
    pub fn live_descendants(&self, session: &SessionId) -> Vec<SessionId> {
        let mut out = Vec::new();
        let mut frontier = vec![session.clone()];
        let mut seen = BTreeSet::from([session.clone()]);
        while let Some(p) = frontier.pop() {
            for s in &self.sessions {
                if s.parent.as_ref() == Some(&p) && seen.insert(s.session.clone()) {
                    frontier.push(s.session.clone());
                    if !s.terminated {
                        out.push(s.session.clone());
                    }
                }
            }
        }
        out
    }
}

/// Check the root at `root` (store file `db_path`), reading through `fs`
/// and changing nothing (see the module doc).
pub fn verify(fs: Arc<dyn Fs>, root: &Path, db_path: &Path) -> Verification {
    verify_with(fs, root, db_path, Writers::MaybeLive)
}

/// Whether a daemon may be writing the root while [`verify_with`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writers {
    /// A live daemon may be caught between two writes: a log that looks
    /// damaged is scanned again a few times, a pause apart, before it is
    /// believed ([`verify`]).
    MaybeLive,
    /// Nobody writes (the caller holds the root lock, or the disk is a
    /// copy): the first scan is the disk's, believed at once, no pause.
    None,
}

/// [`verify`], told whether a writer may be live.
pub fn verify_with(fs: Arc<dyn Fs>, root: &Path, db_path: &Path, writers: Writers) -> Verification {
    let ro: Arc<dyn Fs> = Arc::new(ReadOnlyFs(fs));
    let mut v = Verification {
        root: root.to_path_buf(),
        ..Verification::default()
    };
    let ledger = check_store(ro.as_ref(), root, db_path, &mut v);
    let scans = check_sessions(&ro, root, writers, &mut v);
    if let (Some(ledger), Some(scans)) = (ledger, scans) {
        check_store_behind(db_path, &ledger, &scans, &mut v);
    }
    v
}

/// The store holds the ledger row of every settled irreversible call of
/// an open turn ([`super::damage::SettledCall`]): what the boot checks
/// ([`super::damage::store_behind`]), every such call reported.
fn check_store_behind(
    db_path: &Path,
    ledger: &store_read::Ledger,
    scans: &[SessionScan],
    v: &mut Verification,
) {
    for call in settled_calls(scans) {
        if ledger.contains(&call.call_id) || ledger.contains(&call.idempotency_key) {
            continue;
        }
        let session = scans
            .iter()
            .find(|s| call.log.parent() == Some(s.dir.as_path()))
            .map(|s| s.id.clone());
        let mut found = finding(
            FindingKind::StoreBehind,
            db_path,
            format!(
                "older than the logs: {} holds the result of irreversible call {} (key {}) of an open \
                 turn, but the store has no ledger row for it: an older copy of this root's store; the \
                 boot refuses the root (a resumed turn would send the effect again)",
                call.log.display(),
                call.call_id,
                call.idempotency_key
            ),
            Remedy::AcceptStoreLoss,
        );
        found.session = session;
        v.damaged.push(found);
    }
}

fn finding(kind: FindingKind, path: &Path, message: impl Into<String>, remedy: Remedy) -> Finding {
    Finding {
        kind,
        path: path.to_path_buf(),
        line: None,
        offset: None,
        session: None,
        message: message.into(),
        remedy,
    }
}

fn healthy(v: &mut Verification, path: &Path, what: impl Into<String>) {
    v.healthy.push(Checked {
        path: path.to_path_buf(),
        what: what.into(),
    });
}

fn at_boot(v: &mut Verification, path: &Path, what: impl Into<String>) {
    v.repaired_at_boot.push(Checked {
        path: path.to_path_buf(),
        what: what.into(),
    });
}

fn unreadable(path: &Path, e: impl std::fmt::Display) -> Finding {
    finding(
        FindingKind::Unreadable,
        path,
        format!("cannot be read: {e}"),
        Remedy::Manual,
    )
}

/// The store's checks; its [`store_read::Ledger`] when it is healthy and
/// the one `root.json` names (or no manifest names one yet).
fn check_store(fs: &dyn Fs, root: &Path, db_path: &Path, v: &mut Verification) -> Option<store_read::Ledger> {
    let manifest_path = root.join(MANIFEST_FILE);
    let manifest = match manifest::read(fs, root) {
        Ok(m) => m,
        Err(ManifestError::Invalid { reason, .. }) => {
            v.damaged.push(finding(
                FindingKind::ManifestInvalid,
                &manifest_path,
                format!("not a root manifest: {reason}"),
                Remedy::QuarantineManifest,
            ));
            None
        }
        Err(e @ ManifestError::NewerSchema { .. }) => {
            v.damaged.push(finding(
                FindingKind::NewerSchema,
                &manifest_path,
                e.to_string(),
                Remedy::Manual,
            ));
            None
        }
        Err(e) => {
            v.damaged.push(unreadable(&manifest_path, e));
            None
        }
    };
    v.manifest_store_id = manifest.map(|m| m.store_id);
    // A store given up is empty by the operator's choice: not older than
    // the logs (no ledger handed back, so nothing is checked against it).
    let mut given_up = false;
    if let Ok(lost) = manifest::read_lost(fs, root) {
        given_up = !lost.is_empty();
        for l in lost {
            healthy(
                v,
                &manifest_path,
                format!(
                    "records store {:08x} as lost (accepted at {} ms; its dedup keys and side-effect \
                     ledger are forgotten)",
                    l.store_id, l.accepted_at_ms
                ),
            );
        }
    }
    match store_is_missing(fs, db_path) {
        Err(e) => {
            v.damaged.push(unreadable(db_path, e));
            None
        }
        Ok(true) => {
            match manifest {
                Some(m) => v.damaged.push(finding(
                    FindingKind::StoreMissing,
                    db_path,
                    format!(
                        "missing or empty, but {} says this root has a store (store id {:08x}): triggers, \
                     runs and the side-effect ledger are gone; the boot refuses the root",
                        manifest_path.display(),
                        m.store_id
                    ),
                    Remedy::AcceptStoreLoss,
                )),
                None => healthy(v, db_path, "no store yet (the first boot creates it)"),
            }
            None
        }
        Ok(false) => {
            v.store_present = true;
            check_store_copy(fs, db_path, manifest, &manifest_path, v).filter(|_| !given_up)
        }
    }
}

/// The first bytes of the WAL (its header, with the salts a restart
/// changes), `None` if there is no WAL.
fn wal_head(fs: &dyn Fs, wal: &Path) -> io::Result<Option<Vec<u8>>> {
    match fs.exists(wal, "store.db-wal exists (verify)")? {
        false => Ok(None),
        true => {
            let mut head = vec![0u8; 32];
            let n = crate::fs::read_full_at(fs, wal, 0, &mut head, "store.db-wal header (verify)")?;
            head.truncate(n);
            Ok(Some(head))
        }
    }
}

/// A consistent copy of `store.db`, its WAL (see the module doc) and its
/// rollback journal; an error names the file. The journal matters once:
/// the store is created in rollback mode before it switches to WAL, so a
/// crash while the first pages are written leaves a hot journal that the
/// boot's SQLite rolls back, and so must the copy's (without it the copy
/// is a half-written file, reported corrupt although the boot recovers).
fn copy_store(fs: &dyn Fs, db_path: &Path) -> Result<StoreCopy, (PathBuf, String)> {
    let wal = beside(db_path, "-wal");
    let journal_path = beside(db_path, "-journal");
    let journal = match fs.read(&journal_path, "store.db-journal read (verify)") {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err((journal_path, e.to_string())),
    };
    for _ in 0..20 {
        let before = wal_head(fs, &wal).map_err(|e| (wal.clone(), e.to_string()))?;
        let db = fs
            .read(db_path, "store.db read (verify)")
            .map_err(|e| (db_path.to_path_buf(), e.to_string()))?;
        let wal_bytes = match fs.read(&wal, "store.db-wal read (verify)") {
            Ok(bytes) => Some(bytes),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err((wal.clone(), e.to_string())),
        };
        let after = wal_bytes.as_ref().map(|b| b[..b.len().min(32)].to_vec());
        if before == after {
            return Ok(StoreCopy {
                db,
                wal: wal_bytes,
                journal,
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Err((
        db_path.to_path_buf(),
        "the store's WAL restarted under every copy (a busy daemon): run verify again".to_string(),
    ))
}

fn check_store_copy(
    fs: &dyn Fs,
    db_path: &Path,
    manifest: Option<Manifest>,
    manifest_path: &Path,
    v: &mut Verification,
) -> Option<store_read::Ledger> {
    let copy = match copy_store(fs, db_path) {
        Ok(copy) => copy,
        Err((path, e)) => {
            v.damaged.push(unreadable(&path, e));
            return None;
        }
    };
    let (read, ledger) = store_read::read_with_ledger(copy);
    // A store this build cannot use: its finding, and nothing more to check.
    let found = match read {
        StoreRead::Healthy { store_id } => Ok(store_id),
        StoreRead::Corrupt(message) => Err(finding(
            FindingKind::StoreCorrupt,
            db_path,
            message,
            Remedy::AcceptStoreLoss,
        )),
        StoreRead::Newer(message) => Err(finding(
            FindingKind::NewerSchema,
            db_path,
            message,
            Remedy::Manual,
        )),
        StoreRead::CopyFailed(message) => Err(unreadable(db_path, message)),
    };
    let found = match found {
        Ok(store_id) => store_id,
        Err(f) => {
            v.damaged.push(f);
            return None;
        }
    };
    match manifest {
        Some(m) if m.store_id == found => {
            healthy(
                v,
                db_path,
                format!("integrity_check ok; store id {found:08x}, the one root.json names"),
            );
            Some(ledger)
        }
        Some(m) => {
            v.damaged.push(finding(
                FindingKind::StoreReplaced,
                db_path,
                format!(
                "store id {found:08x}, but {} names {:08x}: the store was emptied or replaced by another \
                 root's; the boot refuses the root",
                manifest_path.display(),
                m.store_id
            ),
                Remedy::AcceptStoreLoss,
            ));
            None
        }
        None => {
            healthy(
                v,
                db_path,
                format!(
                    "integrity_check ok; store id {found:08x} (no root.json yet: the next boot writes it)"
                ),
            );
            Some(ledger)
        }
    }
}

/// A log looks damaged in `scans` (lost entries or a bad line).
fn logs_look_damaged(scans: &[SessionScan]) -> bool {
    scans.iter().any(|s| match &s.log {
        Some(Ok(found)) => found.lost_entries().is_some(),
        Some(Err(_)) => true,
        None => false,
    })
}

/// How often a damaged-looking scan is taken again before it is believed,
/// and how long apart: a live writer can be caught between two writes (a
/// session's first `events.pending` durable before its log exists, a line
/// half copied), never for long; damage on disk stays.
const RESCANS: u32 = 3;
const RESCAN_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// The sessions' checks; the scans they judged (`None` if the sessions
/// could not be listed).
fn check_sessions(
    fs: &Arc<dyn Fs>,
    root: &Path,
    writers: Writers,
    v: &mut Verification,
) -> Option<Vec<SessionScan>> {
    let rescans = match writers {
        Writers::MaybeLive => RESCANS,
        Writers::None => 0,
    };
    let mut attempt = 0;
    let scans = loop {
        let scans = match scan_sessions(fs.as_ref(), root) {
            Ok(scans) => scans,
            Err(e) => {
                let path = e.path().map_or_else(|| root.join("agents"), Path::to_path_buf);
                v.damaged.push(unreadable(&path, e));
                return None;
            }
        };
        if attempt >= rescans || !logs_look_damaged(&scans) {
            break scans;
        }
        attempt += 1;
        std::thread::sleep(RESCAN_PAUSE);
    };
    let store = match SessionStore::open(fs.clone(), root, Canaries::none()) {
        Ok(store) => Some(store),
        Err(e) => {
            if !scans.is_empty() {
                v.damaged.push(unreadable(&root.join("agents"), e));
            }
            None
        }
    };
    // Each session's record as read once (None: none, or unreadable and
    // reported): the placement check judges the records the session
    // checks judged, not a second read of them.
    let mut records = Vec::with_capacity(scans.len());
    for s in &scans {
        v.sessions.push(SessionInfo {
            session: s.id.clone(),
            parent: s.parent().cloned(),
            has_record: s.has_record,
            created: s.created(),
            terminated: s.terminated(),
        });
        let record = if s.has_record {
            load_record(store.as_ref(), s, v)
        } else {
            None
        };
        check_session(fs.as_ref(), s, record.as_ref(), v);
        records.push(record);
    }
    cut_off(&scans, &records, v);
    for damage in session_damage(&scans) {
        let session = scans
            .iter()
            .find(|s| damage.path().is_some_and(|p| p.parent() == Some(s.dir.as_path())))
            .map(|s| s.id.clone());
        let (kind, line, offset) = match (&damage, &session) {
            (DamageError::LostEntries { found, .. }, Some(id)) => {
                let valid = scans.iter().find(|s| &s.id == id).and_then(|s| match &s.log {
                    Some(Ok(found)) => Some(found.valid_len),
                    _ => None,
                });
                (FindingKind::LostEntries, Some(found + 1), valid)
            }
            (DamageError::LostEntries { found, .. }, None) => {
                (FindingKind::LostEntries, Some(found + 1), None)
            }
            (DamageError::MissingRecord { .. }, _) => (FindingKind::MissingRecord, None, None),
            _ => (FindingKind::MissingCreated, Some(1), Some(0)),
        };
        let path = damage
            .path()
            .map_or_else(|| root.to_path_buf(), Path::to_path_buf);
        v.damaged.push(Finding {
            kind,
            path,
            line,
            offset,
            session,
            message: damage_message(&damage),
            remedy: Remedy::QuarantineSession,
        });
    }
    Some(scans)
}

/// The live sessions whose parent never resolves (its directory is gone,
/// or it is cut off itself): the boot terminates each for good and
/// reports it (recovery step 5), so `verify` lists each as done at boot.
/// Live as the boot counts it: a record not TERMINATED, a log that reads,
/// holds `agent.created` and no `agent.terminated`.
fn cut_off(scans: &[SessionScan], records: &[Option<SessionRecord>], v: &mut Verification) {
    let live: Vec<&SessionScan> = scans
        .iter()
        .zip(records)
        .filter(|(s, record)| {
            s.has_record
                && matches!(s.log, Some(Ok(_)))
                && s.created()
                && !s.terminated()
                && record
                    .as_ref()
                    .is_some_and(|r| r.state != SessionState::Terminated)
        })
        .map(|(s, _)| s)
        .collect();
    let (_, cut) = super::placement::place(live, |s| &s.id, |s| s.parent());
    for s in cut {
        let parent = s.parent().map(SessionId::as_str).unwrap_or_default();
        at_boot(
            v,
            &s.dir,
            format!(
                "its parent session {parent} never resolves (its directory is gone, or it is cut off \
                 itself): the next boot terminates this session for good; restore the parent's \
                 directory first to keep it"
            ),
        );
    }
}

/// The damage's message without the path prefix and the advice (the
/// report gives both).
fn damage_message(damage: &DamageError) -> String {
    match damage {
        DamageError::LostEntries { expected, found, .. } => format!(
            "the log ends after {found} entries, but {expected} were acknowledged (events.pending beside \
             it holds seq {}): acknowledged entries were lost; the boot refuses the root",
            expected.saturating_sub(1)
        ),
        DamageError::MissingCreated { evidence, .. } => format!(
            "no agent.created, but the agent existed ({evidence}): the log is damaged, not a crash \
             orphan; the boot refuses the root"
        ),
        other => other.to_string(),
    }
}

/// `s`'s record, read once; a record that cannot be read, or is damaged
/// or newer, is reported here (and is `None`).
fn load_record(store: Option<&SessionStore>, s: &SessionScan, v: &mut Verification) -> Option<SessionRecord> {
    let record_path = s.dir.join(crate::store::session::SESSION_FILE);
    let with_session = |mut f: Finding| {
        f.session = Some(s.id.clone());
        f
    };
    match store.map(|st| st.load(&s.id)) {
        Some(Ok(record)) => record,
        Some(Err(SessionError::Corrupt { reason, .. })) => {
            let mut f = finding(
                FindingKind::RecordDamaged,
                &record_path,
                reason,
                Remedy::QuarantineSession,
            );
            f.line = Some(1);
            f.offset = Some(0);
            v.damaged.push(with_session(f));
            None
        }
        Some(Err(e @ SessionError::NewerSchema { .. })) => {
            let mut f = finding(
                FindingKind::NewerSchema,
                &record_path,
                e.to_string(),
                Remedy::Manual,
            );
            f.line = Some(1);
            f.offset = Some(0);
            v.damaged.push(with_session(f));
            None
        }
        Some(Err(SessionError::Invalid { reason, .. })) => {
            let mut f = finding(
                FindingKind::RecordDamaged,
                &record_path,
                reason,
                Remedy::QuarantineSession,
            );
            f.line = Some(1);
            f.offset = Some(0);
            v.damaged.push(with_session(f));
            None
        }
        Some(Err(e)) => {
            v.damaged.push(with_session(unreadable(&record_path, e)));
            None
        }
        None => None,
    }
}

/// `s`'s log and its agreement with `record` (as [`load_record`] read it).
fn check_session(fs: &dyn Fs, s: &SessionScan, record: Option<&SessionRecord>, v: &mut Verification) {
    let log_path = s.dir.join(EVENTS_FILE);
    let record_path = s.dir.join(crate::store::session::SESSION_FILE);
    let with_session = |mut f: Finding| {
        f.session = Some(s.id.clone());
        f
    };
    if s.created_without_record.is_some() {
        return; // reported with the session damage (MissingRecord)
    }
    if !s.has_record {
        at_boot(
            v,
            &s.dir,
            "no session.json: a crash orphan from session creation (the next boot removes its files)",
        );
        return;
    }
    let Some(log) = &s.log else { return };
    let found = match log {
        Ok(found) => found,
        Err(LogError::Corrupt {
            path,
            line,
            offset,
            reason,
        }) => {
            let replaced = match log::repair::pending_replaces_line(fs, &s.dir, &s.id, *offset) {
                Ok(replaced) => replaced,
                // Unknown: not corruption either (the boot may replace
                // it), so the read is reported (found by the harness's F2).
                Err(e) => {
                    v.damaged
                        .push(with_session(unreadable(&s.dir.join(log::PENDING_FILE), e)));
                    return;
                }
            };
            if replaced {
                at_boot(
                    v,
                    path,
                    format!(
                        "line {line} (byte {offset}), the last, is a damaged copy of the entry \
                         events.pending holds whole: the next boot replaces it (the crash model)"
                    ),
                );
            } else {
                let mut f = finding(
                    FindingKind::CorruptLine,
                    path,
                    reason.clone(),
                    Remedy::QuarantineSession,
                );
                f.line = Some(*line);
                f.offset = Some(*offset);
                v.damaged.push(with_session(f));
            }
            return;
        }
        Err(LogError::NewerSchema {
            path,
            line,
            offset,
            found,
            supported,
        }) => {
            let mut f = finding(
                FindingKind::NewerSchema,
                path,
                format!(
                    "schema_version {found}, newer than the supported {supported}: upgrade durable-agent"
                ),
                Remedy::Manual,
            );
            f.line = Some(*line);
            f.offset = Some(*offset);
            v.damaged.push(with_session(f));
            return;
        }
        Err(e) => {
            v.damaged.push(with_session(unreadable(&log_path, e)));
            return;
        }
    };
    let created: Option<&AgentId> = found.entries.iter().find_map(|e| match &e.event {
        Event::AgentCreated { agent_id, .. } => Some(agent_id),
        _ => None,
    });
    if let (Some(record), Some(agent)) = (record, created) {
        if &record.agent_id != agent {
            v.damaged.push(with_session(finding(
                FindingKind::AgentMismatch,
                &log_path,
                format!(
                    "agent.created names agent {agent} but {} names {}: one of them is damaged",
                    record_path.display(),
                    record.agent_id
                ),
                Remedy::QuarantineSession,
            )));
            return;
        }
    }
    if found.lost_entries().is_some() {
        return; // reported by session_damage
    }
    // An error is reported, never taken for "no torn tail" (found by the
    // harness's F2: the report then called the log healthy).
    let on_disk = match fs.len(&log_path, "events.jsonl size (verify)") {
        Ok(len) => len,
        Err(e) if e.kind() == io::ErrorKind::NotFound => found.valid_len,
        Err(e) => {
            v.damaged.push(with_session(unreadable(&log_path, e)));
            return;
        }
    };
    if on_disk > found.valid_len {
        at_boot(
            v,
            &log_path,
            format!(
                "{} bytes after the last complete line (byte {}): a torn append, never acknowledged (the \
                 next boot cuts it; or a write in flight)",
                on_disk - found.valid_len,
                found.valid_len
            ),
        );
    }
    let n = found.entries.len();
    let mark = found.pending_seq.map_or_else(
        || "no high-water mark".to_string(),
        |s| format!("high-water mark seq {s}"),
    );
    // As the boot decides (recovery step 4): a session neither created
    // nor terminated (in its log or its record) is a crash orphan from
    // session creation, whose files the boot removes — listed at boot, as
    // a record-less one is; its files are whole, so they are listed too.
    let record_terminated = record.is_some_and(|r| r.state == SessionState::Terminated);
    let terminated = s.terminated() || record_terminated;
    let state = if created.is_none() && terminated {
        ", terminated"
    } else {
        ""
    };
    healthy(
        v,
        &log_path,
        format!(
            "{n} entries, seq 0..{}, checksums ok, {mark}{state}",
            n.saturating_sub(1)
        ),
    );
    if record.is_some() {
        healthy(v, &record_path, "record ok");
    }
    if created.is_none() && !terminated && record.is_some() {
        at_boot(
            v,
            &s.dir,
            "session.json, but no agent.created in its log: a crash orphan from session creation \
             (the next boot removes its files)",
        );
    }
}

/// Why `repair --quarantine` refused (nothing was moved), or failed.
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    #[error(
        "{}: session {session} has live descendants ({}) that would lose their parent; nothing was \
         moved. Restore the file from a backup, or pass --force to move them to the quarantine with it",
        path.display(), children.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    LiveChildren {
        path: PathBuf,
        session: SessionId,
        children: Vec<SessionId>,
    },
    #[error(
        "{}: {reason}; nothing was moved. Restore store.db from a backup (docs/OPERATING.md), or pass \
         --accept-store-loss: a new, empty store, every trigger, run, dedup key and the side-effect \
         ledger forgotten (a deduplicated trigger or an email that already happened can happen again)",
        path.display()
    )]
    StoreLoss { path: PathBuf, reason: String },
    #[error("{}: {message}: not something quarantine repairs; nothing was moved", path.display())]
    NotRepairable { path: PathBuf, message: String },
    #[error(
        "{step} on {}: {source} (run repair again: what was moved is in the quarantine batch, with its \
         note)",
        path.display()
    )]
    Io {
        path: PathBuf,
        step: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    Manifest(#[from] ManifestError),
    #[error("{}: creating the new store: {reason}", path.display())]
    NewStore { path: PathBuf, reason: String },
}

/// One thing to move aside.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QuarantineItem {
    /// Relative to the root (`agents/{session}`, `store.db`, `root.json`).
    pub path: PathBuf,
    /// What was wrong (or why it goes along).
    pub why: Vec<String>,
}

/// What [`quarantine`] will do.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct QuarantinePlan {
    pub items: Vec<QuarantineItem>,
    /// The store is given up: a new one is created and `root.json`
    /// records the old identity as lost.
    pub store_loss: bool,
}

impl QuarantinePlan {
    fn add(&mut self, path: PathBuf, why: String) {
        match self.items.iter_mut().find(|i| i.path == path) {
            Some(item) => {
                if !item.why.contains(&why) {
                    item.why.push(why);
                }
            }
            None => self.items.push(QuarantineItem { path, why: vec![why] }),
        }
    }
}

fn describe(f: &Finding) -> String {
    let at = match (f.line, f.offset) {
        (Some(l), Some(o)) => format!(" line {l} (byte {o})"),
        (Some(l), None) => format!(" line {l}"),
        _ => String::new(),
    };
    format!("{}{at}: {}", f.path.display(), f.message)
}

/// What `repair --quarantine` would move for `v`'s findings. Refuses
/// (nothing to move) when a damaged session has live descendants and not
/// `force` (with it they go along, so nothing is cut off from its parent
/// and no child is terminated), when the store would be lost and not
/// `accept_store_loss`, and for findings quarantine does not repair
/// (a newer schema, an unreadable file).
pub fn plan_quarantine(
    v: &Verification,
    force: bool,
    accept_store_loss: bool,
) -> Result<QuarantinePlan, RepairError> {
    let mut plan = QuarantinePlan::default();
    let rel = |p: &Path| {
        p.strip_prefix(&v.root)
            .map_or_else(|_| p.to_path_buf(), Path::to_path_buf)
    };
    for f in &v.damaged {
        match f.remedy {
            Remedy::Manual => {
                return Err(RepairError::NotRepairable {
                    path: f.path.clone(),
                    message: f.message.clone(),
                })
            }
            Remedy::QuarantineSession => {
                let Some(session) = &f.session else {
                    return Err(RepairError::NotRepairable {
                        path: f.path.clone(),
                        message: f.message.clone(),
                    });
                };
                let dir = PathBuf::from("agents").join(session.to_string());
                plan.add(dir, describe(f));
                let children = v.live_descendants(session);
                if !children.is_empty() && !force {
                    return Err(RepairError::LiveChildren {
                        path: f.path.clone(),
                        session: session.clone(),
                        children,
                    });
                }
                for child in children {
                    plan.add(
                        PathBuf::from("agents").join(child.to_string()),
                        format!("moved with its ancestor session {session} (--force), itself undamaged"),
                    );
                }
            }
            Remedy::AcceptStoreLoss => {
                if !accept_store_loss {
                    return Err(RepairError::StoreLoss {
                        path: f.path.clone(),
                        reason: f.message.clone(),
                    });
                }
                plan.store_loss = true;
                plan.add(rel(&f.path), describe(f));
            }
            Remedy::QuarantineManifest => {
                if !v.store_present && !accept_store_loss {
                    return Err(RepairError::StoreLoss {
                        path: f.path.clone(),
                        reason: format!(
                            "{}; and there is no store.db: without the manifest the next boot would create \
                             an empty store",
                            f.message
                        ),
                    });
                }
                plan.add(rel(&f.path), describe(f));
            }
        }
    }
    if plan.store_loss {
        // The store's side files go with it (a WAL holds committed pages).
        for side in ["store.db", "store.db-wal"] {
            if v.store_present || side == "store.db-wal" {
                plan.add(
                    PathBuf::from(side),
                    "the store given up (--accept-store-loss)".to_string(),
                );
            }
        }
    }
    Ok(plan)
}

/// Move `plan`'s items that exist from `root` into a new batch
/// `{root}/quarantine/NNNN-<UTC time>/` (e.g. `0001-20261125T153907Z`),
/// at the same relative paths, after its `NOTE.txt`; then, for a store
/// loss, create a new store and record the old identity as lost in
/// `root.json`. The caller holds the root lock. Returns the batch
/// directory. A session moves as one directory rename (atomic).
pub fn quarantine(
    fs: &Arc<dyn Fs>,
    root: &Path,
    db_path: &Path,
    plan: &QuarantinePlan,
    old_store_id: Option<u32>,
    now_ms: u64,
) -> Result<PathBuf, RepairError> {
    let io = |path: &Path, step: &'static str| {
        let path = path.to_path_buf();
        move |source| RepairError::Io { path, step, source }
    };
    let qroot = root.join(QUARANTINE_DIR);
    fs.create_dir_all(&qroot, "quarantine mkdir")
        .map_err(io(&qroot, "mkdir"))?;
    let taken = fs.list(&qroot, "quarantine list").map_err(io(&qroot, "list"))?;
    let mut n = taken.len() + 1;
    let batch = loop {
        let name = format!("{n:04}-{}", utc_stamp(now_ms, true));
        if !taken.iter().any(|t| t == &name) {
            break qroot.join(name);
        }
        n += 1;
    };
    fs.create_dir_all(&batch, "quarantine batch mkdir")
        .map_err(io(&batch, "mkdir"))?;
    fs.sync_dir(&qroot, "quarantine dir fsync")
        .map_err(io(&qroot, "dir fsync"))?;
    fs.sync_dir(root, "root dir fsync (quarantine)")
        .map_err(io(root, "dir fsync"))?;
    let note_path = batch.join(NOTE_FILE);
    let note = note(root, &batch, plan, old_store_id, now_ms);
    fs.open(&note_path, OpenMode::CreateNew, "NOTE.txt create")
        .map_err(io(&note_path, "create"))?;
    fs.write_at(&note_path, 0, note.as_bytes(), "NOTE.txt write")
        .map_err(io(&note_path, "write"))?;
    fs.sync(&note_path, "NOTE.txt fsync")
        .map_err(io(&note_path, "fsync"))?;
    fs.sync_dir(&batch, "quarantine batch fsync")
        .map_err(io(&batch, "dir fsync"))?;
    let mut moved_store = false;
    for item in &plan.items {
        let from = root.join(&item.path);
        if !fs
            .exists(&from, "quarantine source exists")
            .map_err(io(&from, "exists"))?
        {
            continue;
        }
        let to = batch.join(&item.path);
        if let Some(parent) = to.parent() {
            if parent != batch {
                fs.create_dir_all(parent, "quarantine item mkdir")
                    .map_err(io(parent, "mkdir"))?;
                fs.sync_dir(parent, "quarantine item dir fsync")
                    .map_err(io(parent, "dir fsync"))?;
                fs.sync_dir(&batch, "quarantine batch fsync")
                    .map_err(io(&batch, "dir fsync"))?;
            }
        }
        fs.rename(&from, &to, "quarantine rename")
            .map_err(io(&from, "rename"))?;
        if let Some(parent) = to.parent() {
            fs.sync_dir(parent, "quarantine dest fsync")
                .map_err(io(parent, "dir fsync"))?;
        }
        if let Some(parent) = from.parent() {
            fs.sync_dir(parent, "quarantine source fsync")
                .map_err(io(parent, "dir fsync"))?;
        }
        moved_store |= item.path == Path::new("store.db");
        tracing::warn!(from = %from.display(), to = %to.display(), "moved to quarantine");
    }
    if plan.store_loss {
        new_store(
            fs,
            root,
            db_path,
            old_store_id,
            moved_store.then(|| rel_str(root, &batch)),
            now_ms,
        )?;
    }
    Ok(batch)
}

/// `now_ms` (ms since the UNIX epoch) as UTC: `2026-11-25T15:39:07Z`, or
/// `20261125T153907Z` when `compact` (a directory name).
fn utc_stamp(now_ms: u64, compact: bool) -> String {
    let secs = now_ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (rem / 3_600, rem % 3_600 / 60, rem % 60);
    if compact {
        format!("{year:04}{month:02}{day:02}T{h:02}{m:02}{s:02}Z")
    } else {
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
    }
}

fn rel_str(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

/// A new, empty store with a new identity, and `root.json` naming it with
/// the old identity recorded as lost.
fn new_store(
    fs: &Arc<dyn Fs>,
    root: &Path,
    db_path: &Path,
    old_store_id: Option<u32>,
    quarantined_to: Option<String>,
    now_ms: u64,
) -> Result<(), RepairError> {
    let err = |reason: String| RepairError::NewStore {
        path: db_path.to_path_buf(),
        reason,
    };
    // The history of lost stores keeps a new store id from repeating an
    // old one: unread, the check below would be blind.
    let mut lost = manifest::read_lost(fs.as_ref(), root).map_err(|e| err(e.to_string()))?;
    let mut bytes = now_ms.to_le_bytes().to_vec();
    bytes.extend_from_slice(root.as_os_str().as_encoded_bytes());
    bytes.extend_from_slice(b"accept-store-loss");
    let mut store_id = {
        let h = crate::runtime::ids::fnv1a(&bytes);
        ((h ^ (h >> 32)) as u32).max(1)
    };
    if Some(store_id) == old_store_id || lost.iter().any(|l| l.store_id == store_id) {
        store_id = store_id.wrapping_add(1).max(1);
    }
    let db = crate::store::schema::open_store(fs.clone(), db_path, &crate::sqlite::SqliteOptions::default())
        .map_err(|e| err(e.to_string()))?;
    db.conn()
        .pragma_update(None, "application_id", store_id as i32)
        .map_err(|e| err(e.to_string()))?;
    db.close().map_err(|e| err(e.to_string()))?;
    lost.push(LostStore {
        store_id: old_store_id.unwrap_or(0),
        accepted_at_ms: now_ms,
        quarantined_to,
    });
    let m = Manifest {
        schema_version: MANIFEST_VERSION,
        store_id,
    };
    manifest::write_with_history(fs.as_ref(), root, &m, &lost)?;
    Ok(())
}

fn note(root: &Path, batch: &Path, plan: &QuarantinePlan, old_store_id: Option<u32>, now_ms: u64) -> String {
    let mut out = format!(
        "Moved here by `durable-agent repair --quarantine` at {} (UTC),\n\
         from the root {}. Nothing was deleted: every file is here as it was found.\n\n",
        utc_stamp(now_ms, false),
        root.display()
    );
    for item in &plan.items {
        out.push_str(&format!(
            "{}\n  was {}\n",
            item.path.display(),
            root.join(&item.path).display()
        ));
        for why in &item.why {
            out.push_str(&format!("  why: {why}\n"));
        }
        out.push('\n');
    }
    out.push_str(
        "To restore (after restoring the damaged file in it from a backup, or to look again):\n\
         stop every durable-agent using the root, then move the item back to where it was:\n",
    );
    for item in &plan.items {
        out.push_str(&format!(
            "  mv {} {}\n",
            batch.join(&item.path).display(),
            root.join(&item.path).display()
        ));
    }
    if plan.store_loss {
        out.push_str(&format!(
            "\nThe store was given up (--accept-store-loss): a new, empty store.db was created and\n\
             root.json names it, recording store id {} as lost. Its triggers, runs, dedup keys and the\n\
             side-effect ledger are forgotten. To put the old store back instead: stop the daemon, move\n\
             the new store.db (and store.db-wal) aside, move the old one back, and set root.json's\n\
             store_id to {0} (a decimal number).\n",
            old_store_id.map_or_else(|| "unknown".to_string(), |id| id.to_string())
        ));
    }
    out.push_str("\nThen `durable-agent verify ROOT` says whether the root is healthy.\n");
    out
}

#[cfg(test)]
mod tests {
    use super::utc_stamp;

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(0, false), "1970-01-01T00:00:00Z");
        assert_eq!(utc_stamp(1_700_000_000_000, false), "2023-11-14T22:13:20Z");
        assert_eq!(utc_stamp(951_782_400_000, true), "20000229T000000Z");
        assert_eq!(utc_stamp(4_107_542_400_000, false), "2100-03-01T00:00:00Z");
    }
}
