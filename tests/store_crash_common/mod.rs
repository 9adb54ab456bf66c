//! Crash sweep shared by the `store_crash_*` tests: run a scenario on SQLite
//! over SimFs, crash it at EVERY I/O point under each crash mode, restart,
//! recover, and collect what the scenario's checker says is violated.
//!
//! A scenario is three closures: `setup` (not swept: the durable starting
//! state), `run` (the swept operations; it records what was acknowledged in
//! the model and stops at the first error, as the runtime bails on any I/O
//! error), and `check` (recovery on the rebooted database, then invariants;
//! returns violations as text). The model lives outside the `Fs`, like the
//! external world, so it survives the crash.

#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use durable_agent::fs::sim::FailKind;
use durable_agent::fs::{CrashMode, DirModel, Fault, Fs, SimConfig, SimFs};
use durable_agent::sqlite::{Db, SqliteOptions, Synchronous};
use durable_agent::store::schema::open_store;

pub const DB_PATH: &str = "/data/sessions.db";

/// How the process dies at the swept point, and how the machine restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kill {
    /// Crash at the point, then restart in this mode.
    Crash(CrashMode),
    /// The point takes effect but its caller gets EIO; the runtime bails
    /// out, then the machine restarts in this mode.
    LostReply(CrashMode),
    /// The point fails with this error; the runtime bails out, then the
    /// machine restarts in this mode.
    Fail(FailKind, CrashMode),
}

impl Kill {
    pub fn fault(self, at: u64) -> Fault {
        match self {
            Kill::Crash(_) => Fault::CrashAt(at),
            Kill::LostReply(_) => Fault::LostReplyAt(at),
            Kill::Fail(kind, _) => Fault::FailAt(at, kind),
        }
    }

    pub fn restart_mode(self) -> CrashMode {
        match self {
            Kill::Crash(m) | Kill::LostReply(m) | Kill::Fail(_, m) => m,
        }
    }
}

/// Crashes under each crash mode.
pub const CRASHES: [Kill; 3] = [
    Kill::Crash(CrashMode::ProcessCrash),
    Kill::Crash(CrashMode::PowerLoss(DirModel::Strict)),
    Kill::Crash(CrashMode::PowerLoss(DirModel::Eager)),
];

/// Crashes, plus lost replies and injected errors followed by a restart
/// (power loss where it is the harsher test).
pub const KILLS: [Kill; 6] = [
    CRASHES[0],
    CRASHES[1],
    CRASHES[2],
    Kill::LostReply(CrashMode::PowerLoss(DirModel::Strict)),
    Kill::Fail(FailKind::Eio, CrashMode::PowerLoss(DirModel::Strict)),
    Kill::Fail(FailKind::Enospc, CrashMode::ProcessCrash),
];

/// One violated invariant at one crash point.
#[derive(Debug, Clone)]
pub struct Violation {
    pub kill: Kill,
    /// Crash point relative to the start of `run` (1-based; 0 = no crash).
    pub point: u64,
    pub label: String,
    pub what: String,
}

/// What a sweep did and found.
#[derive(Debug, Default)]
pub struct Report {
    /// I/O points in one uncrashed `run` (the sweep crashes at each).
    pub points: u64,
    /// Cases executed (points × kills).
    pub cases: usize,
    pub violations: Vec<Violation>,
}

impl Report {
    /// Distinct faulted cases (kill, point > 0) with at least one violation.
    pub fn violating_crash_cases(&self) -> usize {
        let cases: std::collections::BTreeSet<(String, u64)> = self
            .violations
            .iter()
            .filter(|v| v.point > 0)
            .map(|v| (format!("{:?}", v.kill), v.point))
            .collect();
        cases.len()
    }

    /// Panic with a readable summary if anything was violated.
    pub fn assert_clean(&self, name: &str) {
        if self.violations.is_empty() {
            return;
        }
        let shown: Vec<String> = self
            .violations
            .iter()
            .take(10)
            .map(|v| {
                format!(
                    "  {:?} at run point {} [{}]: {}",
                    v.kill, v.point, v.label, v.what
                )
            })
            .collect();
        panic!(
            "{name}: {} violations in {} cases ({} points per run), first:\n{}",
            self.violations.len(),
            self.cases,
            self.points,
            shown.join("\n")
        );
    }
}

fn boot(seed: u64) -> (SimFs, Arc<dyn Fs>) {
    let sim = SimFs::new(SimConfig::new(seed));
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    (sim, fs)
}

/// Open the database and bring its schema current.
pub fn open_db(fs: &Arc<dyn Fs>, opts: &SqliteOptions) -> Result<Db, String> {
    open_store(fs.clone(), Path::new(DB_PATH), opts).map_err(|e| format!("reopen failed: {e}"))
}

fn fresh(seed: u64, opts: &SqliteOptions, setup: &dyn Fn(&Db)) -> (SimFs, Arc<dyn Fs>, Db) {
    let (sim, fs) = boot(seed);
    fs.create_dir_all(Path::new("/data"), "test mkdir /data").unwrap();
    fs.sync_dir(Path::new("/"), "test sync_dir /").unwrap();
    let db = open_db(&fs, opts).unwrap();
    setup(&db);
    (sim, fs, db)
}

/// Sweep every I/O point of `run` under every kill in `kills`, on the
/// runtime's SQLite settings (WAL, synchronous=FULL).
pub fn sweep<M>(
    kills: &[Kill],
    new_model: &dyn Fn() -> M,
    setup: &dyn Fn(&Db),
    run: &dyn Fn(&Db, &mut M) -> Result<(), String>,
    check: &dyn Fn(&Db, &M) -> Vec<String>,
) -> Report {
    sweep_with_options(&SqliteOptions::default(), kills, new_model, setup, run, check)
}

/// [`sweep`] with explicit SQLite settings (to show the sweep sees loss
/// when durability is switched off).
pub fn sweep_with_options<M>(
    opts: &SqliteOptions,
    kills: &[Kill],
    new_model: &dyn Fn() -> M,
    setup: &dyn Fn(&Db),
    run: &dyn Fn(&Db, &mut M) -> Result<(), String>,
    check: &dyn Fn(&Db, &M) -> Vec<String>,
) -> Report {
    // Probe: the uncrashed run, its length, and a clean-restart check.
    let (sim, fs, db) = fresh(0, opts, setup);
    let base = sim.points();
    let mut model = new_model();
    run(&db, &mut model).unwrap_or_else(|e| panic!("uncrashed run failed: {e}"));
    let points = sim.points() - base;
    drop(db);
    let db = open_db(&fs, opts).unwrap();
    let clean = check(&db, &model);
    drop(db);

    let mut report = Report {
        points,
        ..Report::default()
    };
    report.violations.extend(clean.into_iter().map(|what| Violation {
        kill: Kill::Crash(CrashMode::ProcessCrash),
        point: 0,
        label: "<no crash: clean restart>".to_string(),
        what,
    }));
    for &kill in kills {
        for n in 1..=points {
            report.cases += 1;
            let (sim, fs, db) = fresh(n, opts, setup);
            let crash_at = sim.points() + n;
            sim.set_fault(Some(kill.fault(crash_at)));
            let mut model = new_model();
            let _ = run(&db, &mut model);
            let hit = sim.trace().into_iter().find(|t| t.point == crash_at);
            let label = hit
                .as_ref()
                .map_or_else(|| "<no such point>".to_string(), |t| t.label.clone());
            let mut found = Vec::new();
            if hit.is_none() {
                found.push("run finished without reaching the faulted point".to_string());
            }
            drop(db);
            sim.restart(kill.restart_mode());
            match open_db(&fs, opts) {
                Ok(db) => found.extend(check(&db, &model)),
                Err(e) => found.push(e),
            }
            report.violations.extend(found.into_iter().map(|what| Violation {
                kill,
                point: n,
                label: label.clone(),
                what,
            }));
        }
    }
    report
}

/// SQLite settings that give up durability (synchronous=OFF).
pub fn unsynced() -> SqliteOptions {
    SqliteOptions {
        synchronous: Synchronous::Off,
        ..SqliteOptions::default()
    }
}
