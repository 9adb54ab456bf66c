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
    /// an earlier append was lost.
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
            prop_assert!(got.unwrap().starts_with(bytes), "{} lost durable bytes", path.display());
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
