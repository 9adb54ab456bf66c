//! Properties over random op sequences, crash points, crash modes and seeds.

use proptest::prelude::*;

use super::*;

#[derive(Debug, Clone)]
enum Op {
    Create(usize),
    Append(usize, Vec<u8>),
    Sync(usize),
    SyncDir,
}

const FILES: [&str; 3] = ["/d/a", "/d/b", "/d/c"];

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..FILES.len()).prop_map(Op::Create),
        (0..FILES.len(), prop::collection::vec(1u8..=255, 1..12)).prop_map(|(f, data)| Op::Append(f, data)),
        (0..FILES.len()).prop_map(Op::Sync),
        Just(Op::SyncDir),
    ]
}

fn mode() -> impl Strategy<Value = CrashMode> {
    prop_oneof![Just(CrashMode::ProcessCrash), Just(STRICT), Just(EAGER)]
}

/// Run `ops` against a fresh disk with a crash armed at `crash_at`; errors
/// (appending to a file not yet created, calls after the crash) are part of
/// the run, not failures.
fn run(seed: u64, ops: &[Op], crash_at: u64) -> SimFs {
    let fs = SimFs::new(SimConfig::new(seed));
    fs.create_dir_all(p("/d"), "mkdir d").unwrap();
    fs.sync_dir(p("/"), "sync root").unwrap();
    fs.set_fault(Some(Fault::CrashAt(fs.points() + crash_at)));
    for op in ops {
        let _ = match op {
            Op::Create(f) => fs.open(p(FILES[*f]), OpenMode::Create, "create"),
            Op::Append(f, data) => fs.append(p(FILES[*f]), data, "append").map(drop),
            Op::Sync(f) => fs.sync(p(FILES[*f]), "sync"),
            Op::SyncDir => fs.sync_dir(p("/d"), "sync d"),
        };
    }
    fs
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The durability promise: whatever was durable when the crash hit is
    /// on disk after it, under every crash mode — and power loss invents
    /// nothing: each recovered byte is the byte written there, or zero where
    /// an earlier append was lost. A zero in the durable floor is a hole,
    /// not data: an fsync the crash cut short may have persisted a later
    /// page and not an earlier one (`[0, 1]` durable where `[1, 1]` was
    /// written), and a process crash keeps the written byte there.
    #[test]
    fn durable_data_survives_any_crash_at_any_point(
        seed: u64,
        ops in prop::collection::vec(op(), 1..24),
        crash_at in 1u64..30,
        mode in mode(),
    ) {
        let fs = run(seed, &ops, crash_at);
        let durable = fs.durable_image();
        let visible = fs.disk_image();
        fs.restart(mode);
        let recovered = fs.disk_image();
        for (path, bytes) in &durable {
            let got = recovered.get(path);
            prop_assert!(got.is_some(), "{} vanished", path.display());
            let got = got.unwrap();
            prop_assert!(got.len() >= bytes.len(), "{} lost durable bytes", path.display());
            prop_assert!(
                got.iter().zip(bytes).all(|(g, d)| g == d || *d == 0),
                "{} lost durable bytes",
                path.display()
            );
        }
        for (path, got) in &recovered {
            let seen = visible.get(path);
            prop_assert!(seen.is_some(), "{} appeared from nowhere", path.display());
            let seen = seen.unwrap();
            prop_assert!(got.len() <= seen.len());
            prop_assert!(got.iter().zip(seen).all(|(g, s)| g == s || *g == 0));
        }
    }

    /// A run replays from its seed: same ops, crash point and mode give the
    /// same disk and trace.
    #[test]
    fn a_run_replays_from_its_seed(
        seed: u64,
        ops in prop::collection::vec(op(), 1..16),
        crash_at in 1u64..20,
        mode in mode(),
    ) {
        let hashes = || {
            let fs = run(seed, &ops, crash_at);
            fs.restart(mode);
            (fs.image_hash(), fs.trace_hash())
        };
        prop_assert_eq!(hashes(), hashes());
    }
}

#[derive(Debug, Clone)]
enum AnyOp {
    Mkdir,
    Open(usize, bool),
    Append(usize, Vec<u8>),
    WriteAt(usize, u64, Vec<u8>),
    Truncate(usize, u64),
    Rename(usize, usize),
    Remove(usize),
    Sync(usize),
}

const ANY_FILES: [&str; 4] = ["/d/a", "/d/b", "/d/s/c", "/d/s/d"];

fn any_op() -> impl Strategy<Value = AnyOp> {
    let f = || 0..ANY_FILES.len();
    let data = || prop::collection::vec(any::<u8>(), 1..8);
    prop_oneof![
        Just(AnyOp::Mkdir),
        (f(), any::<bool>()).prop_map(|(f, t)| AnyOp::Open(f, t)),
        (f(), data()).prop_map(|(f, d)| AnyOp::Append(f, d)),
        (f(), 0u64..24, data()).prop_map(|(f, o, d)| AnyOp::WriteAt(f, o, d)),
        (f(), 0u64..24).prop_map(|(f, l)| AnyOp::Truncate(f, l)),
        (f(), f()).prop_map(|(a, b)| AnyOp::Rename(a, b)),
        f().prop_map(AnyOp::Remove),
        f().prop_map(AnyOp::Sync),
    ]
}

fn apply_any(fs: &SimFs, op: &AnyOp) {
    let path = |f: &usize| p(ANY_FILES[*f]);
    let _ = match op {
        AnyOp::Mkdir => fs.create_dir_all(p("/d/s"), "mkdir s"),
        AnyOp::Open(f, truncate) => {
            let mode = if *truncate {
                OpenMode::Truncate
            } else {
                OpenMode::Create
            };
            fs.open(path(f), mode, "open")
        }
        AnyOp::Append(f, d) => fs.append(path(f), d, "append").map(drop),
        AnyOp::WriteAt(f, o, d) => fs.write_at(path(f), *o, d, "write_at"),
        AnyOp::Truncate(f, l) => fs.truncate(path(f), *l, "truncate"),
        AnyOp::Rename(a, b) => fs.rename(path(a), path(b), "rename"),
        AnyOp::Remove(f) => fs.remove(path(f), "remove"),
        AnyOp::Sync(f) => fs.sync(path(f), "sync"),
    };
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The bookkeeping is complete: once every file and every directory is
    /// synced, nothing is left for a power loss to decide, whatever
    /// creates, writes, truncates, renames and removes came before.
    #[test]
    fn after_syncing_everything_power_loss_changes_nothing(
        seed: u64,
        ops in prop::collection::vec(any_op(), 1..32),
        eager: bool,
    ) {
        let fs = SimFs::new(SimConfig::new(seed));
        fs.create_dir_all(p("/d"), "mkdir d").unwrap();
        for op in &ops {
            apply_any(&fs, op);
        }
        for path in fs.disk_image().keys() {
            fs.sync(path, "sync all").unwrap();
        }
        for dir in ["/", "/d", "/d/s"] {
            if fs.exists(p(dir), "exists").unwrap() {
                fs.sync_dir(p(dir), "sync dir").unwrap();
            }
        }
        let before = fs.disk_image();
        prop_assert_eq!(&fs.durable_image(), &before);
        let model = if eager { DirModel::Eager } else { DirModel::Strict };
        fs.restart(CrashMode::PowerLoss(model));
        prop_assert_eq!(fs.disk_image(), before);
    }

    /// `is_durable` (what the harness's crash chain asks of a rebooted
    /// disk) never claims too much: when it holds, a power loss under
    /// either directory model leaves the disk as it is. And an unsynced
    /// write to a named file is always seen as pending.
    #[test]
    fn a_durable_disk_is_left_as_is_by_a_power_loss(
        seed: u64,
        ops in prop::collection::vec(any_op(), 1..32),
        sync_all: bool,
        eager: bool,
    ) {
        let fs = SimFs::new(SimConfig::new(seed));
        fs.create_dir_all(p("/d"), "mkdir d").unwrap();
        for op in &ops {
            apply_any(&fs, op);
        }
        if sync_all {
            for path in fs.disk_image().keys() {
                fs.sync(path, "sync all").unwrap();
            }
            for dir in ["/", "/d", "/d/s"] {
                if fs.exists(p(dir), "exists").unwrap() {
                    fs.sync_dir(p(dir), "sync dir").unwrap();
                }
            }
        }
        if fs.is_durable() {
            let before = fs.disk_image();
            let model = if eager { DirModel::Eager } else { DirModel::Strict };
            fs.restart(CrashMode::PowerLoss(model));
            prop_assert_eq!(fs.disk_image(), before);
        }
        if let Some(path) = fs.disk_image().keys().next().cloned() {
            fs.append(&path, b"x", "append").unwrap();
            prop_assert!(!fs.is_durable(), "an unsynced append to {} went unseen", path.display());
        }
    }

    /// A process crash at any point of any op sequence keeps exactly what
    /// the process saw at that moment.
    #[test]
    fn process_crash_at_any_point_keeps_the_visible_image(
        seed: u64,
        ops in prop::collection::vec(any_op(), 1..24),
        crash_at in 1u64..30,
    ) {
        let fs = SimFs::new(SimConfig::new(seed));
        fs.set_fault(Some(Fault::CrashAt(crash_at)));
        fs.create_dir_all(p("/d"), "mkdir d").ok();
        for op in &ops {
            apply_any(&fs, op);
        }
        let seen = (fs.disk_image(), fs.image_hash());
        fs.restart(CrashMode::ProcessCrash);
        prop_assert_eq!((fs.disk_image(), fs.image_hash()), seen);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Capture mode is a faithful fork: the crash image captured at point
    /// `n` of an uncrashed run reboots (under any mode) to the very disk —
    /// bytes, undecided ops and later random draws — that running the same
    /// calls into `CrashAt(n)` and restarting leaves. The fast sweep judges
    /// these images instead of re-running the prefix.
    #[test]
    fn a_captured_crash_image_reboots_to_the_disk_a_real_crash_leaves(
        seed: u64,
        ops in prop::collection::vec(any_op(), 1..24),
        crash_at in 1u64..30,
        mode in mode(),
        then in prop::collection::vec(any_op(), 0..6),
        second in mode(),
    ) {
        let run = |fs: &SimFs| {
            fs.create_dir_all(p("/d"), "mkdir d").ok();
            for op in &ops {
                apply_any(fs, op);
            }
        };
        let live = SimFs::new(SimConfig::new(seed));
        live.set_capture(true);
        run(&live);
        let captured = live.take_captures();
        prop_assert_eq!(captured.len() as u64, live.points());
        prop_assume!(crash_at <= live.points());
        let image = captured[(crash_at - 1) as usize].clone();
        prop_assert_eq!(image.point(), crash_at);
        let forked = image.reboot(mode);

        let real = SimFs::new(SimConfig::new(seed));
        real.set_fault(Some(Fault::CrashAt(crash_at)));
        run(&real);
        real.restart(mode);
        prop_assert_eq!(forked.points(), real.points());
        prop_assert_eq!(forked.disk_image(), real.disk_image());
        prop_assert_eq!(forked.durable_image(), real.durable_image());
        // Later draws agree too: more calls, then a second crash.
        for fs in [&forked, &real] {
            for op in &then {
                apply_any(fs, op);
            }
            fs.restart(second);
        }
        prop_assert_eq!(forked.disk_image(), real.disk_image());
    }
}
