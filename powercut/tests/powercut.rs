//! The power-cut FUSE filesystem on a real kernel mount: what `fsync` and
//! `fsyncdir` make durable survives a cut, what they did not is dropped
//! (or kept) exactly as SimFs's `PowerLoss` decides, from the seed; and the
//! library's own RealFs workloads (the runtime, and `System::boot` with its
//! SQLite stores) recover everything they acknowledged after a cut.
//!
//! These tests need /dev/fuse and root (mount(2)); where the mount fails
//! they fail with the reason — they never pass without mounting.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use durable_agent::fs::{DirModel, Fs, RealFs, SimConfig};
use durable_agent::recovery::check_invariants;
use durable_agent::runtime::{FakeProvider, PureTools, Runtime, RuntimeConfig};
use durable_agent::store::triggers::{EmitOutcome, TriggerSource, TriggerSpec};
use durable_agent::system::{Deps, LogicalClock, System, SystemConfig};
use durable_agent::world::World;
use durable_agent_powercut::{MountConfig, PowerCutMount};
use tempfile::TempDir;

/// A backing directory and a mountpoint in one temp dir.
struct Disk {
    _tmp: TempDir,
    backing: PathBuf,
    mnt: PathBuf,
}

impl Disk {
    fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let backing = tmp.path().join("backing");
        let mnt = tmp.path().join("mnt");
        fs::create_dir(&backing).expect("mkdir backing");
        fs::create_dir(&mnt).expect("mkdir mnt");
        Disk {
            _tmp: tmp,
            backing,
            mnt,
        }
    }

    fn mount(&self, config: MountConfig) -> PowerCutMount {
        PowerCutMount::mount(&self.backing, &self.mnt, config).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The backing tree: every file's bytes by relative path.
    fn files(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut out = BTreeMap::new();
        let mut dirs = vec![self.backing.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in fs::read_dir(&dir).expect("read_dir") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    let rel = path.strip_prefix(&self.backing).expect("under backing");
                    out.insert(rel.to_path_buf(), fs::read(&path).expect("read"));
                }
            }
        }
        out
    }
}

/// SimFs's defaults with the three survival choices pinned (the seed
/// then decides nothing).
fn pinned(model: DirModel, writes: f64, torn: f64, dir_ops: f64) -> MountConfig {
    let mut config = MountConfig::new(model);
    config.sim = SimConfig {
        unsynced_write_survival: writes,
        torn_write_probability: torn,
        dir_op_survival: dir_ops,
        ..SimConfig::new(0)
    };
    config
}

fn write_file(path: &Path, data: &[u8], sync: bool) {
    let mut file = File::create(path).expect("create");
    file.write_all(data).expect("write");
    if sync {
        file.sync_all().expect("fsync");
    }
}

fn sync_dir(path: &Path) {
    File::open(path).expect("open dir").sync_all().expect("fsyncdir");
}

#[test]
fn reads_see_unsynced_writes_and_a_clean_unmount_keeps_them() {
    let disk = Disk::new();
    let m = disk.mount(pinned(DirModel::Strict, 0.0, 0.0, 0.0));
    fs::create_dir(m.mountpoint().join("d")).expect("mkdir");
    write_file(&m.mountpoint().join("d/a"), b"hello", false);
    let mut f = OpenOptions::new()
        .append(true)
        .open(m.mountpoint().join("d/a"))
        .expect("open append");
    f.write_all(b" world").expect("append");
    drop(f);
    assert_eq!(
        fs::read(m.mountpoint().join("d/a")).expect("read"),
        b"hello world"
    );
    fs::rename(m.mountpoint().join("d/a"), m.mountpoint().join("d/b")).expect("rename");
    let names: Vec<_> = fs::read_dir(m.mountpoint().join("d"))
        .expect("readdir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, vec!["b"]);
    m.unmount().expect("unmount");
    assert_eq!(
        disk.files(),
        BTreeMap::from([(PathBuf::from("d/b"), b"hello world".to_vec())])
    );
}

#[test]
fn unsynced_write_is_gone_after_a_cut() {
    let disk = Disk::new();
    let m = disk.mount(pinned(DirModel::Strict, 0.0, 0.0, 1.0));
    let path = m.mountpoint().join("f");
    write_file(&path, b"durable", true);
    sync_dir(m.mountpoint());
    let mut f = OpenOptions::new().append(true).open(&path).expect("open");
    f.write_all(b" and more").expect("append");
    drop(f);
    let cut = m.cut_power(1).expect("cut");
    assert!(!cut.undecided.is_empty(), "the append was undecided");
    assert_eq!(disk.files()[Path::new("f")], b"durable");
}

#[test]
fn fsynced_write_and_dir_survive_a_cut() {
    let disk = Disk::new();
    let m = disk.mount(pinned(DirModel::Strict, 0.0, 0.0, 0.0));
    fs::create_dir(m.mountpoint().join("d")).expect("mkdir");
    sync_dir(m.mountpoint());
    write_file(&m.mountpoint().join("d/f"), b"kept", true);
    sync_dir(&m.mountpoint().join("d"));
    m.cut_power(1).expect("cut");
    assert_eq!(disk.files()[Path::new("d/f")], b"kept");
    // And the remounted disk shows it to the next program.
    let m = disk.mount(pinned(DirModel::Strict, 0.0, 0.0, 0.0));
    assert_eq!(fs::read(m.mountpoint().join("d/f")).expect("read"), b"kept");
    m.cut_power(1).expect("cut");
}

#[test]
fn created_file_without_fsyncdir_is_dropped_under_strict_and_kept_under_eager() {
    for (model, kept) in [(DirModel::Strict, false), (DirModel::Eager, true)] {
        let disk = Disk::new();
        let m = disk.mount(pinned(model, 0.0, 0.0, 0.0));
        write_file(&m.mountpoint().join("f"), b"data", true);
        m.cut_power(1).expect("cut");
        assert_eq!(
            disk.files().contains_key(Path::new("f")),
            kept,
            "{model:?}: a created+fsynced file without fsyncdir"
        );
    }
}

#[test]
fn rename_over_a_file_is_atomic_across_seeds() {
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..12 {
        let disk = Disk::new();
        let m = disk.mount(MountConfig::new(DirModel::Strict));
        write_file(&m.mountpoint().join("a"), b"old", true);
        sync_dir(m.mountpoint());
        write_file(&m.mountpoint().join("tmp"), b"new", true);
        fs::rename(m.mountpoint().join("tmp"), m.mountpoint().join("a")).expect("rename");
        m.cut_power(seed).expect("cut");
        let files = disk.files();
        let a = files.get(Path::new("a")).cloned();
        assert!(
            a.as_deref() == Some(b"old") || a.as_deref() == Some(b"new"),
            "seed {seed}: a is {a:?} (repro: cargo test -p durable-agent-powercut --test powercut rename_over)"
        );
        // The temp name survives only if the rename was lost.
        if a.as_deref() == Some(b"new") {
            assert!(
                !files.contains_key(Path::new("tmp")),
                "seed {seed}: rename half applied"
            );
        }
        seen.insert(a);
    }
    assert_eq!(seen.len(), 2, "12 seeds should show both outcomes: {seen:?}");
}

/// The same seed and the same syscalls leave byte-identical disks; other
/// seeds leave others (writes kept, dropped or torn).
#[test]
fn what_survives_is_decided_by_the_seed() {
    let run = |seed: u64| {
        let disk = Disk::new();
        let m = disk.mount(MountConfig::new(DirModel::Strict));
        write_file(&m.mountpoint().join("base"), b"", true);
        sync_dir(m.mountpoint());
        let mut f = OpenOptions::new()
            .append(true)
            .open(m.mountpoint().join("base"))
            .expect("open");
        for i in 0..8 {
            f.write_all(format!("line {i} of the log\n").as_bytes())
                .expect("append");
        }
        drop(f);
        write_file(&m.mountpoint().join("new"), b"unsynced entry", false);
        m.cut_power(seed).expect("cut");
        disk.files()
    };
    assert_eq!(run(42), run(42));
    let outcomes: std::collections::BTreeSet<_> = (0..6).map(run).collect();
    assert!(outcomes.len() > 1, "six seeds gave one outcome");
}

#[derive(Debug, Default)]
struct Clock(AtomicU64);

impl LogicalClock for Clock {
    fn now_ms(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst)
    }
}

/// The runtime on RealFs on the mount: every acknowledged op survives a
/// cut under either directory model, whatever the seed keeps. Each
/// "process" gets its own `RealFs` (which keeps the descriptors it wrote
/// and synced through): it is dropped before the cut, as a killed
/// process's descriptors are closed — an open one keeps the mount busy.
#[test]
fn runtime_on_realfs_recovers_every_acknowledged_op_after_a_cut() {
    for (seed, model) in [
        (11, DirModel::Strict),
        (12, DirModel::Eager),
        (13, DirModel::Strict),
    ] {
        let disk = Disk::new();
        let m = disk.mount(MountConfig::new(model));
        let root = m.mountpoint().join("runtime");
        let process = || -> Arc<dyn Fs> { Arc::new(RealFs::new()) };
        let (mut rt, _) = Runtime::open(process(), &root, RuntimeConfig::new(3)).expect("open");
        let a = rt.create_root("a", "x").expect("root");
        let b = rt.spawn_child(&a, "b", "y").expect("child");
        rt.run_turn(&b, "lookup something").expect("turn");
        rt.send_message(&b, &a, "hi").expect("send");
        let before = rt.state();
        drop(rt);
        m.cut_power(seed).expect("cut");
        let m = disk.mount(MountConfig::new(model));
        let fs = process();
        let (rt, _) = Runtime::open(fs.clone(), &root, RuntimeConfig::new(3))
            .unwrap_or_else(|e| panic!("seed {seed} {model:?}: recovery failed: {e}"));
        assert_eq!(rt.state(), before.normalized(), "seed {seed} {model:?}");
        check_invariants(fs.as_ref(), &root).expect("invariants");
        drop((rt, fs));
        m.cut_power(seed + 1000).expect("cut");
    }
}

/// `System::boot` (lock, SQLite stores through the VFS, recovery) on the
/// mount: every trigger whose `emit` returned is there after a cut.
#[test]
fn system_on_realfs_keeps_every_emitted_trigger_after_a_cut() {
    for (seed, model) in [(21, DirModel::Strict), (22, DirModel::Eager)] {
        let disk = Disk::new();
        let clock = Arc::new(Clock::default());
        let boot = |root: &Path| {
            let deps = Deps {
                provider: Arc::new(FakeProvider::new(seed)),
                tools: Arc::new(PureTools),
                outbox: Arc::new(World::default()),
                clock: clock.clone(),
            };
            // A fresh RealFs per boot: each is a process (see above).
            System::boot(Arc::new(RealFs::new()), SystemConfig::new(root, seed), deps)
                .unwrap_or_else(|e| panic!("seed {seed} {model:?}: boot: {e}"))
                .0
        };
        let spec = |i: u32| TriggerSpec {
            source: TriggerSource::Scheduled,
            dedup_key: Some(format!("key-{i}")),
            session_id: None,
            fire_at_ms: 0,
            priority: 0,
            description: format!("trigger {i}"),
            payload: serde_json::json!({}),
        };
        let m = disk.mount(MountConfig::new(model));
        let root = m.mountpoint().join("root");
        let system = boot(&root);
        let mut ids = Vec::new();
        for i in 0..5 {
            let now = system.now_ms();
            match system
                .triggers()
                .emit(system.db().conn(), &spec(i), now)
                .expect("emit")
            {
                EmitOutcome::Inserted(id) => ids.push(id),
                other => panic!("fresh key answered {other:?}"),
            }
        }
        drop(system);
        m.cut_power(seed).expect("cut");
        let m = disk.mount(MountConfig::new(model));
        let system = boot(&root);
        for (i, id) in (0..5).zip(&ids) {
            let now = system.now_ms();
            let again = system
                .triggers()
                .emit(system.db().conn(), &spec(i), now)
                .expect("emit");
            assert_eq!(
                again,
                EmitOutcome::Duplicate(id.clone()),
                "seed {seed} {model:?}: trigger key-{i} lost"
            );
        }
        drop(system);
        m.cut_power(seed + 1000).expect("cut");
    }
}

/// A file still open on the mount keeps it busy: the cut says so (the
/// program was not killed first) and still leaves no dead mount behind.
#[test]
fn a_cut_with_a_file_open_reports_it_and_leaves_no_mount_behind() {
    let disk = Disk::new();
    let m = disk.mount(MountConfig::new(DirModel::Strict));
    let held = File::create(m.mountpoint().join("held")).expect("create");
    let err = m.cut_power(1).expect_err("a busy mount must not unmount quietly");
    assert!(err.to_string().contains("still has a file open"), "{err}");
    drop(held);
    let mounts = fs::read_to_string("/proc/self/mounts").expect("mounts");
    let mnt = disk.mnt.to_string_lossy().into_owned();
    assert!(
        !mounts.lines().any(|l| l.split(' ').nth(1) == Some(mnt.as_str())),
        "{mnt} is still mounted"
    );
}
