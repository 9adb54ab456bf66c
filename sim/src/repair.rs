//! The operator's `repair --quarantine`, judged on every disk a boot
//! refused as damaged (`exec/restart.rs`, before the damage is undone):
//! on a detached copy of that disk (the run's disk, points and draws
//! untouched), the harness plans the repair from the refused disk's
//! `verify` and carries it out, as `durable-agent repair` does
//! (`recovery::verify::{plan_quarantine, quarantine}`), then judges it.
//! The promise (docs/OPERATING.md, `plan_quarantine`'s doc):
//!
//! - **Q1 refusals**: without `--force` and `--accept-store-loss`, the
//!   plan is refused exactly when a finding needs one of them — a
//!   damaged session with live descendants, a store given up, a
//!   manifest lost with no store beside it — or is not quarantine's
//!   (`Remedy::Manual`); with both, exactly when one is not
//!   quarantine's;
//! - **Q2 the plan** moves what each finding names — a damaged session's
//!   directory and, with `--force`, each live session descending from it;
//!   the store (with its WAL) when given up; a damaged manifest — and
//!   nothing else;
//! - **Q3 moved whole**: every file of every item is in the new batch at
//!   the same relative path, byte for byte, and gone from the root;
//! - **Q4 nothing else touched**: every other file keeps its bytes (a
//!   store given up is replaced by a new one, and `root.json` then names
//!   it);
//! - **Q5 the note** (`NOTE.txt` in the batch) names every item, and
//!   every finding's file with its line and byte when known; the plan
//!   gives no item the same reason twice;
//! - **Q6 healthy after**: `verify` of the repaired root finds no damage,
//!   and a store given up is replaced by one of another identity, the
//!   old one recorded in `root.json`'s history of lost stores (its
//!   identity, the time, and the batch holding what was left of it).
//!
//! The repaired disk is never booted here (its boot would act on the
//! run's world); `verify`, which I7 holds to what a boot does, stands
//! for it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use durable_agent::fs::{Fs, SimConfig, SimFs};
use durable_agent::recovery::verify::{
    plan_quarantine, quarantine, verify_with, Finding, QuarantinePlan, Remedy, Verification, Writers,
    NOTE_FILE, QUARANTINE_DIR,
};
use durable_agent::runtime::SessionId;
use durable_agent::store::manifest::{self, LostStore};

use crate::driver::{ROOT, STORE_DB};

/// The live sessions descending from `session` (their parent chain
/// reaches it), by the sessions `v` lists. Computed here, not by the
/// product's `Verification::live_descendants`: the plan that function
/// feeds is what Q1 and Q2 judge.
fn live_descendants(v: &Verification, session: &SessionId) -> BTreeSet<SessionId> {
    let mut out = BTreeSet::new();
    let mut seen = BTreeSet::from([session.clone()]);
    let mut frontier = vec![session.clone()];
    while let Some(p) = frontier.pop() {
        for s in v.sessions.iter().filter(|s| s.parent.as_ref() == Some(&p)) {
            if seen.insert(s.session.clone()) {
                frontier.push(s.session.clone());
                if !s.terminated {
                    out.insert(s.session.clone());
                }
            }
        }
    }
    out
}

fn session_dir(s: &SessionId) -> PathBuf {
    PathBuf::from("agents").join(s.to_string())
}

/// The item (relative to the root) that moving `f`'s damage aside moves:
/// its session's directory, or the damaged file itself.
fn item_of(f: &Finding) -> PathBuf {
    match (&f.remedy, &f.session) {
        (Remedy::QuarantineSession, Some(s)) => session_dir(s),
        _ => f
            .path
            .strip_prefix(ROOT)
            .map_or_else(|_| f.path.clone(), Path::to_path_buf),
    }
}

/// Q1–Q6 for the refused disk `fs` (a dead process's: nobody writes it),
/// whose `verify` is `v`, repaired at `now_ms`.
pub fn judge(fs: &SimFs, seed: u64, v: &Verification, now_ms: u64) -> Result<(), String> {
    if v.damaged.is_empty() {
        return Ok(());
    }
    let manual = v.damaged.iter().any(|f| {
        f.remedy == Remedy::Manual || (f.remedy == Remedy::QuarantineSession && f.session.is_none())
    });
    let needs_loss = v.damaged.iter().any(|f| {
        f.remedy == Remedy::AcceptStoreLoss || (f.remedy == Remedy::QuarantineManifest && !v.store_present)
    });
    let needs_force = v.damaged.iter().any(|f| {
        f.remedy == Remedy::QuarantineSession
            && f.session
                .as_ref()
                .is_some_and(|s| !live_descendants(v, s).is_empty())
    });
    let plain = plan_quarantine(v, false, false);
    if plain.is_ok() == (manual || needs_loss || needs_force) {
        return Err(format!(
            "Q1: repair --quarantine without --force and --accept-store-loss answered {plain:?}; the findings need --force: {needs_force}, --accept-store-loss: {needs_loss}, are not quarantine's: {manual}"
        ));
    }
    let plan = match (plan_quarantine(v, true, true), manual) {
        (Err(_), true) => return Ok(()),
        (Ok(plan), false) => plan,
        (other, _) => {
            return Err(format!(
                "Q1: repair --quarantine --force --accept-store-loss answered {other:?}; a finding quarantine cannot repair: {manual}"
            ))
        }
    };
    // Q2: what each finding names, and nothing else.
    let mut wanted: BTreeSet<PathBuf> = BTreeSet::new();
    let mut loss = false;
    for f in &v.damaged {
        wanted.insert(item_of(f));
        match (&f.remedy, &f.session) {
            (Remedy::QuarantineSession, Some(s)) => {
                wanted.extend(live_descendants(v, s).iter().map(session_dir));
            }
            (Remedy::AcceptStoreLoss, _) => loss = true,
            _ => {}
        }
    }
    if loss {
        if v.store_present {
            wanted.insert(PathBuf::from("store.db"));
        }
        wanted.insert(PathBuf::from("store.db-wal"));
    }
    if let Some(item) = plan
        .items
        .iter()
        .find(|i| i.why.iter().collect::<BTreeSet<_>>().len() != i.why.len())
    {
        return Err(format!(
            "Q2: the plan gives {} a reason twice: {:?}",
            item.path.display(),
            item.why
        ));
    }
    // Each finding is a reason given for the item that moves it.
    for f in &v.damaged {
        let item = item_of(f);
        let file = f.path.display().to_string();
        let given = plan
            .items
            .iter()
            .find(|i| i.path == item)
            .is_some_and(|i| i.why.iter().any(|w| w.contains(&file) && w.contains(&f.message)));
        if !given {
            return Err(format!(
                "Q2: the plan does not give {} the finding in {file} ({}) as a reason; the plan: {plan:?}",
                item.display(),
                f.message
            ));
        }
    }
    let planned: BTreeSet<PathBuf> = plan.items.iter().map(|i| i.path.clone()).collect();
    if planned != wanted || plan.store_loss != loss || planned.len() != plan.items.len() {
        return Err(format!(
            "Q2: the repair plans to move {planned:?} (store given up: {}), but the findings name {wanted:?} (store given up: {loss}); the plan: {plan:?}",
            plan.store_loss
        ));
    }

    carry_out(fs, seed, v, &plan, now_ms)
}

/// Q3–Q6: `plan` carried out on a detached copy of `fs`.
fn carry_out(
    fs: &SimFs,
    seed: u64,
    v: &Verification,
    plan: &QuarantinePlan,
    now_ms: u64,
) -> Result<(), String> {
    let root = Path::new(ROOT);
    let copy = fs.detached(SimConfig::new(seed));
    let before = copy.disk_image();
    let qroot = root.join(QUARANTINE_DIR);
    let batches_before = copy
        .list(&qroot, "harness: quarantine list")
        .map_or(0, |l| l.len());
    // A damaged manifest has no history to keep (the repair reads it so too).
    let lost_before = manifest::read_lost(&copy, root).unwrap_or_default();
    let shared: Arc<dyn Fs> = Arc::new(copy.clone());
    let batch = quarantine(
        &shared,
        root,
        Path::new(STORE_DB),
        plan,
        v.manifest_store_id,
        now_ms,
    )
    .map_err(|e| format!("Q3: repair --quarantine failed on a disk nobody writes: {e}"))?;
    let after = copy.disk_image();
    let moved = |path: &Path| plan.items.iter().find(|i| path.starts_with(root.join(&i.path)));
    let mut out = Vec::new();
    // The batch: `quarantine/NNNN-<UTC time>`, numbered after the batches
    // already there.
    let name = format!("{:04}-{}", batches_before + 1, compact_utc(now_ms));
    if batch != qroot.join(&name) {
        out.push(format!(
            "Q3: the batch is {}, not {} ({batches_before} batches before, repaired at {now_ms} ms)",
            batch.display(),
            qroot.join(&name).display()
        ));
    }
    for (path, bytes) in &before {
        match moved(path) {
            Some(_) => {
                let to = batch.join(path.strip_prefix(root).unwrap_or(path));
                if after.get(&to) != Some(bytes) {
                    out.push(format!(
                        "Q3: {} is not in the batch at {} as it was",
                        path.display(),
                        to.display()
                    ));
                }
                let replaced = plan.store_loss && path == Path::new(STORE_DB);
                if after.contains_key(path) && !replaced {
                    out.push(format!(
                        "Q3: {} was moved but is still in the root",
                        path.display()
                    ));
                }
            }
            None => {
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                let remade = plan.store_loss && (name == "root.json" || name.starts_with("store.db"));
                if !remade && after.get(path) != Some(bytes) {
                    out.push(format!(
                        "Q4: {} is not in the plan, yet the repair changed it",
                        path.display()
                    ));
                }
            }
        }
    }
    let note = after
        .get(&batch.join(NOTE_FILE))
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default();
    let named: BTreeMap<String, &str> = plan
        .items
        .iter()
        .map(|i| (i.path.display().to_string(), "item"))
        // Each finding by its file, and where in it when known.
        .chain(v.damaged.iter().map(|f| {
            let at = match (f.line, f.offset) {
                (Some(l), Some(o)) => format!(" line {l} (byte {o})"),
                (Some(l), None) => format!(" line {l}"),
                _ => String::new(),
            };
            (format!("{}{at}", f.path.display()), "finding")
        }))
        .collect();
    for (path, what) in named {
        if !note.contains(&path) {
            out.push(format!(
                "Q5: the batch's NOTE.txt does not name the {what} {path}"
            ));
        }
    }
    let healed = verify_with(
        Arc::new(copy.detached(SimConfig::new(seed))),
        root,
        Path::new(STORE_DB),
        Writers::None,
    );
    if !healed.damaged.is_empty() {
        out.push(format!(
            "Q6: after the repair, verify still finds damage: {:?}",
            healed.damaged
        ));
    }
    if plan.store_loss && healed.manifest_store_id == v.manifest_store_id {
        out.push(format!(
            "Q6: the store was given up, but root.json still names store {:?}",
            v.manifest_store_id
        ));
    }
    // A store given up is recorded in root.json's history for good: its
    // identity, when, and where what was left of it went.
    let lost_after = manifest::read_lost(&copy, root).map_err(|e| format!("Q6: {e}"))?;
    let mut lost_wanted = lost_before;
    if plan.store_loss {
        let store_moved = before.contains_key(Path::new(STORE_DB))
            && plan.items.iter().any(|i| i.path == Path::new("store.db"));
        lost_wanted.push(LostStore {
            store_id: v.manifest_store_id.unwrap_or(0),
            accepted_at_ms: now_ms,
            quarantined_to: store_moved
                .then(|| batch.strip_prefix(root).unwrap_or(&batch).display().to_string()),
        });
    }
    if lost_after != lost_wanted {
        out.push(format!(
            "Q6: root.json records the lost stores {lost_after:?}, not {lost_wanted:?}"
        ));
    }
    if out.is_empty() {
        Ok(())
    } else {
        Err(out.join("\n"))
    }
}

/// `now_ms` as the batch name's UTC stamp (`20261125T153907Z`), by way
/// of `httpdate`'s RFC 7231 date (`Wed, 25 Nov 2026 15:39:07 GMT`).
fn compact_utc(now_ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(now_ms);
    let http = httpdate::fmt_http_date(at);
    let parts: Vec<&str> = http.split([' ', ':']).collect();
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| parts.get(2) == Some(m))
    .map_or(0, |m| m + 1);
    match parts.as_slice() {
        [_, day, _, year, h, m, s, _] => format!("{year}{month:02}{day}T{h}{m}{s}Z"),
        _ => http,
    }
}

#[cfg(test)]
mod tests {
    use super::compact_utc;

    #[test]
    fn the_batch_stamp_is_utc_compact() {
        // The example in `quarantine`'s doc, and a leap day's last second.
        assert_eq!(compact_utc(1_795_621_147_999), "20261125T153907Z");
        assert_eq!(compact_utc(1_709_251_199_000), "20240229T235959Z");
    }
}
