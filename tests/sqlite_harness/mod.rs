//! Shared harness of the SQLite fault sweeps: a durable setup, a workload
//! of small acknowledged transactions, a fault at every I/O point, a
//! restart under a crash mode, and the check against the one reference
//! model: every acknowledged row is present, the in-flight row may or may
//! not be, nothing else appears, and `PRAGMA integrity_check` is ok.

#![allow(dead_code)] // each test binary uses a different part

use std::collections::BTreeSet;
use std::io;
use std::path::Path;
use std::sync::Arc;

use durable_agent::fs::sim::{FailKind, IoOp, Outcome};
use durable_agent::fs::{CrashMode, DirModel, Fault, Fs, OpenMode, SimConfig, SimFs};
use durable_agent::sqlite::{open, JournalMode, SqliteOptions, Synchronous};

pub const ROWS: i64 = 10;
pub const SEEDS: [u64; 3] = [1, 2, 3];
pub const DB: &str = "/data/guarantees.db";

pub const MODES: [CrashMode; 3] = [
    CrashMode::ProcessCrash,
    CrashMode::PowerLoss(DirModel::Strict),
    CrashMode::PowerLoss(DirModel::Eager),
];

/// What is injected at point k.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inject {
    /// The process dies at k; then restart under the sweep's mode.
    Crash,
    /// k fails (EIO / ENOSPC) or succeeds with a lost reply; the process
    /// stops its workload, closes, and then the sweep's crash mode hits.
    Fail(FailKind),
    LostReply,
}

impl Inject {
    fn fault(self, point: u64) -> Fault {
        match self {
            Inject::Crash => Fault::CrashAt(point),
            Inject::Fail(kind) => Fault::FailAt(point, kind),
            Inject::LostReply => Fault::LostReplyAt(point),
        }
    }
}

/// How the op at a crash point is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// SimFs's seeded default: not done, done, or cut midway (a torn
    /// write, an `fsync` the power cut in the middle of).
    Seeded,
    /// Always midway: every crash at an `fsync` or directory fsync is a
    /// power cut in the middle of it (a seeded subset of its pages or
    /// directory changes reached the disk).
    Midway,
}

/// The disk's fault config: one `read_at` in ten is short (the VFS must
/// loop to honour xRead), and the crash point's op is cut per `cut`.
fn config(seed: u64, cut: Cut) -> SimConfig {
    let config = SimConfig {
        short_read_probability: 0.1,
        ..SimConfig::new(seed)
    };
    match cut {
        Cut::Seeded => config,
        Cut::Midway => SimConfig {
            crash_point_done_probability: 1.0,
            torn_write_probability: 1.0,
            ..config
        },
    }
}

/// Builds the `Fs` SQLite runs on from the simulated disk.
pub type Wrap = fn(SimFs) -> Arc<dyn Fs>;

pub fn plain(sim: SimFs) -> Arc<dyn Fs> {
    Arc::new(sim)
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub cases: u64,
    /// Cases where an acknowledged commit is missing after recovery.
    pub lost: u64,
    /// Of those, cases missing a commit older than the last acknowledged.
    pub lost_older: u64,
    /// Cases that failed to reopen, failed integrity_check, or showed a
    /// row that was never written.
    pub corrupt: u64,
    /// Cases whose crash cut an `fsync` or directory fsync midway.
    pub mid_fsync: u64,
}

pub fn opts(journal: JournalMode, sync: Synchronous, seed: u64) -> SqliteOptions {
    SqliteOptions {
        journal_mode: journal,
        synchronous: sync,
        seed,
        ..SqliteOptions::default()
    }
}

/// A fresh disk with the table created, closed and made durable (setup is
/// not swept: synchronous=OFF would never sync it).
fn setup(seed: u64, o: &SqliteOptions, wrap: Wrap, cut: Cut) -> (SimFs, Arc<dyn Fs>) {
    let sim = SimFs::new(config(seed, cut));
    sim.create_dir_all(Path::new("/data"), "test mkdir").unwrap();
    sim.sync_dir(Path::new("/"), "test sync root").unwrap();
    let fs = wrap(sim.clone());
    let durable = SqliteOptions {
        synchronous: Synchronous::Extra,
        ..o.clone()
    };
    let db = open(fs.clone(), Path::new(DB), &durable).unwrap();
    db.conn()
        .execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        .unwrap();
    db.close().unwrap();
    sim.sync(Path::new(DB), "test sync setup db").unwrap();
    sim.sync_dir(Path::new("/data"), "test sync setup dir").unwrap();
    (sim, fs)
}

/// Run the workload until it finishes or the first error. Returns the
/// acknowledged ids and the id in flight when it stopped.
fn workload(fs: Arc<dyn Fs>, o: &SqliteOptions) -> (Vec<i64>, Option<i64>) {
    let mut acked = Vec::new();
    let Ok(mut db) = open(fs, Path::new(DB), o) else {
        return (acked, Some(0));
    };
    // Checkpoint often so the sweep crosses WAL checkpoints and restarts.
    if db.conn().execute_batch("PRAGMA wal_autocheckpoint=4").is_err() {
        return (acked, Some(0));
    }
    for i in 0..ROWS {
        let body = vec![(i % 251) as u8; 300 + (i as usize * 37) % 500];
        let r = db.conn_mut().transaction().and_then(|tx| {
            tx.execute("INSERT INTO t (id, body) VALUES (?1, ?2)", (i, body))?;
            tx.commit()
        });
        if r.is_err() {
            return (acked, Some(i));
        }
        acked.push(i);
    }
    // The close (final checkpoint, WAL delete) is swept too; its failure
    // leaves every commit acknowledged.
    let _ = db.close();
    (acked, None)
}

/// "point N op path: label" of the injected fault, for reports.
fn fault_label(sim: &SimFs) -> String {
    sim.trace()
        .iter()
        .find(|t| t.outcome != Outcome::Ok && t.outcome != Outcome::Err)
        .map(|t| format!("point {} {:?} {}: {}", t.point, t.op, t.path, t.label))
        .unwrap_or_else(|| "<fault not reached>".into())
}

/// Reopen after the crash and judge it: Ok(missing acked ids) or Err(why
/// the database is corrupt).
fn check(
    fs: Arc<dyn Fs>,
    o: &SqliteOptions,
    acked: &[i64],
    inflight: Option<i64>,
) -> Result<Vec<i64>, String> {
    let db = open(fs, Path::new(DB), o).map_err(|e| format!("reopen: {e}"))?;
    let problems = db
        .integrity_check()
        .map_err(|e| format!("integrity_check: {e}"))?;
    if !problems.is_empty() {
        return Err(format!("integrity_check: {problems:?}"));
    }
    let ids: BTreeSet<i64> = (|| {
        let mut s = db.conn().prepare("SELECT id FROM t")?;
        let ids = s.query_map([], |r| r.get(0))?.collect::<Result<_, _>>();
        ids
    })()
    .map_err(|e| format!("select: {e}"))?;
    let allowed: BTreeSet<i64> = acked.iter().copied().chain(inflight).collect();
    if let Some(p) = ids.difference(&allowed).next() {
        return Err(format!("row {p} was never written; ids {ids:?}"));
    }
    Ok(acked.iter().copied().filter(|i| !ids.contains(i)).collect())
}

/// Inject at every I/O point of the workload for one config, then restart
/// under `mode` and check. Prints up to 3 failing cases.
pub fn sweep(
    name: &str,
    journal: JournalMode,
    sync: Synchronous,
    inject: Inject,
    mode: CrashMode,
    wrap: Wrap,
) -> Counts {
    sweep_cut(name, journal, sync, inject, mode, wrap, Cut::Seeded)
}

/// [`sweep`] with the crash point's op cut per `cut`.
pub fn sweep_cut(
    name: &str,
    journal: JournalMode,
    sync: Synchronous,
    inject: Inject,
    mode: CrashMode,
    wrap: Wrap,
    cut: Cut,
) -> Counts {
    let mut c = Counts::default();
    let mut reported = 0;
    for seed in SEEDS {
        let o = opts(journal, sync, seed);
        let (sim, fs) = setup(seed, &o, wrap, cut);
        let base = sim.points();
        let (acked, _) = workload(fs, &o);
        assert_eq!(
            acked.len() as i64,
            ROWS,
            "unfaulted workload must commit everything"
        );
        let total = sim.points() - base;
        for k in 1..=total {
            c.cases += 1;
            let (sim, fs) = setup(seed, &o, wrap, cut);
            sim.set_fault(Some(inject.fault(sim.points() + k)));
            let (acked, inflight) = workload(fs.clone(), &o);
            if inject == Inject::Crash {
                assert!(sim.crashed(), "seed {seed} point {k}: crash point not reached");
                let cut_sync = sim
                    .trace()
                    .iter()
                    .any(|t| t.outcome == Outcome::Crashed && matches!(t.op, IoOp::Sync | IoOp::SyncDir));
                if cut_sync && cut == Cut::Midway {
                    c.mid_fsync += 1;
                }
            }
            sim.restart(mode);
            let what = format!(
                "{name} {inject:?} then {mode:?} seed {seed} k {k} at {}",
                fault_label(&sim)
            );
            match check(fs, &o, &acked, inflight) {
                Err(why) => {
                    c.corrupt += 1;
                    if reported < 3 {
                        reported += 1;
                        eprintln!("CORRUPT {what}: {why}");
                    }
                }
                Ok(missing) if !missing.is_empty() => {
                    c.lost += 1;
                    if missing.iter().any(|i| Some(i) != acked.last()) {
                        c.lost_older += 1;
                    }
                    if reported < 3 {
                        reported += 1;
                        eprintln!("LOST {what}: acked {acked:?} missing {missing:?}");
                    }
                }
                Ok(_) => {}
            }
        }
    }
    c
}

/// One printed row of the results table.
pub fn print_row(name: &str, what: &str, c: &Counts) {
    eprintln!(
        "sqlite guarantees | {name:<22} | {what:<30} | cases {:>5} | lost {:>4} (older than last {:>4}) | corrupt {:>4} | mid-fsync cuts {:>4}",
        c.cases, c.lost, c.lost_older, c.corrupt, c.mid_fsync
    );
}

/// Crash at every point under each of [`MODES`]; print and return the rows.
pub fn crash_table(
    name: &str,
    journal: JournalMode,
    sync: Synchronous,
    wrap: Wrap,
) -> Vec<(CrashMode, Counts)> {
    let rows: Vec<(CrashMode, Counts)> = MODES
        .iter()
        .map(|&m| (m, sweep(name, journal, sync, Inject::Crash, m, wrap)))
        .collect();
    for (m, c) in &rows {
        print_row(name, &format!("crash, {m:?}"), c);
    }
    rows
}

/// Power cut in the middle of every `fsync`/directory fsync the sweep
/// crashes at (and every other crash point's op cut midway too), under
/// both power-loss modes; print and return the rows.
pub fn mid_fsync_table(name: &str, journal: JournalMode, sync: Synchronous) -> Vec<(CrashMode, Counts)> {
    let rows: Vec<(CrashMode, Counts)> = MODES[1..]
        .iter()
        .map(|&m| {
            (
                m,
                sweep_cut(name, journal, sync, Inject::Crash, m, plain, Cut::Midway),
            )
        })
        .collect();
    for (m, c) in &rows {
        print_row(name, &format!("mid-fsync cut, {m:?}"), c);
    }
    rows
}

/// An `Fs` that acknowledges `sync_dir` without doing it: a VFS that
/// forgot os_unix.c's directory fsyncs. Everything else goes to SimFs.
#[derive(Debug)]
pub struct NoDirSync(pub SimFs);

pub fn no_dir_sync(sim: SimFs) -> Arc<dyn Fs> {
    Arc::new(NoDirSync(sim))
}

impl Fs for NoDirSync {
    fn create_dir_all(&self, p: &Path, l: &str) -> io::Result<()> {
        self.0.create_dir_all(p, l)
    }
    fn open(&self, p: &Path, m: OpenMode, l: &str) -> io::Result<()> {
        self.0.open(p, m, l)
    }
    fn write_at(&self, p: &Path, o: u64, d: &[u8], l: &str) -> io::Result<()> {
        self.0.write_at(p, o, d, l)
    }
    fn append(&self, p: &Path, d: &[u8], l: &str) -> io::Result<u64> {
        self.0.append(p, d, l)
    }
    fn read_at(&self, p: &Path, o: u64, b: &mut [u8], l: &str) -> io::Result<usize> {
        self.0.read_at(p, o, b, l)
    }
    fn read(&self, p: &Path, l: &str) -> io::Result<Vec<u8>> {
        self.0.read(p, l)
    }
    fn len(&self, p: &Path, l: &str) -> io::Result<u64> {
        self.0.len(p, l)
    }
    fn truncate(&self, p: &Path, n: u64, l: &str) -> io::Result<()> {
        self.0.truncate(p, n, l)
    }
    fn sync(&self, p: &Path, l: &str) -> io::Result<()> {
        self.0.sync(p, l)
    }
    fn sync_dir(&self, _p: &Path, _l: &str) -> io::Result<()> {
        Ok(())
    }
    fn rename(&self, f: &Path, t: &Path, l: &str) -> io::Result<()> {
        self.0.rename(f, t, l)
    }
    fn remove(&self, p: &Path, l: &str) -> io::Result<()> {
        self.0.remove(p, l)
    }
    fn list(&self, p: &Path, l: &str) -> io::Result<Vec<String>> {
        self.0.list(p, l)
    }
    fn exists(&self, p: &Path, l: &str) -> io::Result<bool> {
        self.0.exists(p, l)
    }
}
