//! `durable-agent verify` and `durable-agent repair --quarantine`: the
//! product's wiring of [`durable_agent::recovery::verify`] — the root from
//! the command line or a config, the report as text or JSON, and the
//! command that repairs each finding.
//!
//! Invariant: `verify` takes no lock and changes nothing (it reads through
//! the library's read-only view); `repair` takes the root lock first and
//! fails at once if a daemon holds it, then moves only what a fresh check
//! under that lock finds damaged.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use durable_agent::fs::Fs;
use durable_agent::recovery::verify::{
    plan_quarantine, quarantine, verify, verify_with, Finding, QuarantinePlan, Remedy, RepairError,
    Verification, Writers,
};
use durable_agent::system::{LOCK_FILE, STORE_DB_FILE};

use crate::boot::real_fs;
use crate::config::Config;

/// The root a command names: `ROOT`, or `--config FILE`'s `[runtime] root`.
#[derive(Debug, Clone)]
pub struct RootArg {
    pub root: PathBuf,
    /// How to name the root in a suggested command.
    pub cli: String,
}

impl RootArg {
    /// The root made absolute, so every path a report or a NOTE.txt
    /// gives works from any directory.
    pub fn resolve(root: Option<PathBuf>, config: Option<PathBuf>) -> Result<RootArg, String> {
        let absolute = |p: &Path| std::path::absolute(p).map_err(|e| format!("{}: {e}", p.display()));
        match (root, config) {
            (Some(root), None) => {
                let root = absolute(&root)?;
                Ok(RootArg {
                    cli: shell_word(&root.display().to_string()),
                    root,
                })
            }
            (None, Some(config)) => {
                let loaded = Config::load(&config).map_err(|e| e.to_string())?;
                Ok(RootArg {
                    root: absolute(&loaded.runtime.root)?,
                    cli: format!(
                        "--config {}",
                        shell_word(&absolute(&config)?.display().to_string())
                    ),
                })
            }
            // clap's group makes these unreachable; said plainly anyway.
            _ => Err("name the root: ROOT or --config FILE".to_string()),
        }
    }

    fn db_path(&self) -> PathBuf {
        self.root.join(STORE_DB_FILE)
    }
}

/// `s` quoted for a shell when it needs it.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The command (or action) that repairs `f`.
pub fn repair_command(f: &Finding, root: &RootArg) -> String {
    match f.remedy {
        Remedy::QuarantineSession => format!(
            "restore {} from a backup, or: durable-agent repair --quarantine {} (moves the session's \
             directory to quarantine/; add --force if it has live children)",
            f.path.display(),
            root.cli
        ),
        Remedy::AcceptStoreLoss => format!(
            "restore store.db from a backup, or: durable-agent repair --quarantine --accept-store-loss {} \
             (a new, empty store: dedup keys and the side-effect ledger forgotten)",
            root.cli
        ),
        Remedy::QuarantineManifest => format!(
            "restore root.json from a backup, or: durable-agent repair --quarantine {}",
            root.cli
        ),
        Remedy::Manual if f.kind == durable_agent::recovery::verify::FindingKind::SchedulesInvalid => {
            format!(
                "not repaired by quarantine: restore {} from a backup, or move it aside (its schedules \
             are then forgotten: add them again)",
                f.path.display()
            )
        }
        Remedy::Manual => {
            "not repaired by quarantine: upgrade durable-agent or fix the file's permissions".to_string()
        }
    }
}

/// `{root}/schedules.json` as the daemon loads it (`serve`, and every
/// command that boots the root, refuse a root whose file cannot be
/// read): a finding if it cannot be (found by a review: `verify` called
/// such a root healthy). Read only; a missing file is no schedules.
fn check_schedules(fs: Arc<dyn Fs>, root: &Path) -> Option<Finding> {
    use durable_agent::recovery::verify::FindingKind;
    use durable_agent::worker::schedule::{ScheduleError, Schedules, SCHEDULES_FILE};
    let e = Schedules::load(fs, root).err()?;
    let kind = match &e {
        ScheduleError::FutureVersion { .. } => FindingKind::NewerSchema,
        ScheduleError::Io { .. } => FindingKind::Unreadable,
        _ => FindingKind::SchedulesInvalid,
    };
    Some(Finding {
        kind,
        path: root.join(SCHEDULES_FILE),
        line: None,
        offset: None,
        session: None,
        message: e.to_string(),
        remedy: Remedy::Manual,
    })
}

fn root_missing(root: &RootArg) -> Option<String> {
    (!root.root.is_dir()).then(|| format!("{}: no such root directory", root.root.display()))
}

/// `verify`: the report (text or JSON) and whether the root is healthy.
pub fn verify_command(root: &RootArg, json: bool) -> Result<(String, bool), String> {
    if let Some(e) = root_missing(root) {
        return Err(e);
    }
    let fs: Arc<dyn Fs> = Arc::new(real_fs().map_err(|e| e.to_string())?);
    let mut v = verify(fs.clone(), &root.root, &root.db_path());
    v.damaged.extend(check_schedules(fs, &root.root));
    let healthy = v.is_healthy();
    let out = if json {
        json_report(&v, root)?
    } else {
        text_report(&v, root)
    };
    Ok((out, healthy))
}

fn json_report(v: &Verification, root: &RootArg) -> Result<String, String> {
    let mut value = serde_json::to_value(v).map_err(|e| e.to_string())?;
    if let Some(damaged) = value.get_mut("damaged").and_then(|d| d.as_array_mut()) {
        for (item, f) in damaged.iter_mut().zip(&v.damaged) {
            if let Some(obj) = item.as_object_mut() {
                obj.insert("repair".into(), repair_command(f, root).into());
            }
        }
    }
    if let Some(obj) = value.as_object_mut() {
        obj.insert(
            "status".into(),
            if v.is_healthy() { "healthy" } else { "damaged" }.into(),
        );
    }
    serde_json::to_string_pretty(&value).map_err(|e| e.to_string())
}

fn text_report(v: &Verification, root: &RootArg) -> String {
    let mut out = format!("root {}\n", v.root.display());
    for c in &v.healthy {
        out.push_str(&format!("ok       {}: {}\n", c.path.display(), c.what));
    }
    for c in &v.repaired_at_boot {
        out.push_str(&format!("at boot  {}: {}\n", c.path.display(), c.what));
    }
    for f in &v.damaged {
        let at = match (f.line, f.offset) {
            (Some(l), Some(o)) => format!(" line {l} (byte {o})"),
            (Some(l), None) => format!(" line {l}"),
            _ => String::new(),
        };
        out.push_str(&format!(
            "DAMAGED  {}{at}: {}\n         repair: {}\n",
            f.path.display(),
            f.message,
            repair_command(f, root)
        ));
    }
    if v.is_healthy() {
        out.push_str("healthy: nothing acknowledged is missing or damaged\n");
    } else {
        out.push_str(&format!(
            "damaged: {} finding(s); the boot refuses this root until they are restored or quarantined \
             (docs/OPERATING.md)\n",
            v.damaged.len()
        ));
    }
    out
}

/// What `repair --quarantine` did.
#[derive(Debug, serde::Serialize)]
pub struct Repaired {
    pub root: PathBuf,
    /// The quarantine batch, when anything was moved.
    pub quarantine: Option<PathBuf>,
    pub plan: QuarantinePlan,
}

/// `repair --quarantine`: under the root lock, check again and move what
/// is damaged aside (see the module doc).
pub fn repair_command_run(root: &RootArg, force: bool, accept_store_loss: bool) -> Result<Repaired, String> {
    if let Some(e) = root_missing(root) {
        return Err(e);
    }
    let fs: Arc<dyn Fs> = Arc::new(real_fs().map_err(|e| e.to_string())?);
    let lock_path = root.root.join(LOCK_FILE);
    let _lock = fs.lock_exclusive(&lock_path, "root lock (repair)").map_err(|e| {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            format!(
                "root {} is in use by another durable-agent (its lock {} is held): stop it first; \
                 repair moves files only while nothing uses the root",
                root.root.display(),
                lock_path.display()
            )
        } else {
            format!("{}: cannot take the root lock: {e}", lock_path.display())
        }
    })?;
    // The lock is ours: no daemon writes, so damage is believed at once.
    let v = verify_with(fs.clone(), &root.root, &root.db_path(), Writers::None);
    let plan = plan_quarantine(&v, force, accept_store_loss).map_err(|e: RepairError| e.to_string())?;
    if plan.items.is_empty() && !plan.store_loss {
        return Ok(Repaired {
            root: root.root.clone(),
            quarantine: None,
            plan,
        });
    }
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let batch = quarantine(
        &fs,
        &root.root,
        &root.db_path(),
        &plan,
        v.manifest_store_id,
        now_ms,
    )
    .map_err(|e| e.to_string())?;
    Ok(Repaired {
        root: root.root.clone(),
        quarantine: Some(batch),
        plan,
    })
}

/// A one-line-per-item summary of a repair.
pub fn repaired_text(r: &Repaired) -> String {
    let Some(batch) = &r.quarantine else {
        return format!("root {}: nothing damaged, nothing moved\n", r.root.display());
    };
    let mut out = String::new();
    for item in &r.plan.items {
        out.push_str(&format!(
            "moved {} -> {}\n",
            r.root.join(&item.path).display(),
            batch.join(&item.path).display()
        ));
    }
    if r.plan.store_loss {
        out.push_str("created a new, empty store.db; root.json records the old store as lost\n");
    }
    out.push_str(&format!(
        "see {} (what was wrong, how to restore)\n",
        Path::new(batch)
            .join(durable_agent::recovery::verify::NOTE_FILE)
            .display()
    ));
    out
}
