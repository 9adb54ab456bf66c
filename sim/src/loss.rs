//! Damage at rest that loses whole files or lines, for the `PowerRot`
//! crash mode ([`crate::rot::Damage::Lost`]): what no crash makes and the
//! boot must refuse, naming the file, before it changes anything
//! (`durable_agent::recovery::damage`). The kinds ([`Loss`]):
//! - **store**: `store.db` deleted (with its `-wal`, `-journal`) or
//!   emptied while `root.json` says the root has a store — refused as
//!   `StoreMissing` naming `store.db` (never booted empty: a fresh store
//!   forgets every trigger and side effect);
//! - **replaced store**: `store.db` (with its `-wal`; the `-shm` is the
//!   VFS's memory, never a file) replaced by another root's store — a
//!   second system booted on a scratch disk at another time, so its
//!   store id differs — refused as `StoreReplaced` naming `store.db`
//!   (the manifest's store id is not the store's `application_id`);
//! - **older store**: `store.db` (with its `-wal`) replaced by an older
//!   copy of this root's own — the install's, taken before the first op
//!   (a restored backup) — when the disk proves it older: an open turn's
//!   log (its last `turn.start`, no `turn.complete` after it, the agent
//!   not terminated) holds the `tool.result` of an irreversible call
//!   (not denied, not the runtime's own orchestration tool), whose
//!   tool-call ledger row is committed before that result is appended
//!   and kept by GC while the turn is open; the install's ledger is empty.
//!   Refused as `StoreBehind` naming `store.db`. Such a disk is rare (a
//!   few in a `ci` fuzz), so when the strike finds one it always loses
//!   this way. An older copy the logs do not contradict boots: a stated
//!   limit of the product (nothing to judge, so never struck);
//! - **entries**: an `events.jsonl` lost lines off its end (cut at a line
//!   boundary, emptied or deleted) before the `seq` its `events.pending`
//!   holds — refused as `LostEntries` naming the log, with the expected
//!   (that `seq` + 1) and found (the lines kept) counts;
//! - **record**: a `session.json` deleted beside a log that holds
//!   `agent.created` (appended only once the record is durable) — refused
//!   as `MissingRecord` naming the record, never cleaned up as a crash
//!   orphan (which would delete the log);
//! - **parent**: a session's whole directory lost while a live session
//!   names it as parent — the child's parent never resolves, and the boot
//!   must do what GUARANTEES 9 says: boot, and terminate each live session
//!   cut off that way, durably (its log ends with `agent.terminated`,
//!   logged past every tick of every log the boot read: the one clock;
//!   its record TERMINATED);
//! - **created**: such a parent's log lost with its `events.pending` (its
//!   `session.json` kept), so no high-water mark says entries were lost —
//!   refused as `MissingCreated` naming the log: a child's `agent.created`
//!   names it, and a parent's creation is durable before any child's, so
//!   no crash leaves a parent without it (the boot must not clean the
//!   parent up as a crash orphan and cut its children off);
//! - **manifest**: `root.json` torn at rest (cut before its closing
//!   brace: no longer JSON), one time in two with `store.db` lost beside
//!   it — refused as an invalid manifest naming `root.json` (the boot
//!   cannot tell which store the root had, so it trusts none); one time
//!   in three a newer build's `root.json` instead (its `schema_version`
//!   raised), refused as newer (`ManifestError::NewerSchema`), which
//!   `verify` reports as `NewerSchema`, not damage;
//! - **rotted store**: `store.db` damaged at rest outside SQLite's
//!   reach (a bad sector, a stray write): its 16-byte header overwritten
//!   (no longer a SQLite file) or the rest of its first page (the
//!   schema) smashed, its WAL folded into it first so the damage is what
//!   SQLite reads — refused as a corrupt store naming `store.db`
//!   (`SqliteError::NotADatabase` or `SqliteError::Corrupt`, never a
//!   generic SQLite error), and `verify` reports `StoreCorrupt`;
//! - **newer store**: `store.db` as a newer build leaves it (a build
//!   rolled back over a root a newer one ran, its store kept): a loop
//!   checkpoint's `schema_version` raised above this build's when the
//!   store holds one (a newer checkpoint format under the same schema),
//!   else the store's own schema version (`PRAGMA user_version`) —
//!   refused with the typed version error (`StoreError::FutureCheckpoint`
//!   naming the run, `StoreError::FutureSchema` naming `store.db`), never
//!   resumed or migrated as this build's; `verify` reports it as
//!   `NewerSchema` on `store.db`. Not damage, but nothing this build may
//!   use either: it is put back like the losses (the operator runs the
//!   newer build again, or restores a backup).
//!
//! `verify` (I7) must report the same: a finding of the same kind on the
//! same file (for lost entries, at the first missing line); for a lost
//! parent no damage, and each session the boot then terminates listed as
//! done at boot.
//!
//! Invariant: a loss only strikes a disk where the damage is unambiguous
//! (the manifest present for a store; every complete line of the log an
//! entry of its session, so the product's reader sees what this module
//! sees), the whole disk is kept aside first ([`SimFs::backup`]) and put
//! back after the refusal (an operator's restore from backup), and the
//! choice is a pure function of (seed, crash point, disk), so a forked
//! crash image and a replay lose the same bytes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::sync::{Arc, OnceLock};

use durable_agent::canary::Canaries;
use durable_agent::fs::{DiskBackup, Fs, OpenMode, SimConfig, SimFs};
use durable_agent::log::{Event, LogEntry, EVENTS_FILE, PENDING_FILE};
use durable_agent::recovery::verify::{FindingKind, Verification};
use durable_agent::recovery::DamageError;
use durable_agent::sqlite::{SqliteError, SqliteOptions};
use durable_agent::store::manifest::{ManifestError, MANIFEST_FILE};
use durable_agent::store::schema::StoreError;
use durable_agent::store::schema::SCHEMA_VERSION;
use durable_agent::system::SystemError;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::driver::{Driver, ROOT, STORE_DB};
use crate::op::CrashKind;
use crate::rot::{Damage, Rot};

/// What was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// `store.db` gone or emptied (its WAL and journal gone).
    Store,
    /// `store.db` and its WAL replaced by another root's.
    StoreReplaced,
    /// `store.db` and its WAL replaced by the install's (an older copy of
    /// this root's) while an open turn's log holds a settled irreversible
    /// call.
    StoreOlder,
    /// The log keeps `found` entries; `events.pending` says `expected`
    /// were acknowledged.
    Entries { expected: u64, found: u64 },
    /// `session.json` gone beside a log holding `agent.created`.
    Record,
    /// A session's directory gone while a live session names it as
    /// parent; `ts_floor`: the highest `ts` of every log the boot reads.
    /// The sessions cut off are [`Rot::cut_off`].
    Parent { ts_floor: u64 },
    /// The `events.jsonl` and `events.pending` of a session a live session
    /// names as parent gone, its `session.json` kept.
    Created,
    /// `root.json` no longer JSON, or (`newer`) a newer build's: its
    /// `schema_version` raised; `store.db` (with its WAL and journal) gone
    /// too when `store_too`.
    Manifest { store_too: bool, newer: bool },
    /// `store.db` edited as a newer build leaves it: a loop checkpoint's
    /// schema version raised (`checkpoint`), else the store's own.
    Newer { checkpoint: bool },
    /// `store.db` rotted at rest: its header (`header`), else the rest of
    /// its first page.
    StoreRot { header: bool },
}

/// The version a newer build's store or loop checkpoint carries here.
pub const NEWER_VERSION: u32 = 9;

/// The damage a boot refused with, as the harness compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    StoreMissing(PathBuf),
    StoreReplaced(PathBuf),
    StoreBehind(PathBuf),
    LostEntries {
        path: PathBuf,
        expected: u64,
        found: u64,
    },
    MissingRecord(PathBuf),
    MissingCreated(PathBuf),
    ManifestInvalid(PathBuf),
    /// `root.json` is a newer build's (`ManifestError::NewerSchema`).
    NewerManifest(PathBuf),
    /// The store is not a healthy SQLite database: typed
    /// `SqliteError::NotADatabase` or `Corrupt` (or `StoreError::Corrupt`),
    /// naming it.
    StoreCorrupt(PathBuf),
    /// The store's schema is a newer build's (`StoreError::FutureSchema`).
    NewerStore {
        db: PathBuf,
        found: u32,
    },
    /// A loop checkpoint is a newer build's
    /// (`StoreError::FutureCheckpoint`; the harness's store has one
    /// checkpointed run, so its id is not compared).
    NewerCheckpoint {
        found: u32,
    },
    /// Any other damage, with its message.
    Other(String),
}

/// The damage `e` refuses the root for, if it is one
/// (`SystemError::Damaged`), or the store's typed refusal: a newer
/// build's schema or loop checkpoint, or SQLite corruption naming it.
pub fn refusal(e: &SystemError) -> Option<Refusal> {
    let d = match e {
        SystemError::Damaged(d) => d,
        SystemError::Store(StoreError::FutureSchema { db, found, .. }) => {
            return Some(Refusal::NewerStore {
                db: PathBuf::from(db),
                found: *found,
            })
        }
        SystemError::LoopResume(StoreError::FutureCheckpoint { found, .. }) => {
            return Some(Refusal::NewerCheckpoint { found: *found })
        }
        SystemError::Store(StoreError::Open(
            SqliteError::NotADatabase { path, .. } | SqliteError::Corrupt { path, .. },
        )) => return Some(Refusal::StoreCorrupt(path.clone())),
        SystemError::Store(StoreError::Corrupt { db, .. }) => {
            return Some(Refusal::StoreCorrupt(PathBuf::from(db)))
        }
        _ => return None,
    };
    Some(match d {
        DamageError::StoreMissing { path, .. } => Refusal::StoreMissing(path.clone()),
        DamageError::StoreReplaced { path, .. } => Refusal::StoreReplaced(path.clone()),
        DamageError::StoreBehind { path, .. } => Refusal::StoreBehind(path.clone()),
        DamageError::LostEntries {
            path,
            expected,
            found,
        } => Refusal::LostEntries {
            path: path.clone(),
            expected: *expected,
            found: *found,
        },
        DamageError::MissingRecord { path, .. } => Refusal::MissingRecord(path.clone()),
        DamageError::MissingCreated { path, .. } => Refusal::MissingCreated(path.clone()),
        DamageError::Manifest(ManifestError::Invalid { path, .. }) => Refusal::ManifestInvalid(path.clone()),
        DamageError::Manifest(ManifestError::NewerSchema { path, .. }) => {
            Refusal::NewerManifest(path.clone())
        }
        other => Refusal::Other(other.to_string()),
    })
}

/// The complete lines of `bytes` as `(start, entry)` when every one is an
/// entry of session `id` (checksums verified), else `None`.
fn entries_of(bytes: &[u8], id: &str) -> Option<Vec<(usize, LogEntry)>> {
    let mut out = Vec::new();
    let mut start = 0;
    while let Some(nl) = bytes[start..].iter().position(|&b| b == b'\n') {
        let entry = LogEntry::parse(&bytes[start..start + nl]).ok()?;
        if entry.session_id.as_str() != id {
            return None;
        }
        out.push((start, entry));
        start += nl + 1;
    }
    Some(out)
}

/// One loss the disk can take: the kind, the file, and how to do it.
struct Candidate {
    loss: Loss,
    path: PathBuf,
    /// For lost entries: the byte the log is cut at (`None`: deleted).
    cut_at: Option<Option<u64>>,
    /// For a lost parent: the session directories the boot cuts off.
    cut_off: Vec<PathBuf>,
}

/// A session record's state member when TERMINATED, as serde writes it.
const TERMINATED: &[u8] = b"\"state\":\"TERMINATED\"";

/// One session as the boot will read it (its pending append in flight
/// replayed), for the lost-parent damage.
struct Scanned<'a> {
    dir: &'a Path,
    id: &'a str,
    parent: Option<String>,
    /// A record not TERMINATED, `agent.created` and no `agent.terminated`.
    live: bool,
    /// The highest `ts` of its log.
    max_ts: u64,
}

/// The live sessions of `sessions` whose parent never resolves once
/// `lost` is gone (recovery step 5: roots first, then children of placed
/// sessions, until no progress).
fn cut_off(sessions: &[Scanned<'_>], lost: &Path) -> Vec<PathBuf> {
    let live: Vec<&Scanned<'_>> = sessions.iter().filter(|s| s.live && s.dir != lost).collect();
    let mut placed: Vec<&str> = Vec::new();
    loop {
        let before = placed.len();
        for s in &live {
            if !placed.contains(&s.id) && s.parent.as_deref().is_none_or(|p| placed.contains(&p)) {
                placed.push(s.id);
            }
        }
        if placed.len() == before {
            break;
        }
    }
    live.iter()
        .filter(|s| !placed.contains(&s.id))
        .map(|s| s.dir.to_path_buf())
        .collect()
}

/// Lose something of `fs` (rebooted after a power loss), when the disk
/// has something to lose: a pure function of (seed, point, disk).
pub fn strike(fs: &SimFs, seed: u64, point: u64) -> Option<Rot> {
    let root = Path::new(ROOT);
    let store = Path::new(STORE_DB);
    let named = |p: &Path| {
        p == store
            || p == root.join(MANIFEST_FILE)
            || matches!(
                p.file_name().and_then(|n| n.to_str()),
                Some("session.json" | EVENTS_FILE | PENDING_FILE)
            )
    };
    let disk = fs.disk_image_where(named);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ point.rotate_left(23) ^ 0x6c6f_7374);
    let mut by_kind: [Vec<Candidate>; 6] = Default::default();
    let beside = |suffix: &str| PathBuf::from(format!("{STORE_DB}{suffix}"));
    // A store lost whole: its WAL and journal go with it.
    let lose_sides = || {
        for suffix in ["-wal", "-journal"] {
            let _ = fs.lose(&beside(suffix));
        }
    };
    let wal_bytes = fs.disk_image_where(|p| p == beside("-wal"));
    let has_store =
        disk.get(store).is_some_and(|b| !b.is_empty()) || wal_bytes.values().any(|w| !w.is_empty());
    if disk.contains_key(&root.join(MANIFEST_FILE)) && has_store {
        let foreign = foreign_root().is_some();
        for loss in [
            Loss::Store,
            Loss::StoreReplaced,
            Loss::Manifest {
                store_too: false,
                newer: false,
            },
            Loss::Manifest {
                store_too: true,
                newer: false,
            },
            // The store's own bytes, not a file lost: a kind of its own,
            // so each is drawn as often as a whole kind's share allows.
            Loss::Newer { checkpoint: true },
            Loss::Newer { checkpoint: false },
            Loss::StoreRot { header: true },
            Loss::StoreRot { header: false },
        ] {
            let (path, kind) = match loss {
                Loss::Manifest { .. } => (root.join(MANIFEST_FILE), 0),
                Loss::Newer { .. } | Loss::StoreRot { .. } => (store.to_path_buf(), 5),
                _ => (store.to_path_buf(), 0),
            };
            if loss != Loss::StoreReplaced || foreign {
                by_kind[kind].push(Candidate {
                    loss,
                    path,
                    cut_at: None,
                    cut_off: Vec::new(),
                });
            }
        }
    }
    let sessions: BTreeMap<&Path, &str> = disk
        .keys()
        .filter(|p| p.file_name().and_then(|n| n.to_str()) == Some("session.json"))
        .filter_map(|p| {
            let dir = p.parent()?;
            (dir.parent() == Some(&root.join("agents"))).then_some((dir, dir.file_name()?.to_str()?))
        })
        .collect();
    let mut scanned: Vec<Scanned<'_>> = Vec::new();
    // An open turn's log holds a settled irreversible call.
    let mut proves_store_older = false;
    // Every session the boot reads, readable here (else no lost parent:
    // which sessions the boot cuts off would be a guess).
    let mut all_read = true;
    for (dir, id) in sessions {
        let log_path = dir.join(EVENTS_FILE);
        let Some(log) = disk.get(&log_path) else {
            all_read = false;
            continue;
        };
        let Some(entries) = entries_of(log, id) else {
            all_read = false;
            continue;
        };
        if entries
            .iter()
            .any(|(_, e)| matches!(e.event, Event::AgentCreated { .. }))
        {
            by_kind[2].push(Candidate {
                loss: Loss::Record,
                path: dir.join("session.json"),
                cut_at: None,
                cut_off: Vec::new(),
            });
        }
        // The pending copy: a complete entry of this session whose `seq`
        // the log reaches (else the log already lost entries, or holds a
        // replayable append in flight beyond them).
        let pending = disk
            .get(&dir.join(PENDING_FILE))
            .and_then(|b| b.strip_suffix(b"\n"))
            .filter(|line| !line.contains(&b'\n'))
            .and_then(|line| LogEntry::parse(line).ok())
            .filter(|e| e.session_id.as_str() == id);
        let in_flight = pending.as_ref().is_some_and(|e| e.seq == entries.len() as u64);
        let record_terminated = disk
            .get(&dir.join("session.json"))
            .is_some_and(|r| r.windows(TERMINATED.len()).any(|w| w == TERMINATED));
        let mut read = entries.iter().map(|(_, e)| e).collect::<Vec<_>>();
        read.extend(pending.as_ref().filter(|_| in_flight));
        let parent = read.iter().find_map(|e| match &e.event {
            Event::AgentCreated {
                parent_session_id, ..
            } => Some(parent_session_id.as_ref().map(|p| p.as_str().to_string())),
            _ => None,
        });
        let terminated = read
            .iter()
            .any(|e| matches!(e.event, Event::AgentTerminated { .. }));
        if !terminated && settled_irreversible(&read) {
            proves_store_older = true;
        }
        scanned.push(Scanned {
            dir,
            id,
            parent: parent.clone().flatten(),
            live: parent.is_some() && !terminated && !record_terminated,
            max_ts: read.iter().map(|e| e.ts).max().unwrap_or(0),
        });
        let Some(seq) = pending.map(|e| e.seq) else {
            continue;
        };
        if seq == 0 || seq > entries.len() as u64 {
            continue;
        }

        let found = rng.random_range(0..seq);
        let cut_at = match found {
            0 if rng.random_bool(0.5) => None,
            k => Some(entries.get(k as usize).map_or(log.len(), |(start, _)| *start) as u64),
        };
        by_kind[1].push(Candidate {
            loss: Loss::Entries {
                expected: seq + 1,
                found,
            },
            path: log_path,
            cut_at: Some(cut_at),
            cut_off: Vec::new(),
        });
    }
    if all_read && proves_store_older && has_store && disk.contains_key(&root.join(MANIFEST_FILE)) {
        by_kind[4].push(Candidate {
            loss: Loss::StoreOlder,
            path: store.to_path_buf(),
            cut_at: None,
            cut_off: Vec::new(),
        });
    }
    if all_read {
        for parent in &scanned {
            let named = scanned
                .iter()
                .any(|s| s.live && s.parent.as_deref() == Some(parent.id));
            if named {
                // The logs the boot reads: every one but the lost.
                let ts_floor = scanned
                    .iter()
                    .filter(|s| s.dir != parent.dir)
                    .map(|s| s.max_ts)
                    .max()
                    .unwrap_or(0);
                by_kind[3].push(Candidate {
                    loss: Loss::Parent { ts_floor },
                    path: parent.dir.to_path_buf(),
                    cut_at: None,
                    cut_off: cut_off(&scanned, parent.dir),
                });
                by_kind[3].push(Candidate {
                    loss: Loss::Created,
                    path: parent.dir.join(EVENTS_FILE),
                    cut_at: None,
                    cut_off: Vec::new(),
                });
            }
        }
    }
    let kinds: Vec<&Vec<Candidate>> = by_kind.iter().filter(|k| !k.is_empty()).collect();
    if kinds.is_empty() {
        return None;
    }
    // A disk that proves an older store wrong is rare (a few in a `ci`
    // fuzz): when there is one, that is what is lost. The draw is made
    // all the same, so the rest of the choice stays where it was.
    let drawn = kinds[rng.random_range(0..kinds.len())];
    let kind = if by_kind[4].is_empty() { drawn } else { &by_kind[4] };
    let chosen = &kind[rng.random_range(0..kind.len())];
    let backup = fs.backup();
    let mut loss = chosen.loss;
    match (chosen.loss, chosen.cut_at) {
        (Loss::Store, _) => {
            if rng.random_bool(0.5) && disk.contains_key(store) {
                fs.cut(store, 0).ok()?;
            } else {
                let _ = fs.lose(store);
            }
            lose_sides();
        }
        (Loss::StoreReplaced | Loss::StoreOlder, _) => {
            let copy = match chosen.loss {
                Loss::StoreOlder => older_copy(crate::model::installed_by(seed))?,
                _ => foreign_root()?,
            };
            let files = [store.to_path_buf(), beside("-wal"), beside("-journal")];
            fs.copy_in(copy, |p| files.iter().any(|f| f == p)).ok()?;
        }
        (Loss::Entries { .. }, Some(Some(len))) => fs.cut(&chosen.path, len).ok()?,
        (Loss::Manifest { store_too, .. }, _) => {
            let bytes = disk.get(&chosen.path)?;
            match newer_version_digit(bytes) {
                // One time in three, a newer build's `root.json` (a build
                // rolled back over a root a newer one ran): valid JSON,
                // its `schema_version` 9 — refused as newer, not damage.
                Some(at) if rng.random_bool(1.0 / 3.0) => {
                    fs.rot(&chosen.path, at as u64, bytes[at] ^ b'9').ok()?;
                    loss = Loss::Manifest {
                        store_too,
                        newer: true,
                    };
                }
                // Cut anywhere before the closing brace: never JSON again.
                _ => {
                    let brace = bytes.iter().rposition(|&b| b == b'}')?;
                    fs.cut(&chosen.path, rng.random_range(0..=brace) as u64).ok()?;
                }
            }
            if store_too {
                let _ = fs.lose(store);
                lose_sides();
            }
        }
        (Loss::StoreRot { header }, _) => rot_store(fs, header)?,
        // A store with no loop checkpoint yet gets a newer schema instead.
        (Loss::Newer { checkpoint }, _) => {
            loss = Loss::Newer {
                checkpoint: newer_store(fs, checkpoint)?,
            };
        }
        (Loss::Entries { .. } | Loss::Record | Loss::Parent { .. }, _) => fs.lose(&chosen.path).ok()?,
        (Loss::Created, _) => {
            fs.lose(&chosen.path).ok()?;
            if let Some(dir) = chosen.path.parent() {
                let _ = fs.lose(&dir.join(PENDING_FILE));
            }
        }
    }
    let (line, line_offset) = match (chosen.loss, chosen.cut_at) {
        (Loss::Entries { found, .. }, Some(at)) => (found + 1, at.unwrap_or(0)),
        _ => (0, 0),
    };
    Some(Rot {
        damage: Damage::Lost(loss),
        path: chosen.path.clone(),
        line,
        line_offset,
        bytes: Vec::new(),
        at_point: fs.points(),
        replaceable: false,
        backup: Some(backup),
        cut_off: chosen.cut_off.clone(),
    })
}

/// Make `fs`'s store (at rest) a newer build's: with `checkpoint`, every
/// loop checkpoint's `schema_version` raised to [`NEWER_VERSION`] if the
/// store holds one, else its own schema version (`PRAGMA user_version`).
/// Returns whether a checkpoint was raised; `None` if the copy cannot be
/// edited (then nothing is lost).
fn newer_store(fs: &SimFs, checkpoint: bool) -> Option<bool> {
    edit_store(
        fs,
        |conn| {
            let raised = checkpoint
                && conn
                    .execute("UPDATE loop_checkpoints SET schema_version = ?1", [NEWER_VERSION])
                    .ok()?
                    > 0;
            if !raised {
                conn.pragma_update(None, "user_version", NEWER_VERSION).ok()?;
            }
            Some(raised)
        },
        |_| Some(()),
    )
}

/// Rot `fs`'s store at rest: its WAL folded into `store.db` first (so
/// what is smashed is what SQLite reads), then its 16-byte header
/// (`header`) or the rest of its first page (the schema) overwritten.
/// `None` if the copy cannot be edited (then nothing is lost).
fn rot_store(fs: &SimFs, header: bool) -> Option<()> {
    edit_store(
        fs,
        |conn| {
            conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .ok()
        },
        |copy| {
            let db = Path::new(STORE_DB);
            let (at, bytes) = match header {
                true => (0, b"not sqlite! rot.".to_vec()),
                false => (100, vec![0xFF; FIRST_PAGE - 100]),
            };
            copy.open(db, OpenMode::Existing, "rot store.db (harness)").ok()?;
            copy.write_at(db, at, &bytes, "rot store.db (harness)").ok()
        },
    )
}

/// The store's page size (the product's default): the first page holds
/// the header and the schema's root.
const FIRST_PAGE: usize = 4096;

/// Edit `fs`'s store at rest on a detached copy — `sql` on SQLite's
/// connection, then `bytes` on the closed copy's files — whose store
/// files then replace these (`store.db`, its WAL and journal), so the
/// run's I/O points and draws are untouched. `None` if either step fails
/// (then `fs` is unchanged).
fn edit_store<T>(
    fs: &SimFs,
    sql: impl FnOnce(&rusqlite::Connection) -> Option<T>,
    bytes: impl FnOnce(&SimFs) -> Option<()>,
) -> Option<T> {
    let copy = fs.detached(SimConfig::new(0));
    let out = {
        let db = durable_agent::sqlite::open(
            Arc::new(copy.clone()),
            Path::new(STORE_DB),
            &SqliteOptions::default(),
        )
        .ok()?;
        sql(db.conn())?
    };
    bytes(&copy)?;
    let files = [
        STORE_DB.to_string(),
        format!("{STORE_DB}-wal"),
        format!("{STORE_DB}-journal"),
    ];
    fs.copy_in(&copy.backup(), |p| files.iter().any(|f| Path::new(f) == p))
        .ok()?;
    Some(out)
}

/// The offset of the single digit of `root.json`'s `schema_version`
/// (this build writes 1), if the bytes hold one that is not already 9.
fn newer_version_digit(bytes: &[u8]) -> Option<usize> {
    let key = b"\"schema_version\"";
    let after = bytes.windows(key.len()).position(|w| w == key)? + key.len();
    let at = after
        + bytes[after..]
            .iter()
            .position(|b| !matches!(b, b':' | b' ' | b'\n'))?;
    let single = bytes.get(at)?.is_ascii_digit() && !bytes.get(at + 1)?.is_ascii_digit();
    (single && bytes[at] != b'9').then_some(at)
}

/// Another root's disk, stopped cleanly: a second system booted on a
/// scratch disk at op [`FOREIGN_STEP`] (not at the install's time, so the
/// store id its boot draws from the clock differs from every case's):
/// a healthy store with its own loop checkpoint. Built once
/// per process; a pure function of constants, so every case, fork and
/// replay copies the same bytes. `None` if that system does not boot
/// (then no store is replaced).
fn foreign_root() -> Option<&'static DiskBackup> {
    static FOREIGN: OnceLock<Option<DiskBackup>> = OnceLock::new();
    FOREIGN
        .get_or_init(|| {
            let mut other = Driver::before_install(FOREIGN_SEED, Canaries::default(), SCHEMA_VERSION).ok()?;
            other.set_step(FOREIGN_STEP);
            other.open().ok()?;
            other.shutdown(CrashKind::Process);
            Some(other.fs.backup())
        })
        .as_ref()
}

/// This root's store as installed (before the first op, the same for every
/// case of one origin, [`crate::model::installed_by`]): the older copy an
/// operator restores from a backup. `None` if the install fails (then no
/// store is replaced).
fn older_copy(origin: u32) -> Option<&'static DiskBackup> {
    static OLDER: [OnceLock<Option<DiskBackup>>; SCHEMA_VERSION as usize] =
        [const { OnceLock::new() }; SCHEMA_VERSION as usize];
    OLDER
        .get(usize::try_from(origin).ok()?.checked_sub(1)?)?
        .get_or_init(|| {
            let install = crate::driver::installed_disk(&Canaries::default(), origin).ok()?;
            let fs = SimFs::from_snapshot(&install, crate::driver::sim_config(0));
            Some(fs.backup())
        })
        .as_ref()
}

/// `read` (one session's log as the boot reads it) has an open turn — its
/// last `turn.start`, no `turn.complete` after it — holding the
/// `tool.result` of an irreversible call its `round.decided` decided, not
/// denied by a hook and not one of the runtime's own orchestration tools
/// (those never reach the tool-call ledger).
fn settled_irreversible(read: &[&LogEntry]) -> bool {
    let Some(start) = read
        .iter()
        .rposition(|e| matches!(e.event, Event::TurnStart { .. }))
    else {
        return false;
    };
    let open = &read[start..];
    if open.iter().any(|e| matches!(e.event, Event::TurnComplete { .. })) {
        return false;
    }
    let ledgered: Vec<&str> = open
        .iter()
        .filter_map(|e| match &e.event {
            Event::RoundDecided { calls, .. } => Some(calls),
            _ => None,
        })
        .flatten()
        .filter(|c| {
            c.irreversible
                && c.hook.as_ref().is_none_or(|h| h.denied.is_none())
                && !matches!(c.tool.as_str(), "spawn_agent" | "send_message" | "list_agents")
        })
        .map(|c| c.call_id.as_str())
        .collect();
    open.iter().any(
        |e| matches!(&e.event, Event::ToolResult { call_id, .. } if ledgered.contains(&call_id.as_str())),
    )
}

/// The other root's seed and the op its system was installed at.
const FOREIGN_SEED: u64 = 0x0f07_e167;
const FOREIGN_STEP: u64 = 1_000;

/// What the boot must have refused with for `loss` of `path`.
fn wanted(loss: Loss, path: &Path) -> Refusal {
    let path = path.to_path_buf();
    match loss {
        Loss::Store => Refusal::StoreMissing(path),
        Loss::StoreReplaced => Refusal::StoreReplaced(path),
        Loss::StoreOlder => Refusal::StoreBehind(path),
        Loss::Entries { expected, found } => Refusal::LostEntries {
            path,
            expected,
            found,
        },
        Loss::Record => Refusal::MissingRecord(path),
        Loss::Created => Refusal::MissingCreated(path),
        Loss::Manifest { newer: true, .. } => Refusal::NewerManifest(path),
        Loss::Manifest { newer: false, .. } => Refusal::ManifestInvalid(path),
        Loss::StoreRot { .. } => Refusal::StoreCorrupt(path),
        Loss::Newer { checkpoint: true } => Refusal::NewerCheckpoint { found: NEWER_VERSION },
        Loss::Newer { checkpoint: false } => Refusal::NewerStore {
            db: path,
            found: NEWER_VERSION,
        },
        Loss::Parent { .. } => Refusal::Other("none: the boot terminates the sessions cut off".into()),
    }
}

/// R6 for a loss: the boot must refuse with the typed damage error naming
/// the file (and, for lost entries, the expected and found counts).
pub fn judge(
    rot: &Rot,
    loss: Loss,
    opened: &Result<(), String>,
    refused: Option<&Refusal>,
    fs: &SimFs,
) -> Result<(), String> {
    if let Loss::Parent { ts_floor } = loss {
        return match opened {
            Ok(()) => judge_cut_off(rot, ts_floor, fs),
            Err(e) => Err(format!(
                "the boot failed over a lost parent directory; it must terminate the sessions cut off ({:?}): {e}",
                rot.cut_off
            )),
        };
    }
    let want = wanted(loss, &rot.path);
    match (opened, refused) {
        (Err(_), Some(r)) if *r == want => Ok(()),
        (Err(e), Some(r)) => Err(format!("the boot refused with {r:?}, but {want:?} was due: {e}")),
        (Err(e), None) => Err(format!(
            "the boot failed, but not as damage ({want:?} was due): {e}"
        )),
        (Ok(()), _) => Err(format!(
            "the boot succeeded over the loss: acknowledged data silently gone ({want:?} was due)"
        )),
    }
}

/// R6 for a lost parent the boot booted over: each session cut off ends
/// its log with `agent.terminated` logged past `ts_floor` (the one clock),
/// its record TERMINATED.
fn judge_cut_off(rot: &Rot, ts_floor: u64, fs: &SimFs) -> Result<(), String> {
    let mut wrong = Vec::new();
    for dir in &rot.cut_off {
        let files = fs.disk_image_where(|p| p.parent() == Some(dir.as_path()));
        let id = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let last = files
            .get(&dir.join(EVENTS_FILE))
            .and_then(|log| entries_of(log, id))
            .and_then(|entries| entries.last().map(|(_, e)| e.clone()));
        match last {
            Some(e) if matches!(e.event, Event::AgentTerminated { .. }) && e.ts > ts_floor => {}
            Some(e) if matches!(e.event, Event::AgentTerminated { .. }) => wrong.push(format!(
                "{}: agent.terminated logged at ts {}, not past ts {ts_floor} (the highest of the logs the boot read)",
                dir.display(),
                e.ts
            )),
            other => wrong.push(format!(
                "{}: its parent never resolves, but its log does not end with agent.terminated: {other:?}",
                dir.display()
            )),
        }
        let record = files.get(&dir.join("session.json"));
        if !record.is_some_and(|r| r.windows(TERMINATED.len()).any(|w| w == TERMINATED)) {
            wrong.push(format!(
                "{}: cut off, but its record is not TERMINATED",
                dir.display()
            ));
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("\n"))
    }
}

/// I7 for a loss the boot refused: `verify` reports a finding of the same
/// kind on the same file (for lost entries, at the first missing line and
/// the byte where the log's readable part ends).
pub fn verify_agrees(verified: &Verification, rot: &Rot) -> Vec<String> {
    let Damage::Lost(loss) = rot.damage else {
        return Vec::new();
    };
    if let Loss::Parent { .. } = loss {
        let unlisted: Vec<&PathBuf> = rot
            .cut_off
            .iter()
            .filter(|d| !verified.repaired_at_boot.iter().any(|c| &c.path == *d))
            .collect();
        // And the converse: a session directory listed as done at boot
        // that has a record and logged its creation is one the boot
        // terminates (a session terminated before is not cut off). A crash
        // orphan is listed too — no record, or a log without
        // `agent.created` — which the boot removes (a crash inside session
        // creation, which the lost parent does not change).
        let recorded = |p: &Path| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|id| {
                verified
                    .sessions
                    .iter()
                    .any(|s| s.session.as_str() == id && s.has_record && s.created)
            })
        };
        let extra: Vec<&PathBuf> = verified
            .repaired_at_boot
            .iter()
            .map(|c| &c.path)
            .filter(|p| p.parent().and_then(|d| d.file_name()).and_then(|n| n.to_str()) == Some("agents"))
            .filter(|p| recorded(p) && !rot.cut_off.contains(p))
            .collect();
        return match (verified.is_healthy(), unlisted.is_empty(), extra.is_empty()) {
            (true, true, true) => Vec::new(),
            _ => vec![format!(
                "I7: a parent's directory {} was lost: the boot terminated {:?}, but `verify` reported damage {:?}, \
                 or did not list {unlisted:?} as done at boot, or listed {extra:?} too",
                rot.path.display(),
                rot.cut_off,
                verified.damaged
            )],
        };
    }
    let (kind, line) = match loss {
        Loss::Store => (FindingKind::StoreMissing, None),
        Loss::StoreReplaced => (FindingKind::StoreReplaced, None),
        Loss::StoreOlder => (FindingKind::StoreBehind, None),
        Loss::Entries { found, .. } => (FindingKind::LostEntries, Some(found + 1)),
        Loss::Record => (FindingKind::MissingRecord, None),
        Loss::Created => (FindingKind::MissingCreated, None),
        Loss::Manifest { newer: true, .. } | Loss::Newer { .. } => (FindingKind::NewerSchema, None),
        Loss::Manifest { newer: false, .. } => (FindingKind::ManifestInvalid, None),
        Loss::StoreRot { .. } => (FindingKind::StoreCorrupt, None),
        Loss::Parent { .. } => return Vec::new(), // answered above
    };
    // Lost entries: the finding also says where the log's readable part
    // ends (the cut, or 0 for a log emptied or deleted).
    let offset = matches!(loss, Loss::Entries { .. }).then_some(rot.line_offset);
    let agrees = verified.damaged.iter().any(|f| {
        f.path == rot.path
            && f.kind == kind
            && (line.is_none() || f.line == line)
            && (offset.is_none() || f.offset == offset)
    });
    if agrees {
        Vec::new()
    } else {
        vec![format!(
            "I7: the boot refused {} ({loss:?}), but `verify` did not report it as {kind:?}{}{}: {:?}",
            rot.path.display(),
            line.map(|l| format!(" at line {l}")).unwrap_or_default(),
            offset.map(|o| format!(" (byte {o})")).unwrap_or_default(),
            verified.damaged
        )]
    }
}
