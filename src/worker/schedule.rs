//! Recurring schedules of the worker: "every `period_ms`, fire `prompt` on
//! `agent`", each period's firing being an ordinary durable trigger whose
//! dedup key is `scheduled:{id}:{bucket}`, `bucket = now_ms / period_ms`.
//!
//! Where the definition lives, and why: in `{root}/schedules.json`, one
//! JSON document holding every schedule, replaced atomically through the
//! system crate's `Fs` seam (write `schedules.json.tmp`, fsync, rename over,
//! fsync the root) before `POST /schedules` answers. Not in a trigger
//! payload: a trigger is a one-shot work item the scheduler claims, and a
//! definition must never be claimed, acked or dead-lettered. The file is
//! read only at boot (under the root lock, which the process holds).
//!
//! Invariants:
//! - an acknowledged schedule (add or delete answered 200) survives any
//!   crash: the rename is the commit point and is fsynced before the reply;
//! - every schedule held passed the checks `add` applies, whether added or
//!   loaded: a file holding one that does not (damage, a hand edit) is
//!   refused on load naming the file and the schedule, never run;
//! - each bucket fires at most once, across any number of kill -9
//!   restarts, because its trigger is emitted with the dedup key
//!   `scheduled:{id}:{bucket}` (the trigger store keeps at most one row per
//!   key, and a row reaches DONE at most once);
//! - missed buckets are coalesced: only the current bucket is ever emitted,
//!   and when earlier ones were skipped (the daemon was down) its prompt
//!   carries a note saying how many. A new schedule fires in its current
//!   bucket, i.e. right away, due when it was added (so not "late");
//! - what a schedule emitted last is read back from the triggers table
//!   at boot: its newest bucket row of its own period
//!   (`store::triggers::scheduled`), which GC keeps. A schedule deleted
//!   and added again starts afresh: with another period, its marks are
//!   another period's; with the same, the file records when each
//!   definition was added (`added_at_ms`) and marks of buckets before
//!   that are an earlier definition's, so it is not told it missed the
//!   periods it did not exist in.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::canary::Canary;
use crate::fs::{Fs, OpenMode};
use crate::store::triggers::scheduled::{bucket_key, newest_buckets};
use crate::store::triggers::{TriggerSource, TriggerSpec};
use crate::store::StoreError;
use crate::system::System;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::check_plain_id;
use super::ops::MAX_TRIGGER_DELAY_MS;

/// The definitions file, inside the root.
pub const SCHEDULES_FILE: &str = "schedules.json";
const SCHEDULES_TMP: &str = "schedules.json.tmp";
/// The format this build writes, and the newest it reads.
pub const SCHEDULES_VERSION: u32 = 1;
/// Limits: a schedule fires at most every poll or so, at least once a year,
/// and a root holds a bounded number of them.
pub const MIN_PERIOD_MS: u64 = 100;
pub const MAX_PERIOD_MS: u64 = MAX_TRIGGER_DELAY_MS;
pub const MAX_SCHEDULES: usize = 1_000;

/// One recurring schedule (also the body of `POST /schedules`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    /// `[A-Za-z0-9._-]`, 1-64 characters (it is part of the dedup key).
    pub id: String,
    /// Agent name or id, resolved when each bucket fires.
    pub agent: String,
    pub prompt: String,
    pub period_ms: u64,
}

impl Schedule {
    /// The dedup key of `bucket`'s trigger.
    pub fn key(&self, bucket: u64) -> String {
        bucket_key(&self.id, bucket)
    }

    fn validate(&self) -> Result<(), String> {
        check_plain_id(&self.id).map_err(|m| format!("`id`: {m}"))?;
        if self.agent.trim().is_empty() || self.prompt.trim().is_empty() {
            return Err("`agent` and `prompt` must not be empty".into());
        }
        if !(MIN_PERIOD_MS..=MAX_PERIOD_MS).contains(&self.period_ms) {
            return Err(format!(
                "`period_ms` must be between {MIN_PERIOD_MS} and {MAX_PERIOD_MS}"
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Document {
    version: u32,
    schedules: Vec<Schedule>,
    /// When each definition was added (ms), by id. Absent in files of
    /// earlier builds (every mark then counts, as it did), and ignored by
    /// them (this struct takes unknown keys), so the version stays.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    added_at_ms: BTreeMap<String, u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// Reading or replacing the file failed. On a write, the outcome is
    /// unknown (the rename may have happened): restart to reload.
    #[error("{step} {path}: {source}")]
    Io {
        path: PathBuf,
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a schedules file ({source}); move it aside to start with no schedules")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path} has version {found}, this build reads up to {SCHEDULES_VERSION}; upgrade durable-agent")]
    FutureVersion { path: PathBuf, found: u32 },
    /// The file parses but holds what `add` refuses (a damaged or
    /// hand-edited file): `schedule` names the entry (its id, or its
    /// position when the id itself is what is wrong).
    #[error(
        "{path}: {schedule}: {reason}; fix or remove that schedule in the file, or move the file aside \
         to start with no schedules"
    )]
    InvalidFile {
        path: PathBuf,
        schedule: String,
        reason: String,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Conflict(String),
    #[error("no schedule {0:?}")]
    NotFound(String),
}

/// The schedules of a loaded file by id, each held to the rules `add`
/// applies: a file only `save` wrote passes, so one that does not is
/// damaged or hand-edited.
fn checked(path: &Path, schedules: Vec<Schedule>) -> Result<BTreeMap<String, Schedule>, ScheduleError> {
    let invalid = |schedule: String, reason: String| ScheduleError::InvalidFile {
        path: path.to_path_buf(),
        schedule,
        reason,
    };
    if schedules.len() > MAX_SCHEDULES {
        return Err(invalid(
            "schedules".into(),
            format!(
                "{} schedules, a root holds at most {MAX_SCHEDULES}",
                schedules.len()
            ),
        ));
    }
    let mut defs = BTreeMap::new();
    for (index, schedule) in schedules.into_iter().enumerate() {
        let name = if check_plain_id(&schedule.id).is_ok() {
            format!("schedule {:?}", schedule.id)
        } else {
            format!("schedules[{index}]")
        };
        schedule
            .validate()
            .map_err(|reason| invalid(name.clone(), reason))?;
        if defs.contains_key(&schedule.id) {
            return Err(invalid(name, "the id appears more than once".into()));
        }
        defs.insert(schedule.id.clone(), schedule);
    }
    Ok(defs)
}

/// The schedules of one root, and the last bucket emitted for each.
#[derive(Debug)]
pub struct Schedules {
    fs: Arc<dyn Fs>,
    root: PathBuf,
    defs: BTreeMap<String, Schedule>,
    /// When each definition was added, where known (see [`Document`]).
    added_at: BTreeMap<String, u64>,
    /// Last bucket whose trigger is committed, per schedule; absent until
    /// read back from the triggers table (once per boot, see `tick`).
    emitted: BTreeMap<String, Option<u64>>,
}

impl Schedules {
    /// Read `{root}/schedules.json` (none yet: no schedules). A leftover
    /// `.tmp` from a crash before the rename is an unacknowledged write and
    /// is ignored (the next save truncates it). The file is held to what
    /// [`Schedules::add`] accepts (each schedule valid, ids unique, at
    /// most [`MAX_SCHEDULES`]): one that is not is refused naming the file
    /// and the schedule, never run.
    pub fn load(fs: Arc<dyn Fs>, root: &Path) -> Result<Schedules, ScheduleError> {
        let path = root.join(SCHEDULES_FILE);
        let io = |step| {
            let path = path.clone();
            move |source| ScheduleError::Io { path, step, source }
        };
        let defs = if fs.exists(&path, "schedules exists").map_err(io("stat"))? {
            let bytes = fs.read(&path, "schedules read").map_err(io("read"))?;
            let doc: Document = serde_json::from_slice(&bytes).map_err(|source| ScheduleError::Corrupt {
                path: path.clone(),
                source,
            })?;
            if doc.version > SCHEDULES_VERSION {
                return Err(ScheduleError::FutureVersion {
                    path,
                    found: doc.version,
                });
            }
            let defs = checked(&path, doc.schedules)?;
            let mut added_at = doc.added_at_ms;
            added_at.retain(|id, _| defs.contains_key(id));
            (defs, added_at)
        } else {
            (BTreeMap::new(), BTreeMap::new())
        };
        let (defs, added_at) = defs;
        tracing::info!(schedules = %path.display(), count = defs.len(), "schedules loaded");
        Ok(Schedules {
            fs,
            root: root.to_path_buf(),
            defs,
            added_at,
            emitted: BTreeMap::new(),
        })
    }

    pub fn list(&self) -> Vec<Schedule> {
        self.defs.values().cloned().collect()
    }

    /// Add `schedule` durably at `now_ms`. The same definition again is a
    /// no-op (`Ok(false)`), so a retried request is harmless; a different
    /// one under an existing id is a conflict.
    pub fn add(&mut self, schedule: Schedule, now_ms: u64) -> Result<bool, ScheduleError> {
        schedule.validate().map_err(ScheduleError::Invalid)?;
        match self.defs.get(&schedule.id) {
            Some(existing) if *existing == schedule => return Ok(false),
            Some(_) => {
                return Err(ScheduleError::Conflict(format!(
                    "schedule {:?} exists with another definition; delete it first",
                    schedule.id
                )))
            }
            None if self.defs.len() >= MAX_SCHEDULES => {
                return Err(ScheduleError::Conflict(format!(
                    "a root holds at most {MAX_SCHEDULES} schedules"
                )))
            }
            None => {}
        }
        let mut next = self.defs.clone();
        let mut added_at = self.added_at.clone();
        added_at.insert(schedule.id.clone(), now_ms);
        // Read back afresh at the next tick, from this definition's marks.
        self.emitted.remove(&schedule.id);
        next.insert(schedule.id.clone(), schedule);
        self.save(&next, &added_at)?;
        self.defs = next;
        self.added_at = added_at;
        Ok(true)
    }

    /// Remove schedule `id` durably. A trigger already emitted for its
    /// current bucket still fires.
    pub fn remove(&mut self, id: &str) -> Result<Schedule, ScheduleError> {
        let mut next = self.defs.clone();
        let removed = next
            .remove(id)
            .ok_or_else(|| ScheduleError::NotFound(id.to_string()))?;
        let mut added_at = self.added_at.clone();
        added_at.remove(id);
        self.save(&next, &added_at)?;
        self.defs = next;
        self.added_at = added_at;
        self.emitted.remove(id);
        Ok(removed)
    }

    /// Write-temp, fsync, rename, fsync-dir: the rename is the commit.
    fn save(
        &self,
        defs: &BTreeMap<String, Schedule>,
        added_at: &BTreeMap<String, u64>,
    ) -> Result<(), ScheduleError> {
        let doc = Document {
            version: SCHEDULES_VERSION,
            schedules: defs.values().cloned().collect(),
            added_at_ms: added_at.clone(),
        };
        let path = self.root.join(SCHEDULES_FILE);
        let tmp = self.root.join(SCHEDULES_TMP);
        let bytes = serde_json::to_vec_pretty(&doc).map_err(|source| ScheduleError::Corrupt {
            path: path.clone(),
            source,
        })?;
        let io = |p: &Path, step| {
            let path = p.to_path_buf();
            move |source| ScheduleError::Io { path, step, source }
        };
        let fs = &self.fs;
        fs.open(&tmp, OpenMode::Truncate, "schedules tmp create")
            .map_err(io(&tmp, "create"))?;
        fs.write_at(&tmp, 0, &bytes, "schedules tmp write")
            .map_err(io(&tmp, "write"))?;
        fs.sync(&tmp, "schedules tmp fsync").map_err(io(&tmp, "fsync"))?;
        fs.rename(&tmp, &path, "schedules rename")
            .map_err(io(&path, "rename"))?;
        fs.sync_dir(&self.root, "schedules dir fsync")
            .map_err(io(&self.root, "dir fsync"))?;
        tracing::info!(count = defs.len(), "schedules saved");
        Ok(())
    }

    /// Emit the current bucket's trigger of every schedule that has not
    /// emitted it yet. Returns the keys emitted now.
    pub fn tick(&mut self, system: &System) -> Result<Vec<String>, StoreError> {
        if self.defs.keys().any(|id| !self.emitted.contains_key(id)) {
            self.read_back(system)?;
        }
        let now = system.now_ms();
        let mut emitted_now = Vec::new();
        for schedule in self.defs.values() {
            let bucket = now / schedule.period_ms;
            let last = self.emitted.get(&schedule.id).copied().flatten();
            if last.is_some_and(|last| last >= bucket) {
                continue;
            }
            let missed = last.map_or(0, |last| bucket - last - 1);
            let mut prompt = schedule.prompt.clone();
            if missed > 0 {
                // Coalesced: one firing stands for the periods skipped.
                prompt.push_str(&format!(
                    "\n\n[overdue: schedule {} missed {missed} earlier period(s) of {} ms while the \
                     daemon was down; they are coalesced into this one]",
                    schedule.id, schedule.period_ms
                ));
            }
            let key = schedule.key(bucket);
            // Due at the bucket's start, but a schedule's first bucket is
            // due when it was added: it is not late, and the claim's
            // catch-up note ("fires late after a restart or backlog; use
            // judgment whether it still applies") would tell the agent it
            // may skip it.
            let fire_at_ms = match last {
                Some(_) => bucket.saturating_mul(schedule.period_ms),
                None => now,
            };
            let spec = TriggerSpec {
                source: TriggerSource::Scheduled,
                // The bucket's key is what makes it fire once across restarts
                // (the canary drops it: keyed by row id, re-fired after one).
                dedup_key: (!system.config().canaries.has(Canary::ScheduleBucketWithoutKey))
                    .then(|| key.clone()),
                session_id: None,
                fire_at_ms,
                priority: 0,
                description: format!("schedule {} bucket {bucket}", schedule.id),
                payload: json!({
                    "agent": schedule.agent, "prompt": prompt,
                    "schedule": schedule.id, "bucket": bucket, "missed": missed,
                    "period_ms": schedule.period_ms,
                }),
            };
            let outcome = system.triggers().emit(system.db().conn(), &spec, now)?;
            tracing::info!(key, missed, ?outcome, "schedule bucket emitted");
            self.emitted.insert(schedule.id.clone(), Some(bucket));
            emitted_now.push(key);
        }
        Ok(emitted_now)
    }

    /// The last bucket of each schedule whose trigger is committed, from
    /// the triggers table (after a boot, the memory is empty): its newest
    /// mark of the schedule's own period (`store::triggers::scheduled`).
    fn read_back(&mut self, system: &System) -> Result<(), StoreError> {
        let now = system.now_ms();
        let marks = newest_buckets(&system.triggers().all(system.db().conn(), now)?);
        for (id, schedule) in &self.defs {
            // Buckets before this definition was added are an earlier
            // one's (deleted, then added again).
            let first = self.added_at.get(id).map_or(0, |at| at / schedule.period_ms);
            let last = marks
                .iter()
                .filter(|(mark, _)| mark.is_of(id, schedule.period_ms))
                .map(|(_, (bucket, _))| *bucket)
                .filter(|bucket| *bucket >= first)
                .max();
            self.emitted.insert(id.clone(), last);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::RealFs;

    fn schedule(id: &str, period_ms: u64) -> Schedule {
        Schedule {
            id: id.into(),
            agent: "a".into(),
            prompt: "p".into(),
            period_ms,
        }
    }

    #[test]
    fn acknowledged_schedules_are_read_back_and_bad_ones_refused() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let fs: Arc<dyn Fs> = Arc::new(RealFs::new());
        let mut book = Schedules::load(fs.clone(), dir.path())?;
        assert!(book.add(schedule("daily", 1_000), 5_000)?);
        assert!(
            !book.add(schedule("daily", 1_000), 6_000)?,
            "same definition: no-op"
        );
        assert!(matches!(
            book.add(schedule("daily", 2_000), 6_000),
            Err(ScheduleError::Conflict(_))
        ));
        assert!(matches!(
            book.add(schedule("bad:id", 1_000), 6_000),
            Err(ScheduleError::Invalid(_))
        ));
        assert!(matches!(
            book.add(schedule("fast", 1), 6_000),
            Err(ScheduleError::Invalid(_))
        ));
        book.add(schedule("hourly", 3_600_000), 6_000)?;
        book.remove("hourly")?;
        let again = Schedules::load(fs.clone(), dir.path())?;
        assert_eq!(again.list(), vec![schedule("daily", 1_000)]);
        // When it was added (the first add's time, not the no-op's), and
        // nothing of the removed one.
        assert_eq!(again.added_at, BTreeMap::from([("daily".to_string(), 5_000)]));
        assert!(!dir.path().join(SCHEDULES_TMP).exists());
        std::fs::write(dir.path().join(SCHEDULES_FILE), b"{not json")?;
        let err = Schedules::load(fs, dir.path()).expect_err("corrupt");
        assert!(err.to_string().contains(SCHEDULES_FILE), "{err}");
        Ok(())
    }

    /// A file holding what `add` refuses is refused on load, naming the
    /// file and the schedule (by id, or by position when the id is bad).
    #[test]
    fn a_file_holding_what_add_refuses_is_refused_on_load() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let fs: Arc<dyn Fs> = Arc::new(RealFs::new());
        let cases = [
            (vec![schedule("daily", 0)], "schedule \"daily\""),
            (vec![schedule("daily", MAX_PERIOD_MS + 1)], "schedule \"daily\""),
            (
                vec![schedule("ok", 1_000), schedule("bad:id", 1_000)],
                "schedules[1]",
            ),
            (
                vec![schedule("daily", 1_000), schedule("daily", 2_000)],
                "schedule \"daily\"",
            ),
        ];
        for (schedules, named) in cases {
            let doc = Document {
                version: SCHEDULES_VERSION,
                schedules,
                added_at_ms: BTreeMap::new(),
            };
            std::fs::write(dir.path().join(SCHEDULES_FILE), serde_json::to_vec(&doc)?)?;
            let err = Schedules::load(fs.clone(), dir.path()).expect_err("refused");
            assert!(matches!(err, ScheduleError::InvalidFile { .. }), "{err:?}");
            let text = err.to_string();
            assert!(text.contains(SCHEDULES_FILE) && text.contains(named), "{text}");
        }
        Ok(())
    }
}
